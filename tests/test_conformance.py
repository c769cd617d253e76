"""Conformance tier (issue 22, point 7): rocMLIR's REAL tuningRunner.py over GPU-less fakes.

Opt-in. Set MLIRTUNA_ROCMLIR_SCRIPTS=DIR, DIR holding rocMLIR's own scripts from
`mlir/utils/performance/` (tuningRunner.py, perfRunner.py, gpu_topology.py, perfCommonUtils.py,
reportUtils.py) at ROCMLIR_COMMIT. The real tool needs numpy, pandas and tqdm: set
MLIRTUNA_ROCMLIR_PYTHON to an interpreter that has them if this one does not.
The code index stores only tuningRunner.py and perfRunner.py at that commit. What ran with them
(issue 42): gpu_topology.py of ROCm/rocMLIR c9e14cdd (the one stored version with the six
names tuningRunner imports), perfCommonUtils.py of rocmlirTriton 64b52410 without its
SPLITK_IDX lines, and reportUtils.py of rocmlirTriton 046da074 with `TransO` taken out of
GEMM_TEST_PARAMETERS in the scratch copy (3fc5be9e's gemm table_entry has 17 values, no TransO;
every stored reportUtils lists 16 or 18 names and fails perfRunner's own assert).

The fakes in src/mlirtuna/standin/rocmlir/below sit where the GPU stack would: rocmlir-gen,
rocmlir-driver, rocmlir-opt, rocmlir-tuning-driver (bin/, found by the tool under
`--mlir-build-dir`), rocm-smi, rocminfo, amd-smi (bin/, on PATH), the `hip` module and rocMLIR's
compiled `amd_arch_db` binding (python/, on PYTHONPATH).

Each case runs the real tool in a private working directory and checks the tool's own files
(.tsv, .debug, .state, fusion_config_file) and exit status. tests/data/rocmlir-real/<case>/
holds what one such run wrote (see its README.md).

Through mlirtuna (the end of this file): sessions and workers drive the real tool, pointed at
the script directory with MLIRTUNA_ROCMLIR_SCRIPT_DIR and run by MLIRTUNA_ROCMLIR_PYTHON, and the
database's winners and candidates are compared row by row with the tool's own .tsv/.debug of the
same configs (the fakes' times are deterministic), for one-stage, batch and fusion jobs, on every
backend; RDNA sessions detect HIP's CU count and their export is read by the real perfRunner.
"""

from __future__ import annotations

import ast
import json
import os
import shutil
import subprocess
from dataclasses import dataclass, field
from pathlib import Path

import pytest
from support.conformance import (
    BELOW,
    FAKE_GPU,
    PYTHON,
    assert_same_row,
    open_session,
    recorded,
    tier_marks,
)
from support.standin import with_overlay

from mlirtuna import standin
from mlirtuna.defaults import ENV_ROCMLIR_PYTHON, ENV_ROCMLIR_SCRIPT_DIR, ENV_TOOL_ENV

ROCMLIR_COMMIT = "3fc5be9e52def9925a3d464748ef221c3a845e01"
SCRIPTS = os.environ.get("MLIRTUNA_ROCMLIR_SCRIPTS", "")
TESTS = Path(__file__).parent
STAND_IN = standin.BUILD / "bin" / "tuningRunner.py"
FUSION = TESTS / "data" / "fusion"

HOW = (
    "conformance tier: set MLIRTUNA_ROCMLIR_SCRIPTS=DIR to a directory holding rocMLIR's real "
    "scripts, read from ROCm/rocMLIR mlir/utils/performance/ (tuningRunner.py, perfRunner.py, "
    f"gpu_topology.py, perfCommonUtils.py, reportUtils.py) at commit {ROCMLIR_COMMIT}; "
    "never commit them"
)

pytestmark = tier_marks(SCRIPTS, HOW, "the real tuningRunner.py", ("numpy", "pandas", "tqdm"))

