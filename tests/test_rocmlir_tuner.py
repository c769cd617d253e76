"""The rocmlir tuner against the stand-in tuningRunner.py (src/mlirtuna/standin/rocmlir), both eras.

No database and no GPU: the stand-in speaks the real tool's command line and file formats, and
logs the argv it received (FAKE_TUNINGRUNNER_LOG) so the exact flags can be checked.
"""

from __future__ import annotations

import math
import time
from dataclasses import dataclass
from pathlib import Path

import pytest
from support import hangguard
from support.rocmlir import (
    ARCH_FULL,
    ATTN,
    CONV,
    GEMM,
    calls,
    context,
    expected,
    pid_alive,
    tuner,
    tuning_calls,
)

from mlirtuna.errors import TunerError, TunerTimeout, Unsupported, UserError
from mlirtuna.formats.tuningdb import TuningRow
from mlirtuna.problems import parse
from mlirtuna.tuners import process, rocmlir
from mlirtuna.tuners.base import Candidate
from mlirtuna.tuners.rocmlir import RocmlirTuner, outcome

ERAS = ["E2", "E3"]


# --- construction -------------------------------------------------------------------------------


def test_missing_build_dir_names_the_flag_and_the_variable(build: Path, tmp_path: Path) -> None:
    with pytest.raises(UserError) as info:
        RocmlirTuner(None)
    assert "--mlir-build-dir" in str(info.value) and "MLIRTUNA_ROCMLIR_BUILD" in str(info.value)
    with pytest.raises(UserError) as info:
        RocmlirTuner(str(tmp_path))
    assert "bin/tuningRunner.py not found" in str(info.value)
    assert "--mlir-build-dir" in str(info.value) and "MLIRTUNA_ROCMLIR_BUILD" in str(info.value)


