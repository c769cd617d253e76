"""Measurements you can trust (issue 17): the statistics and the timing harness, the stored
per-candidate statistics, the top-k re-measurement and winner margin of every tuner, and a
compare that tells noise from regression. Database tests run on every backend."""

from __future__ import annotations

import json
import math
import time

import pytest
import sqlalchemy as sa
from fastapi.testclient import TestClient
from support.clitools import cli
from support.results import cand, gemm, new_session, record
from support.rocmlir import rocmlir_session, work
from threadpoolctl import threadpool_info

from mlirtuna import catalog, sessions, stats
from mlirtuna.db.models import Candidate, Problem, Result
from mlirtuna.errors import UserError
from mlirtuna.history import compare, winners
from mlirtuna.problems import ExpandOptions, parse
from mlirtuna.queue import jobs
from mlirtuna.sessions import SessionSpec
from mlirtuna.stats import Spread
from mlirtuna.tuners import timing
from mlirtuna.tuners.base import TuneContext
from mlirtuna.tuners.cpu import CpuTuner
from mlirtuna.web import explore
from mlirtuna.web.app import create_app, open_read_only
from mlirtuna.worker import Worker, WorkerSettings

# --- statistics ----------------------------------------------------------------------------------


def test_summary_discards_only_slow_outliers_by_tukeys_fence() -> None:
    samples = [100.0, 101, 102, 103, 104, 105, 106, 107, 2000, 50]
    s = stats.summarize(samples)
    # Q1 = 101.25, Q3 = 105.75, fence = 112.5: 2000 goes, the fast 50 stays (it is real).
    assert s.discarded == 1 and s.samples == 9 and s.min == 50
    assert s.median == 103 and s.iqr == pytest.approx(105 - 101)
    assert s.noise == pytest.approx(1.57 * s.iqr / 3)


def test_within_noise_is_overlapping_notches() -> None:
    a, b = Spread(100.0, 95, 10, 25), Spread(103.0, 97, 10, 25)
    assert a.noise == pytest.approx(3.14)
    assert stats.within_noise(a.median, a.noise, b.median, b.noise)
    assert not stats.within_noise(a.median, a.noise, 110.0, b.noise)
    m = stats.margin(a, b)
    assert m.margin == pytest.approx(0.03) and m.noise == pytest.approx(0.0628)
    assert m.within_noise
    assert not stats.margin(a, Spread(120.0, 118, 10, 25)).within_noise
    assert stats.rel_noise(100.0, 10.0, 25) == pytest.approx(0.0314)
    assert stats.rel_noise(100.0, None, None) is None


def test_spearman() -> None:
    assert stats.spearman([1, 2, 3, 4], [10, 20, 30, 40]) == pytest.approx(1.0)
    assert stats.spearman([1, 2, 3, 4], [4, 3, 2, 1]) == pytest.approx(-1.0)
    assert stats.spearman([1, 2, 2, 3], [1, 2, 3, 4]) == pytest.approx(0.9486832980505138)
    assert stats.spearman([1], [2]) is None and stats.spearman([1, 1], [1, 2]) is None


# --- the timing harness --------------------------------------------------------------------------


def test_measure_runs_for_the_time_budget_not_a_count() -> None:
    calls = []

    def kernel() -> None:
        calls.append(1)
        end = time.perf_counter() + 0.001
        while time.perf_counter() < end:
            pass

    start = time.perf_counter()
    s = timing.measure(kernel, timing.Budget(warmup_ms=10, rep_ms=30, min_samples=3))
    took = time.perf_counter() - start
    assert took >= 0.04  # both budgets were spent
    timed = s.samples + s.discarded
    assert timed >= 3 and len(calls) > timed  # and some runs were warm-up
    assert s.median >= 0.5e6  # ns: ~1 ms of CPU time each
    calls.clear()
    fixed = timing.measure(kernel, timing.Budget.fixed(4))
    assert fixed.samples + fixed.discarded == 4 == len(calls)


def test_interleaved_runs_in_turns() -> None:
    order: list[str] = []
    kernels = {name: (lambda name=name: order.append(name)) for name in "ABC"}
    out = timing.measure_interleaved(kernels, timing.Budget.fixed(3))
    assert order == list("ABC" * 3)
    assert set(out) == set("ABC") and all(s.samples + s.discarded == 3 for s in out.values())