V3_HEADER = (
    "# arch\tnumCUs\tnumChiplets\ttestVector\tperfConfig\tTFlops\ttuningSpace\tcommitId"
    "\ttimestamp\tdurationSec"
)
# The driver's --show-stats shapes (ms): each run timed, or the legacy mode's one CPU timer over
# all runs of a sub-ms kernel (every fake kernel but FAKE_ROCMLIR_SLOW's).
STATS_KEYS = {"min", "median", "max", "stddev", "cv"}
ONE_TIMER_KEYS = {"total_cpu_time", "iterations"}
# What one gfx942 / gfx1100 looks like to the tool: (arch, HIP CU count, chiplets)
GFX942 = ("gfx942:sramecc+:xnack-", "304", "8")
GFX1100 = ("gfx1100", "48", "1")

G1 = "-t f16 -out_datatype f16 -transA false -transB false -g 1 -m 256 -n 512 -k 128"
G2 = "-t f32 -out_datatype f32 -transA true -transB false -g 2 -m 1024 -n 64 -k 256"
G3 = "-t i8 -out_datatype i32 -transA false -transB true -g 1 -m 128 -n 128 -k 4096"
BAD = "-t f16 -out_datatype f16 -transA false -transB false -transO true -g 1 -m 64 -n 64 -k 64"
C1 = (
    "conv -F 1 -f NCHW -I NCHW -O NCHW -n 64 -c 64 -H 56 -W 56 -k 64 -y 3 -x 3 -p 1 -q 1 "
    "-u 1 -v 1 -l 1 -j 1 -g 1"
)
C2 = (
    "convfp16 -F 2 -f NHWC -I NHWC -O NHWC -n 32 -c 128 -H 28 -W 28 -k 256 -y 1 -x 1 -p 0 -q 0 "
    "-u 1 -v 1 -l 1 -j 1 -g 1"
)
ATTN = (
    "-t f16 -transQ false -transK false -transV false -transO false -g 1 -seq_len_q 256 "
    "-seq_len_k 256 -head_dim_qk 64 -head_dim_v 64"
)
GG = (
    "-t f16 -transA false -transB false -transC false -transO false -g 1 -m 256 -k 64 -n 256 "
    "-gemmO 64"
)
CG = (
    "-t f16 -f NCHW -I NCHW -transC false -transO false -n 1 -c 64 -H 32 -W 32 -k 64 -y 3 -x 3 "
    "-p 1 -q 1 -u 1 -v 1 -l 1 -j 1 -g 1 -gemmO 64"
)
RESNET_CONV = "resnet50/mixr-resnet-fusion-case-2.mlir"
RESNET50 = tuple(f"resnet50/{p.name}" for p in sorted((FUSION / "resnet50").glob("*.mlir")))
MIXR_GEMM = "mixr-gemm/mixr-gemm-add.e2e.mlir"


@dataclass(frozen=True)
class Case:
    """One call of tuningRunner.py and what the real tool does with it."""

    name: str
    args: tuple[str, ...]  # after `tuningRunner.py`; `-o out.tsv --mlir-build-dir` are added
    stdin: str | None = None
    env: dict[str, str] = field(default_factory=dict)
    modules: tuple[str, ...] = ()  # fusion modules copied into ./modules (the --test-dir)
    prefiles: dict[str, str] = field(default_factory=dict)  # files written first
    rc: int = 0
    rows: int = 0  # result rows in out.tsv
    debug_rows: int = 0  # .debug rows (every candidate of every tuned config)
    states: dict[str, str] = field(default_factory=dict)  # config part -> state in .state
    stderr: tuple[str, ...] = ()  # texts the tool's stderr holds
    gpu: tuple[str, str, str] = GFX942
    stats: bool = False  # --debug: the .debug has a Stats column


def _batch(*lines: str) -> str:
    return "".join(line + "\n" for line in lines)


def _second_of_two_fails(
    name: str, fault: str, state: str, stderr: tuple[str, ...], *args: str
) -> Case:
    """G1 and G2 in one batch, the fakes' `fault` set on G2 (-m 1024): G1's row written, G2
    left in `state` in the .state file, exit status 1."""
    return Case(
        name,
        ("--op", "gemm", "-c", "-", *args),
        stdin=_batch(G1, G2),
        env={fault: "-m 1024"},
        rc=1,
        rows=1,
        states={"-m 1024": state},
        stderr=stderr,
    )


