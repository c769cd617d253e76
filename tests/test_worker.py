"""Real worker processes against every backend: draining, chaos, pauses, signals, outages.

These start `python -m mlirtuna worker` as subprocesses and signal them, as an operator would.
"""

from __future__ import annotations

import contextlib
import itertools
import random
import signal
import time

import pytest
import sqlalchemy as sa
from plugins.claimlog import read_log
from support.workers import (
    assert_done_exactly_once,
    assert_never_held_twice,
    claimed_with_record,
    finish,
    job_states,
    make_session,
    running_job,
    start_worker,
    stderr_of,
    wait_for,
    wait_past_lease,
)

from mlirtuna import catalog
from mlirtuna.db import Database
from mlirtuna.db.models import Attempt, Job
from mlirtuna.queue import jobs

# The flow over whole workers: each backend in .ci/run, SQLite in the quick loop (the
# queue, claim and settle SQL it runs is tested on all three there too).
pytestmark = pytest.mark.backends(fast=("sqlite",))


@pytest.mark.slow  # worker processes: chaos, signals, pauses
def test_four_workers_drain_500_jobs_exactly_once(db, db_url, tmp_path):
    sid = make_session(db, tmp_path, 500)
    log = tmp_path / "claims.log"
    procs = [start_worker(db_url, sid, log, "--until-empty", barrier=4) for _ in range(4)]
    finish(procs)
    assert [p.returncode for p in procs] == [0, 0, 0, 0], stderr_of(procs[0])
    assert_done_exactly_once(db, sid, 500)
    rows = read_log(log)
    starts = [r for r in rows if r[0] == "start"]
    assert len(starts) == 500 and len({r[3] for r in starts}) == 500  # each tuned once
    assert len({r[1] for r in starts}) == 4  # and all four workers took part
    assert_never_held_twice(rows)


# --batch 4: each worker holds up to four leases at once; a kill leaves them all to expire.
BATCHES = [1, pytest.param(4, marks=pytest.mark.slow)]


@pytest.mark.parametrize("batch", BATCHES)
@pytest.mark.slow  # worker processes: chaos, signals, pauses
def test_chaos_sigkill_and_restart_loses_nothing(db, db_url, tmp_path, batch):
    n = 150
    sid = make_session(db, tmp_path, n)
    log = tmp_path / "claims.log"
    args = ("--until-empty", "--lease", "1.5", "--max-retries", "1000", "--retry-backoff", "0")
    args += ("--batch", str(batch))
    procs = [start_worker(db_url, sid, log, *args, sleep_s=0.1) for _ in range(4)]
    rng = random.Random(7)
    kills = 0
    # A worker takes seconds to start on a loaded machine: kill only one that holds a job (read
    # from the attempt log), so every kill tests a lease coming back, however slow the start.
    deadline = time.monotonic() + 120
    try:
        while kills < 6 and time.monotonic() < deadline and not jobs.is_drained(db, sid):
            time.sleep(rng.uniform(0.1, 0.4))
            holders = _holding(db, sid) & {p.pid for p in procs if p.poll() is None}
            if not holders:
                continue
            pid = rng.choice(sorted(holders))
            victim = next(i for i, p in enumerate(procs) if p.pid == pid)
            procs[victim].send_signal(signal.SIGKILL)
            procs[victim].wait()
            kills += 1
            procs[victim] = start_worker(db_url, sid, log, *args, sleep_s=0.1)
        finish(procs)
    finally:
        for p in procs:  # a failure above must not leave workers running into the next test
            if p.poll() is None:
                p.kill()
                p.wait()
    assert kills >= 5
    assert_done_exactly_once(db, sid, n)
    if batch == 1:  # one job at a time: records claimed the next job in their commit
        assert claimed_with_record(procs) > 0
    with db.session() as s:
        expired = s.scalar(
            sa.select(sa.func.count()).select_from(Attempt).where(Attempt.outcome == "expired")
        )
    assert expired >= 1  # kills hit held jobs, which came back through their leases


