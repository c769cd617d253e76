"""A split session's GPU worker never waits on itself (issue 24 §1), on every backend: it waits
(bounded) for a full batch while compile jobs are open, prefetches batch N+1 (claim, fetch,
unpack) while call N benchmarks, drops a prefetched job whose lease was lost before it runs, and
gives prefetched jobs back when it stops."""

from __future__ import annotations

import json
import logging
import threading
import time
from collections.abc import Callable
from pathlib import Path

import pytest
import sqlalchemy as sa
from support.clitools import cli
from support.rocmlir import work, worker_settings
from support.standin import standin_build
from support.twostage import count, problems, session, states

from mlirtuna.db.models import BENCHMARK, RUNNING, Attempt, Bundle, Job, Result
from mlirtuna.queue import jobs
from mlirtuna.worker import Worker, WorkerSettings, supervisor

BENCH_MS = "50"  # per candidate; `quick` has 8 in the stand-in: 0.4 s per bundle


@pytest.fixture
def build(tmp_path, monkeypatch):
    # GPU stretches are logged from 1 ms on
    return standin_build(
        tmp_path,
        monkeypatch,
        era="E4",
        FAKE_TUNINGRUNNER_LOG=str(tmp_path / "tool.jsonl"),
        FAKE_TUNINGRUNNER_GPU_LOG=str(tmp_path / "gpu.jsonl"),
        FAKE_TUNINGRUNNER_BENCH_MS="1",
    )


def benchmark_calls(tmp_path: Path) -> list[list[str]]:
    lines = (tmp_path / "tool.jsonl").read_text().splitlines()
    calls = [json.loads(line)["argv"] for line in lines]
    return [a for a in calls if any(x.startswith("--benchmark-artifacts=") for x in a)]


def stretches(tmp_path: Path) -> list[dict]:
    """The stand-in's benchmarking stretches (one per bundle), in time order."""
    path = tmp_path / "gpu.jsonl"
    lines = path.read_text().splitlines() if path.exists() else []
    return sorted((json.loads(line) for line in lines), key=lambda e: e["start"])


def gpu_settings(sid: int, build: Path, **changes) -> WorkerSettings:
    return worker_settings(sid, build, "gpu", **{"batch": 4, **changes})


def while_compiling(db, sid: int, build: Path, settings: WorkerSettings) -> Worker:
    """Run a GPU worker while a compile worker (a thread) compiles the session's problems."""
    compiler = threading.Thread(target=work, args=(db, sid, build, "compile"), daemon=True)
    compiler.start()
    try:
        gpu = Worker(db, settings)
        gpu.run()
    finally:
        compiler.join(120)
    return gpu


def benchmark_jobs(db, sid: int) -> list:
    """The session's benchmark jobs in claim order (priority, id)."""
    with db.session() as s:
        return s.execute(
            sa.select(Job.id, Job.problem_id, Job.state, Job.retries)
            .where(Job.session_id == sid, Job.stage == BENCHMARK)
            .order_by(Job.priority, Job.id)
        ).all()


def when_second_batch_claimed(db, sid: int, then: Callable[[int], None]) -> threading.Thread:
    """A thread that waits until the 5th benchmark job (batch 2) is running, i.e. claimed by
    the prefetch while call 1 benchmarks, and calls `then(job_id)`."""

    def watch() -> None:
        deadline = time.monotonic() + 120
        while time.monotonic() < deadline:
            fifth = benchmark_jobs(db, sid)[4]
            if fifth.state == RUNNING:
                then(fifth.id)
                return
            time.sleep(0.02)

    thread = threading.Thread(target=watch, daemon=True)
    thread.start()
    return thread


@pytest.mark.slow  # times a stand-in's benchmark calls
def test_a_gpu_worker_waits_for_a_full_batch_while_compiles_run(db, tmp_path, build, monkeypatch):
    problems(db, tmp_path, 4)
    sid = session(db, build)
    monkeypatch.setenv("FAKE_TUNINGRUNNER_COMPILE_MS", "40")  # 0.3 s per compile call
    gpu = while_compiling(db, sid, build, gpu_settings(sid, build, batch_wait_s=120))
    assert gpu.stats.completed == 4
    assert states(db, sid) == {("compile", "completed"): 4, ("benchmark", "completed"): 4}
    # The bundles came one by one, yet one call held all four.
    assert len(benchmark_calls(tmp_path)) == 1
    assert len(stretches(tmp_path)) == 4


@pytest.mark.slow  # times a stand-in's benchmark calls
def test_without_the_wait_a_call_takes_what_is_ready(db, tmp_path, build, monkeypatch):
    """The contrast: --batch-wait 0 starts a call with the first bundle ready."""
    problems(db, tmp_path, 4)
    sid = session(db, build)
    monkeypatch.setenv("FAKE_TUNINGRUNNER_COMPILE_MS", "100")  # 0.8 s per compile call
    gpu = while_compiling(db, sid, build, gpu_settings(sid, build, batch_wait_s=0, prefetch=False))
    assert gpu.stats.completed == 4
    assert len(benchmark_calls(tmp_path)) > 1


