"""Hostile input, on every backend: each malformed config list (`import`) and tuning DB
(`import-tsv`) gives exit 2, exactly one line on stderr, and writes nothing.

The cases are written fresh from the kinds an audit threw at it: huge, negative and zero sizes,
non-ASCII digits, NUL and control characters, CRLF, a BOM, repeated flags, flags without a value,
binary and non-UTF-8 data, a directory, /dev/null, /dev/zero, a FIFO and a 100 KiB line.
"""

# ruff: noqa: RUF001 (non-ASCII digits are the point)
from __future__ import annotations

import os
from pathlib import Path

import pytest
import sqlalchemy as sa
from support.clitools import cli

from mlirtuna.db import Database
from mlirtuna.db.models import Job, Problem, Result, TuningSession

BAD_INTS = ["+64", "6_4", "٦٤", "６４", "3²", "0x40", "64.0", "1e3", "2147483648",
            "99999999999999999999", "1" * 4300, "-1", "6\x004"]  # fmt: skip
GEMM = "-t f32 -out_datatype f32 -transA false -transB false -g 1 -m 64 -n 64 -k 64"
CONV = "-F 1 -f NCHW -I NCHW -O NCHW -n 1 -c 3 -H 32 -W 32 -k 16 -y 3 -x 3 -p 1 -q 1 -u 1 -v 1 -l 1 -j 1 -g 1"  # noqa: E501


def _with(line: str, flag: str, value: str) -> str:
    tokens = line.split(" ")
    tokens[tokens.index(flag) + 1] = value
    return " ".join(tokens)


def import_cases() -> list[tuple[str, str, bytes | str]]:
    """(name, op, content); content str "@dir" etc. names a special path."""
    cases: list[tuple[str, str, bytes | str]] = []
    for flag in ("-g", "-m", "-n", "-k"):
        for i, value in enumerate(BAD_INTS):
            cases.append((f"gemm{flag}{i}", "gemm", (_with(GEMM, flag, value) + "\n").encode()))
        cases.append((f"gemm{flag}zero", "gemm", (_with(GEMM, flag, "0") + "\n").encode()))
    for flag in ("-n", "-c", "-H", "-y", "-p", "-u", "-l"):
        for value in ("+1", "٣", "2147483648", "-1" if flag != "-p" else "-2"):
            cases.append((f"conv{flag}{value}", "conv", (_with(CONV, flag, value) + "\n").encode()))
    lines = {
        "nul": GEMM.replace("-m 64", "-m 64\x00"),
        "escape": GEMM + " \x1b[31m",
        "c1": GEMM.replace("f32", "f32\x85", 1),
        "dup": GEMM + " -m 64",
        "novalue": GEMM + " -k",
        "novalue-mid": GEMM.replace("-n 64", "-n"),
        "unknown": GEMM + " -zz 1",
        "stray": GEMM + " 64",
        "prio-plus": GEMM + " -perf_priority +1",
        "prio-huge": GEMM + " -perf_priority 99999999999",
        "prio-novalue": GEMM + " -perf_priority",
        "bad-type": GEMM.replace("-t f32", "-t f33"),
        "bad-bool": GEMM.replace("-transA false", "-transA maybe"),
    }
    for name, line in lines.items():
        cases.append((name, "gemm", (line + "\n").encode()))
    cases += [
        ("crlf-bad", "gemm", (GEMM + "\r\n" + _with(GEMM, "-m", "６") + "\r\n").encode()),
        ("bom-bad", "gemm", b"\xef\xbb\xbf" + (_with(GEMM, "-k", "-5") + "\n").encode()),
        ("binary", "gemm", bytes(range(256)) * 4),
        ("latin1", "gemm", (GEMM + " # caf\xe9\n").encode("latin-1")),
        ("long-line", "gemm", (GEMM + " " + "x" * (100 << 10) + "\n").encode()),
        ("long-noeol", "gemm", b"-m " + b"9" * (200 << 10)),
        ("dir", "gemm", "@dir"),
        ("devnull", "gemm", "@/dev/null"),
        ("devzero", "gemm", "@/dev/zero"),
        ("fifo", "gemm", "@fifo"),
        ("missing", "gemm", "@missing"),
    ]
    return cases


V3_HEADER = ("# arch\tnumCUs\tnumChiplets\ttestVector\tperfConfig\tTFlops\ttuningSpace\tcommitId\t"
             "timestamp\tdurationSec")  # fmt: skip
V3_ROW = ["gfx942", "304", "8", GEMM, "v2:64,64,8,16,16,8,1,1,1", "12.5", "full", "abc",
          "2025-01-01T00:00:00Z", "10.0"]  # fmt: skip


def _row(**changes: str) -> str:
    names = ["arch", "cu", "chiplets", "vector", "perf", "tflops", "space", "commit", "ts", "dur"]
    row = dict(zip(names, V3_ROW, strict=True))
    row.update(changes)
    return "\t".join(row.values())


