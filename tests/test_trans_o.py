"""Issue 33, point 1: one gemm problem, every key form.

A gemm problem knows -transO (migration 0018 gives every older gemm problem `false`); the build
decides how a line is spelled for the tool (eras.build_key_form: e4 spells -transO), and the
key form how an export spells it. The E3 form (plain) of a `-transO false` problem is what it
was before: the vector without the flag.
"""

from __future__ import annotations

import os

import sqlalchemy as sa
from support.clitools import cli
from support.perfrunner_reader import read_tuning_db
from support.results import FULL, new_session, tune
from support.rocmlir import tuner
from support.standin import standin_build

from mlirtuna import catalog, keys, migrations
from mlirtuna.db import Database
from mlirtuna.problems import parse

G = "-t f16 -out_datatype f16 -transA false -transB false -g 1 -m 64 -n 512 -k 128"
GT = G.replace("-transB false", "-transB false -transO true")  # a transposed output
HEADER = (
    "# arch\tnumCUs\tnumChiplets\ttestVector\tperfConfig\tTFlops\ttuningSpace\tcommitId"
    "\ttimestamp\tdurationSec"
)


def _gemm_at_0017(db: Database) -> None:
    """A gemm problem as a database before 0018 holds it: trans_o NULL (the line had none)."""
    with db.engine.begin() as conn:
        conn.execute(
            sa.text(
                "INSERT INTO problem (op, test_vector, created_at) "
                "VALUES ('gemm', :tv, '2025-01-01 00:00:00')"
            ),
            {"tv": G},
        )
        conn.execute(
            sa.text(
                "INSERT INTO gemm_config (id, data_type, out_data_type, trans_a, trans_b, trans_o,"
                " group_size, m, n, k, kernel_repeats) VALUES (1, 'f16', 'f16', :no, :no, NULL,"
                " 1, 64, 512, 128, 1)"
            ),
            {"no": False},
        )


def _trans_o(db: Database) -> tuple[list, bool]:
    with db.engine.connect() as conn:
        values = conn.exec_driver_sql("SELECT trans_o FROM gemm_config").scalars().all()
    (column,) = [
        c for c in sa.inspect(db.engine).get_columns("gemm_config") if c["name"] == "trans_o"
    ]
    return values, column["nullable"]


def test_0018_gives_every_gemm_problem_trans_o_false(empty_db_url):
    db = Database(empty_db_url, check_schema=False)
    try:
        migrations.upgrade(db.engine, "0017")
        _gemm_at_0017(db)
        assert _trans_o(db) == ([None], True)
        assert db.upgrade() == ("0017", migrations.head_revision())
        values, nullable = _trans_o(db)
        assert [bool(v) for v in values] == [False] and not nullable
        with db.session() as s:  # the same problem, the same key it always had
            problem = catalog.load_problem(s, 1)
        assert problem.trans_o is False and problem.canonical() == G
        assert migrations.downgrade(db.engine, "0017") == (migrations.head_revision(), "0017")
        assert _trans_o(db)[1] is True
        assert db.upgrade() == ("0017", migrations.head_revision())  # and up again
        assert [bool(v) for v in _trans_o(db)[0]] == [False]
    finally:
        db.dispose()


def test_every_export_key_form_spells_trans_o_as_its_perfrunner(db, db_url, tmp_path):
    sid = new_session(db)
    tune(db, tmp_path, sid, [G, GT], perf=lambda tv: "v4:t" if "transO" in tv else "v4:f")
    e4 = keys.e4_vector("gemm", G)
    want = {
        "plain": {G, GT},  # the E3 form: -transO only when true
        "split-k": {f"{G} -supportsSplitK true", f"{GT} -supportsSplitK true"},
        "e4": {e4, GT},  # rocmlirTriton's: always -transO
        "e4-split-k": {f"{e4} -supportsSplitK true", f"{GT} -supportsSplitK true"},
    }
    for form, vectors in want.items():
        out = tmp_path / f"{form}.tsv"
        run = cli(db_url, "export", "--session", str(sid), "--key-format", form, "-o", str(out))
        assert run.code == 0, run.stderr
        lines = out.read_text().splitlines()
        assert lines[0] == HEADER
        assert {line.split("\t")[3] for line in lines[1:]} == vectors, form
        found = read_tuning_db(str(out))
        assert {k[3]: v for k, v in found.items()} == {
            v: ("v4:t" if "transO true" in v else "v4:f") for v in vectors
        }
        assert {k[:3] for k in found} == {(FULL, 304, 8)}


