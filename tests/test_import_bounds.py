"""Inputs within bounds (issue 34 point 4), on every backend: import-tsv's dedupe knows the op
filter (M11), a key twice with different perf configs is FILE:LINE, an attention perf config
on a gemm row is refused; attention heads must divide; a `.mlir` function named like an option
is refused; names with control or bidi characters are escaped in terminal tables."""

from __future__ import annotations

import pytest
import sqlalchemy as sa
from support.clitools import cli

from mlirtuna import catalog, sessions
from mlirtuna.db.models import Problem, Result, TuningSession
from mlirtuna.errors import InputError
from mlirtuna.problems import ExpandOptions

HEADER = (
    "# arch\tnumCUs\tnumChiplets\ttestVector\tperfConfig\tTFlops\ttuningSpace\tcommitId"
    "\ttimestamp\tdurationSec\n"
)
GEMM = "-t f32 -out_datatype f32 -transA false -transB false -g 1 -m 64 -n 64 -k 32"
CONV = (
    "conv -F 1 -f NCHW -I NCHW -O NCHW -n 2 -c 16 -H 14 -W 14 -k 16 -y 1 -x 1 -p 0 -q 0 "
    "-u 1 -v 1 -l 1 -j 1 -m conv -g 1 -t 1"
)
ATTENTION = (
    "-t f16 -transQ false -transK true -transV false -transO false -g 1 -seq_len_q 64 "
    "-seq_len_k 64 -num_heads_q 8 -num_heads_kv 2 -head_dim_qk 64 -head_dim_v 64"
)
ATTN_PERF = "attn:v1:32,32,64,2,32,32,32,4,1"


def row(vector: str, perf: str, tflops: str = "1.5") -> str:
    return f"gfx942\t304\t8\t{vector}\t{perf}\t{tflops}\tquick\tabc\t2025-01-01T00:00:00Z\t1.0\n"


def results_by_op(db) -> dict[str, int]:
    with db.session() as s:
        rows = s.execute(
            sa.select(Problem.op, sa.func.count())
            .join(Result, Result.problem_id == Problem.id)
            .group_by(Problem.op)
        ).all()
    return dict(rows)


def test_a_second_import_with_another_op_imports_what_the_first_left_out(db, db_url, tmp_path):
    path = tmp_path / "mixed.tsv"
    path.write_text(HEADER + row(CONV, "v2:1,2") + row(GEMM, "v2:3,4") + row(ATTENTION, ATTN_PERF))
    first = cli(db_url, "import-tsv", "--op", "conv", str(path))
    assert first.code == 0, first.stderr
    assert results_by_op(db) == {"conv": 1}
    gemm = cli(db_url, "import-tsv", "--op", "gemm", str(path))
    assert gemm.code == 0 and "already imported" not in gemm.stderr
    assert results_by_op(db) == {"conv": 1, "gemm": 1}
    rest = cli(db_url, "import-tsv", str(path))  # every op: only attention is left
    assert rest.code == 0 and "already imported" not in rest.stderr
    assert results_by_op(db) == {"conv": 1, "gemm": 1, "attention": 1}
    again = cli(db_url, "import-tsv", str(path))
    assert again.code == 0 and "already imported as session 1, 2, 3" in again.stderr
    assert cli(db_url, "import-tsv", "--op", "gemm", str(path)).code == 0
    assert results_by_op(db) == {"conv": 1, "gemm": 1, "attention": 1}
    with db.session() as s:
        assert s.scalar(sa.select(sa.func.count()).select_from(TuningSession)) == 3


def test_a_key_twice_with_different_perf_configs_is_an_error_at_its_line(db, db_url, tmp_path):
    path = tmp_path / "twice.tsv"
    path.write_text(HEADER + row(GEMM, "v2:1,2") + row(CONV, "v2:5,6") + row(GEMM, "v2:3,4"))
    run = cli(db_url, "import-tsv", str(path))
    assert run.code == 2 and run.stderr.startswith(f"error: {path}:4: key ")
    assert "already at line 2 with perf config 'v2:1,2', here with 'v2:3,4'" in run.stderr
    assert results_by_op(db) == {}
    same = tmp_path / "same.tsv"  # the same fact twice is fine
    same.write_text(HEADER + row(GEMM, "v2:1,2") + row(GEMM, "v2:1,2", "1.6"))
    assert cli(db_url, "import-tsv", str(same)).code == 0
    assert results_by_op(db) == {"gemm": 1}
    rerun = tmp_path / "rerun.tsv"  # a rerun appended under a new header replaces the old row
    rerun.write_text(HEADER + row(GEMM, "v2:1,2") + HEADER + row(GEMM, "v2:9,9"))
    assert cli(db_url, "import-tsv", str(rerun)).code == 0