def tsv_cases() -> list[tuple[str, bytes | str]]:
    cases: list[tuple[str, bytes | str]] = []

    def add(name: str, *lines: str) -> None:
        cases.append((name, ("\n".join([V3_HEADER, *lines]) + "\n").encode()))

    for i, value in enumerate(["+304", "3_04", "٣٠٤", "３０４", "2147483648", "1" * 4300, "-1"]):
        add(f"cu{i}", _row(cu=value))
        add(f"chiplets{i}", _row(chiplets=value))
    for i, value in enumerate(["+64", "٦٤", "2147483648", "0", "-3", "1" * 4300]):
        add(f"vector{i}", _row(vector=_with(GEMM, "-m", value)))
    for i, value in enumerate(["1e-320", "abc", "1,5", "0x1p3"]):
        add(f"tflops{i}", _row(tflops=value))
    add("tflops-inf-only", _row(tflops="inf"))  # no finite winner: nothing to import
    add("nul-field", _row(commit="ab\x00c"))
    add("escape-field", _row(perf="v2:\x1b[2J"))
    add("perf-too-long", _row(perf="v2:" + "1," * 200))
    add("bad-timestamp", _row(ts="yesterday"))
    add("bad-duration", _row(dur="ten"))
    add("short-row", "\t".join(V3_ROW[:4]))
    add("long-row", _row() + "\textra")
    add("dup-flag", _row(vector=GEMM + " -m 64"))
    add("novalue-flag", _row(vector=GEMM + " -k"))
    add("space-too-long", _row(space="sideways" * 5))
    add("header-only")
    add("vector-bad-type", _row(vector=GEMM.replace("-t f32", "-t f33")))
    add("vector-unknown-flag", _row(vector=GEMM + " -zz 3"))
    add("vector-nul", _row(vector=GEMM.replace("-k 64", "-k 6\x004")))
    add("tflops-negative-only", _row(tflops="-1"))
    add("arch-too-long", _row(arch="gfx" + "9" * 300))
    cases += [
        (
            "legacy-without-num-cu",
            b"# arch\tconfig\tperfconfig\ngfx942\t" + GEMM.encode() + b"\tp1\n",
        ),
        ("empty", b""),
        ("crlf-bad", (V3_HEADER + "\r\n" + _row(cu="x") + "\r\n").encode()),
        ("bom-bad", b"\xef\xbb\xbf" + (V3_HEADER + "\n" + _row(cu="-9") + "\n").encode()),
        ("binary", bytes(range(256)) * 4),
        ("latin1", (V3_HEADER + "\n" + _row(commit="caf\xe9") + "\n").encode("latin-1")),
        ("long-line", (V3_HEADER + "\n" + _row(commit="x" * (100 << 10)) + "\n").encode()),
        ("dir", "@dir"),
        ("devnull", "@/dev/null"),
        ("devzero", "@/dev/zero"),
        ("fifo", "@fifo"),
        ("missing", "@missing"),
    ]
    return cases


def _path(tmp: Path, name: str, content: bytes | str) -> str:
    if isinstance(content, bytes):
        path = tmp / name
        path.write_bytes(content)
        return str(path)
    special = content[1:]
    if special == "dir":
        (tmp / name).mkdir()
        return str(tmp / name)
    if special == "fifo":
        os.mkfifo(tmp / name)
        return str(tmp / name)
    if special == "missing":
        return str(tmp / name)
    return special


def _written(db_url: str) -> int:
    db = Database(db_url)
    try:
        with db.session() as s:
            return sum(
                s.scalar(sa.select(sa.func.count()).select_from(model))
                for model in (Problem, TuningSession, Job, Result)
            )
    finally:
        db.dispose()


def _check(db_url: str, args: list[str], name: str) -> str | None:
    """None when the CLI refused the input as it must, else what went wrong."""
    try:
        run = cli(db_url, *args)
    except Exception as exc:  # a traceback is a failure of its own
        return f"{name}: raised {type(exc).__name__}: {str(exc)[:200]}"
    lines = run.stderr.strip().splitlines()
    if run.code != 2 or len(lines) != 1 or not lines[0].startswith("error: "):
        return f"{name}: exit {run.code}, stderr {run.stderr[:300]!r}"
    if len(lines[0]) > 400:
        return f"{name}: an error line of {len(lines[0])} characters"
    return None


def test_fuzz_cases_are_many():
    assert len(import_cases()) >= 82 and len(tsv_cases()) >= 49


def test_every_malformed_config_list_is_one_line_and_writes_nothing(db_url, tmp_path):
    failures = []
    for name, op, content in import_cases():
        path = _path(tmp_path, f"i-{len(failures)}-{name}", content)
        failures.append(_check(db_url, ["import", "--op", op, path], name))
    assert [f for f in failures if f] == []
    assert _written(db_url) == 0


def test_every_malformed_tuning_db_is_one_line_and_writes_nothing(db_url, tmp_path):
    failures = []
    for name, content in tsv_cases():
        path = _path(tmp_path, f"t-{len(failures)}-{name}", content)
        failures.append(_check(db_url, ["import-tsv", "--op", "gemm", path], name))
    assert [f for f in failures if f] == []
    assert _written(db_url) == 0


@pytest.mark.parametrize(
    "text",
    ["-m 6" + "4" * 5000, "-m ６" * 3000, "-zz" + "z" * 5000, "-t f" + "3" * 5000, "w" * 5000],
)
def test_an_error_line_quotes_at_most_80_characters(tmp_path, text):
    path = tmp_path / "c"
    path.write_text(GEMM.replace("-m 64", text) + "\n")
    run = cli(f"sqlite:///{tmp_path / 'm.db'}", "import", "--op", "gemm", str(path))
    assert run.code == 2 and len(run.stderr) < 300


def test_compare_refuses_an_empty_or_malformed_side(tmp_path):
    good = tmp_path / "good.tsv"
    good.write_text(V3_HEADER + "\n" + _row() + "\n")
    url = f"sqlite:///{tmp_path / 'm.db'}"
    cases = [("empty", b""), ("header-only", (V3_HEADER + "\n").encode())]
    cases += [c for c in tsv_cases() if c[0] in ("cu0", "nul-field", "binary", "dir", "fifo")]
    failures = []
    for name, content in cases:
        bad = _path(tmp_path, f"c-{name}", content)
        for args in ([str(good), bad], [bad, str(good)]):
            failures.append(_check(url, ["compare", "--op", "gemm", *args], f"compare {name}"))
    assert [f for f in failures if f] == []
