"""mlirtuna.problems.configlist: reading whole config lists (no database)."""

from __future__ import annotations

import gc
import time
from pathlib import Path

import pytest

from mlirtuna.errors import InputError, UserError
from mlirtuna.problems import ExpandOptions
from mlirtuna.problems.configlist import read_config_lines, read_config_list

DATA = Path(__file__).parent / "data"
GEMM = "-t f16 -out_datatype f16 -transA false -transB false -g 1 -m 1024 -n 512 -k 769"
CONV = (
    "conv -F 1 -f N01GC -I 01NGC -O NGC01 -n 1 -c 3 -H 640 -W 640 -k 16 -y 3 -x 3 -p 1 -q 1 "
    "-u 2 -v 2 -l 1 -j 1 -g 1"
)


@pytest.mark.parametrize(("op", "lines", "problems"), [
    ("conv", 96, 480),  # no prefix on any line: x5 data types (f32 bf16 f16 fp8 i8), all -F 1
    ("gemm", 230, 172),  # 58 lines repeat an earlier line
    ("attention", 28, 28),
])  # fmt: skip
def test_tier1_lists(op: str, lines: int, problems: int) -> None:
    listing = read_config_list(str(DATA / f"tier1-{op}-configs"), op)
    assert (listing.lines, len(listing.entries)) == (lines, problems)
    assert listing.duplicates == {"gemm": 58}.get(op, 0)
    assert listing.warnings == []
    assert len({e.problem.canonical() for e in listing.entries}) == problems
    linenos = [e.lineno for e in listing.entries]
    assert linenos == sorted(linenos) and linenos[0] > 1  # line 1 of each is a comment


def test_comments_blanks_priority_and_dedup() -> None:
    text = [
        "# a model",
        "   # an indented comment",
        "",
        "   ",
        f"{GEMM} -perf_priority 3",
        f"  {GEMM.replace('-transA false', '-transA 0')}  -perf_priority 9",  # same problem
        GEMM.replace("-m 1024", "-m 2048"),
    ]
    listing = read_config_lines(text, "list.txt", "gemm")
    assert listing.lines == 3
    assert [(e.lineno, e.priority) for e in listing.entries] == [(5, 3), (7, 0)]
    assert listing.duplicates == 1
    assert listing.entries[0].problem.canonical() == GEMM


def test_newest_conv_list_format() -> None:
    listing = read_config_lines([f"{CONV} -perf_priority 2", f"convint8 {CONV[5:]}"], "x", "conv")
    assert [(e.problem.data_type, e.priority) for e in listing.entries] == [("f32", 2), ("i8", 0)]


def test_newer_attention_list_format() -> None:
    line = (
        "-t f16 -transQ false -transK true -transV false -transO false -causal false "
        "-return_lse false -g 12 -seq_len_q 384 -seq_len_k 384 -head_dim_qk 64 -head_dim_v 64 "
        "-with-attn-scale False -with-attn-bias False"
    )
    (entry,) = read_config_lines([line], "x", "attention").entries
    assert entry.problem.canonical().endswith(
        "-with-attn-scale false -with-attn-bias false -transBias false"
    )


def test_perf_config_is_dropped_with_a_warning() -> None:
    listing = read_config_lines(
        ["# c", f"{GEMM} -perf_config v2:32,256,2,32,32,4,1,1,1"], "l", "gemm"
    )
    assert len(listing.entries) == 1
    assert listing.warnings == ["l:2: ignoring -perf_config v2:32,256,2,32,32,4,1,1,1"]


def test_line_that_expands_to_nothing_warns() -> None:
    options = ExpandOptions(data_types=("i8",))
    listing = read_config_lines([CONV[5:].replace("-F 1", "-F 2")], "l", "conv", options)
    assert listing.entries == []
    assert listing.warnings == ["l:1: no problem left after expansion"]