SECOND_OF_TWO_FAILS = [
    _second_of_two_fails("gemm-crash", "FAKE_ROCMLIR_CRASH", "failed",
                         ("Tuning pipeline failed", "Exit code: -6")),
    _second_of_two_fails("gemm-timeout", "FAKE_ROCMLIR_HANG", "timed_out",
                         ("Tuning timed out after 2s",), "--timeout", "2"),
    _second_of_two_fails("gemm-gpu-timeout", "FAKE_ROCMLIR_HANG", "gpu_timed_out",
                         ("GPU run hung (exceeded --gpu-run-timeout=1s)",),
                         "--gpu-run-timeout", "1"),
]  # fmt: skip


CASES = [
    Case("gemm", ("--op", "gemm", "--config", G1, "-d"), rows=1, debug_rows=8, stats=True),
    Case(  # kernels of 1 ms and more: the legacy mode times each run (issue 42 §2)
        "gemm-slow",
        ("--op", "gemm", "--config", G1, "-d"),
        env={"FAKE_ROCMLIR_SLOW": "-m 256"},
        rows=1,
        debug_rows=8,
        stats=True,
    ),
    Case(
        "gemm-batch",
        ("--op", "gemm", "-c", "-", "-d"),
        stdin=_batch(G1, G2, G3),
        rows=3,
        debug_rows=24,
        stats=True,
    ),
    Case(
        "gemm-quick-tune-data",
        ("--op", "gemm", "--config", G1, "--debug-quick-tune-data", "--tuning-space", "quick"),
        rows=1,
        debug_rows=4,
    ),
    Case(
        "gemm-bad-line",
        ("--op", "gemm", "-c", "-"),
        stdin=_batch(G1, BAD, G2),
        rc=1,
        stderr=("ValueError: Failed to canonicalize config from", "as GemmConfiguration"),
    ),
    Case(
        "gemm-incomplete-config",
        ("--op", "gemm", "--config", "-t f16 -transA false -transB false -g 1 -m 8 -n 8 -k 8"),
        rc=1,
        stderr=("Incomplete GEMM configuration",),
    ),
    Case(
        "gemm-fail-compile",
        ("--op", "gemm", "-c", "-", "-d"),
        stdin=_batch(G1, G2, G3),
        env={"FAKE_ROCMLIR_FAIL_COMPILE": "-m 1024"},
        rc=1,
        rows=2,
        debug_rows=16,
        states={"-m 1024": "failed"},
        stderr=("Tuning pipeline failed", "failed to compile perf config"),
        stats=True,
    ),
    *SECOND_OF_TWO_FAILS,
    Case(
        "gemm-no-valid-config",
        ("--op", "gemm", "--config", G1),
        env={"FAKE_ROCMLIR_ALL_NA": "-m 256"},
        rc=1,
        states={"-m 256": "failed"},
        stderr=("No valid perf config found",),
    ),
    Case("conv", ("--op", "conv", "--config", C1, "-d"), rows=1, debug_rows=8, stats=True),
    Case("conv-batch", ("--op", "conv", "-c", "-"), stdin=_batch(C1, C2), rows=2),
    Case(
        "attention", ("--op", "attention", "--config", ATTN, "-d"), rows=1, debug_rows=8, stats=True
    ),
    Case(
        "gemm_gemm", ("--op", "gemm_gemm", "--config", GG, "-d"), rows=1, debug_rows=8, stats=True
    ),
    Case(
        "conv_gemm", ("--op", "conv_gemm", "--config", CG, "-d"), rows=1, debug_rows=8, stats=True
    ),
    Case(
        "fusion-config-usage",
        ("--op", "fusion", "--config", "modules/mixr-resnet-fusion-case-2.mlir"),
        modules=(RESNET_CONV,),
        rc=2,
        stderr=("argument --op=fusion: requires --test-dir to be specified",),
    ),
    Case(
        "fusion-test-dir-conv",
        ("--op", "fusion", "--test-dir", "modules", "-d"),
        modules=(RESNET_CONV,),
        rows=1,
        debug_rows=8,
        stats=True,
    ),
    Case(
        "fusion-test-dir-resnet50",
        ("--op", "fusion", "--test-dir", "modules", "-d"),
        modules=RESNET50,
        rows=9,
        debug_rows=72,
        stats=True,
    ),
    Case(
        # perfRunner.find_run_command stops at the first RUN line holding "runner"; in these
        # modules that line has no `-fut NAME`, so the tool passes None to Popen and dies.
        "fusion-test-dir-mixr-gemm",
        ("--op", "fusion", "--test-dir", "modules"),
        modules=(MIXR_GEMM,),
        rc=1,
        stderr=("TypeError: expected str, bytes or os.PathLike object, not NoneType",),
    ),
    Case(
        "rdna-gemm",
        ("--op", "gemm", "--config", G1, "-d"),
        env={"FAKE_GPU": "gfx1100"},
        gpu=GFX1100,
        rows=1,
        debug_rows=8,
        stats=True,
    ),
    Case(
        "rdna-legacy-state",
        ("--op", "gemm", "--config", G1),
        env={"FAKE_GPU": "gfx1100"},
        gpu=GFX1100,
        prefiles={"out.tsv.state": json.dumps({"contexts": {"gfx1100/96/1/full": {G1: "failed"}}})},
        states={"-m 256": "failed"},
        stderr=("Skipping 1 unsuccessful config(s)",),
    ),
]


