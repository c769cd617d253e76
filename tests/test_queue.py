"""The queue's operations on every backend: load, claim, heartbeat, fenced record, failure,
expired leases, release, requeue, cancel."""

from __future__ import annotations

import re
import threading

import pytest
import sqlalchemy as sa
from support.clitools import cli
from support.queueing import (  # noqa: F401 (the session_with_jobs fixture)
    ME,
    fixture_session_with_jobs,
    gemm_file,
    outcome,
)
from support.workers import wait_past_lease

from mlirtuna import catalog, queue, sessions
from mlirtuna.db.models import Attempt, Candidate, Job, Result
from mlirtuna.errors import UserError
from mlirtuna.problems import ExpandOptions
from mlirtuna.queue import Claimant, jobs
from mlirtuna.sessions import SessionSpec


def count(db, model, **where) -> int:
    with db.session() as s:
        stmt = sa.select(sa.func.count()).select_from(model)
        for key, value in where.items():
            stmt = stmt.where(getattr(model, key) == value)
        return s.scalar(stmt)


def job_row(db, job_id: int) -> Job:
    with db.session() as s:
        return s.get(Job, job_id)


# -- loading -----------------------------------------------------------------------------------


def test_load_by_tag_file_all_is_idempotent(db, tmp_path):
    catalog.import_files(db, "gemm", [gemm_file(tmp_path, 3)], tag="a")
    catalog.import_files(db, "gemm", [gemm_file(tmp_path, 5, "more")], tag="b")
    sess = sessions.create(db, SessionSpec(tuner="sleep"))
    assert jobs.load(db, sess.id, tag="a").as_dict() == {
        "added": 3,
        "existing": 0,
        "cannot_run": {},
    }
    assert jobs.load(db, sess.id, tag="a").as_dict() == {
        "added": 0,
        "existing": 3,
        "cannot_run": {},
    }
    assert jobs.load(
        db, sess.id, file=gemm_file(tmp_path, 4, "f"), op="gemm", options=ExpandOptions()
    ).as_dict() == {"added": 1, "existing": 3, "cannot_run": {}}
    assert jobs.load(db, sess.id, all_problems=True).as_dict() == {
        "added": 1,
        "existing": 4,
        "cannot_run": {},
    }
    with pytest.raises(UserError, match="exactly one"):
        jobs.load(db, sess.id, tag="a", all_problems=True)
    with pytest.raises(UserError, match="no problems carry the tag"):
        jobs.load(db, sess.id, tag="nope")


def test_perf_priority_orders_claims(db, tmp_path):
    path = tmp_path / "conv"
    path.write_text(
        "conv -F 1 -f NCHW -I NCHW -O NCHW -n 1 -c 8 -H 8 -W 8 -k 8 -y 3 -x 3 -p 1 -q 1 -u 1 "
        "-v 1 -l 1 -j 1 -g 1 -perf_priority 5\n"
        "conv -F 1 -f NCHW -I NCHW -O NCHW -n 2 -c 8 -H 8 -W 8 -k 8 -y 3 -x 3 -p 1 -q 1 -u 1 "
        "-v 1 -l 1 -j 1 -g 1 -perf_priority 1\n"
    )
    catalog.import_files(db, "conv", [str(path)], ExpandOptions(expand=False), tag="p")
    sess = sessions.create(db, SessionSpec(tuner="sleep"))
    jobs.load(db, sess.id, tag="p")
    first = queue.claim(db, sess.id, ME, 60)
    with db.session() as s:
        from mlirtuna.catalog import load_problem

        assert load_problem(s, first.problem_id).batchsize == 2  # priority 1 before 5


def test_cli_load_and_status_json(db_url, tmp_path):
    assert cli(db_url, "import", "--op", "gemm", "--tag", "t", gemm_file(tmp_path, 4)).code == 0
    sid = cli(db_url, "session", "new", "--tuner", "sleep", "--json").json()["id"]
    assert cli(db_url, "jobs", "load", "--session", str(sid), "--tag", "t", "--json").json() == {
        "added": 4,
        "existing": 0,
        "cannot_run": {},  # a sleep session can run every problem
    }
    status = cli(db_url, "status", "--session", str(sid), "--json").json()
    assert status == {
        "sessions": [
            {
                "id": sid,
                "counts": {
                    "new": 4,
                    "waiting": 0,
                    "running": 0,
                    "completed": 0,
                    "error": 0,
                    "cancelled": 0,
                },
                "per_minute": None,  # nothing finished yet: no rate, no ETA
                "eta_s": None,
            }
        ]
    }


# -- claim and record --------------------------------------------------------------------------


