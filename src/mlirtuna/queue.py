"""The job queue: the job table itself, made safe for any number of workers on any machines.

Four operations, each one short transaction (docs/architecture.md explains why they are safe):
- claim: the next `new` job of a session, by priority then id, skipping rows other workers hold
  (`FOR UPDATE SKIP LOCKED` on PostgreSQL/MariaDB; on SQLite the write lock of BEGIN IMMEDIATE
  serializes claims and `UPDATE … RETURNING` picks and takes the row in one statement);
  claim_many takes up to K jobs in one transaction, each with its own token and attempt;
- heartbeat: extend the lease while the tuner runs;
- record / fail / release: fenced writes, applied only while the job still carries this worker's
  lease_token, so a worker that lost its lease (paused, partitioned, requeued) writes nothing;
- reclaim_expired: jobs whose lease ran out (their worker died) go back to `new` or to `error`.
Every lease time is computed by the database clock (db.db_now), never a worker's.
"""

from __future__ import annotations

import datetime as dt
import logging
import os
import uuid
from dataclasses import dataclass

import sqlalchemy as sa
from sqlalchemy.orm import Session

from mlirtuna.configs import load_problem
from mlirtuna.db import Database, db_now
from mlirtuna.dbtext import MAX_CANDIDATE_ERROR_BYTES
from mlirtuna.dbtext import cut_text as _cut
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
from mlirtuna.problems import Problem
from mlirtuna.tuners import base
from mlirtuna.tuners.base import TuneOutcome

log = logging.getLogger(__name__)

MAX_BACKOFF_S = 600.0


@dataclass(frozen=True)
class Lease:
    """A job this worker holds. `token` fences every write about it."""

    job_id: int
    token: str
    session_id: int
    problem_id: int
    retries: int
    problem: Problem | None = None  # read with the claim


@dataclass(frozen=True)
class Claimant:
    """Who claims: recorded on the job and its attempt."""

    machine_name: str
    gpu_id: int
    pid: int = os.getpid()


# The claim and the record run once per job on every worker: their statements are built once,
# here, with bind parameters (building SQLAlchemy expressions per call cost more than the SQL).
_J, _A = Job.__table__, Attempt.__table__
_NOW = db_now()
_CLAIMABLE = sa.and_(
    _J.c.session_id == sa.bindparam("p_session"),
    _J.c.state == NEW,
    sa.or_(_J.c.not_before.is_(None), _J.c.not_before <= _NOW),
)
_TAKE = {
    "state": RUNNING,
    "lease_token": sa.bindparam("p_token"),
    "lease_expires_at": db_now(sa.bindparam("p_lease_s", type_=sa.Double())),
    "heartbeat_at": _NOW,
    "claimed_at": _NOW,
    "compile_start": _NOW,
    "compile_end": None,
    "finished_at": None,
    "machine_name": sa.bindparam("p_machine"),
    "gpu_id": sa.bindparam("p_gpu"),
}
_NEXT = sa.select(_J.c.id, _J.c.problem_id, _J.c.retries).where(_CLAIMABLE)
_NEXT = _NEXT.order_by(_J.c.priority, _J.c.id).limit(1)
# SQLite: BEGIN IMMEDIATE holds the write lock; one UPDATE … RETURNING picks and takes the row.
_CLAIM_SQLITE = (
    sa.update(_J)
    .where(_J.c.id == _NEXT.with_only_columns(_J.c.id).scalar_subquery())
    .values(_TAKE)
    .returning(_J.c.id, _J.c.problem_id, _J.c.retries)
)
# PostgreSQL, MariaDB/MySQL: lock the next free row, skipping rows other workers hold; take it.
_PICK_SKIP_LOCKED = _NEXT.with_for_update(skip_locked=True)
_TAKE_PICKED = sa.update(_J).where(_J.c.id == sa.bindparam("p_job")).values(_TAKE)
_ADD_ATTEMPT = sa.insert(_A).values(
    job_id=sa.bindparam("p_job"),
    lease_token=sa.bindparam("p_token"),
    machine_name=sa.bindparam("p_machine"),
    gpu_id=sa.bindparam("p_gpu"),
    pid=sa.bindparam("p_pid"),
    claimed_at=_NOW,
)


def new_token() -> str:
    return uuid.uuid4().hex