def tool_env(case: Case, scripts: str = SCRIPTS) -> dict[str, str]:
    env = dict(os.environ)
    for var in ("ROCR_VISIBLE_DEVICES", "HIP_VISIBLE_DEVICES"):
        env.pop(var, None)
    env["PATH"] = f"{BELOW / 'bin'}{os.pathsep}{env.get('PATH', '')}"
    # The tests' overlay first: the fakes' FAKE_ROCMLIR_* faults and slow kernels are its.
    env["PYTHONPATH"] = os.pathsep.join([scripts, str(BELOW / "python")])
    env.update(case.env)
    return with_overlay(env)


def run_tool(case: Case, workdir: Path, tool: str | None = None, env=None, timeout: float = 120):
    """Run `tool` (the real tuningRunner.py by default) for `case` inside `workdir`."""
    workdir.mkdir(parents=True, exist_ok=True)
    for name in case.modules:
        (workdir / "modules").mkdir(exist_ok=True)
        shutil.copy(FUSION / name, workdir / "modules" / Path(name).name)
    for name, text in case.prefiles.items():
        (workdir / name).write_text(text)
    argv = [PYTHON, tool or str(Path(SCRIPTS) / "tuningRunner.py"), *case.args]
    argv += ["-o", "out.tsv", "--mlir-build-dir", str(BELOW), "--verify-mode", "none"]
    return subprocess.run(
        argv,
        cwd=workdir,
        env=env or tool_env(case),
        input=case.stdin,
        capture_output=True,
        text=True,
        timeout=timeout,
        check=False,
    )


def read_debug(path: Path) -> tuple[list[str], list[dict[str, str]]]:
    lines = path.read_text().splitlines()
    header = lines[0].split("\t")
    return header, [dict(zip(header, line.split("\t"), strict=True)) for line in lines[1:]]


