"""The rocmlir tuner measuring chosen perf configs (issue 45 §2) on the stand-in build: a search's
round or a `list:` session's list, each config one `rocmlir-gen LINE | rocmlir-tuning-driver
--benchmark-config=PC -` as perfRunner's run_config_with_mlir does; the space listed by
`rocmlir-gen --emit-tuning-space`; a build whose driver predates --benchmark-config refuses.

No database and no GPU: the stand-in's tools log each call (FAKE_ROCMLIR_TOOLS_LOG), and their
times are the stand-in tuningRunner's own generator's, so each candidate is checked against it.
"""

from __future__ import annotations

import json
from pathlib import Path

import pytest
import sqlalchemy as sa
from support.rocmlir import (
    ATTN,
    CONV,
    GEMM,
    STAND_IN,
    context,
    rocmlir_session,
    tuner,
    tuning_calls,
    work,
)

from mlirtuna.db.models import Candidate
from mlirtuna.errors import BatchRefused, TunerError, TunerTimeout, Unsupported
from mlirtuna.history import quick
from mlirtuna.problems import Problem, fusion, parse
from mlirtuna.queue import jobs
from mlirtuna.tuners.base import SearchableTuner
from mlirtuna.tuners.rocmlir import RocmlirTuner, chosen

LINES = {"gemm": GEMM, "conv": CONV, "attention": ATTN}


@pytest.fixture(autouse=True)
def tools_log(build: Path, monkeypatch: pytest.MonkeyPatch) -> Path:
    path = build.parent / "tools.jsonl"
    monkeypatch.setenv("FAKE_ROCMLIR_TOOLS_LOG", str(path))
    return path


def tool_calls(log: Path, tool: str) -> list[dict]:
    """The logged calls of one stand-in tool, --help left out."""
    if not log.exists():
        return []
    entries = [json.loads(line) for line in log.read_text().splitlines()]
    return [e for e in entries if e["tool"] == tool and e["argv"] != ["--help"]]


def driver_ns(t: RocmlirTuner, problem: Problem, era: str) -> dict[str, float | None]:
    """perf config -> the stand-in's time in ns for this problem (None: N/A), exhaustive."""
    line = t.line(problem)
    _, flops = STAND_IN.describe(problem.op, line, STAND_IN.Gpu(), era)
    space = STAND_IN.perf_configs(problem.op, "exhaustive", era)
    return {pc: STAND_IN.candidate_time_ns(line, pc, flops) for pc in space}


def some_configs(times: dict[str, float | None], valid: int, na: int) -> tuple[str, ...]:
    """`valid` measurable configs then `na` not applicable ones, from the far end of the space."""
    ok = [pc for pc, ns in reversed(times.items()) if ns is not None][:valid]
    bad = [pc for pc, ns in reversed(times.items()) if ns is None][:na]
    return (*ok, *bad)


def test_the_rocmlir_tuner_is_a_searchable_tuner(build: Path) -> None:
    assert isinstance(RocmlirTuner(str(build)), SearchableTuner)