def claim(
    db: Database, session_id: int, who: Claimant, lease_s: float, token: str | None = None
) -> Lease | None:
    """Take the next job of the session, or None when there is nothing to take now.

    The problem is read in the same transaction, so a claimed job is ready to tune. A caller
    that retries a claim passes the same `token` and asks `claimed_with` first.
    """
    params = {
        "p_session": session_id,
        "p_token": token or new_token(),
        "p_lease_s": float(lease_s),
        "p_machine": who.machine_name,
        "p_gpu": who.gpu_id,
        "p_pid": who.pid,
    }
    with db.session(immediate=True) as s:
        conn = s.connection()
        if db.is_sqlite:
            row = conn.execute(_CLAIM_SQLITE, params).first()
        else:
            row = conn.execute(_PICK_SKIP_LOCKED, params).first()
            if row is not None:
                conn.execute(_TAKE_PICKED, {**params, "p_job": row.id})
        if row is None:
            return None
        conn.execute(_ADD_ATTEMPT, {**params, "p_job": row.id})
        problem = load_problem(s, row.problem_id)
        return Lease(row.id, params["p_token"], session_id, row.problem_id, row.retries, problem)


# A batch: the next `limit` claimable jobs in claim order, locked (PostgreSQL, MariaDB: rows
# other workers hold are skipped) or, on SQLite, under the write lock of BEGIN IMMEDIATE.
_NEXT_MANY = _NEXT.limit(sa.bindparam("p_limit", type_=sa.Integer()))
_PICK_MANY_SKIP_LOCKED = _NEXT_MANY.with_for_update(skip_locked=True)
# Each job of a batch gets its own token: one statement, run once per picked row.
_TAKE_ONE = sa.update(_J).where(_J.c.id == sa.bindparam("p_job"), _J.c.state == NEW).values(_TAKE)


def claim_many(
    db: Database,
    session_id: int,
    who: Claimant,
    lease_s: float,
    limit: int,
    tokens: list[str] | None = None,
) -> list[Lease]:
    """Take up to `limit` jobs of the session in one transaction, in claim order (priority,
    id); an empty list when there is nothing to take now.

    Each job gets its own lease token (tokens[i] for the i-th job taken) and its own attempt,
    so that each is recorded, failed, released or lost on its own, exactly as a job taken by
    `claim`. A caller that retries passes the same `tokens` and asks `claimed_with_any` first.
    """
    tokens = tokens or [new_token() for _ in range(limit)]
    if len(tokens) < limit:
        raise ValueError(f"claim_many: {len(tokens)} tokens for up to {limit} jobs")
    params = {
        "p_session": session_id,
        "p_limit": int(limit),
        "p_lease_s": float(lease_s),
        "p_machine": who.machine_name,
        "p_gpu": who.gpu_id,
        "p_pid": who.pid,
    }
    with db.session(immediate=True) as s:
        conn = s.connection()
        pick = _NEXT_MANY if db.is_sqlite else _PICK_MANY_SKIP_LOCKED
        rows = conn.execute(pick, params).all()
        if not rows:
            return []
        taken = [
            {**params, "p_job": r.id, "p_token": t}
            for r, t in zip(rows, tokens[: len(rows)], strict=True)
        ]
        conn.execute(_TAKE_ONE, taken)
        conn.execute(_ADD_ATTEMPT, taken)
        return [
            Lease(r.id, t["p_token"], session_id, r.problem_id, r.retries,
                  load_problem(s, r.problem_id))
            for r, t in zip(rows, taken, strict=True)
        ]  # fmt: skip


def claimed_with_any(db: Database, tokens: list[str]) -> list[Lease]:
    """The jobs a batch claim with these tokens took, when that claim committed (its reply may
    have been lost), in claim order; empty when it did not commit."""
    with db.session() as s:
        rows = s.execute(
            sa.select(_J.c.id, _J.c.session_id, _J.c.problem_id, _J.c.retries, _J.c.lease_token)
            .where(_J.c.lease_token.in_(tokens), _J.c.state == RUNNING)
            .order_by(_J.c.priority, _J.c.id)
        ).all()
        return [
            Lease(r.id, r.lease_token, r.session_id, r.problem_id, r.retries,
                  load_problem(s, r.problem_id))
            for r in rows
        ]  # fmt: skip


def claimed_with(db: Database, token: str) -> Lease | None:
    """The job a claim with this token took, when that claim committed (its reply may not have
    reached us: a server restart between the commit and the answer)."""
    with db.session() as s:
        row = s.execute(
            sa.select(_J.c.id, _J.c.session_id, _J.c.problem_id, _J.c.retries).where(
                _J.c.lease_token == token, _J.c.state == RUNNING
            )
        ).first()
        if row is None:
            return None
        problem = load_problem(s, row.problem_id)
        return Lease(row.id, token, row.session_id, row.problem_id, row.retries, problem)


def _attempt_outcome(s: Session, token: str) -> str | None:
    """How the attempt with this token ended, if it did: what an earlier try of a retried
    write did when its commit landed and its reply was lost."""
    return s.scalar(sa.select(Attempt.outcome).where(Attempt.lease_token == token))


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


