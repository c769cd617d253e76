"""Hostile input, part two (issue 23 items 8, 13, 14): timestamps, floats and ranges in tuning
DBs, `.mlir` modules that are malformed, oversized or not files, and file names holding control
characters. Each case: exit 2, exactly one line on stderr with no raw control character,
nothing written to the database and no file created, in bounded time and memory (tracemalloc
in-process; a real process under an address-space limit for the 1 GiB files).
"""

# ruff: noqa: RUF001 (fullwidth and Arabic-Indic digits are the point)
from __future__ import annotations

import os
import re
import resource
import subprocess
import time
import tracemalloc
from pathlib import Path

import pytest
import sqlalchemy as sa
from support.clitools import cli, mlirtuna_argv, subprocess_env

from mlirtuna.db import Database
from mlirtuna.db.models import Base

VECTOR = "-t f16 -out_datatype f16 -transA false -transB true -g 1 -m 128 -n 256 -k 64"
HEADER = "\t".join(["# arch", "numCUs", "numChiplets", "testVector", "perfConfig", "TFlops",
                    "tuningSpace", "commitId", "timestamp", "durationSec"])  # fmt: skip
FIELDS = {"arch": "gfx942:sramecc+:xnack-", "cu": "304", "chiplets": "8", "vector": VECTOR,
          "perf": "v2:32,64,4,16,16,4,1,1,1", "tflops": "40.25", "space": "quick",
          "commit": "0123abcd", "ts": "2026-02-03T04:05:06Z", "dur": "3.5"}  # fmt: skip
MODULE = """module {
  func.func @test(%arg0: tensor<1x8x7x7xf32>, %arg1: tensor<16x8x3x3xf32>) -> tensor<1x16x7x7xf32> {
    %0 = migraphx.convolution(%arg0, %arg1) {dilation = [1, 1], group = 1 : i64, padding = [1, 1, 1, 1], padding_mode = 0 : i64, stride = [1, 1]} : (tensor<1x8x7x7xf32>, tensor<16x8x3x3xf32>) -> tensor<1x16x7x7xf32>
    %1 = migraphx.relu(%0) : (tensor<1x16x7x7xf32>) -> tensor<1x16x7x7xf32>
    return %1 : tensor<1x16x7x7xf32>
  }
}
"""  # noqa: E501
CONV_ATTRS = ("{dilation = [1, 1], group = 1 : i64, padding = [1, 1, 1, 1], padding_mode = 0 : "
              "i64, stride = [1, 1]}")  # fmt: skip
CONTROL = re.compile("[\x00-\x1f\x7f-\x9f\u2028\u2029\u202a-\u202e\u2066-\u2069]")
MAX_PEAK_BYTES = 96 << 20
MAX_CPU_SECONDS = 30.0  # this process's CPU time (the CLI runs in it): no load can fail it


def tsv(**changes: str) -> bytes:
    row = dict(FIELDS, **changes)
    return (HEADER + "\n" + "\t".join(row.values()) + "\n").encode()


def module(old: str, new: str) -> bytes:
    assert old in MODULE
    return MODULE.replace(old, new, 1).encode()


# (name, kind, file name or None, content: bytes, or "@special"), kind: tsv | mlir | list
Case = tuple[str, str, str | None, bytes | str]


