"""The job queue: the job table itself, made safe for any number of workers on any machines.

Four operations, each one short transaction (docs/architecture.md explains why they are safe):
- claim: the next `new` job of a session, by priority then id, skipping rows other workers hold
  (`FOR UPDATE SKIP LOCKED` on PostgreSQL/MariaDB; on SQLite the write lock of BEGIN IMMEDIATE
  serializes claims and `UPDATE … RETURNING` picks and takes the row in one statement);
- heartbeat: extend the lease while the tuner runs;
- record / fail / release: fenced writes, applied only while the job still carries this worker's
  lease_token, so a worker that lost its lease (paused, partitioned, requeued) writes nothing;
- reclaim_expired: jobs whose lease ran out (their worker died) go back to `new` or to `error`.
Every lease time is computed by the database clock (db.db_now), never a worker's.
"""

from __future__ import annotations

import logging
import os
import uuid
from dataclasses import dataclass

import sqlalchemy as sa
from sqlalchemy.orm import Session

from mlirtuna.db import Database, db_now
from mlirtuna.models import (
    COMPLETED,
    ERROR,
    NEW,
    RUNNING,
    Attempt,
    Candidate,
    Job,
    Result,
)
from mlirtuna.tuners.base import TuneOutcome

log = logging.getLogger(__name__)

MAX_BACKOFF_S = 600.0
# job.result is TEXT (64 KiB on MySQL); a tool's output beyond this is cut from the front.
MAX_RESULT_CHARS = 60_000


@dataclass(frozen=True)
class Lease:
    """A job this worker holds. `token` fences every write about it."""

    job_id: int
    token: str
    session_id: int
    problem_id: int
    retries: int


@dataclass(frozen=True)
class Claimant:
    """Who claims: recorded on the job and its attempt."""

    machine_name: str
    gpu_id: int
    pid: int = os.getpid()


def _claim_values(token: str, who: Claimant, lease_s: float) -> dict:
    return {
        "state": RUNNING,
        "lease_token": token,
        "lease_expires_at": db_now(lease_s),
        "heartbeat_at": db_now(),
        "claimed_at": db_now(),
        "compile_start": db_now(),
        "compile_end": None,
        "finished_at": None,
        "machine_name": who.machine_name,
        "gpu_id": who.gpu_id,
    }


def _claimable(session_id: int):
    return sa.and_(
        Job.session_id == session_id,
        Job.state == NEW,
        sa.or_(Job.not_before.is_(None), Job.not_before <= db_now()),
    )


_RETURNED = (Job.id, Job.session_id, Job.problem_id, Job.retries)


def claim(db: Database, session_id: int, who: Claimant, lease_s: float) -> Lease | None:
    """Take the next job of the session, or None when there is nothing to take now."""
    token = uuid.uuid4().hex
    with db.session(immediate=True) as s:
        row = (
            _claim_sqlite(s, session_id, token, who, lease_s)
            if db.is_sqlite
            else (_claim_skip_locked(s, session_id, token, who, lease_s))
        )
        if row is None:
            return None
        s.execute(
            sa.insert(Attempt).values(
                job_id=row.id,
                lease_token=token,
                machine_name=who.machine_name,
                gpu_id=who.gpu_id,
                pid=who.pid,
                claimed_at=db_now(),
            )
        )
        return Lease(row.id, token, row.session_id, row.problem_id, row.retries)


def _claim_sqlite(s: Session, session_id: int, token: str, who: Claimant, lease_s: float):
    pick = (
        sa.select(Job.id).where(_claimable(session_id)).order_by(Job.priority, Job.id).limit(1)
    ).scalar_subquery()
    stmt = (
        sa.update(Job)
        .where(Job.id == pick)
        .values(_claim_values(token, who, lease_s))
        .returning(*_RETURNED)
    )
    return s.execute(stmt).first()


def _claim_skip_locked(s: Session, session_id: int, token: str, who: Claimant, lease_s: float):
    job_id = s.scalar(
        sa.select(Job.id)
        .where(_claimable(session_id))
        .order_by(Job.priority, Job.id)
        .limit(1)
        .with_for_update(skip_locked=True)
    )
    if job_id is None:
        return None
    s.execute(sa.update(Job).where(Job.id == job_id).values(_claim_values(token, who, lease_s)))
    return s.execute(sa.select(*_RETURNED).where(Job.id == job_id)).first()


def _fenced(lease: Lease):
    """The WHERE clause of every write about a held job: still ours, still running."""
    return sa.and_(Job.id == lease.job_id, Job.lease_token == lease.token, Job.state == RUNNING)


def heartbeat(db: Database, lease: Lease, lease_s: float) -> bool:
    """Extend the lease; False when it is no longer ours (the worker must not record)."""
    with db.session() as s:
        done = s.execute(
            sa.update(Job)
            .where(_fenced(lease))
            .values(lease_expires_at=db_now(lease_s), heartbeat_at=db_now())
        )
        return done.rowcount == 1