def test_an_e3_export_of_trans_o_false_problems_is_as_before(db, db_url, tmp_path):
    """The E3 export is byte for byte what it was: the problem's stored vector, no -transO."""
    sid = new_session(db)
    spelled = G.replace("-transB false", "-transB false -transO false")
    tune(db, tmp_path, sid, [spelled])  # imported with `-transO false`: the same problem
    with db.session() as s:
        assert s.scalars(sa.text("SELECT test_vector FROM problem")).all() == [G]
    out = tmp_path / "e3.tsv"
    assert cli(db_url, "export", "--session", str(sid), "-o", str(out)).code == 0
    (row,) = out.read_text().splitlines()[1:]
    fields = row.split("\t")
    assert fields[:6] == [FULL, "304", "8", G, "v4:best", repr(parse("gemm", G).flops() / 1e8)]
    assert fields[6:8] == ["full", "abc123"] and len(fields) == 10


def test_each_build_gets_lines_in_its_own_spelling(tmp_path, monkeypatch):
    build = standin_build(tmp_path, monkeypatch)
    plain, transposed = parse("gemm", G), parse("gemm", GT)
    e3 = tuner(build, "E3", monkeypatch)
    assert e3.key_form == keys.PLAIN  # no perfRunner.py beside it: an E3 build
    assert (e3.line(plain), e3.line(transposed)) == (G, GT)
    e4 = tuner(build, "E4", monkeypatch)
    assert e4.key_form == keys.E4
    assert (e4.line(plain), e4.line(transposed)) == (keys.e4_vector("gemm", G), GT)
    conv = parse(
        "conv",
        "conv -F 1 -f NCHW -I NCHW -O NCHW -n 1 -c 8 -H 8 -W 8 -k 8 -y 3 -x 3 -p 1 -q 1 -u 1 "
        "-v 1 -l 1 -j 1 -g 1",
    )
    assert e4.line(conv) == conv.canonical()  # only gemm keys change


def test_run_refuses_what_the_build_cannot_tune_before_writing_anything(
    db, db_url, tmp_path, monkeypatch
):
    """`run` asks the tuner's kind what the build can never tune (TunerKind.build_limit, as
    `jobs load` does): on an E3 build a -transO true line stops it, one line, exit 2, before a
    session is opened or a problem imported; the same lists without it run."""
    build = standin_build(tmp_path, monkeypatch, era="E3")
    monkeypatch.setenv("PATH", f"{build / 'below' / 'bin'}:{os.environ['PATH']}")  # rocminfo
    configs = tmp_path / "gemm.txt"
    configs.write_text(f"{G}\n{GT}\n")
    argv = ["run", "--op", "gemm", str(configs), "--mlir-build-dir", str(build),
            "--gpu-identity", "g0", "--tuning-space", "quick"]  # fmt: skip
    refused = cli(db_url, *argv)
    lines = refused.stderr.strip().splitlines()
    assert refused.code == 2 and len(lines) == 1, refused.stderr
    assert "the rocmlir tuner's build cannot tune gemm -transO true" in lines[0]
    assert GT in lines[0] and "open the session on an E4 build" in lines[0]
    with db.session() as s:
        assert s.scalar(sa.text("SELECT count(*) FROM session")) == 0
        assert s.scalar(sa.text("SELECT count(*) FROM problem")) == 0
