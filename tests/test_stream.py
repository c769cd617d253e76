"""The benchmark stream and compile batches (issue 24 §1), on every backend.

A split session's GPU worker whose tool offers the proposed `--benchmark-stream` (the stand-in
with FAKE_TUNINGRUNNER_STREAM=1) starts one benchmark process and feeds it each bundle as it is
unpacked; each job is recorded as its reply arrives. Leases hold (a job lost before it is fed
is never fed, one lost after is not recorded), a killed stream retries the job it was on and
gives back the ones behind it, a stopping worker gives back what it did not feed. Compile
workers with --batch K compile K problems in one --compile-only call, split into one bundle
per problem; one bad problem never fails the others."""

from __future__ import annotations

import datetime as dt
import itertools
import json
import os
import signal
import threading
import time
from pathlib import Path

import pytest
import sqlalchemy as sa
from support.rocmlir import work, worker_settings
from support.standin import standin_build
from support.streamrace import LeasesLostInStream, assert_each_recorded_from_its_second_attempt
from support.twostage import count, gemm, problems, recorded, session, states

import mlirtuna.tuners.rocmlir.stream as rocmlir_stream
import mlirtuna.worker.stream as worker_stream
from mlirtuna import catalog, keys
from mlirtuna.db.models import BENCHMARK, COMPILE, RUNNING, Attempt, Bundle, Job, Result
from mlirtuna.queue import bundles, jobs
from mlirtuna.tuners.rocmlir import RocmlirTuner
from mlirtuna.worker import Worker, WorkerSettings, supervisor

# The flow over whole workers: each backend in .ci/run, SQLite in the quick loop (the
# queue, claim and settle SQL it runs is tested on all three there too).
pytestmark = pytest.mark.backends(fast=("sqlite",))

BENCH_MS = "50"  # per candidate; `quick` has 8 in the stand-in: 0.4 s per bundle


@pytest.fixture
def build(tmp_path, monkeypatch):
    # GPU stretches are logged from 1 ms on
    return standin_build(
        tmp_path,
        monkeypatch,
        era="E4",
        FAKE_TUNINGRUNNER_STREAM="1",
        FAKE_TUNINGRUNNER_LOG=str(tmp_path / "tool.jsonl"),
        FAKE_TUNINGRUNNER_GPU_LOG=str(tmp_path / "gpu.jsonl"),
        FAKE_TUNINGRUNNER_BENCH_MS="1",
    )


def tool_calls(tmp_path: Path) -> list[dict]:
    path = tmp_path / "tool.jsonl"
    lines = path.read_text().splitlines() if path.exists() else []
    return [json.loads(line) for line in lines if "--help" not in json.loads(line)["argv"]]


def streams(tmp_path: Path) -> list[dict]:
    return [c for c in tool_calls(tmp_path) if rocmlir_stream.STREAM_FLAG in c["argv"]]


def with_flag(tmp_path: Path, prefix: str) -> list[list[str]]:
    return [c["argv"] for c in tool_calls(tmp_path) if any(a.startswith(prefix) for a in c["argv"])]


def stretches(tmp_path: Path) -> list[dict]:
    path = tmp_path / "gpu.jsonl"
    lines = path.read_text().splitlines() if path.exists() else []
    return sorted((json.loads(line) for line in lines), key=lambda e: e["start"])


def benchmark_jobs(db, sid: int) -> list:
    with db.session() as s:
        return s.execute(
            sa.select(Job.id, Job.problem_id, Job.state, Job.retries, Job.result)
            .where(Job.session_id == sid, Job.stage == BENCHMARK)
            .order_by(Job.priority, Job.id)
        ).all()


def compiled_session(db, tmp_path, build, n: int) -> int:
    problems(db, tmp_path, n)
    sid = session(db, build)
    work(db, sid, build, "compile")
    return sid


def test_the_tool_offers_the_stream_only_where_its_help_shows_it(build, monkeypatch):
    assert RocmlirTuner(str(build)).can_stream()
    monkeypatch.delenv("FAKE_TUNINGRUNNER_STREAM")
    tuner = RocmlirTuner(str(build))
    tuner.check_split()  # still an E4 that splits: only the stream is gone
    assert not tuner.can_stream()