@pytest.mark.parametrize("era", ["E3", "E4"])
@pytest.mark.parametrize("op", ["gemm", "conv", "attention"])
def test_exactly_the_chosen_configs_are_measured(
    build: Path, monkeypatch: pytest.MonkeyPatch, tools_log: Path, era: str, op: str
) -> None:
    t = tuner(build, era, monkeypatch)
    problem = parse(op, LINES[op])
    times = driver_ns(t, problem, era)
    picked = some_configs(times, valid=3, na=1)
    out = t.tune(problem, context(tuning_space="full", perf_configs=picked))

    assert [c.perf_config for c in out.candidates] == list(picked)
    for cand in out.candidates:
        ns = times[cand.perf_config]
        if ns is None:
            assert not cand.valid and "N/A" in (cand.error or "")
        else:  # the driver's last column, in ns, is the candidate's time
            assert cand.kernel_time_ns == pytest.approx(ns, rel=1e-6)
            assert cand.tflops == pytest.approx(problem.flops() / (ns * 1e3), rel=1e-6)
    fastest = min((pc for pc in picked if times[pc] is not None), key=lambda pc: times[pc] or 0)
    assert out.winner.perf_config == fastest
    # One driver call per chosen config, fed the module on stdin; no tuningRunner run at all.
    driver = tool_calls(tools_log, "rocmlir-tuning-driver")
    assert [c["argv"][0] for c in driver] == [f"--benchmark-config={pc}" for pc in picked]
    assert all(c["argv"][-1] == "-" and "--use-median" in c["argv"] for c in driver)
    assert all(c["env"] == {"ROCR_VISIBLE_DEVICES": "3"} for c in driver)  # the worker's GPU
    (gen,) = tool_calls(tools_log, "rocmlir-gen")  # the module, once, from perfRunner's line
    assert gen["argv"][:2] == ["-operation", op] and t.line(problem) in " ".join(gen["argv"])
    assert tuning_calls(build) == []


@pytest.mark.parametrize("era", ["E3", "E4"])
def test_runs_are_milliseconds_and_the_time_nanoseconds(
    build: Path, monkeypatch: pytest.MonkeyPatch, era: str
) -> None:
    """--show-all-measurements prints every run in ms and the (median) time in ns: the
    candidate's spread is in ns, its median the driver's time."""
    t = tuner(build, era, monkeypatch)
    problem = parse("gemm", GEMM)
    picked = some_configs(driver_ns(t, problem, era), valid=2, na=0)
    out = t.tune(problem, context(tuning_space="quick", perf_configs=picked))
    for cand in out.candidates:
        assert cand.spread is not None and cand.spread.samples == 11
        assert cand.spread.median == pytest.approx(cand.kernel_time_ns, rel=1e-5)
        assert 1e3 < cand.spread.median < 1e9  # ns: a stand-in kernel takes 1 µs to 1 s
    assert out.margin is not None and out.margin.noise is not None


def test_each_era_gets_its_tuning_runners_timing(
    build: Path, monkeypatch: pytest.MonkeyPatch, tools_log: Path
) -> None:
    """E3's legacy counts (3fc5be9e's MLIR_N_REPEATS, WARMUP_ITERATIONS, LEGACY_SLEEP_US);
    E4's time budgets, the session's --rep/--warmup where it sets them."""
    problem = parse("gemm", GEMM)
    t3 = tuner(build, "E3", monkeypatch)
    t3.tune(problem, context(perf_configs=some_configs(driver_ns(t3, problem, "E3"), 1, 0)))
    (e3,) = tool_calls(tools_log, "rocmlir-tuning-driver")
    shown = ["--use-median", "--show-all-measurements=True", "-"]
    assert e3["argv"][1:] == [*chosen.LEGACY_TIMING, *shown]
    tools_log.unlink()
    t4 = tuner(build, "E4", monkeypatch)
    picked = some_configs(driver_ns(t4, problem, "E4"), 1, 0)
    t4.tune(problem, context(rep_ms=50, warmup_ms=10, perf_configs=picked))
    (e4,) = tool_calls(tools_log, "rocmlir-tuning-driver")
    assert e4["argv"][1:] == ["--rep=50", "--warmup=10", *shown]


def test_a_config_chosen_twice_is_measured_once_and_a_bad_one_is_an_invalid_candidate(
    build: Path, monkeypatch: pytest.MonkeyPatch, tools_log: Path
) -> None:
    t = tuner(build, "E3", monkeypatch)
    problem = parse("gemm", GEMM)
    (good,) = some_configs(driver_ns(t, problem, "E3"), valid=1, na=0)
    out = t.tune(problem, context(perf_configs=(good, "v4:nonsense", good)))
    assert [c.perf_config for c in out.candidates] == [good, "v4:nonsense"]
    bad = out.candidates[1]
    assert not bad.valid
    assert "Failed to parse perfConfig for config: v4:nonsense" in (bad.error or "")
    assert out.winner.perf_config == good
    assert len(tool_calls(tools_log, "rocmlir-tuning-driver")) == 2