@pytest.mark.parametrize("case", CASES, ids=lambda c: c.name)
def test_real_tuning_runner(case: Case, tmp_path):
    run = run_tool(case, tmp_path)
    assert run.returncode == case.rc, run.stderr
    for text in case.stderr:
        assert text in run.stderr
    out = tmp_path / "out.tsv"
    if case.rows:
        lines = out.read_text().splitlines()
        assert lines[0] == V3_HEADER
        rows = [line.split("\t") for line in lines[1:]]
        assert len(rows) == case.rows
        for row in rows:
            assert tuple(row[:3]) == case.gpu and len(row) == 10
            assert (float(row[5]) > 0 and row[6] == "full") or "quick" in case.args
    else:
        assert not out.exists() or out.read_text() == ""
    debug = tmp_path / "out.tsv.debug"
    assert debug.exists() == bool(case.debug_rows)
    if case.debug_rows:
        header, rows = read_debug(debug)
        assert len(rows) == case.debug_rows
        assert header[-1] == ("Stats" if case.stats else "TFlops")
        assert {"PerfConfig", "TFlops"} <= set(header) and ("Stats" in header) == case.stats
        assert {r["Chip"] for r in rows} == {case.gpu[0].split(":")[0]}
        assert {r["numCU"] for r in rows} == {case.gpu[1]}
        problem_flops: dict[tuple[str, ...], float] = {}
        for row in rows if case.stats else []:
            # An N/A candidate has neither TFlops nor Stats (pandas writes NaN/None as "").
            # pandas writes the Stats dict as Python's repr (single quotes), not as JSON.
            assert (row["Stats"] == "") == (row["TFlops"] == "")
            if row["Stats"]:
                slow = "FAKE_ROCMLIR_SLOW" in case.env
                shape = STATS_KEYS if slow else ONE_TIMER_KEYS
                assert set(ast.literal_eval(row["Stats"])) == shape
                # The Stats time (ms) is the time the row's TFlops was computed from (ns):
                # their product is the problem's flops, the same for each of its candidates.
                flops = stats_median_ns(row["Stats"]) * float(row["TFlops"]) * 1e3
                first = problem_flops.setdefault(problem_of(row), flops)
                assert flops == pytest.approx(first, rel=1e-5)
                assert flops == pytest.approx(known_flops(case, row) or flops, rel=1e-5)
    state = tmp_path / "out.tsv.state"
    assert state.exists() == bool(case.states)
    if case.states:
        (context, configs), *rest = json.loads(state.read_text())["contexts"].items()
        assert (
            not rest and context == f"{case.gpu[0].split(':')[0]}/{case.gpu[1]}/{case.gpu[2]}/full"
        )
        for part, wanted in case.states.items():
            assert [s for tv, s in configs.items() if part in tv] == [wanted]
    if case.modules and case.rc == 0:
        # fusion_config_file (in the working directory) holds rocmlir-gen's keys; the rows are
        # keyed by their canonical form (a conv key gains `-m conv … -t 1`).
        keys = (tmp_path / "fusion_config_file").read_text().splitlines()
        assert len(keys) == len(case.modules)
        tuned = [row.split("\t")[3] for row in out.read_text().splitlines()[1:]]
        assert sorted(tv.replace(" -m conv", "").replace(" -t 1", "") for tv in tuned) == sorted(
            keys
        )


def test_stdout_output_has_no_debug_file(tmp_path):
    case = Case("stdout", ("--op", "gemm", "--config", G1, "-d"))
    argv = [PYTHON, str(Path(SCRIPTS) / "tuningRunner.py"), *case.args, "-o", "-"]
    argv += ["--mlir-build-dir", str(BELOW), "--verify-mode", "none"]
    run = subprocess.run(
        argv, cwd=tmp_path, env=tool_env(case), capture_output=True, text=True, check=False
    )
    assert run.returncode == 0, run.stderr
    assert run.stdout.splitlines()[0] == V3_HEADER and len(run.stdout.splitlines()) == 2
    assert "Debug output disabled when writing to stdout" in run.stderr
    assert sorted(p.name for p in tmp_path.iterdir()) == []


def test_fakes_report_hip_and_rocminfo_cu_counts_apart():
    """On WGP-mode RDNA the tool takes HIP's 48; rocminfo (what a session reads) prints 96."""
    env = tool_env(Case("rdna", (), env={"FAKE_GPU": "gfx1100"}))
    probe = "import perfRunner as p; print(p.get_arch(), p.get_num_cu(), p.chip_uses_wgp_mode())"
    run = subprocess.run([PYTHON, "-c", probe], env=env, capture_output=True, text=True, check=True)
    assert run.stdout.split() == ["gfx1100", "48", "True"]
    info = subprocess.run(["rocminfo"], env=env, capture_output=True, text=True, check=True)
    assert "Compute Unit:            96" in info.stdout