@pytest.mark.slow  # worker processes: chaos, signals, pauses
def test_paused_worker_records_nothing_after_takeover(db, db_url, tmp_path):
    sid = make_session(db, tmp_path, 1)
    log = tmp_path / "claims.log"
    a = start_worker(db_url, sid, log, "--max-jobs", "1", "--lease", "1", sleep_s=1.0)
    wait_for(lambda: job_states(db, sid).get("running") == 1)
    a.send_signal(signal.SIGSTOP)
    wait_past_lease(db, running_job(db, sid))  # A's heartbeat cannot renew it
    b = start_worker(db_url, sid, log, "--until-empty", "--lease", "30", sleep_s=0.1)
    finish([b])
    a.send_signal(signal.SIGCONT)
    finish([a])
    assert_done_exactly_once(db, sid, 1)
    with db.session() as s:
        attempts = s.execute(sa.select(Attempt.pid, Attempt.outcome).order_by(Attempt.id)).all()
    assert [(pid, outcome) for pid, outcome in attempts] == [
        (a.pid, "expired"),
        (b.pid, "completed"),
    ]
    assert "lease lost" in stderr_of(a)  # A says why it recorded nothing


@pytest.mark.slow  # worker processes: chaos, signals, pauses
def test_first_signal_finishes_the_job_second_gives_it_back(db, db_url, tmp_path):
    sid = make_session(db, tmp_path, 3)
    log = tmp_path / "claims.log"
    w = start_worker(db_url, sid, log, sleep_s=1.5)
    wait_for(lambda: job_states(db, sid).get("running") == 1)
    w.send_signal(signal.SIGTERM)
    assert w.wait(timeout=30) == 0
    assert job_states(db, sid) == {"completed": 1, "new": 2}

    w = start_worker(db_url, sid, log, sleep_s=3)
    wait_for(lambda: job_states(db, sid).get("running") == 1)
    w.send_signal(signal.SIGINT)
    time.sleep(0.2)
    w.send_signal(signal.SIGINT)
    assert w.wait(timeout=30) == 0
    assert job_states(db, sid) == {"completed": 1, "new": 2}
    with db.session() as s:
        released = s.execute(sa.select(Attempt.job_id).where(Attempt.outcome == "released")).all()
        assert len(released) == 1
        assert s.get(Job, released[0].job_id).retries == 0


def test_failing_tuner_retries_with_backoff_then_errors(db, db_url, tmp_path):
    sid = make_session(db, tmp_path, 2, tuner="plugins.claimlog:Failing")
    log = tmp_path / "claims.log"
    w = start_worker(
        db_url, sid, log, "--until-empty", "--max-retries", "3", "--retry-backoff", "0.3"
    )
    finish([w])
    assert job_states(db, sid) == {"error": 2}
    with db.session() as s:
        for job in s.scalars(sa.select(Job).where(Job.session_id == sid)):
            assert job.retries == 3 and "ERROR: compile failed" in job.result
            times = s.scalars(
                sa.select(Attempt.claimed_at).where(Attempt.job_id == job.id).order_by(Attempt.id)
            ).all()
            gaps = [(b - a).total_seconds() for a, b in itertools.pairwise(times)]
            assert gaps[0] >= 0.25 and gaps[1] >= 0.55  # 0.3 s, then doubled


@pytest.mark.parametrize("batch", BATCHES)
@pytest.mark.slow  # worker processes: chaos, signals, pauses
def test_workers_survive_killed_connections(db, db_url, tmp_path, batch):
    if db.is_sqlite:
        pytest.skip("SQLite has no server connection to lose")
    n = 120
    sid = make_session(db, tmp_path, n)
    log = tmp_path / "claims.log"
    # 0.2 s a job: about 8 s of work for three workers, so the last to start (on a loaded machine)
    # still finds jobs to claim.
    args = ("--until-empty", "--lease", "10", "--batch", str(batch))
    procs = [start_worker(db_url, sid, log, *args, sleep_s=0.2) for _ in range(3)]
    # Mid-run: once every worker has claimed a job, i.e. holds a connection and is past its
    # start-up (a worker that cannot reach the database at start-up stops at once with one line
    # and exit 2, by design), cut their connections, four times.
    wait_for(lambda: _claimants(db, sid) >= {p.pid for p in procs}, timeout=120)
    killed = 0
    for _ in range(4):
        killed += _kill_worker_connections(db)
        time.sleep(0.7)
    finish(procs)
    assert killed > 0
    assert [p.returncode for p in procs] == [0, 0, 0], [stderr_of(p)[-2000:] for p in procs]
    assert_done_exactly_once(db, sid, n)
    if batch == 1:
        assert claimed_with_record(procs) > 0