def tsv_cases() -> list[Case]:
    values = {
        "ts": ["２０２６-02-03T04:05:06Z", "2026-０2-03T04:05:06Z", "٢٠٢٦-02-03T04:05:06Z",
               "2026-02-03T04:05:06", "2026-02-03t04:05:06z", "2026-02-03 04:05:06Z",
               "2026-13-03T04:05:06Z", "2026-02-30T04:05:06Z", "2026-02-03T24:05:06Z",
               "+2026-02-03T04:05:06Z", "2026-02-03T04:05:06.5Z", "0000-00-00T00:00:00Z",
               "2026-02-03T04:05:06+00:00", "20260203T040506Z"],
        "tflops": ["12_5", "１２.５", "١٢", "1e308", "1e7", "-5", "-0.5", "inf", "+inf",
                   "Infinity", "0x1p3", "12.5.1", "1e99999", "½", "12,5", "--5", ".", "e5",
                   "12e", "12.5f", "1e-320"],
        "dur": ["-5", "-0.1", "inf", "1e308", "1e12", "5_0", "５", "ten"],
        "cu": ["0", "00", "+0", "٠"],
        "chiplets": ["0", "00"],
        "arch": ["gfx 942", "GFX942", "gfx942:", "gfx942::xnack-", "gfxzz", "sm_90",
                 "gfx942\u202e", "gfx９４２", "gfx942:sramecc+:xnack-:", "gfx", "x86_64",
                 "gfx942;rm", "gfx942:xnack+-"],
        "space": ["", "two words", "exhaustivé", "full;", "q" * 65],
    }  # fmt: skip
    cases: list[Case] = []
    for field, bad in values.items():
        for i, value in enumerate(bad):
            cases.append((f"tsv-{field}-{i}", "tsv", None, tsv(**{field: value})))
    for i, name in enumerate(["bad\nname.tsv", "bad\x1b[2Jclear.tsv", "\u202eevil.tsv",
                              "tab\there.tsv", "del\x7f.tsv"]):  # fmt: skip
        cases.append((f"tsv-filename-{i}", "tsv", name, tsv(cu="x")))
    cases.append(("tsv-filename-missing", "tsv", "gone\x1b]0;title\x07.tsv", "@missing"))
    cases.append(("tsv-sparse-nul", "tsv", None, "@sparse"))
    return cases


def mlir_cases() -> list[Case]:
    conv_in = "%0 = migraphx.convolution(%arg0, %arg1) "
    edits = {
        "attrs-no-brace": (CONV_ATTRS, CONV_ATTRS[:-1]),
        "attrs-open-only": (CONV_ATTRS, "{"),
        "shape-fullwidth": ("tensor<1x8x7x7xf32>, %arg1", "tensor<１x8x7x7xf32>, %arg1"),
        "shape-underscore": ("tensor<1x8x7x7xf32>, %arg1", "tensor<1_0x8x7x7xf32>, %arg1"),
        "shape-dynamic": ("tensor<1x8x7x7xf32>, %arg1", "tensor<?x8x7x7xf32>, %arg1"),
        "shape-huge": ("tensor<1x8x7x7xf32>, %arg1", "tensor<99999999999x8x7x7xf32>, %arg1"),
        "dtype": ("tensor<16x8x3x3xf32>) ->", "tensor<16x8x3x3xf33>) ->"),
        "pad-words": ("padding = [1, 1, 1, 1]", "padding = [a, b]"),
        "pad-string": ("padding = [1, 1, 1, 1]", 'padding = "abc"'),
        "pad-asym": ("padding = [1, 1, 1, 1]", "padding = [1, 2, 3, 4]"),
        "stride-words": ("stride = [1, 1]", "stride = [x, y]"),
        "stride-three": ("stride = [1, 1]", "stride = [1, 1, 1]"),
        "group-word": ("group = 1 : i64", "group = many"),
        "padmode-word": ("padding_mode = 0 : i64", "padding_mode = abc"),
        "padmode-one": ("padding_mode = 0 : i64", "padding_mode = 1 : i64"),
        "dilation-fullwidth": ("dilation = [1, 1]", "dilation = [１, 1]"),
        "operand-unknown": ("(%arg0, %arg1) {", "(%arg7, %arg9) {"),
        "operand-missing": ("(%arg0, %arg1) {", "() {"),
        "conv-3d": ("tensor<1x8x7x7xf32>, %arg1", "tensor<1x8x7xf32>, %arg1"),
        "no-arrow": (") -> tensor<1x16x7x7xf32>\n    %1", ") tensor<1x16x7x7xf32>\n    %1"),
        "unknown-op": ("migraphx.relu", "migraphx.frobnicate"),
        "other-dialect": ("%1 = migraphx.relu", "%1 = tosa.relu"),
        "two-convs": ("%1 = migraphx.relu(%0)", conv_in.replace("%0", "%1") + CONV_ATTRS
                      + " : (tensor<1x8x7x7xf32>, tensor<16x8x3x3xf32>) -> tensor<1x16x7x7xf32>"
                      "\n    %2 = migraphx.relu(%0)"),
        "no-anchor": (conv_in, "%0 = migraphx.relu(%arg0) "),
        "no-function": ("func.func @test", "// func.func @test"),
        "nul": ("migraphx.relu", "migraphx.re\x00lu"),
        "escape": ("migraphx.relu", "migraphx.relu\x1b[2J"),
    }  # fmt: skip
    cases: list[Case] = [(f"mlir-{k}", "mlir", None, module(*v)) for k, v in edits.items()]
    cases += [
        ("mlir-empty", "mlir", None, b""),
        ("mlir-latin1", "mlir", None, MODULE.replace("test", "t\xe9st").encode("latin-1")),
        ("mlir-binary", "mlir", None, bytes(range(256)) * 16),
        ("mlir-over-cap", "mlir-1mib", None, MODULE.encode() + b"// " + b"x" * (2 << 20) + b"\n"),
        ("mlir-sparse-1gib", "mlir", None, "@sparse"),
        ("mlir-fifo", "mlir", None, "@fifo"),
        ("mlir-devzero", "mlir", None, "@/dev/zero"),
        ("mlir-empty-dir", "mlir", None, "@dir"),
        ("mlir-missing", "mlir", None, "@missing"),
        ("mlir-filename-escape", "mlir", "evil\x1b[2J.mlir", module("group = 1", "group = x")),
        ("mlir-filename-newline", "mlir", "two\nlines.mlir", module(CONV_ATTRS, "{")),
    ]
    return cases