def test_a_stream_worker_drains_a_split_session_recording_every_job_once(db, tmp_path, build):
    sid = compiled_session(db, tmp_path, build, 6)
    gpu = work(db, sid, build, "gpu")
    assert gpu.stats.completed == 6 and gpu.stats.lost == 0
    assert states(db, sid) == {("compile", "completed"): 6, ("benchmark", "completed"): 6}
    assert len(streams(tmp_path)) == 1  # one process, started once
    assert with_flag(tmp_path, "--benchmark-artifacts=") == []
    assert len(stretches(tmp_path)) == 6
    runs = stretches(tmp_path)
    assert all(a["end"] <= b["start"] for a, b in itertools.pairwise(runs))
    with db.session() as s:
        attempts = s.scalar(
            sa.select(sa.func.count())
            .select_from(Attempt)
            .join(Job, Job.id == Attempt.job_id)
            .where(Job.session_id == sid, Job.stage == BENCHMARK)
        )
    assert attempts == 6 and count(db, Result, Result.session_id == sid) == 6
    assert count(db, Bundle) == 0
    # The same problems through today's batch path record exactly the same.
    other = session(db, build)
    work(db, other, build, "compile")
    work(db, other, build, "gpu", stream=False, batch=4)
    assert recorded(db, sid) == recorded(db, other)


def test_a_job_whose_lease_is_lost_before_it_is_fed_is_never_fed(db, tmp_path, build, monkeypatch):
    sid = compiled_session(db, tmp_path, build, 4)
    target = benchmark_jobs(db, sid)[2].id
    real = worker_stream.stages.prepare

    def prepare(runner, leases):  # its lease taken away between its claim and its feed
        if leases[0].job_id == target:
            assert jobs.cancel(db, sid, target) == 1
        return real(runner, leases)

    monkeypatch.setattr(worker_stream.stages, "prepare", prepare)
    gpu = work(db, sid, build, "gpu")
    assert gpu.stats.completed == 3 and gpu.stats.lost == 1
    assert len(stretches(tmp_path)) == 3  # never benchmarked
    (job,) = [j for j in benchmark_jobs(db, sid) if j.id == target]
    assert job.state == "cancelled"
    assert count(db, Result, Result.problem_id == job.problem_id, Result.session_id == sid) == 0


def test_a_fed_job_whose_lease_is_lost_is_not_recorded(db, tmp_path, build, monkeypatch):
    sid = compiled_session(db, tmp_path, build, 4)
    target = benchmark_jobs(db, sid)[1]
    real = rocmlir_stream.Stream.feed

    def feed(self, key, problem, artifacts):  # taken away once it is in the stream
        real(self, key, problem, artifacts)
        if key.startswith(f"job-{target.id}-"):
            assert jobs.cancel(db, sid, target.id) == 1

    monkeypatch.setattr(rocmlir_stream.Stream, "feed", feed)
    gpu = work(db, sid, build, "gpu")
    assert gpu.stats.completed == 3 and gpu.stats.lost == 1
    assert len(stretches(tmp_path)) == 4  # it was benchmarked; its reply was not recorded
    (job,) = [j for j in benchmark_jobs(db, sid) if j.id == target.id]
    assert job.state == "cancelled"
    assert count(db, Result, Result.problem_id == target.problem_id, Result.session_id == sid) == 0


def test_a_job_claimed_again_while_its_old_attempt_is_in_the_stream_is_recorded_once(
    db, tmp_path, build, monkeypatch
):
    sid = compiled_session(db, tmp_path, build, 2)

    def lose() -> None:  # both leases run out (as in a server restart longer than the lease)
        with db.session() as s:
            s.execute(
                sa.update(Job)
                .where(Job.session_id == sid, Job.stage == BENCHMARK, Job.state == RUNNING)
                .values(lease_expires_at=dt.datetime(2000, 1, 1))
            )

    race = LeasesLostInStream(monkeypatch, 2, lose)
    try:
        gpu = work(db, sid, build, "gpu", max_retries=3, job_timeout_s=10)
    finally:
        race.release()
    assert_each_recorded_from_its_second_attempt(db, sid, gpu, race, 2)
    assert len(streams(tmp_path)) == 1  # never stopped as hung


def test_foreign_replies_cost_no_job_its_reply(db, tmp_path, build, monkeypatch):
    # 200,000 reply lines naming no request of ours after the first reply (issue 43 §4): they
    # are dropped as they are read, never queued ahead of our replies, and no job times out.
    sid = compiled_session(db, tmp_path, build, 3)
    monkeypatch.setenv("FAKE_TUNINGRUNNER_STREAM_FOREIGN", "200000")
    gpu = work(db, sid, build, "gpu", max_retries=0, job_timeout_s=10)
    assert [j.state for j in benchmark_jobs(db, sid)] == ["completed"] * 3
    assert gpu.stats.completed == 3 and gpu.stats.failed == 0
    assert len(streams(tmp_path)) == 1