def _kill_worker_connections(db: Database) -> int:
    """Cut every other connection to this database, as a server restart would."""
    with db.engine.connect() as conn:
        if db.backend == "postgresql":
            ids = (
                conn.execute(
                    sa.text(
                        "SELECT pid FROM pg_stat_activity WHERE datname = current_database() "
                        "AND pid <> pg_backend_pid()"
                    )
                )
                .scalars()
                .all()
            )
            for pid in ids:
                conn.execute(sa.text("SELECT pg_terminate_backend(:p)"), {"p": pid})
        else:
            ids = (
                conn.execute(
                    sa.text(
                        "SELECT id FROM information_schema.processlist WHERE db = DATABASE() "
                        "AND id <> CONNECTION_ID()"
                    )
                )
                .scalars()
                .all()
            )
            for pid in ids:
                with contextlib.suppress(sa.exc.DBAPIError):  # it may have ended meanwhile
                    conn.execute(sa.text(f"KILL {int(pid)}"))
        conn.commit()
    return len(ids)


def _claimants(db: Database, sid: int) -> set[int]:
    """The pids of the workers that have claimed a job of the session."""
    with db.session() as s:
        return set(
            s.scalars(
                sa.select(Attempt.pid)
                .join(Job, Job.id == Attempt.job_id)
                .where(Job.session_id == sid)
            )
        )


def _holding(db: Database, sid: int) -> set[int]:
    """Pids of workers holding a running job of the session now (an attempt not yet ended)."""
    with db.session() as s:
        return set(
            s.scalars(
                sa.select(Attempt.pid)
                .join(Job, Job.id == Attempt.job_id)
                .where(Job.session_id == sid, Job.state == "running", Attempt.outcome.is_(None))
            )
        )


@pytest.mark.slow  # worker processes: chaos, signals, pauses
def test_a_worker_without_until_empty_says_once_that_it_is_idle(db, db_url, tmp_path):
    sid = make_session(db, tmp_path, 1)
    w = start_worker(db_url, sid, tmp_path / "claims.log")
    try:
        wait_for(lambda: job_states(db, sid) == {"completed": 1}, timeout=60)
        time.sleep(1.5)  # several empty polls: still one line
        more = tmp_path / "more"
        more.write_text(
            "-t f32 -out_datatype f32 -transA false -transB false -g 1 -m 99 -n 8 -k 8\n"
        )
        catalog.import_files(db, "gemm", [str(more)], tag="more")
        jobs.load(db, sid, tag="more")
        wait_for(lambda: job_states(db, sid) == {"completed": 2}, timeout=60)
        time.sleep(1.0)
    finally:
        w.send_signal(signal.SIGTERM)
        assert w.wait(timeout=30) == 0
    idle = [line for line in stderr_of(w).splitlines() if "idle: no job of session" in line]
    assert len(idle) == 2, stderr_of(w)  # once per idle stretch
    assert f"session {sid}" in idle[0] and "--until-empty" in idle[0]


def test_an_until_empty_worker_waiting_on_held_jobs_says_so(db, db_url, tmp_path):
    from mlirtuna import queue

    sid = make_session(db, tmp_path, 1)
    lease = queue.claim(db, sid, queue.Claimant("elsewhere", 0, 1), lease_s=600)
    assert lease is not None  # another worker holds the session's only job
    w = start_worker(db_url, sid, tmp_path / "claims.log", "--until-empty")
    try:
        wait_for(lambda: "idle: no job of session" in stderr_of(w), timeout=60)
        with db.session() as s:
            s.execute(sa.update(Job).where(Job.id == lease.job_id).values(state="completed"))
        assert w.wait(timeout=60) == 0
    finally:
        if w.poll() is None:
            w.kill()
    (idle,) = [line for line in stderr_of(w).splitlines() if "idle: no job of session" in line]
    assert "other workers hold its last jobs" in idle and "--until-empty exits instead" not in idle