def list_cases() -> list[Case]:
    line = VECTOR + "\n"
    return [
        ("list-filename-escape", "list", "conf\x1b[31mig", line.replace("-m 128", "-m ٣").encode()),
        ("list-filename-newline", "list", "conf\nig", line.replace("-k 64", "-k").encode()),
        ("list-filename-bidi", "list", "conf\u202eig", line.replace("f16", "f17", 1).encode()),
        ("list-missing-escape", "list", "gone\x1b[2J", "@missing"),
    ]


CASES = tsv_cases() + mlir_cases() + list_cases()


def _input(tmp: Path, case: Case) -> str:
    name, _, file_name, content = case
    suffix = ".mlir" if case[1].startswith("mlir") else ""
    path = tmp / (file_name or f"{name}{suffix}")
    if isinstance(content, bytes):
        path.write_bytes(content)
        return str(path)
    special = content[1:]
    if special == "sparse":  # 1 GiB of NUL that takes no disk
        with open(path, "wb") as f:
            f.truncate(1 << 30)
    elif special == "fifo":
        os.mkfifo(path)
    elif special == "dir":
        path.mkdir()
        (path / "notes.txt").write_text("no modules here")
    elif special != "missing":
        return special
    return str(path)


def _args(case: Case, path: str) -> list[str]:
    kind = case[1]
    if kind == "tsv":
        return ["import-tsv", "--op", "gemm", path]
    if kind == "list":
        return ["import", "--op", "gemm", path]
    extra = ["--max-module-mib", "1"] if kind == "mlir-1mib" else []
    return ["import", "--op", "fusion", *extra, path]


def _rows(db_url: str) -> dict[str, int]:
    db = Database(db_url)
    try:
        with db.engine.connect() as conn:
            return {
                t.name: conn.execute(sa.select(sa.func.count()).select_from(t)).scalar_one()
                for t in Base.metadata.sorted_tables
            }
    finally:
        db.dispose()


