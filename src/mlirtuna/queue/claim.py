"""Claiming jobs: the next `new` job of a session, by priority then id, skipping rows other
workers hold (`FOR UPDATE SKIP LOCKED` on PostgreSQL/MariaDB; on SQLite the write lock of BEGIN
IMMEDIATE serializes claims and `UPDATE … RETURNING` picks and takes the row in one statement);
claim_many takes up to K jobs in one transaction, each with its own token and attempt. Each job
taken is a Lease, whose token fences every later write about it (settle.py). A claim whose reply
was lost is found again by its token (claimed_with, claimed_with_any)."""

from __future__ import annotations

import datetime as dt
import os
import uuid
from collections.abc import Sequence
from dataclasses import dataclass, field
from typing import NamedTuple

import sqlalchemy as sa

import mlirtuna.queue.sql as sql
from mlirtuna import catalog
from mlirtuna.catalog import load_problem
from mlirtuna.db import Database, stored_time
from mlirtuna.db.models import RUNNING, TUNE, Job
from mlirtuna.problems import Problem

_J = Job.__table__


@dataclass(frozen=True)
class Lease:
    """A job this worker holds. `token` fences every write about it."""

    job_id: int
    token: str
    session_id: int
    problem_id: int
    retries: int
    problem: Problem | None = None  # read with the claim
    stage: str = TUNE  # models.STAGES


@dataclass(frozen=True)
class Claimant:
    """Who claims: recorded on the job and its attempt. `gpu` is the GPU's key (its unique id,
    else MACHINE:INDEX; "" without a GPU): no job is claimed on a GPU another worker (another
    `worker` token) holds a live attempt on. `gpu_perf`: its performance level, where known."""

    machine_name: str
    gpu_id: int
    pid: int = os.getpid()
    gpu: str = ""
    gpu_perf: str = ""
    worker: str = field(default_factory=lambda: new_token())

    def params(self) -> dict[str, object]:
        return {
            "p_machine": self.machine_name,
            "p_gpu": self.gpu_id,
            "p_pid": self.pid,
            "p_gpu_key": self.gpu,
            "p_gpu_perf": self.gpu_perf,
            "p_worker": self.worker,
        }


def new_token() -> str:
    return uuid.uuid4().hex


@dataclass(frozen=True)
class NextClaim:
    """The claim a worker sends with its record of the job before (settle.record_and_claim):
    the next job of this session and stage, taken with `token` (the same for every try)."""

    session_id: int
    who: Claimant
    lease_s: float
    stage: str = TUNE
    token: str = field(default_factory=new_token)

    def params(self, token_name: str = "p_token") -> dict[str, object]:
        return {
            "p_session": self.session_id,
            "p_stage": self.stage,
            token_name: self.token,
            "p_lease_s": float(self.lease_s),
            **self.who.params(),
        }

    def lease(self, conn: sa.Connection, taken: Sequence) -> Lease | None:
        """The Lease of a combined claim's row (job id, problem id, retries, problem columns;
        a NULL job id: nothing taken). A problem that is gone is left for the runner to
        report (problem None): the record it came with must still commit."""
        job_id, problem_id, retries, *problem = taken
        if job_id is None:
            return None
        try:
            found: Problem | None = _problem_of(conn, problem)
        except LookupError:
            found = None
        return Lease(job_id, self.token, self.session_id, problem_id, retries, found, self.stage)

    def take(self, db: Database, conn: sa.Connection) -> Lease | None:
        """The claim, in the caller's transaction (SQLite: after its record)."""
        row, problem = _take_next(db, conn, self.params())
        if row is None:
            return None
        return Lease(row.id, self.token, self.session_id, row.problem_id, row.retries, problem,
                     self.stage)  # fmt: skip


def claim(
    db: Database,
    session_id: int,
    who: Claimant,
    lease_s: float,
    token: str | None = None,
    stage: str = TUNE,
) -> Lease | None:
    """Take the next job of the session in this stage (models.STAGES: the worker's role in the
    session), or None when there is nothing to take now.

    The problem is read in the same transaction, so a claimed job is ready to tune. A caller
    that retries a claim passes the same `token` and asks `claimed_with` first.
    """
    token = token or new_token()
    params = {
        "p_session": session_id,
        "p_stage": stage,
        "p_token": token,
        "p_lease_s": float(lease_s),
        **who.params(),
    }
    with db.transaction(immediate=True, single=db.backend == "postgresql") as conn:
        row, problem = _take_next(db, conn, params)
        if row is None:
            return None
        return Lease(row.id, token, session_id, row.problem_id, row.retries, problem, stage)


class _Taken(NamedTuple):
    id: int
    problem_id: int
    retries: int


def _take_next(
    db: Database, conn: sa.Connection, params: dict
) -> tuple[_Taken | None, Problem | None]:
    """(the job taken: a row with id, problem_id, retries; its problem), or (None, None)."""
    if db.backend == "postgresql":
        row = sql.CLAIM_PG.run(conn, params).first()
        if row is None:
            return None, None
        return _Taken(*row[:3]), _problem_of(conn, row[3:])
    if db.is_sqlite:
        row = sql.CLAIM_SQLITE.run(conn, params).first()
        if row is None:
            return None, None
        taken = _Taken(*row)
        sql.ADD_ATTEMPT_SQLITE.run(conn, {**params, "p_job": taken.id})
        values = sql.READ_PROBLEM_SQLITE.run(conn, {"p_problem": taken.problem_id}).one()
        return taken, _problem_of(conn, values)
    last = sql.CLAIM_MYSQL.run_script(conn, params)[-1].first()
    if last is None:
        return None, None
    job_id, problem_id, retries, *problem = last
    return _Taken(job_id, problem_id, retries), _problem_of(conn, problem)