def test_real_perfrunner_reads_an_mlirtuna_export(tmp_path):
    """perfRunner.read_tuning_db of the real scripts finds every problem `mlirtuna export` wrote."""
    from support.clitools import cli
    from support.results import FULL, m_of, new_session, tune

    from mlirtuna.db import Database

    url = f"sqlite:///{tmp_path / 'mlirtuna.db'}"
    db = Database(url)
    try:
        vectors = [G1.replace("-m 256", f"-m {m}") for m in (16, 32, 64)]
        tune(db, tmp_path, new_session(db), vectors, perf=m_of)
    finally:
        db.dispose()
    out = tmp_path / "export.tsv"
    run = cli(url, "export", "--arch", "gfx942", "-o", str(out))
    assert run.code == 0, run.stderr
    probe = (
        "import json, sys, perfRunner\n"
        "db = perfRunner.read_tuning_db(sys.argv[1], perfRunner.GemmConfiguration)\n"
        "print(json.dumps([[list(k), v] for k, v in db.items()]))\n"
    )
    env = tool_env(Case("read", ()))
    got = subprocess.run(
        [PYTHON, "-c", probe, str(out)], env=env, capture_output=True, text=True, check=True
    )
    found = {tuple(k): v for k, v in json.loads(got.stdout)}
    assert len(found) == len(vectors)
    for key, perf in found.items():
        assert key[:3] == (FULL, 304, 8) and key[3] in vectors and perf == m_of(key[3])


# --- through mlirtuna: sessions and workers drive the real tuningRunner.py -----------------------


@pytest.fixture
def real_tool(tmp_path, monkeypatch):
    """The real scripts as the rocmlir tuner runs them: MLIRTUNA_ROCMLIR_SCRIPT_DIR names a
    directory whose tuningRunner.py runs the real one with `--verify-mode none` appended (the
    winner's verification needs /opt/rocm/bin/rocprofv3) and whose perfRunner.py is the real
    one; the fakes below on PATH/PYTHONPATH and their FAKE_* settings passed to the tool."""
    scripts = tmp_path / "scripts"
    scripts.mkdir()
    for name in ("perfRunner.py", "gpu_topology.py", "perfCommonUtils.py", "reportUtils.py"):
        (scripts / name).symlink_to(Path(SCRIPTS) / name)
    (scripts / "tuningRunner.py").write_text(
        "import runpy, sys\n"
        f"sys.path.insert(0, {SCRIPTS!r})\n"
        "sys.argv.append('--verify-mode=none')\n"
        f"runpy.run_path({str(Path(SCRIPTS) / 'tuningRunner.py')!r}, run_name='__main__')\n"
    )
    for name, value in tool_env(Case("mlirtuna", ())).items():
        if name in ("PATH", "PYTHONPATH"):
            monkeypatch.setenv(name, value)
    monkeypatch.setenv(ENV_ROCMLIR_SCRIPT_DIR, str(scripts))
    monkeypatch.setenv(ENV_ROCMLIR_PYTHON, PYTHON)
    monkeypatch.setenv(ENV_TOOL_ENV, "FAKE_*")
    return scripts


def through_mlirtuna(
    db, tmp_path, op: str, lines: list[str], batch: int = 1, completed: int | None = None, **spec
) -> int:
    """Import `lines`, open a rocmlir session on the fakes' build (detected, nothing given but
    the commit), and drain it with one in-process worker on GPU 0."""
    from support.rocmlir import work

    sid = open_session(db, tmp_path, op, lines, f"{op}-{len(lines)}", mlir_v="c" * 40, **spec)
    # The fakes stand in for a GPU the kernel does not show: the worker is told which it is.
    worker = work(db, sid, BELOW, batch=batch, job_timeout_s=120, gpu_identity=FAKE_GPU)
    assert worker.stats.completed == (len(lines) if completed is None else completed)
    return sid


def stats_median_ns(cell: str) -> float:
    """The time a Stats cell (ms) gives, in ns: the runs' median, or the one timer's mean."""
    value = ast.literal_eval(cell)
    if set(value) == ONE_TIMER_KEYS:
        return value["total_cpu_time"] / value["iterations"] * 1e6
    return value["median"] * 1e6


# A .debug row's candidate columns; the others name its problem.
CANDIDATE_COLUMNS = {"PerfConfig", "LDSBankConflict", "TFlops", "Stats"}


def problem_of(row: dict[str, str]) -> tuple[str, ...]:
    return tuple(v for k, v in row.items() if k not in CANDIDATE_COLUMNS)


def known_flops(case: Case, row: dict[str, str]) -> float | None:
    """The flops perfRunner's compute_tflops counts for the row's problem where this test can
    say them itself: any gemm (2·G·M·N·K) and C1; None for the other ops."""
    if case.args[1] == "gemm":
        return 2.0 * int(row["G"]) * int(row["M"]) * int(row["N"]) * int(row["K"])
    if case.name == "conv":
        return 2.0 * 64 * 64 * 56 * 56 * 64 * 3 * 3
    return None