def test_a_gemm_row_with_an_attention_perf_config_is_refused(db, db_url, tmp_path):
    path = tmp_path / "wrong.tsv"
    path.write_text(HEADER + row(ATTENTION, ATTN_PERF) + row(GEMM, ATTN_PERF))
    run = cli(db_url, "import-tsv", str(path))
    assert run.code == 2 and run.stderr.startswith(f"error: {path}:3: perf config ")
    assert "is an attention one, not gemm's" in run.stderr
    assert results_by_op(db) == {}


def test_attention_heads_that_do_not_divide_are_refused(db, db_url, tmp_path):
    configs = tmp_path / "attention-configs"
    configs.write_text(ATTENTION.replace("-num_heads_kv 2", "-num_heads_kv 3") + "\n")
    run = cli(db_url, "import", "--op", "attention", "--no-expand", str(configs))
    assert run.code == 2 and f"{configs}:1:" in run.stderr
    assert "-num_heads_q 8 is not a multiple of -num_heads_kv 3" in run.stderr
    tsv = tmp_path / "gqa.tsv"
    tsv.write_text(HEADER + row(ATTENTION.replace("-num_heads_kv 2", "-num_heads_kv 3"), ATTN_PERF))
    assert cli(db_url, "import-tsv", str(tsv)).code == 2
    configs.write_text(ATTENTION + "\n")  # 8 query heads over 2 K/V heads: grouped-query
    assert cli(db_url, "import", "--op", "attention", "--no-expand", str(configs)).code == 0


A, B, C = "tensor<1x64x32xf32>", "tensor<1x32x64xf32>", "tensor<1x64x64xf32>"
MODULE = f"""// RUN: rocmlir-gen -fut NAME --verifier clone - | FileCheck %s
module {{
  func.func @NAME(%arg0: {A}, %arg1: {B}) -> {C} {{
    %0 = migraphx.dot(%arg0, %arg1) : ({A}, {B}) -> {C}
    return %0 : {C}
  }}
}}
"""


def test_a_fusion_function_named_like_an_option_is_refused(db, db_url, tmp_path):
    bad = tmp_path / "bad.mlir"
    bad.write_text(MODULE.replace("NAME", "-o"))
    run = cli(db_url, "import", "--op", "fusion", str(bad))
    assert run.code == 2 and "function name '-o' starts with '-'" in run.stderr
    good = tmp_path / "good.mlir"
    good.write_text(MODULE.replace("NAME", "dot_only"))
    assert cli(db_url, "import", "--op", "fusion", str(good)).code == 0


def test_session_names_with_control_and_bidi_characters_are_escaped(db, db_url):
    name = "evil\x1b[2J\u202eemanrev\x07x"
    sessions.create(db, sessions.SessionSpec(tuner="cpu", tuning_space="quick", name=name))
    run = cli(db_url, "session", "list")
    assert run.code == 0
    assert "\x1b" not in run.stdout and "\u202e" not in run.stdout
    assert "evil\\x1b[2J\\u202eemanrev\\x07x" in run.stdout
    assert len(run.stdout.splitlines()) == 2  # the header and one row: no line break injected


def test_catalog_import_keeps_the_heads_check_for_expanded_lines(db, tmp_path):
    configs = tmp_path / "attention-configs"
    configs.write_text(ATTENTION.replace("-num_heads_kv 2", "-num_heads_kv 3") + "\n")
    with pytest.raises(InputError, match="is not a multiple of -num_heads_kv 3"):
        catalog.import_files(db, "attention", [str(configs)], ExpandOptions(expand=True))