_FENCE = sa.and_(
    _J.c.id == sa.bindparam("p_job"),
    _J.c.lease_token == sa.bindparam("p_token"),
    _J.c.state == RUNNING,
)
_COMPLETE = (
    sa.update(_J)
    .where(_FENCE)
    .values(
        state=COMPLETED,
        result=sa.bindparam("p_output"),
        finished_at=_NOW,
        # The tuner's own phases where it has them, else the claim time and now.
        compile_start=sa.func.coalesce(
            sa.bindparam("p_compile_start", type_=_J.c.compile_start.type), _J.c.compile_start
        ),
        compile_end=sa.func.coalesce(
            sa.bindparam("p_compile_end", type_=_J.c.compile_end.type), _NOW
        ),
    )
)
_ADD_RESULT = sa.insert(Result.__table__)
_ADD_CANDIDATES = sa.insert(Candidate.__table__)


def record(db: Database, lease: Lease, outcome: TuneOutcome) -> bool:
    """Winner, every candidate and `completed` in one transaction, only while the lease holds."""
    ids = {"session_id": lease.session_id, "problem_id": lease.problem_id, "job_id": lease.job_id}
    with db.session(immediate=True) as s:
        conn = s.connection()
        done = conn.execute(
            _COMPLETE,
            {
                "p_job": lease.job_id,
                "p_token": lease.token,
                "p_output": _cut(outcome.output),
                "p_compile_start": _naive_utc(outcome.compile_start),
                "p_compile_end": _naive_utc(outcome.compile_end),
            },
        )
        # The fenced update comes first: when it matches nothing, nothing has been written.
        if done.rowcount != 1:
            if _attempt_outcome(s, lease.token) == "completed":
                return True  # an earlier try of this record committed; its reply was lost
            log.warning("job %s: lease lost before recording; recording nothing", lease.job_id)
            return False
        w, m = outcome.winner, outcome.margin
        conn.execute(
            _ADD_RESULT,
            {**ids, "perf_config": w.perf_config, "kernel_time": w.kernel_time_ns,
             "tflops": w.tflops, "tuned_at": None, "duration_s": None,
             "winner_margin": m and m.margin, "winner_noise": m and m.noise},
        )  # fmt: skip
        if outcome.candidates:
            conn.execute(
                _ADD_CANDIDATES,
                [{**ids, "perf_config": c.perf_config, "kernel_time": c.kernel_time_ns,
                  "tflops": c.tflops, "error": _cut(c.error, MAX_CANDIDATE_ERROR_BYTES),
                  **_spread_columns(c)}
                 for c in outcome.candidates],
            )  # fmt: skip
        _end_attempt(s, lease.token, "completed", None)
        return True


def _spread_columns(c: base.Candidate) -> dict[str, object]:
    """The candidate row's statistics columns (None where the tuner measured no spread)."""
    sp = c.spread
    return {
        "time_min": sp and sp.min,
        "time_iqr": sp and sp.iqr,
        "samples": sp and sp.samples,
        "remeasured": c.remeasured,
    }


def _naive_utc(when: dt.datetime | None) -> dt.datetime | None:
    """Tuners report aware UTC times; the columns hold naive UTC (models.py)."""
    if when is None or when.tzinfo is None:
        return when
    return when.astimezone(dt.UTC).replace(tzinfo=None)


def fail(
    db: Database,
    lease: Lease,
    message: str,
    *,
    max_retries: int,
    backoff_s: float,
    final: bool = False,
) -> str | None:
    """Count a failed attempt: back to `new` after a backoff, or `error` once retries run out
    or at once when `final` (a deterministic failure: retrying cannot help).

    Returns the job's new state, or None when the lease was already lost (nothing written).
    """
    retries = lease.retries + 1
    state = ERROR if final or retries >= max_retries else NEW
    delay = min(backoff_s * 2 ** (retries - 1), MAX_BACKOFF_S)
    what = "failed, not retried" if final else f"{retries}/{max_retries} failed"
    values: dict = {
        "state": state,
        "retries": retries,
        "result": _cut(f"attempt {what}: {message}"),
        "compile_end": db_now(),
        "not_before": db_now(delay) if state == NEW else None,
        "finished_at": db_now() if state == ERROR else None,
    }
    with db.session(immediate=True) as s:
        if s.execute(sa.update(Job).where(_fenced(lease)).values(values)).rowcount != 1:
            if _attempt_outcome(s, lease.token) == "failed":  # an earlier try committed
                return s.scalar(sa.select(Job.state).where(Job.id == lease.job_id))
            return None
        _end_attempt(s, lease.token, "failed", _cut(message))
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
            return _attempt_outcome(s, lease.token) == "released"  # an earlier try committed
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