def test_a_stream_that_exits_at_start_falls_back_to_calls(db, tmp_path, build, monkeypatch, caplog):
    sid = compiled_session(db, tmp_path, build, 4)
    monkeypatch.setenv("FAKE_TUNINGRUNNER_FAULT", "stream_exit")
    with caplog.at_level("WARNING", logger="mlirtuna.worker.stream"):
        gpu = work(db, sid, build, "gpu", max_retries=0)
    rows = benchmark_jobs(db, sid)
    assert [j.state for j in rows] == ["completed"] * 4 and [j.retries for j in rows] == [0] * 4
    assert gpu.stats.completed == 4 and gpu.stats.failed == 0
    assert len(streams(tmp_path)) == 1  # tried once, never started again
    assert len(with_flag(tmp_path, "--benchmark-artifacts=")) == 4
    said = [r.getMessage() for r in caplog.records if "benchmarking in calls" in r.getMessage()]
    assert len(said) == 1


@pytest.mark.slow  # kills and signals a worker's stream
def test_a_stream_killed_mid_job_retries_that_job_and_loses_nothing(
    db, tmp_path, build, monkeypatch
):
    sid = compiled_session(db, tmp_path, build, 6)
    monkeypatch.setenv("FAKE_TUNINGRUNNER_BENCH_MS", BENCH_MS)
    killed: list[int] = []

    def kill_after_the_first_bundle() -> None:
        deadline = time.monotonic() + 60
        while time.monotonic() < deadline and not stretches(tmp_path):
            time.sleep(0.01)
        time.sleep(0.1)  # the next bundle is benchmarking now (0.4 s)
        (first,) = streams(tmp_path)
        os.kill(first["pid"], signal.SIGKILL)
        killed.append(first["pid"])

    killer = threading.Thread(target=kill_after_the_first_bundle, daemon=True)
    killer.start()
    gpu = work(db, sid, build, "gpu", max_retries=2)
    killer.join(5)
    assert killed
    assert len(streams(tmp_path)) == 2  # started again
    rows = benchmark_jobs(db, sid)
    assert [j.state for j in rows] == ["completed"] * 6
    assert sorted(j.retries for j in rows) == [0] * 5 + [1]  # only the job it was on
    assert count(db, Result, Result.session_id == sid) == 6
    assert gpu.stats.failed == 1 and gpu.stats.completed == 6
    assert gpu.stats.released >= 1  # the ones fed behind it went back, no retry counted


@pytest.mark.slow  # waits out a timeout
def test_a_hung_stream_is_stopped_at_the_job_timeout_and_started_again(
    db, tmp_path, build, monkeypatch
):
    sid = compiled_session(db, tmp_path, build, 3)
    monkeypatch.setenv("FAKE_TUNINGRUNNER_FAULT", "stream_hang")
    monkeypatch.setenv("FAKE_TUNINGRUNNER_FAULT_CONFIG", "-m 128 ")
    gpu = work(db, sid, build, "gpu", max_retries=0, job_timeout_s=0.5)
    rows = benchmark_jobs(db, sid)
    (hung,) = [j for j in rows if j.state != "completed"]
    assert hung.state == "error" and "timed out" in hung.result
    assert gpu.stats.completed == 2  # the one fed behind it went back, then ran
    assert len(streams(tmp_path)) == 2


def test_a_request_the_stream_skips_fails_once_a_later_one_is_answered(
    db, tmp_path, build, monkeypatch
):
    # Replies come in order: once the request fed after it is answered, the skipped one's
    # never will be. Its job fails then (a retry counted), not at the job timeout after the
    # others, and the stream is not stopped as hung.
    sid = compiled_session(db, tmp_path, build, 3)
    monkeypatch.setenv("FAKE_TUNINGRUNNER_FAULT", "stream_skip")
    monkeypatch.setenv("FAKE_TUNINGRUNNER_FAULT_CONFIG", "-m 128 ")
    gpu = work(db, sid, build, "gpu", max_retries=0, job_timeout_s=30)
    (skipped,) = [j for j in benchmark_jobs(db, sid) if j.state != "completed"]
    assert skipped.state == "error" and "never this request" in skipped.result
    assert gpu.stats.completed == 2 and gpu.stats.failed == 1
    assert len(streams(tmp_path)) == 1


def test_a_request_the_stream_fails_fails_only_its_job(db, tmp_path, build, monkeypatch):
    sid = compiled_session(db, tmp_path, build, 4)
    monkeypatch.setenv("FAKE_TUNINGRUNNER_FAULT", "gpu_timeout")
    monkeypatch.setenv("FAKE_TUNINGRUNNER_FAULT_CONFIG", "-m 128 ")
    gpu = work(db, sid, build, "gpu", max_retries=0)
    assert gpu.stats.completed == 3
    assert len(streams(tmp_path)) == 1  # a request's failure does not end the stream
    (bad,) = [j for j in benchmark_jobs(db, sid) if j.state != "completed"]
    assert bad.state == "error" and "GPU run timed out" in bad.result