def test_claim_takes_in_id_order_and_marks_running(db, session_with_jobs):
    a = queue.claim(db, session_with_jobs, ME, 60)
    b = queue.claim(db, session_with_jobs, ME, 60)
    assert a.job_id < b.job_id
    row = job_row(db, a.job_id)
    assert row.state == "running" and row.lease_token == a.token
    assert row.machine_name == "test-host" and row.gpu_id == 0
    assert row.claimed_at is not None and row.compile_start is not None
    assert row.lease_expires_at > row.claimed_at


def test_claim_returns_none_when_nothing_left(db, session_with_jobs):
    for _ in range(5):
        assert queue.claim(db, session_with_jobs, ME, 60) is not None
    assert queue.claim(db, session_with_jobs, ME, 60) is None


def test_concurrent_claims_never_share_a_job(db, session_with_jobs, tmp_path):
    """Threads with their own connections race for the same 5 jobs (plus 20 more)."""
    catalog.import_files(db, "gemm", [gemm_file(tmp_path, 25, "many")], tag="small")
    jobs.load(db, session_with_jobs, tag="small")
    taken: list[int] = []
    lock = threading.Lock()

    def grab():
        while (lease := queue.claim(db, session_with_jobs, ME, 60)) is not None:
            with lock:
                taken.append(lease.job_id)

    threads = [threading.Thread(target=grab) for _ in range(4)]
    for t in threads:
        t.start()
    for t in threads:
        t.join()
    assert len(taken) == len(set(taken)) == 25


def test_record_writes_winner_candidates_and_completed_at_once(db, session_with_jobs):
    lease = queue.claim(db, session_with_jobs, ME, 60)
    assert queue.record(db, lease, outcome(3))
    row = job_row(db, lease.job_id)
    assert row.state == "completed" and row.result == "tool output" and row.compile_end
    assert count(db, Result, job_id=lease.job_id) == 1
    assert count(db, Candidate, job_id=lease.job_id) == 4
    with db.session() as s:
        res = s.scalars(sa.select(Result).where(Result.job_id == lease.job_id)).one()
        assert (res.perf_config, res.kernel_time, res.tflops) == ("pc0", 1000.0, 10.0)
        attempt = s.scalars(sa.select(Attempt).where(Attempt.lease_token == lease.token)).one()
        assert attempt.outcome == "completed" and attempt.ended_at is not None


def test_record_with_a_lost_lease_writes_nothing(db, session_with_jobs):
    lease = queue.claim(db, session_with_jobs, ME, 60)
    stale = queue.Lease(lease.job_id, "not-my-token", lease.session_id, lease.problem_id, 0)
    assert not queue.record(db, stale, outcome())
    assert count(db, Result) == 0 and count(db, Candidate) == 0
    assert job_row(db, lease.job_id).state == "running"


def _running(db) -> list[tuple[int, str]]:
    with db.session() as s:
        rows = s.execute(sa.select(Job.id, Job.lease_token).where(Job.state == "running"))
        return sorted((r.id, r.lease_token) for r in rows)


def test_record_and_claim_records_and_takes_the_next_in_one_commit(db, session_with_jobs):
    """One durable commit per job: job N's record and job N+1's claim; the last record takes
    nothing, and nothing is held after it."""
    lease = queue.claim(db, session_with_jobs, ME, 60)
    first = lease.job_id
    for n in range(5):
        claim = queue.NextClaim(session_with_jobs, ME, 60)
        recorded, nxt = queue.record_and_claim(db, lease, outcome(3), claim)
        assert recorded
        assert count(db, Result, job_id=lease.job_id) == 1
        assert count(db, Candidate, job_id=lease.job_id) == 4
        assert job_row(db, lease.job_id).state == "completed"
        if n == 4:
            assert nxt is None  # no job left
            break
        assert nxt is not None and nxt.job_id == first + n + 1 and nxt.token == claim.token
        assert nxt.problem is not None and nxt.problem.op == "gemm" and nxt.retries == 0
        assert _running(db) == [(nxt.job_id, claim.token)]
        lease = nxt
    assert _running(db) == []
    with db.session() as s:
        outcomes = s.scalars(sa.select(Attempt.outcome).order_by(Attempt.id)).all()
    assert outcomes == ["completed"] * 5


def test_record_and_claim_with_a_lost_lease_takes_nothing(db, session_with_jobs):
    lease = queue.claim(db, session_with_jobs, ME, 60)
    stale = queue.Lease(lease.job_id, "not-my-token", lease.session_id, lease.problem_id, 0)
    claim = queue.NextClaim(session_with_jobs, ME, 60)
    assert queue.record_and_claim(db, stale, outcome(), claim) == (False, None)
    assert count(db, Result) == 0 and count(db, Candidate) == 0
    assert _running(db) == [(lease.job_id, lease.token)]  # the claim leaked no job
    assert count(db, Attempt) == 1 and count(db, Job, state="new") == 4