def test_the_cpu_tuner_times_on_one_blas_thread() -> None:
    seen = []

    def probe(op) -> None:
        seen.append([i["num_threads"] for i in threadpool_info() if i["user_api"] == "blas"])
        op.run_blocked(op.quick[0])

    problem = parse("gemm", "-t f32 -transA false -transB false -g 1 -m 32 -n 32 -k 32")
    ctx = TuneContext("cpu", "cpu", 1, 1, "quick", gpu_id=-1)
    CpuTuner(repeats=2, extra_kernels={"test:probe": probe}).tune(problem, ctx)
    assert seen and all(threads and threads == [1] * len(threads) for threads in seen)


# --- the CPU tuner through a real worker, every backend ------------------------------------------


def cpu_session(db, tmp_path, topk: int = 3, space: str = "quick") -> int:
    path = tmp_path / "gemm-configs"
    path.write_text("-t f32 -transA false -transB false -g 1 -m 64 -n 96 -k 64\n")
    catalog.import_files(db, "gemm", [str(path)], ExpandOptions(expand=False), tag="g")
    sid = sessions.create(db, SessionSpec(tuner="cpu", tuning_space=space, topk=topk)).id
    jobs.load(db, sid, tag="g")
    return sid


def run_cpu(db, sid: int) -> None:
    settings = WorkerSettings(session_id=sid, tuner="cpu", gpu_id=-1, until_empty=True)
    assert Worker(db, settings, CpuTuner(repeats=4)).run().completed == 1


def rows(db, sid: int) -> tuple[Result, list[Candidate]]:
    with db.session() as s:
        result = s.scalars(sa.select(Result).where(Result.session_id == sid)).one()
        cands = list(s.scalars(sa.select(Candidate).where(Candidate.session_id == sid)))
        s.expunge_all()
    return result, cands


def test_cpu_candidates_store_their_statistics_and_the_top_k(db, db_url, tmp_path) -> None:
    sid = cpu_session(db, tmp_path, topk=3)
    run_cpu(db, sid)
    result, cands = rows(db, sid)
    assert len(cands) >= 4
    for c in cands:
        assert c.samples is not None and 1 <= c.samples <= 4
        assert c.time_min is not None and 0 < c.time_min <= c.kernel_time
        assert c.time_iqr is not None and c.time_iqr >= 0
    again = [c for c in cands if c.remeasured]
    assert len(again) == 3
    fastest = min(again, key=lambda c: c.kernel_time)
    assert result.perf_config == fastest.perf_config
    runner_up = sorted(c.kernel_time for c in again)[1]
    assert result.winner_margin == pytest.approx(runner_up / fastest.kernel_time - 1, rel=1e-6)
    assert result.winner_noise is not None and result.winner_noise >= 0

    (winner,) = winners.winners(db, sid)
    assert winner.winner_margin == pytest.approx(result.winner_margin)
    assert winner.within_noise == (result.winner_margin <= result.winner_noise)
    (row,) = explore.winners_page(db, sid, explore.WinnerFilter()).rows  # the dashboard's
    assert row.winner_margin == pytest.approx(result.winner_margin)
    assert row.winner_noise == pytest.approx(result.winner_noise)
    data = cli(db_url, "results", "--session", str(sid), "--json").json()
    assert data[0]["winner_margin"] == pytest.approx(result.winner_margin)
    assert data[0]["within_noise"] == winner.within_noise
    table = cli(db_url, "results", "--session", str(sid))
    assert (
        table.code == 0
        and "margin" in table.stdout
        and f"{result.winner_margin:+.1%}" in (table.stdout)
    )


def test_topk_is_a_session_setting(db, db_url, tmp_path) -> None:
    sid = cpu_session(db, tmp_path, topk=1)
    assert sessions.get(db, sid).topk == 1
    run_cpu(db, sid)
    result, cands = rows(db, sid)
    assert not any(c.remeasured for c in cands)
    # The margin then comes from the search itself.
    assert result.winner_margin is not None and result.winner_margin >= 0
    new = cli(db_url, "session", "new", "--tuner", "cpu", "--topk", "5", "--json")
    assert new.code == 0 and new.json()["topk"] == 5
    with pytest.raises(UserError, match="--topk 0"):
        sessions.create(db, SessionSpec(tuner="cpu", topk=0))