@pytest.mark.slow  # kills and signals a worker's stream
def test_a_stopping_stream_worker_gives_back_what_it_did_not_feed(db, tmp_path, build, monkeypatch):
    sid = compiled_session(db, tmp_path, build, 8)
    monkeypatch.setenv("FAKE_TUNINGRUNNER_BENCH_MS", BENCH_MS)
    gpu = Worker(db, worker_settings(sid, build, "gpu"))

    def stop_after_the_first() -> None:
        deadline = time.monotonic() + 60
        while time.monotonic() < deadline:
            if any(j.state == "completed" for j in benchmark_jobs(db, sid)):
                gpu.stop_requested.set()
                return
            time.sleep(0.01)

    watcher = threading.Thread(target=stop_after_the_first, daemon=True)
    watcher.start()
    gpu.run()
    watcher.join(5)
    rows = benchmark_jobs(db, sid)
    done = [j for j in rows if j.state == "completed"]
    assert 1 <= len(done) <= 1 + worker_stream.STREAM_DEPTH  # what was fed still finished
    assert {j.state for j in rows} == {"completed", "new"}  # none left running
    assert all(j.retries == 0 for j in rows)
    assert count(db, Bundle, Bundle.complete.is_(True)) == 8 - len(done)
    monkeypatch.setenv("FAKE_TUNINGRUNNER_BENCH_MS", "1")  # what is left: its count, not its timing
    assert work(db, sid, build, "gpu").stats.completed == 8 - len(done)


# -- compile batches -------------------------------------------------------------------------
def test_a_compile_batch_is_one_call_split_into_a_bundle_per_problem(db, tmp_path, build):
    problems(db, tmp_path, 5)
    sid = session(db, build)
    compiler = work(db, sid, build, "compile", batch=4)
    assert compiler.stats.completed == 5
    assert len(with_flag(tmp_path, "--compile-only=")) == 2  # 4 problems, then 1
    with db.session() as s:
        wanted = dict(
            s.execute(
                sa.select(Job.problem_id, Job.id).where(Job.session_id == sid, Job.stage == COMPILE)
            ).all()
        )
    for n, problem_id in enumerate(sorted(wanted)):
        fetched = bundles.fetch(db, sid, problem_id)
        dest = tmp_path / f"unpacked-{n}"
        bundles.unpack(fetched.data, dest)
        index = json.loads((dest / "index.json").read_text())
        (entry,) = index["problems"].values()  # exactly its own problem
        (digest,) = index["problems"]
        assert (dest / "problems" / digest / "manifest.json.z").is_file()
        assert [p.name for p in (dest / "problems").iterdir()] == [digest]
        with db.session() as s:
            problem = catalog.load_problem(s, problem_id)
        # the tool's canonical form: E4 spells -transO, matched back in the stored form
        assert keys.stored_vector(entry["testVector"], problem.op) == problem.canonical()
        assert "-transO false" in entry["testVector"]
    assert work(db, sid, build, "gpu").stats.completed == 5


def test_one_bad_problem_in_a_compile_batch_does_not_fail_the_others(
    db, tmp_path, build, monkeypatch
):
    problems(db, tmp_path, 4)
    sid = session(db, build)
    monkeypatch.setenv("FAKE_TUNINGRUNNER_FAULT", "fail")
    monkeypatch.setenv("FAKE_TUNINGRUNNER_FAULT_CONFIG", gemm(128))
    compiler = work(db, sid, build, "compile", batch=4, max_retries=0)
    assert compiler.stats.completed == 3
    with db.session() as s:
        rows = s.execute(
            sa.select(Job.state, Job.retries, Job.result).where(
                Job.session_id == sid, Job.stage == COMPILE
            )
        ).all()
    good = [r for r in rows if r.state == "completed"]
    (bad,) = [r for r in rows if r.state != "completed"]
    assert len(good) == 3 and all(r.retries == 0 for r in good)  # no retry for the shared call
    assert bad.state == "error" and "Compilation failed" in bad.result
    # E4 discards only the failed problem and keeps the others (exit 1): the call of four
    # hands out the three it compiled, the bad one is compiled again alone: two calls.
    assert len(with_flag(tmp_path, "--compile-only=")) == 2


def test_no_stream_reaches_every_worker_process():
    argv = supervisor.worker_argv(WorkerSettings(session_id=1, stream=False), supervisor.Slot(0))
    assert "--no-stream" in argv
    default = supervisor.worker_argv(WorkerSettings(session_id=1), supervisor.Slot(0))
    assert "--no-stream" not in default