@pytest.mark.slow  # times a stand-in's benchmark calls
def test_the_next_batch_is_unpacked_while_the_current_call_benchmarks(
    db, tmp_path, build, monkeypatch, caplog
):
    problems(db, tmp_path, 8)
    sid = session(db, build)
    work(db, sid, build, "compile")
    monkeypatch.setenv("FAKE_TUNINGRUNNER_BENCH_MS", BENCH_MS)
    with caplog.at_level(logging.INFO, logger="mlirtuna.worker.prefetch"):
        gpu = Worker(db, gpu_settings(sid, build))
        gpu.run()
    assert gpu.stats.completed == 8 and gpu.stats.prefetched == 1
    assert len(benchmark_calls(tmp_path)) == 2
    runs = stretches(tmp_path)
    assert len(runs) == 8
    (prefetched,) = [r for r in caplog.records if "prefetched" in r.getMessage()]
    assert "4 bundles" in prefetched.getMessage()
    # Batch 2's bundles were fetched and unpacked before call 1 finished benchmarking.
    assert prefetched.created < runs[3]["end"]
    assert runs[3]["end"] <= runs[4]["start"]  # one benchmark at a time on the GPU
    assert count(db, Bundle) == 0


@pytest.mark.slow  # times a stand-in's benchmark calls
def test_a_prefetched_job_whose_lease_is_lost_is_dropped_before_it_runs(
    db, tmp_path, build, monkeypatch
):
    problems(db, tmp_path, 8)
    sid = session(db, build)
    work(db, sid, build, "compile")
    monkeypatch.setenv("FAKE_TUNINGRUNNER_BENCH_MS", BENCH_MS)
    stolen: list[int] = []

    def steal(job_id: int) -> None:  # its lease taken away: cancelled while prefetched
        assert jobs.cancel(db, sid, job_id) == 1
        stolen.append(job_id)

    watcher = when_second_batch_claimed(db, sid, steal)
    gpu = Worker(db, gpu_settings(sid, build))
    gpu.run()
    watcher.join(5)
    (job_id,) = stolen
    assert gpu.stats.completed == 7 and gpu.stats.lost == 1
    assert len(stretches(tmp_path)) == 7  # never benchmarked
    (job,) = [j for j in benchmark_jobs(db, sid) if j.id == job_id]
    assert job.state == "cancelled"  # nothing recorded for it
    assert count(db, Result, Result.problem_id == job.problem_id, Result.session_id == sid) == 0


@pytest.mark.slow  # times a stand-in's benchmark calls
def test_a_stopping_worker_gives_its_prefetched_jobs_back(db, tmp_path, build, monkeypatch):
    problems(db, tmp_path, 8)
    sid = session(db, build)
    work(db, sid, build, "compile")
    monkeypatch.setenv("FAKE_TUNINGRUNNER_BENCH_MS", BENCH_MS)
    gpu = Worker(db, gpu_settings(sid, build))
    watcher = when_second_batch_claimed(db, sid, lambda _: gpu.stop_requested.set())
    gpu.run()
    watcher.join(5)
    assert gpu.stats.completed == 4 and gpu.stats.released == 4
    assert len(benchmark_calls(tmp_path)) == 1
    rows = benchmark_jobs(db, sid)
    assert [j.state for j in rows] == ["completed"] * 4 + ["new"] * 4
    assert all(j.retries == 0 for j in rows)  # no retry counted
    with db.session() as s:
        outcomes = s.scalars(
            sa.select(Attempt.outcome).where(Attempt.job_id.in_([j.id for j in rows[4:]]))
        ).all()
    assert outcomes == ["released"] * 4
    assert count(db, Bundle, Bundle.complete.is_(True)) == 4  # kept for whoever takes them
    monkeypatch.setenv("FAKE_TUNINGRUNNER_BENCH_MS", "1")  # what is left: its count, not its timing
    assert work(db, sid, build, "gpu", batch=4).stats.completed == 4


def test_batch_wait_and_prefetch_reach_every_worker_process():
    settings = WorkerSettings(session_id=1, batch=4, batch_wait_s=0.5, prefetch=False)
    argv = supervisor.worker_argv(settings, supervisor.Slot(0))
    at = argv.index("--batch-wait")
    assert argv[at + 1] == "0.5" and "--no-prefetch" in argv
    default = supervisor.worker_argv(WorkerSettings(session_id=1, batch=4), supervisor.Slot(0))
    assert "--batch-wait" not in default and "--no-prefetch" not in default


def test_a_negative_batch_wait_is_refused(db_url):
    run = cli(db_url, "worker", "--session", "1", "--batch", "4", "--batch-wait", "-1")
    assert run.code == 2
    assert run.stderr.strip().splitlines() == ["error: --batch-wait -1: give 0 or more seconds"]