def _problem_of(conn: sa.Connection, values: Sequence) -> Problem:
    """The problem from the claim's problem columns (sql.py: op, config row as JSON)."""
    op, config = values
    if op is None:
        raise LookupError("the claimed job's problem is gone")
    return catalog.problem_from_json(conn.dialect, op, config)


def claim_many(
    db: Database,
    session_id: int,
    who: Claimant,
    lease_s: float,
    limit: int,
    tokens: list[str] | None = None,
    stage: str = TUNE,
) -> list[Lease]:
    """Take up to `limit` jobs of the session in this stage in one transaction, in claim order
    (priority, id); an empty list when there is nothing to take now.

    Each job gets its own lease token (tokens[i] for the i-th job taken) and its own attempt,
    so that each is recorded, failed, released or lost on its own, exactly as a job taken by
    `claim`. A caller that retries passes the same `tokens` and asks `claimed_with_any` first.
    """
    tokens = tokens or [new_token() for _ in range(limit)]
    if len(tokens) < limit:
        raise ValueError(f"claim_many: {len(tokens)} tokens for up to {limit} jobs")
    params = {
        "p_session": session_id,
        "p_stage": stage,
        "p_limit": int(limit),
        "p_lease_s": float(lease_s),
        **who.params(),
    }
    with db.session(immediate=True) as s:
        conn = s.connection()
        pick = sql.NEXT_MANY if db.is_sqlite else sql.PICK_MANY_SKIP_LOCKED
        rows = conn.execute(pick, params).all()
        if not rows:
            return []
        taken = [
            {**params, "p_job": r.id, "p_token": t}
            for r, t in zip(rows, tokens[: len(rows)], strict=True)
        ]
        conn.execute(sql.TAKE_ONE, taken)
        conn.execute(sql.ADD_ATTEMPT, taken)
        return [
            Lease(r.id, t["p_token"], session_id, r.problem_id, r.retries,
                  load_problem(s, r.problem_id), stage)
            for r, t in zip(rows, taken, strict=True)
        ]  # fmt: skip


def claimed_with_any(db: Database, tokens: list[str]) -> list[Lease]:
    """The jobs a batch claim with these tokens took, when that claim committed (its reply may
    have been lost), in claim order; empty when it did not commit."""
    with db.session() as s:
        rows = s.execute(
            sa.select(
                _J.c.id,
                _J.c.session_id,
                _J.c.problem_id,
                _J.c.retries,
                _J.c.lease_token,
                _J.c.stage,
            )
            .where(_J.c.lease_token.in_(tokens), _J.c.state == RUNNING)
            .order_by(_J.c.priority, _J.c.id)
        ).all()
        return [
            Lease(r.id, r.lease_token, r.session_id, r.problem_id, r.retries,
                  load_problem(s, r.problem_id), r.stage)
            for r in rows
        ]  # fmt: skip


def claimed_with(db: Database, token: str) -> Lease | None:
    """The job a claim with this token took, when that claim committed (its reply may not have
    reached us: a server restart between the commit and the answer)."""
    with db.session() as s:
        row = s.execute(
            sa.select(_J.c.id, _J.c.session_id, _J.c.problem_id, _J.c.retries, _J.c.stage).where(
                _J.c.lease_token == token, _J.c.state == RUNNING
            )
        ).first()
        if row is None:
            return None
        problem = load_problem(s, row.problem_id)
        return Lease(row.id, token, row.session_id, row.problem_id, row.retries, problem, row.stage)


class GpuHolder(NamedTuple):
    """Another worker's live attempt on a GPU: where and who (`worker`: its token, where the
    attempt has one). Its text is also what a worker writes into its GPU's lock file. Read
    from the database (gpu_holder): the job it holds, when that job's lease ends and how many
    seconds that is from now, both by the database's clock (what the claim compares)."""

    machine_name: str
    pid: int
    session_id: int
    worker: str | None = None
    job_id: int | None = None
    lease_ends: dt.datetime | None = None
    lease_left_s: float | None = None

    def __str__(self) -> str:
        return f"worker pid {self.pid} (session {self.session_id}) on {self.machine_name}"

    @property
    def lease_line(self) -> str:
        """`its lease on job 7 ends at 2026-12-06 06:32:10 UTC (in 95 s)`; "" when unknown."""
        if self.lease_ends is None or self.lease_left_s is None:
            return ""
        return (
            f"its lease on job {self.job_id} ends at {self.lease_ends:%Y-%m-%d %H:%M:%S} UTC "
            f"(in {max(self.lease_left_s, 0.0):.0f} s)"
        )


def gpu_holder(db: Database, who: Claimant) -> GpuHolder | None:
    """The worker, other than `who`, holding a live attempt on who's GPU (None: the GPU is
    free, or `who` has none). The claim itself refuses such a GPU (sql.GPU_HOLDERS); this is
    what a starting worker asks to say who holds it."""
    if not who.gpu:
        return None
    with db.session() as s:
        row = s.execute(
            sql.GPU_HOLDERS.order_by(sa.desc("claimed_at")).limit(1), who.params()
        ).first()
    if row is None:
        return None
    ends, now = stored_time(row.lease_expires_at), stored_time(row.db_now)
    left = (ends - now).total_seconds() if ends is not None and now is not None else None
    return GpuHolder(row.machine_name, row.pid, row.session_id, row.worker, row.job_id, ends, left)