def tool_blocks(workdir: Path) -> dict[str, tuple[str, float, dict[str, tuple]]]:
    """The same shape from the tool's own files: rows by test vector; each vector's `.debug`
    block (the rows written with its row, in order) with TFlops and the Stats median."""
    rows = [line.split("\t") for line in (workdir / "out.tsv").read_text().splitlines()[1:]]
    _, debug = read_debug(workdir / "out.tsv.debug")
    size = len(debug) // len(rows)
    out = {}
    for i, row in enumerate(rows):
        block = debug[i * size : (i + 1) * size]
        cands = {
            r["PerfConfig"]: (
                float(r["TFlops"]) if r["TFlops"] else None,
                stats_median_ns(r["Stats"]) if r["Stats"] else None,
            )
            for r in block
        }
        out[row[3]] = (row[4], float(row[5]), cands)
    return out


def assert_same(db_side: dict, tool_side: dict) -> None:
    """Winners, TFlops and every candidate equal, row by row (float noise of a text round trip
    aside), each job's candidates exactly its own block."""
    assert len(db_side) == len(tool_side)
    for key, want in tool_side.items():
        match = [k for k in db_side if k in key or key.startswith(k)]
        assert match, f"{key} not recorded: {sorted(db_side)}"
        assert_same_row(db_side[match[0]], want, median_rel=1e-6)


ONE_STAGE = {"gemm": G1, "conv": C1, "attention": ATTN, "gemm_gemm": GG, "conv_gemm": CG}


@pytest.mark.parametrize("op", list(ONE_STAGE))
def test_mlirtuna_records_what_the_real_tool_writes_one_stage(db, tmp_path, real_tool, op):
    line = ONE_STAGE[op]
    sid = through_mlirtuna(db, tmp_path, op, [line])
    run = run_tool(Case("ref", ("--op", op, "--config", line, "-d")), tmp_path / "ref")
    assert run.returncode == 0, run.stderr
    assert_same(recorded(db, sid), tool_blocks(tmp_path / "ref"))
    assert sessions_of(db)[sid].key_form == "plain"  # 3fc5be9e's perfRunner has no split-K keys


def test_a_line_the_real_tool_refuses_fails_only_its_job(db, tmp_path, real_tool, monkeypatch):
    """A -transO true problem this build cannot tune: `jobs load` refuses it (issue 33); one
    loaded by an older mlirtuna reaches the real tool, which fails the whole batch call before
    tuning anything; the good jobs complete, tuned one at a time, and the bad one ends with the
    tool's own reason."""
    import sqlalchemy as sa

    from mlirtuna.db.models import Job, Problem
    from mlirtuna.errors import UserError
    from mlirtuna.queue import jobs

    with pytest.raises(UserError, match="cannot tune gemm -transO true"):
        through_mlirtuna(db, tmp_path, "gemm", [BAD], completed=0)
    monkeypatch.setattr(jobs, "_build_limit", lambda sess: None)  # an older `jobs load`
    sid = through_mlirtuna(db, tmp_path, "gemm", [G1, BAD, G2], batch=3, completed=2)
    # Keyed by problem, not job id: the job ids follow the tag's rows, whose order is the
    # backend's (MariaDB reads them by problem id, and BAD was imported first, above).
    stmt = (
        sa.select(Problem.test_vector, Job.state, Job.retries, Job.result)
        .join(Problem, Problem.id == Job.problem_id)
        .where(Job.session_id == sid)
    )
    with db.session() as s:
        rows = [(v, st, n, res or "") for v, st, n, res in s.execute(stmt)]
    (bad,) = [row for row in rows if "-transO true" in row[0]]
    assert bad[1] == "error" and "Unknown GEMM config argument -transO -> true" in bad[3]
    good = [(st, n) for v, st, n, _ in rows if "-transO true" not in v]
    assert good == [("completed", 0)] * 2  # no retry counted against the innocent ones
    run = run_tool(Case("ref", ("--op", "gemm", "-c", "-", "-d"), stdin=_batch(G1, G2)), tmp_path)
    assert run.returncode == 0, run.stderr
    assert_same(recorded(db, sid), tool_blocks(tmp_path))