# --- the rocmlir tuner: E3 measurements, E4's --two-stage-topk ----------------------------------

# A gemm whose stand-in kernels take 1 ms and more (2 * 8192 * 4096^2 flops at <= 150 TFlops).
LARGE_GEMM = "-t f16 -out_datatype f16 -transA false -transB false -g 1 -m 8192 -n 4096 -k 4096"


def test_rocmlir_e3_stats_become_candidate_statistics(db, tmp_path, build, monkeypatch):
    monkeypatch.setenv("FAKE_TUNINGRUNNER_ERA", "E3")
    monkeypatch.setenv("FAKE_TUNINGRUNNER_LOG", str(tmp_path / "argv.log"))
    sid = rocmlir_session(db, tmp_path, "gemm", line=LARGE_GEMM)
    assert work(db, sid, build).stats.completed == 1
    result, cands = rows(db, sid)
    valid = [c for c in cands if c.tflops]
    # Kernels of 1 ms and more: the Stats column (min/median/max/stddev/cv, in ms) gives a
    # spread in ns but no sample count. The fastest run lies just under the time (the median).
    assert valid and all(c.kernel_time > 1e6 for c in valid)
    assert all(c.samples is None and c.time_iqr > 0 for c in valid)
    assert all(0.97 * c.kernel_time < c.time_min <= c.kernel_time * (1 + 1e-5) for c in valid)
    assert not any(c.remeasured for c in cands)  # E3 has no two-stage tuning
    # Without a count the notch is unknown, not zero.
    assert result.winner_margin is not None and result.winner_noise is None
    argv = json.loads((tmp_path / "argv.log").read_text().splitlines()[-1])["argv"]
    assert not any(a.startswith("--two-stage-topk") for a in argv)


def test_rocmlir_e3_small_kernels_store_no_spread(db, tmp_path, build, monkeypatch):
    # Sub-ms kernels: the driver's legacy mode timed each with one CPU timer
    # ({total_cpu_time, iterations}): their mean is the time, and no min or IQR is invented.
    monkeypatch.setenv("FAKE_TUNINGRUNNER_ERA", "E3")
    sid = rocmlir_session(db, tmp_path, "gemm")
    assert work(db, sid, build).stats.completed == 1
    result, cands = rows(db, sid)
    valid = [c for c in cands if c.tflops]
    assert valid and all(c.kernel_time < 1e6 for c in valid)
    assert all((c.time_min, c.time_iqr, c.samples) == (None, None, None) for c in valid)
    assert result.winner_margin is not None and result.winner_noise is None


@pytest.mark.parametrize("era", ["E3-with-E4-flag", "E4"])
def test_rocmlir_two_stage_topk_where_the_tool_has_it(db, tmp_path, build, monkeypatch, era):
    if era == "E4":
        monkeypatch.setenv("FAKE_TUNINGRUNNER_ERA", "E4")
    else:
        monkeypatch.setenv("FAKE_TUNINGRUNNER_TWO_STAGE", "1")
    monkeypatch.setenv("FAKE_TUNINGRUNNER_LOG", str(tmp_path / "argv.log"))
    sid = rocmlir_session(db, tmp_path, "gemm", space="full")
    assert work(db, sid, build).stats.completed == 1
    argv = json.loads((tmp_path / "argv.log").read_text().splitlines()[-1])["argv"]
    assert "--two-stage-topk=3" in argv
    result, cands = rows(db, sid)
    valid = [c for c in cands if c.tflops]
    assert len(valid) == 3 and all(c.remeasured for c in valid)
    assert result.perf_config == max(valid, key=lambda c: c.tflops).perf_config
    assert all(("top k" in (c.error or "")) or "Discarded" in (c.error or "") for c in cands
               if not c.tflops)  # fmt: skip
    assert result.winner_margin is not None and result.winner_margin >= 0


# --- compare: noise is not a regression ----------------------------------------------------------