def _files(tmp: Path) -> set[str]:
    return {str(p) for p in tmp.rglob("*")}


def _refused(db_url: str, tmp: Path, case: Case) -> str | None:
    """None when the CLI refused the case as it must, else what went wrong."""
    path = _input(tmp, case)
    before = _files(tmp)
    try:
        run = cli(db_url, *_args(case, path))
    except Exception as exc:
        return f"{case[0]}: raised {type(exc).__name__}: {str(exc)[:200]}"
    lines = run.stderr.splitlines()
    if run.code != 2 or len(lines) != 1 or not lines[0].startswith("error: "):
        return f"{case[0]}: exit {run.code}, stderr {run.stderr[:300]!r}"
    # The limit is the message's own: the temp dir's length is the test runner's (xdist's are
    # longer), so it counts as one word.
    if CONTROL.search(lines[0]) or len(lines[0].replace(str(tmp), "TMP")) > 400:
        return f"{case[0]}: a raw control character or an overlong line: {lines[0][:300]!r}"
    if _files(tmp) != before:
        return f"{case[0]}: created {sorted(_files(tmp) - before)}"
    return None


@pytest.fixture(scope="module")
def sqlite_url(tmp_path_factory) -> str:
    url = f"sqlite:///{tmp_path_factory.mktemp('fuzzdb') / 'm.db'}"
    Database(url, create=True).dispose()
    return url


def test_the_cases_are_many():
    assert len(CASES) >= 100 and len({c[0] for c in CASES}) == len(CASES)


@pytest.mark.parametrize("case", CASES, ids=[c[0] for c in CASES])
def test_hostile_input_is_one_line_and_writes_nothing(sqlite_url, tmp_path, case):
    before = _rows(sqlite_url)
    tracemalloc.start()
    start = time.process_time()
    try:
        failure = _refused(sqlite_url, tmp_path, case)
        _, peak = tracemalloc.get_traced_memory()
    finally:
        tracemalloc.stop()
    assert failure is None
    assert time.process_time() - start < MAX_CPU_SECONDS
    assert peak < MAX_PEAK_BYTES, f"{peak >> 20} MiB at peak"
    assert _rows(sqlite_url) == before


def test_every_hostile_input_on_every_backend(db_url, tmp_path):
    before = _rows(db_url)
    failures = []
    for i, case in enumerate(CASES):
        folder = tmp_path / str(i)
        folder.mkdir()
        failures.append(_refused(db_url, folder, case))
    assert [f for f in failures if f] == []
    assert _rows(db_url) == before


def _limited() -> None:
    limit = 1 << 30  # a whole 1 GiB read could not fit beside the interpreter
    resource.setrlimit(resource.RLIMIT_AS, (limit, limit))


@pytest.mark.parametrize("kind", ["tsv", "mlir"])
def test_a_1gib_file_is_refused_within_a_memory_limit(sqlite_url, tmp_path, kind):
    case = next(c for c in CASES if c[1] == kind and c[3] == "@sparse")
    path = _input(tmp_path, case)
    proc = subprocess.run(
        mlirtuna_argv(*_args(case, path)), env=subprocess_env(sqlite_url),
        capture_output=True, text=True, timeout=120, preexec_fn=_limited,
    )  # fmt: skip
    lines = proc.stderr.splitlines()
    assert proc.returncode == 2 and len(lines) == 1 and lines[0].startswith("error: "), proc.stderr


def test_debug_keeps_exit_2_for_input_errors(sqlite_url, tmp_path):
    path = tmp_path / "bad.tsv"
    path.write_bytes(tsv(ts="２０２６-02-03T04:05:06Z"))
    run = cli(sqlite_url, "--debug", "import-tsv", "--op", "gemm", str(path))
    assert run.code == 2 and "Traceback" in run.stderr
    assert run.stderr.splitlines()[-1].startswith(f"error: {path}:2: timestamp")