def test_record_and_claim_whose_reply_was_lost_is_resolved_by_its_tokens(db, session_with_jobs):
    """The combined commit landed and its reply was lost: the retry (same lease, same claim
    token) learns that its record landed and which job it holds; nothing is done twice."""
    lease = queue.claim(db, session_with_jobs, ME, 60)
    claim = queue.NextClaim(session_with_jobs, ME, 60)
    recorded, nxt = queue.record_and_claim(db, lease, outcome(3), claim)
    assert recorded and nxt is not None
    again = queue.record_and_claim(db, lease, outcome(3), claim)  # the retry
    assert again[0] and again[1] is not None
    assert (again[1].job_id, again[1].token, again[1].stage) == (nxt.job_id, claim.token, "tune")
    assert count(db, Result) == 1 and count(db, Candidate) == 4 and count(db, Attempt) == 2
    assert _running(db) == [(nxt.job_id, claim.token)]
    # The last record took nothing: its retry says so too.
    with db.session() as s:  # no job left to claim
        s.execute(sa.update(Job).where(Job.state == "new").values(state="cancelled"))
    last = queue.NextClaim(session_with_jobs, ME, 60)
    assert queue.record_and_claim(db, nxt, outcome(), last) == (True, None)
    assert queue.record_and_claim(db, nxt, outcome(), last) == (True, None)


def test_heartbeat_extends_and_reports_loss(db, session_with_jobs):
    lease = queue.claim(db, session_with_jobs, ME, 5)
    before = job_row(db, lease.job_id).lease_expires_at
    assert queue.heartbeat(db, lease, 600)
    assert (job_row(db, lease.job_id).lease_expires_at - before).total_seconds() > 500
    jobs.requeue(db, session_with_jobs, state="running")
    assert not queue.heartbeat(db, lease, 600)


# -- failures ----------------------------------------------------------------------------------


def test_fail_backs_off_then_errors_after_max(db, session_with_jobs):
    lease = queue.claim(db, session_with_jobs, ME, 60)
    assert queue.fail(db, lease, "tool crashed\nstderr tail", max_retries=2, backoff_s=30) == "new"
    row = job_row(db, lease.job_id)
    assert row.retries == 1 and "tool crashed" in row.result
    assert (row.not_before - row.compile_end).total_seconds() > 25
    # Backoff: the job is not claimable yet; the other four are.
    ids = [queue.claim(db, session_with_jobs, ME, 60).job_id for _ in range(4)]
    assert lease.job_id not in ids and queue.claim(db, session_with_jobs, ME, 60) is None
    with db.session() as s:
        s.execute(sa.update(Job).where(Job.id == lease.job_id).values(not_before=None))
    again = queue.claim(db, session_with_jobs, ME, 60)
    assert again.job_id == lease.job_id and again.retries == 1
    assert queue.fail(db, again, "still broken", max_retries=2, backoff_s=0) == "error"
    row = job_row(db, lease.job_id)
    assert row.state == "error" and row.retries == 2 and "attempt 2/2" in row.result
    assert count(db, Result, job_id=lease.job_id) == 0


def test_expired_lease_goes_back_and_old_holder_records_nothing(db, session_with_jobs):
    lease = queue.claim(db, session_with_jobs, ME, 0.2)
    wait_past_lease(db, lease.job_id)
    assert queue.reclaim_expired(db, max_retries=3) == 1
    row = job_row(db, lease.job_id)
    assert row.state == "new" and row.retries == 1 and "lease expired" in row.result
    taker = queue.claim(db, session_with_jobs, Claimant("other", 1, 2), 60)
    assert taker.job_id == lease.job_id
    assert not queue.record(db, lease, outcome())  # the paused worker wakes up: fenced out
    assert queue.record(db, taker, outcome())
    assert count(db, Result, job_id=lease.job_id) == 1
    with db.session() as s:
        outcomes = s.scalars(
            sa.select(Attempt.outcome).where(Attempt.job_id == lease.job_id).order_by(Attempt.id)
        ).all()
    assert outcomes == ["expired", "completed"]


def test_expired_lease_at_max_retries_is_error(db, session_with_jobs):
    lease = queue.claim(db, session_with_jobs, ME, 0.1)
    wait_past_lease(db, lease.job_id)
    queue.reclaim_expired(db, max_retries=1)
    assert job_row(db, lease.job_id).state == "error"


def test_release_gives_back_without_counting(db, session_with_jobs):
    lease = queue.claim(db, session_with_jobs, ME, 60)
    assert queue.release(db, lease)
    row = job_row(db, lease.job_id)
    assert row.state == "new" and row.retries == 0 and row.lease_token is None
    assert queue.claim(db, session_with_jobs, ME, 60).job_id == lease.job_id