def test_compare_separates_noise_from_regression(db, db_url, tmp_path) -> None:
    noisy, real, changed = gemm(64), gemm(128), gemm(256)
    a, b = new_session(db), new_session(db)
    # noise: 6 % slower, each median +- 0.0628 * 1.57 ... notches of a 20 % IQR overlap;
    # real: 30 % slower with a 2 % IQR; changed: B's winner differs, B also timed A's one.
    record(
        db, tmp_path, a,
        {noisy: [cand(noisy, "p1", 1e5, 0.2)], real: [cand(real, "p1", 1e5)],
         changed: [cand(changed, "old", 1e5)]},
        {noisy: "p1", real: "p1", changed: "old"},
    )  # fmt: skip
    record(
        db, tmp_path, b,
        {noisy: [cand(noisy, "p1", 1.06e5, 0.2)], real: [cand(real, "p1", 1.3e5)],
         changed: [cand(changed, "new", 1.2e5), cand(changed, "old", 1.25e5)]},
        {noisy: "p1", real: "p1", changed: "new"},
    )  # fmt: skip
    side_a, side_b = compare.load_sides(str(a), str(b), None, lambda: db)
    c = compare.compare(side_a, side_b, threshold=0.05)
    assert [r.test_vector for r in c.within_noise] == [noisy]
    assert [r.test_vector for r in c.regressions] == [real, changed]
    (moved,) = (r for r in c.regressions if r.test_vector == changed)
    flops = parse("gemm", changed).flops()
    assert moved.tflops_a_in_b == pytest.approx(flops / 1.25e5 / 1e3)
    assert moved.noise_a == pytest.approx(1.57 * 0.02 / 5)
    assert c.within_noise[0].within_noise and not moved.within_noise

    run = cli(db_url, "compare", str(a), str(b), "--fail-on-regression", "--json")
    assert run.code == 1 and len(run.json()["within_noise"]) == 1
    # It says what it counted: beyond noise only, by kind, and what it left out.
    assert run.stderr.strip() == (
        "failed: 2 findings fail the gate (1 regression, 1 slower, 0 missing; threshold 5%); "
        "not counted: 1 noise"
    )
    only = cli(db_url, "compare", str(a), str(b), "--fail-on-regression", "--changed-winner-only")
    assert only.code == 1 and only.stderr.strip() == (
        "failed: 1 findings fail the gate (1 regression, 0 missing; threshold 5%); "
        "not counted: 1 noise, 1 slower (--changed-winner-only)"
    )
    # The dashboard's compare page splits them the same way, with a noise column and links.
    ro = open_read_only(db_url)
    try:
        page = (
            TestClient(create_app(ro), base_url="http://127.0.0.1")
            .get(f"/api/compare?a={a}&b={b}")
            .json()
        )
    finally:
        ro.dispose()
    assert [r["test_vector"] for r in page["regressions_changed"]] == [changed]
    assert [r["test_vector"] for r in page["regressions_same"]] == [real]
    assert [r["test_vector"] for r in page["within_noise"]] == [noisy]
    assert page["regressions_total"] == 2 and page["within_noise_total"] == 1
    (row,) = page["within_noise"]
    assert row["noise"] == pytest.approx(max(row["noise_a"], row["noise_b"]))
    with db.session() as s:
        pid = s.scalar(sa.select(Problem.id).where(Problem.test_vector == noisy))
    assert row["problem_id"] == pid and row["label"] == noisy
    shown = cli(db_url, "compare", str(a), str(b))
    assert shown.code == 0 and "noise: a drop past the threshold within" in " ".join(
        shown.stdout.split()
    )
    # Past a 50 % threshold nothing regresses: nothing fails.
    quiet = cli(db_url, "compare", str(a), str(b), "--threshold", "50%", "--fail-on-regression")
    assert quiet.code == 0


def test_without_a_spread_every_drop_past_the_threshold_counts() -> None:
    tv = gemm(64)
    a = compare.Side("a", {tv: compare.Entry("p", 10.0)})
    b = compare.Side("b", {tv: compare.Entry("p", 9.0, 0.5)})
    c = compare.compare(a, b, 0.05)
    assert len(c.regressions) == 1 and not c.within_noise
    assert math.isclose(c.regressions[0].ratio, 0.9)