def test_mlirtuna_records_what_the_real_tool_writes_batch(db, tmp_path, real_tool):
    sid = through_mlirtuna(db, tmp_path, "gemm", [G1, G2, G3], batch=3)
    case = Case("ref", ("--op", "gemm", "-c", "-", "-d"), stdin=_batch(G1, G2, G3))
    run = run_tool(case, tmp_path / "ref")
    assert run.returncode == 0, run.stderr
    assert_same(recorded(db, sid), tool_blocks(tmp_path / "ref"))


def test_mlirtuna_records_what_the_real_tool_writes_fusion(db, tmp_path, real_tool):
    sid = through_mlirtuna(db, tmp_path, "fusion", [str(FUSION / RESNET_CONV)])
    case = Case("ref", ("--op", "fusion", "--test-dir", "modules", "-d"), modules=(RESNET_CONV,))
    run = run_tool(case, tmp_path / "ref")
    assert run.returncode == 0, run.stderr
    ((winner, tflops, cands),) = tool_blocks(tmp_path / "ref").values()
    (got,) = recorded(db, sid).values()  # stored against the fusion problem
    assert got[:2] == (winner, pytest.approx(tflops, rel=1e-9))
    assert set(got[2]) == set(cands)


def test_rdna_session_detects_hips_count_and_the_real_perfrunner_reads_its_export(
    db, db_url, tmp_path, real_tool, monkeypatch
):
    monkeypatch.setenv("FAKE_GPU", "gfx1100")
    sid = through_mlirtuna(db, tmp_path, "gemm", [G1])
    made = sessions_of(db)[sid]
    assert (made.arch, made.num_cu, made.key_form) == ("gfx1100", 48, "plain")  # rocminfo: 96
    from support.clitools import cli

    out = tmp_path / "export.tsv"
    run = cli(db_url, "export", "--arch", "gfx1100", "-o", str(out))
    assert run.code == 0, run.stderr
    assert "-supportsSplitK" not in out.read_text()
    probe = (
        "import json, sys, perfRunner\n"
        "db = perfRunner.read_tuning_db(sys.argv[1], perfRunner.GemmConfiguration)\n"
        "print(json.dumps([[list(k), v] for k, v in db.items()]))\n"
    )
    env = tool_env(Case("read", (), env={"FAKE_GPU": "gfx1100"}))
    got = subprocess.run(
        [PYTHON, "-c", probe, str(out)], env=env, capture_output=True, text=True, check=True
    )
    ((key, perf),) = json.loads(got.stdout)
    assert key == ["gfx1100", 48, 1, G1] and perf == recorded(db, sid)[G1][0]


def test_real_read_tuning_db_skips_split_k_keys(tmp_path):
    """Why plain keys for this build: 3fc5be9e's gemm parser knows no -supportsSplitK, and
    read_tuning_db silently skips a row it cannot parse."""
    row = f"gfx942:sramecc+:xnack-\t304\t8\t{G1} -supportsSplitK true\tv4:1,2\t1.0\n"
    (tmp_path / "db.tsv").write_text(row)
    probe = (
        "import sys, perfRunner\n"
        "print(len(perfRunner.read_tuning_db(sys.argv[1], perfRunner.GemmConfiguration)))\n"
    )
    env = tool_env(Case("read", ()))
    got = subprocess.run(
        [PYTHON, "-c", probe, str(tmp_path / "db.tsv")], env=env, capture_output=True,
        text=True, check=True,
    )  # fmt: skip
    assert got.stdout.strip() == "0"


def test_real_help_reads_as_e3_with_gpu_run_timeout(real_tool):
    from mlirtuna.tuners.rocmlir import RocmlirTuner

    era = RocmlirTuner(str(BELOW)).era
    assert era.name == "E3"
    assert era.capabilities == ("gpus", "batch", "timeout", "gpu-run-timeout")
    assert era.tuning_spaces == ("quick", "full", "greedy", "exhaustive")


def sessions_of(db) -> dict:
    from mlirtuna import sessions

    return {s.id: s for s in sessions.list_all(db)}