def test_requeue_and_cancel(db, session_with_jobs):
    lease = queue.claim(db, session_with_jobs, ME, 60)
    queue.fail(db, lease, "boom", max_retries=1, backoff_s=0)
    assert jobs.requeue(db, session_with_jobs) == 1
    assert job_row(db, lease.job_id).state == "new" and job_row(db, lease.job_id).retries == 0
    running = queue.claim(db, session_with_jobs, ME, 60)
    assert jobs.cancel(db, session_with_jobs, job_id=running.job_id) == 1
    assert not queue.record(db, running, outcome())  # cancelled while running: nothing recorded
    with db.session() as s:
        closed = s.scalars(sa.select(Attempt).where(Attempt.lease_token == running.token)).one()
        assert closed.outcome == "cancelled" and closed.ended_at is not None
    assert jobs.cancel(db, session_with_jobs) == 4
    assert jobs.counts(db, session_with_jobs)[session_with_jobs]["cancelled"] == 5
    assert jobs.requeue(db, session_with_jobs, state="cancelled") == 5


def test_cli_jobs_list_show_requeue_cancel(db_url, tmp_path):
    cli(db_url, "import", "--op", "gemm", "--tag", "t", gemm_file(tmp_path, 2))
    sid = cli(db_url, "session", "new", "--tuner", "sleep", "--json").json()["id"]
    cli(db_url, "jobs", "load", "--session", str(sid), "--tag", "t")
    from mlirtuna.db import Database

    db = Database(db_url)
    lease = queue.claim(db, sid, ME, 60)
    queue.fail(db, lease, "tuningRunner exited 1\nERROR: boom", max_retries=1, backoff_s=0)
    db.dispose()
    listed = cli(db_url, "jobs", "list", "--session", str(sid), "--state", "error", "--json").json()
    assert [j["id"] for j in listed] == [lease.job_id]
    assert listed[0]["message"] == "attempt 1/1 failed: tuningRunner exited 1"
    table = cli(db_url, "jobs", "list", "--session", str(sid), "--state", "error")
    assert str(lease.job_id) in table.stdout and "ERROR: boom" not in table.stdout
    shown = cli(db_url, "jobs", "show", str(lease.job_id))
    assert "ERROR: boom" in shown.stdout and "failed" in shown.stdout
    assert cli(db_url, "jobs", "requeue", "--session", str(sid)).stdout.strip() == "1 jobs requeued"
    cancelled = cli(db_url, "jobs", "cancel", "--session", str(sid), "--all")
    assert cancelled.stdout.strip() == "2 jobs cancelled"


@pytest.mark.parametrize("batch", [1, 2])
def test_a_record_that_clashes_with_a_row_it_did_not_write_fails_only_its_job(db, tmp_path, batch):
    """Issue 43 §1 on every backend: a result row already there for a job's session and problem
    (written by anyone but this record) fails that job for good, naming the row; the worker
    records the others (one at a time: the record that claims the next; a batch: each alone)."""
    from support.workers import job_states, make_session

    from mlirtuna.tuners.sleep import SleepTuner
    from mlirtuna.worker import Worker, WorkerSettings

    sid = make_session(db, tmp_path, 4, tuner="sleep")
    with db.session() as s:
        job = s.scalars(sa.select(Job).where(Job.session_id == sid).order_by(Job.id)).all()[1]
        s.add(Result(session_id=sid, problem_id=job.problem_id, job_id=job.id, perf_config="x"))
        s.commit()
        job_id = job.id
    settings = WorkerSettings(session_id=sid, tuner="sleep", until_empty=True, batch=batch)
    stats = Worker(db, settings, tuner=SleepTuner(0)).run()
    assert (stats.completed, stats.failed) == (3, 1)
    assert job_states(db, sid) == {"completed": 3, "error": 1}
    with db.session() as s:
        failed = s.get(Job, job_id)
        assert failed is not None and failed.state == "error"
        assert "record refused: result row" in (failed.result or "")


def test_a_worker_refuses_a_lease_longer_than_the_longest_allowed(db, tmp_path):
    from support.workers import make_session

    from mlirtuna.worker import Worker, WorkerSettings

    sid = make_session(db, tmp_path, 1, tuner="sleep")
    for lease_s in (0.0, 3600.5, 1e9):
        with pytest.raises(
            UserError, match=rf"^--lease {re.escape(f'{lease_s:g}')}: give more than 0"
        ):
            Worker(db, WorkerSettings(session_id=sid, tuner="sleep", lease_s=lease_s))