def record(db: Database, lease: Lease, outcome: TuneOutcome) -> bool:
    """Winner, every candidate and `completed` in one transaction, only while the lease holds."""
    with db.session(immediate=True) as s:
        values: dict = {
            "state": COMPLETED,
            "result": _cut(outcome.output),
            "finished_at": db_now(),
            "compile_end": outcome.compile_end or db_now(),
        }
        if outcome.compile_start is not None:
            values["compile_start"] = outcome.compile_start
        # The fenced update comes first: when it matches nothing, nothing has been written.
        if s.execute(sa.update(Job).where(_fenced(lease)).values(values)).rowcount != 1:
            log.warning("job %s: lease lost before recording; recording nothing", lease.job_id)
            return False
        winner = outcome.winner
        s.execute(
            sa.insert(Result).values(
                session_id=lease.session_id,
                problem_id=lease.problem_id,
                job_id=lease.job_id,
                perf_config=winner.perf_config,
                kernel_time=winner.kernel_time_ns,
                tflops=winner.tflops,
            )
        )
        if outcome.candidates:
            s.execute(
                sa.insert(Candidate.__table__),
                [
                    {
                        "session_id": lease.session_id,
                        "problem_id": lease.problem_id,
                        "job_id": lease.job_id,
                        "perf_config": c.perf_config,
                        "kernel_time": c.kernel_time_ns,
                        "tflops": c.tflops,
                        "error": c.error,
                    }
                    for c in outcome.candidates
                ],
            )
        _end_attempt(s, lease.token, "completed", None)
        return True


def fail(
    db: Database, lease: Lease, message: str, *, max_retries: int, backoff_s: float
) -> str | None:
    """Count a failed attempt: back to `new` after a backoff, or `error` once retries run out.

    Returns the job's new state, or None when the lease was already lost (nothing written).
    """
    retries = lease.retries + 1
    state = ERROR if retries >= max_retries else NEW
    delay = min(backoff_s * 2 ** (retries - 1), MAX_BACKOFF_S)
    values: dict = {
        "state": state,
        "retries": retries,
        "result": _cut(f"attempt {retries}/{max_retries} failed: {message}"),
        "compile_end": db_now(),
        "not_before": db_now(delay) if state == NEW else None,
        "finished_at": db_now() if state == ERROR else None,
    }
    with db.session(immediate=True) as s:
        if s.execute(sa.update(Job).where(_fenced(lease)).values(values)).rowcount != 1:
            return None
        _end_attempt(s, lease.token, "failed", message)
        return state


def release(db: Database, lease: Lease, why: str = "given back by a stopping worker") -> bool:
    """Give a job back untouched (state new, no retry counted)."""
    with db.session(immediate=True) as s:
        done = s.execute(
            sa.update(Job)
            .where(_fenced(lease))
            .values(state=NEW, lease_token=None, lease_expires_at=None, not_before=None)
        )
        if done.rowcount != 1:
            return False
        _end_attempt(s, lease.token, "released", why)
        return True


def reclaim_expired(db: Database, *, max_retries: int, session_id: int | None = None) -> int:
    """Jobs whose lease ran out (worker killed, machine gone) go back to new, or to error."""
    expired = sa.and_(Job.state == RUNNING, Job.lease_expires_at < db_now())
    if session_id is not None:
        expired = sa.and_(expired, Job.session_id == session_id)
    with db.session(immediate=True) as s:
        pick = sa.select(Job.id, Job.lease_token, Job.machine_name, Job.gpu_id, Job.retries).where(
            expired
        )
        if not db.is_sqlite:
            pick = pick.with_for_update(skip_locked=True)
        rows = s.execute(pick).all()
        for row in rows:
            _expire(s, row, expired, max_retries)
        return len(rows)


def _expire(s: Session, row, expired, max_retries: int) -> None:
    why = (
        f"lease expired: the worker on {row.machine_name or '?'} GPU {row.gpu_id} "
        "stopped renewing it (killed, stalled or cut off)"
    )
    retries = row.retries + 1
    state = ERROR if retries >= max_retries else NEW
    s.execute(
        sa.update(Job)
        .where(Job.id == row.id, Job.retries == row.retries, expired)
        .values(
            state=state,
            retries=retries,
            result=f"attempt {retries}/{max_retries} failed: {why}",
            lease_token=None,
            lease_expires_at=None,
            finished_at=db_now() if state == ERROR else None,
        )
    )
    if row.lease_token:
        _end_attempt(s, row.lease_token, "expired", why)


def _end_attempt(s: Session, token: str, outcome: str, message: str | None) -> None:
    s.execute(
        sa.update(Attempt)
        .where(Attempt.lease_token == token, Attempt.ended_at.is_(None))
        .values(ended_at=db_now(), outcome=outcome, message=message)
    )


def _cut(text: str) -> str:
    return text if len(text) <= MAX_RESULT_CHARS else "…" + text[-MAX_RESULT_CHARS:]