def test_no_chosen_config_that_runs_fails_the_job(
    build: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    t = tuner(build, "E3", monkeypatch)
    problem = parse("gemm", GEMM)
    picked = some_configs(driver_ns(t, problem, "E3"), valid=0, na=2)
    said = r"none of the 2 chosen perf configs ran \(first: not applicable"
    with pytest.raises(TunerError, match=said):
        t.tune(problem, context(perf_configs=picked))


def test_a_list_session_measures_exactly_its_list(
    build: Path, monkeypatch: pytest.MonkeyPatch, tools_log: Path
) -> None:
    t = tuner(build, "E3", monkeypatch)
    problem = parse("gemm", GEMM)
    picked = some_configs(driver_ns(t, problem, "E3"), valid=2, na=0)
    out = t.tune(problem, context(tuning_space="list:mine", perf_configs=picked))
    assert [c.perf_config for c in out.candidates] == list(picked)
    assert tuning_calls(build) == []  # not the tool's quick space
    assert t.search_space(problem, context(tuning_space="list:mine", perf_configs=picked)) == list(
        picked
    )


# E2 and E2.5 are the test overlay's (tests/support/standin_faults): the package's rocmlir-gen
# lists the spaces of the eras it ships, E3 and E4.
@pytest.mark.parametrize("era", ["E3", "E4"])
@pytest.mark.parametrize("space", ["quick", "full", "exhaustive"])
def test_search_space_is_the_tools_listing(
    build: Path, monkeypatch: pytest.MonkeyPatch, tools_log: Path, era: str, space: str
) -> None:
    t = tuner(build, era, monkeypatch)
    problem = parse("conv", CONV)
    listed = t.search_space(problem, context(tuning_space=space))
    assert listed == STAND_IN.perf_configs("conv", space, era)
    (call,) = tool_calls(tools_log, "rocmlir-gen")
    assert call["argv"][-1] == f"--emit-tuning-space={space}"
    assert tuning_calls(build) == []


def test_a_space_the_tool_cannot_list_is_refused_in_one_line(
    build: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    t = tuner(build, "E3", monkeypatch)
    with pytest.raises(Unsupported) as info:
        t.search_space(parse("gemm", GEMM), context(tuning_space="greedy"))
    said = str(info.value)
    assert "--emit-tuning-space lists quick, full, exhaustive, not 'greedy'" in said
    assert "\n" not in said


def test_a_driver_without_benchmark_config_refuses_a_search_in_one_line(
    build: Path, monkeypatch: pytest.MonkeyPatch, tools_log: Path
) -> None:
    monkeypatch.setenv("FAKE_ROCMLIR_DRIVER_NO_BENCHMARK_CONFIG", "1")
    t = tuner(build, "E3", monkeypatch)
    problem = parse("gemm", GEMM)
    picked = some_configs(driver_ns(t, problem, "E3"), valid=2, na=0)
    with pytest.raises(Unsupported) as info:
        t.tune(problem, context(tuning_space="full", perf_configs=picked))
    said = str(info.value)
    assert said.startswith("this build cannot measure chosen perf configs (measure-chosen): ")
    assert "rocmlir-tuning-driver has no --benchmark-config" in said and "\n" not in said
    assert tool_calls(tools_log, "rocmlir-tuning-driver") == [] and tuning_calls(build) == []
    # A list: session there runs the tool's own quick space, as before.
    out = t.tune(problem, context(tuning_space="list:mine", perf_configs=picked))
    (call,) = tuning_calls(build)
    assert "--tuning-space=quick" in call["argv"] and out.winner.valid


def test_a_search_over_a_fusion_module_is_refused_in_one_line(
    build: Path, monkeypatch: pytest.MonkeyPatch, tools_log: Path
) -> None:
    """The tool tunes a fusion module as the conv/gemm its key names; perfRunner has no line
    for the module itself, so no chosen config of it is measured (nor its space listed)."""
    t = tuner(build, "E3", monkeypatch)
    problem = fusion.FusionProblem(
        file_name="m.mlir", function="f", sha256="0" * 64, tuning_key=GEMM,
        key_op="gemm", key_source="rocmlir-gen", module_text="",
    )  # fmt: skip
    for call in (
        lambda: t.tune(problem, context(perf_configs=("v4:x",))),
        lambda: t.search_space(problem, context(tuning_space="quick")),
    ):
        with pytest.raises(Unsupported, match="fusion problem has no perfRunner configuration"):
            call()
    assert tool_calls(tools_log, "rocmlir-tuning-driver") == [] and tuning_calls(build) == []


def test_a_batch_of_chosen_configs_is_given_back_to_be_measured_one_by_one(
    build: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """`worker --batch K` on a list: session: each problem has its own list (per data type) and
    the call's context only the first's, so the batch is refused as a whole (BatchRefused:
    each job tuned alone, no retry counted) before any tool runs."""
    t = tuner(build, "E3", monkeypatch)
    problems = [parse("gemm", GEMM), parse("gemm", GEMM.replace("-m 1024", "-m 2048"))]
    got = list(t.tune_many(problems, context(tuning_space="list:mine", perf_configs=("v4:x",))))
    assert [i for i, _ in got] == [0, 1]
    assert all(isinstance(e, BatchRefused) for _, e in got) and tuning_calls(build) == []


def test_a_search_is_not_split_into_compile_and_benchmark_jobs(
    build: Path, monkeypatch: pytest.MonkeyPatch, tmp_path: Path
) -> None:
    t = tuner(build, "E4", monkeypatch)
    with pytest.raises(Unsupported, match="--compile-only bundles the whole tuning space"):
        t.compile(parse("gemm", GEMM), context(perf_configs=("v4:x",)), tmp_path / "bundle")
    assert tuning_calls(build) == []


def test_a_list_session_measures_its_list_through_the_worker(
    db, build: Path, tmp_path: Path, monkeypatch: pytest.MonkeyPatch, tools_log: Path
) -> None:
    """End to end: a quick list made from a stand-in session, then a `list:` session whose
    worker hands the tuner the list: exactly its configs are measured and recorded, and
    tuningRunner is not run for it."""
    monkeypatch.setenv("FAKE_TUNINGRUNNER_ERA", "E3")
    full = rocmlir_session(db, tmp_path, "gemm", space="quick")
    work(db, full, build)
    lists = quick.build(quick.histories(db, [full]), quick.Options(threshold=0.8))
    quick.save(db, "mine", lists, [full])
    listed_configs = {pc for group in lists for pc in group.perf_configs}
    runs_before = len(tuning_calls(build))
    listed = rocmlir_session(db, tmp_path, "gemm", space="list:mine")
    work(db, listed, build)
    assert jobs.counts(db, listed)[listed]["completed"] == 1
    with db.session() as s:
        tried = s.scalars(sa.select(Candidate.perf_config).where(Candidate.session_id == listed))
        assert set(tried) == listed_configs
    assert len(tuning_calls(build)) == runs_before
    driver = tool_calls(tools_log, "rocmlir-tuning-driver")
    assert len(driver) == len(listed_configs)


def test_the_job_timeout_bounds_all_the_calls_of_a_measurement(
    build: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    t = tuner(build, "E3", monkeypatch)
    problem = parse("gemm", GEMM)
    picked = some_configs(driver_ns(t, problem, "E3"), valid=2, na=0)
    with pytest.raises(TunerTimeout):
        t.tune(problem, context(timeout_s=0.001, perf_configs=picked))