def test_build_dir_from_environment(build: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv("MLIRTUNA_ROCMLIR_BUILD", str(build))
    assert RocmlirTuner(None).script == build / "bin" / "tuningRunner.py"


# --- era detection and flags ----------------------------------------------------------------------


@pytest.mark.parametrize("era", ERAS)
def test_era_is_read_once_from_help(build: Path, monkeypatch: pytest.MonkeyPatch, era: str) -> None:
    t = tuner(build, era, monkeypatch)
    assert t.era.name == era
    problem = parse("gemm", GEMM)
    t.tune(problem, context(tuning_space="quick"))
    t.tune(problem, context(tuning_space="quick"))
    assert [c["argv"] for c in calls(build)].count(["--help"]) == 1
    assert t.era.tuning_spaces == (
        ("quick", "full", "exhaustive")
        if era == "E2"
        else ("quick", "full", "greedy", "exhaustive")
    )


def test_detect_era_from_help_text() -> None:
    assert rocmlir.detect_era("usage: x [--rocmlir_gen_flags F] [--tflops]").name == "E2"
    assert rocmlir.detect_era("[--gpus GPU_ID [GPU_ID ...]] [--tflops]").name == "E3"
    with pytest.raises(TunerError, match="no known era"):
        rocmlir.detect_era("usage: something else [--foo]")


def test_e2_flags(build: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    t = tuner(build, "E2", monkeypatch)
    problem = parse("gemm", GEMM)
    t.tune(problem, context(tuning_space="exhaustive"))
    (call,) = tuning_calls(build)
    out = call["argv"][4].removeprefix("--output=")
    assert call["argv"] == [
        "--op=gemm",
        f"--config={problem.canonical()}",
        "--tuning-space=exhaustive",
        f"--mlir-build-dir={build}",
        f"--output={out}",
        "--debug",
        "--tflops",
        "--rocmlir_gen_flags=--device=0",
    ]
    assert Path(out).name == "tuning.tsv" and not Path(out).parent.exists()  # fresh, cleaned up
    assert call["cwd"] == str(build)
    # E2 cannot pick a GPU but through the environment: with nothing pinned, we pin it.
    assert call["env"] == {"ROCR_VISIBLE_DEVICES": "3"}


def test_e2_leaves_the_workers_pinning_alone(build: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    t = tuner(build, "E2", monkeypatch)
    monkeypatch.setenv("HIP_VISIBLE_DEVICES", "5")
    t.tune(parse("gemm", GEMM), context(tuning_space="quick"))
    (call,) = tuning_calls(build)
    assert call["env"] == {"HIP_VISIBLE_DEVICES": "5"}
    assert "--rocmlir_gen_flags=--device=0" in call["argv"]


def test_e3_flags(build: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    t = tuner(build, "E3", monkeypatch)
    monkeypatch.setenv("ROCR_VISIBLE_DEVICES", "3")
    problem = parse("gemm", GEMM)
    t.tune(problem, context(tuning_space="greedy", timeout_s=60.0))
    (call,) = tuning_calls(build)
    out = call["argv"][4].removeprefix("--output=")
    assert call["argv"] == [
        "--op=gemm",
        f"--config={problem.canonical()}",
        "--tuning-space=greedy",
        f"--mlir-build-dir={build}",
        f"--output={out}",
        "--debug",
        "--gpus=3",  # E3 takes the physical id and ignores the environment
        "--timeout=54",
        "--abort-on-error",
    ]
    assert call["env"] == {"ROCR_VISIBLE_DEVICES": "3"}


@pytest.mark.parametrize("era", ERAS)
def test_attention_is_not_verified(build: Path, monkeypatch: pytest.MonkeyPatch, era: str) -> None:
    t = tuner(build, era, monkeypatch)
    t.tune(parse("attention", ATTN), context(tuning_space="quick"))
    (call,) = tuning_calls(build)
    assert "--verify-mode=none" in call["argv"]


def test_e2_has_no_greedy_space(build: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    t = tuner(build, "E2", monkeypatch)
    with pytest.raises(Unsupported, match=r"no tuning space 'greedy' \(E2: "):  # never retried
        t.tune(parse("gemm", GEMM), context(tuning_space="greedy"))
    assert tuning_calls(build) == []


def test_a_list_space_runs_the_tools_quick_space_where_the_build_cannot_measure_it(
    build: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """rocMLIR compiles its quick list in: a `list:NAME` session on a build whose driver cannot
    time a chosen config (no --benchmark-config) runs the tool's `quick` space (where it can:
    test_rocmlir_chosen)."""
    monkeypatch.setenv("FAKE_ROCMLIR_DRIVER_NO_BENCHMARK_CONFIG", "1")
    t = tuner(build, "E3", monkeypatch)
    out = t.tune(parse("gemm", GEMM), context(tuning_space="list:mine", perf_configs=("v4:x",)))
    (call,) = tuning_calls(build)
    assert "--tuning-space=quick" in call["argv"] and out.winner.valid


def test_a_cpu_worker_cannot_use_it(build: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    with pytest.raises(TunerError, match="needs a GPU"):
        tuner(build, "E3", monkeypatch).tune(parse("gemm", GEMM), context(gpu_id=-1))


# --- results: the winner and every candidate as the tool reports them ---------------------------


@pytest.mark.parametrize("era", ERAS)
@pytest.mark.parametrize(
    ("op", "line", "space"),
    [("gemm", GEMM, "exhaustive"), ("conv", CONV, "full"), ("attention", ATTN, "quick")],
)
def test_candidates_and_winner(
    build: Path, monkeypatch: pytest.MonkeyPatch, era: str, op: str, line: str, space: str
) -> None:
    problem = parse(op, line)
    outcome = tuner(build, era, monkeypatch).tune(problem, context(tuning_space=space))
    times = expected(op, problem.canonical(), space, era)

    assert [c.perf_config for c in outcome.candidates] == list(times)
    for cand in outcome.candidates:
        ns = times[cand.perf_config]
        if ns is None:
            assert not cand.valid and "N/A" in (cand.error or "")
            assert cand.kernel_time_ns is None and cand.tflops is None
        else:
            assert cand.valid
            assert cand.kernel_time_ns == pytest.approx(ns, rel=1e-12)
            assert cand.tflops == pytest.approx(problem.flops() / (ns * 1e3), rel=1e-12)
    best = max((c for c in outcome.candidates if c.valid), key=lambda c: c.tflops or 0)
    assert outcome.winner == best and outcome.winner in outcome.candidates
    assert outcome.notes == []
    assert outcome.compile_start and outcome.compile_end
    assert outcome.compile_start <= outcome.compile_end
    assert outcome.compile_start.utcoffset() is not None  # UTC-aware
    assert best.perf_config in outcome.output and "tuningRunner stderr" in outcome.output


# --- faults ---------------------------------------------------------------------------------------


@pytest.mark.parametrize("era", ERAS)
@pytest.mark.parametrize(
    ("fault", "fragment"),
    [
        ("fail", "tuningRunner exited with status 1: "),
        ("garbage", "tuningRunner wrote a malformed result file: "),
        ("wrong_arch", "tool reports gfx90a:sramecc+:xnack-/110 CUs"),
        ("empty", "tuningRunner exited 0 but wrote no result (E2 does this when verification"),
        ("crash_partial", "tuningRunner exited with status 139"),
    ],
)
def test_faults(
    build: Path, monkeypatch: pytest.MonkeyPatch, era: str, fault: str, fragment: str
) -> None:
    t = tuner(build, era, monkeypatch)
    monkeypatch.setenv("FAKE_TUNINGRUNNER_FAULT", fault)
    with pytest.raises(TunerError) as info:
        t.tune(parse("gemm", GEMM), context(tuning_space="quick"))
    assert not isinstance(info.value, TunerTimeout)
    assert fragment in str(info.value)
    if fault == "fail":
        assert "ERROR" in str(info.value) and "ERROR" in info.value.detail
    if fault == "garbage":
        assert "tuning.tsv:2: " in str(info.value)
        assert "three hundred" in info.value.detail  # the offending line
    if fault == "wrong_arch":
        assert f"session is {ARCH_FULL}/304 CUs" in str(info.value)
        assert "refusing to record" in str(info.value)


def test_no_valid_perf_config_e2(build: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    """E2 writes perfConfig None and TFlops -inf and exits 0."""
    t = tuner(build, "E2", monkeypatch)
    monkeypatch.setenv("FAKE_TUNINGRUNNER_FAULT", "none")
    with pytest.raises(TunerError, match=r"no valid perf config: .* None with -inf TFlops"):
        t.tune(parse("gemm", GEMM), context(tuning_space="quick"))


def test_no_valid_perf_config_e3(build: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    """E3 never writes such a row: it logs the error and exits 1."""
    t = tuner(build, "E3", monkeypatch)
    monkeypatch.setenv("FAKE_TUNINGRUNNER_FAULT", "none")
    with pytest.raises(TunerError, match=r"status 1: ERROR: .*No valid perf config found"):
        t.tune(parse("gemm", GEMM), context(tuning_space="quick"))


def test_e3_chiplet_count_must_match(build: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    t = tuner(build, "E3", monkeypatch)
    monkeypatch.setenv("FAKE_GPU_NUM_CHIPLETS", "4")  # an MI308X-like part: same chip, same CUs
    with pytest.raises(TunerError, match=r"304 CUs/4 chiplets, session is .*304 CUs/8 chiplets"):
        t.tune(parse("gemm", GEMM), context(tuning_space="quick"))


def test_bare_chip_name_compares_with_the_session_chip(
    build: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.setenv("FAKE_GPU_ARCH", "gfx942")
    outcome = tuner(build, "E2", monkeypatch).tune(
        parse("gemm", GEMM), context(tuning_space="quick")
    )
    assert outcome.winner.valid


@pytest.mark.parametrize(("era", "ignore_term"), [("E2", False), ("E3", True)])
def test_timeout_kills_the_whole_process_group(
    build: Path, monkeypatch: pytest.MonkeyPatch, tmp_path: Path, era: str, ignore_term: bool
) -> None:
    pidfile = tmp_path / "child.pid"
    t = tuner(build, era, monkeypatch, kill_grace_s=0.5)
    monkeypatch.setenv("FAKE_TUNINGRUNNER_FAULT", "hang")
    monkeypatch.setenv("FAKE_TUNINGRUNNER_CHILD_PIDFILE", str(pidfile))
    if ignore_term:  # only SIGKILL stops the tool itself
        monkeypatch.setenv("FAKE_TUNINGRUNNER_IGNORE_SIGTERM", "1")
    t.era  # noqa: B018 - read --help before the run
    with pytest.raises(TunerTimeout) as info:  # a tool left alive would hang it: a hang guard
        hangguard.returns(
            lambda: t.tune(parse("gemm", GEMM), context(tuning_space="quick", timeout_s=1.5))
        )
    assert "job timeout of 1.5 s" in str(info.value)
    assert info.value.detail.strip()  # what it printed before it hung
    child = int(pidfile.read_text())
    deadline = time.monotonic() + 30  # a hang guard: SIGKILLed, it is gone within moments
    while pid_alive(child) and time.monotonic() < deadline:
        time.sleep(0.05)
    assert not pid_alive(child)


def test_tools_own_timeout_is_a_timeout() -> None:
    now = process.now()
    run = process.Run(
        1, "", "ERROR: [GPU 3] Tuning timed out after 54s\nERROR: Encountered errors\n", now, now
    )
    error = outcome.failure(run)
    assert isinstance(error, TunerTimeout)
    assert (
        str(error) == "tuningRunner exited with status 1: ERROR: [GPU 3] Tuning timed out after 54s"
    )


# --- the config string is data ------------------------------------------------------------------


@dataclass(frozen=True)
class EvilProblem:
    op: str = "gemm"

    def canonical(self) -> str:
        return "-t f16 '; rm -rf x' \"q\" ; rm -rf x $(touch pwned) `touch pwned2` -m 1"

    def flops(self) -> int:
        return 10**9


@pytest.mark.parametrize("era", ERAS)
def test_config_arrives_as_one_argument_and_runs_nothing(
    build: Path, monkeypatch: pytest.MonkeyPatch, era: str
) -> None:
    (build / "x").mkdir()
    t = tuner(build, era, monkeypatch)
    with pytest.raises(TunerError):  # the stand-in cannot parse it, like the real tool
        t.tune(EvilProblem(), context(tuning_space="quick"))  # type: ignore[arg-type]
    (call,) = tuning_calls(build)
    assert f"--config={EvilProblem().canonical()}" in call["argv"]
    assert len(call["argv"]) == (8 if era == "E2" else 9)
    assert (build / "x").is_dir()
    for name in ("pwned", "pwned2"):
        assert not (build / name).exists() and not (build.parent / name).exists()


# --- the .debug file and winner reconciliation (pure functions) ---------------------------------


def test_read_debug_file_e2_layout_with_index_column(tmp_path: Path) -> None:
    path = tmp_path / "out.tsv.debug"
    path.write_text(
        "\tDataType\tChip\tPerfConfig\tLDSBankConflict\tTFlops\n"
        "0\tf16\tgfx942\tv2:32,32,2,32,32,4,1,1,1\tNaN\t51.5\n"
        "1\tf16\tgfx942\tv2:32,32,2,32,32,4,2,1,1\tNaN\t\n"
    )
    rows = rocmlir.read_debug_file(path)
    assert [(r.perf_config, r.tflops, r.lineno) for r in rows] == [
        ("v2:32,32,2,32,32,4,1,1,1", 51.5, 2),
        ("v2:32,32,2,32,32,4,2,1,1", None, 3),
    ]


def test_read_debug_file_e3_layout_with_measurements(tmp_path: Path) -> None:
    path = tmp_path / "out.tsv.debug"
    path.write_text(
        "DataType\tPerfConfig\tTFlops\tMeasurementsMs\n"
        "f16\tv4:1\t21.5\t[0.037, 0.036]\n"
        "f16\tv4:2\t\t\n"
    )
    assert [(r.perf_config, r.tflops) for r in rocmlir.read_debug_file(path)] == [
        ("v4:1", 21.5),
        ("v4:2", None),
    ]


@pytest.mark.parametrize(
    ("text", "fragment"),
    [
        ("DataType\tTFlops\nf16\t1.0\n", ":1: .debug header lacks PerfConfig or TFlops"),
        ("PerfConfig\tTFlops\nv4:1\n", ":2: 1 fields, the .debug header has 2"),
        ("PerfConfig\tTFlops\nv4:1\t1.0\nv4:2\tfast\n", ":3: TFlops 'fast'"),
    ],
)
def test_read_debug_file_malformed(tmp_path: Path, text: str, fragment: str) -> None:
    path = tmp_path / "out.tsv.debug"
    path.write_text(text)
    with pytest.raises(TunerError, match=fragment):
        rocmlir.read_debug_file(path)


def _row(perf_config: str, tflops: float) -> TuningRow:
    return TuningRow(ARCH_FULL, 304, 8, GEMM, perf_config, tflops, "full", None, None, None, 2)


def test_reconcile_records_the_tools_choice_and_notes_a_disagreement() -> None:
    flops = 1e12
    candidates = [
        outcome.tflops_candidate("a", 10.0, flops),
        outcome.tflops_candidate("b", 20.0, flops),
    ]
    notes: list[str] = []
    kept, winner = outcome.reconcile(candidates, _row("a", 10.0), flops, notes)
    assert winner.perf_config == "a" and kept == candidates
    assert len(notes) == 1 and "chose a (10 TFlops)" in notes[0] and "b at 20 TFlops" in notes[0]


def test_reconcile_adds_a_winner_the_debug_file_lacks() -> None:
    flops = 1e12
    candidates = [
        outcome.tflops_candidate("a", 10.0, flops),
        outcome.tflops_candidate("n/a", None, flops),
    ]
    notes: list[str] = []
    kept, winner = outcome.reconcile(
        candidates,
        _row(
            "c",
            30.0,
        ),
        flops,
        notes,
    )
    assert winner == Candidate(
        "c", kernel_time_ns=pytest.approx(1e12 / 30e3), tflops=pytest.approx(30.0)
    )
    assert kept[-1] is winner and len(kept) == 3
    assert notes == [
        "the .debug file lacks tuningRunner's winner c; added it with the TFlops of the result row"
    ]


def test_candidates_keep_the_best_of_repeated_measurements() -> None:
    rows = [
        rocmlir.DebugRow("a", None, 2),
        rocmlir.DebugRow("a", 5.0, 3),
        rocmlir.DebugRow("a", 4.0, 4),
        rocmlir.DebugRow("b", 1.0, 5),
    ]
    cands = outcome.debug_candidates(rows, 1e12)
    assert [(c.perf_config, c.tflops) for c in cands] == [
        ("a", pytest.approx(5.0)),
        ("b", pytest.approx(1.0)),
    ]
    assert math.isclose(cands[0].kernel_time_ns or 0, 1e12 / 5e3)