def test_expansion_options_apply_to_every_line() -> None:
    path = str(DATA / "tier1-conv-configs")
    options = ExpandOptions(data_types=("f16", "bf16"))
    listing = read_config_list(path, "conv", options)
    assert len(listing.entries) == 96 * 2
    assert {e.problem.data_type for e in listing.entries} == {"f16", "bf16"}


def _copy_with_line(tmp_path: Path, op: str, lineno: int, text: str) -> str:
    lines = (DATA / f"tier1-{op}-configs").read_text().splitlines(keepends=True)
    lines[lineno - 1] = text + "\n"
    path = tmp_path / f"{op}-configs"
    path.write_text("".join(lines))
    return str(path)


@pytest.mark.parametrize(
    ("op", "bad", "message"),
    [
        ("conv", CONV + " -z 1", "unknown flag -z for conv"),
        ("conv", CONV.replace("-n 1", "-n abc"), "-n: expected an integer, got 'abc'"),
        ("conv", CONV.replace(" -k 16", ""), "missing required flag -k"),
        ("gemm", GEMM.replace("f16", "f64", 1), "-t: unknown data type 'f64' (known: f32, f16"),
        ("gemm", GEMM + " -foo 1", "unknown flag -foo for gemm"),
        ("gemm", GEMM + " -perf_priority high", "-perf_priority: expected an integer, got 'high'"),
        ("attention", "-t f16 -g 12 -seq_len_q 384", "missing required flag -seq_len_k"),
    ],
)
def test_bad_line_is_reported_at_file_and_line(
    tmp_path: Path, op: str, bad: str, message: str
) -> None:
    path = _copy_with_line(tmp_path, op, 37, bad)
    with pytest.raises(InputError) as caught:
        read_config_list(path, op)
    assert str(caught.value).startswith(f"{path}:37: {message}")
    assert (caught.value.path, caught.value.line) == (path, 37)


def test_file_and_option_errors_are_user_errors(tmp_path: Path) -> None:
    with pytest.raises(UserError, match="no such file"):
        read_config_list(str(tmp_path / "missing"), "gemm")
    with pytest.raises(UserError, match="unknown op 'winograd'"):
        read_config_list(str(DATA / "tier1-gemm-configs"), "winograd")
    with pytest.raises(UserError, match=r"^fusion problems are \.mlir modules"):  # no line blamed
        read_config_list(str(DATA / "tier1-gemm-configs"), "fusion")
    bad = ExpandOptions(data_types=("f64",))
    with pytest.raises(UserError) as caught:
        read_config_list(str(DATA / "tier1-gemm-configs"), "gemm", bad)
    assert not isinstance(caught.value, InputError)  # not any line's fault
    assert "unknown gemm data type 'f64'" in str(caught.value)


def test_large_list_is_linear(tmp_path: Path) -> None:
    # perfRunner dedups with `if x not in list` (quadratic); a long list must stay linear here
    # (how fast 100,000 lines are read and imported: bench/bench_bulk.py).
    # CPU time of the same work at n and 4n, in one run: linear is 4x, quadratic 16x; a busy
    # machine slows both alike (a wall-clock bound failed at 36.6 s on one, issue 46).
    def cpu_seconds(n: int) -> float:
        path = tmp_path / f"big-{n}"
        with path.open("w") as out:
            for i in range(n):
                out.write(f"-t f16 -out_datatype f16 -transA false -transB true -g 1 -m {i + 1}")
                out.write(" -n 8 -k 8\n")
        gc.collect()  # not the garbage of the run before
        start = time.process_time()
        listing = read_config_list(str(path), "gemm")
        spent = time.process_time() - start
        assert len(listing.entries) == n
        return spent

    small = min(cpu_seconds(12_500), cpu_seconds(12_500))  # the smaller run is the noisier
    large = cpu_seconds(50_000)
    assert large / max(small, 1e-3) < 10, f"4x the lines cost {large / small:.1f}x the CPU time"
