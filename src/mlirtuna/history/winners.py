"""The winners of a session, as people and scripts read them (`mlirtuna results`).

Also the one rule of which result rows count (`counted`: the job completed, or the row was
imported and has no job) and the one query every reader of winners starts from
(`counted_results`: `mlirtuna results`, export, compare, reuse and the dashboard's winners page),
so that no reader can list a winner the others hide.
"""

from __future__ import annotations

from dataclasses import asdict, dataclass
from typing import Any

import sqlalchemy as sa
from sqlalchemy.sql.elements import ColumnElement

from mlirtuna import catalog, sessions
from mlirtuna.db import Database
from mlirtuna.db.models import COMPLETED, Candidate, FusionConfig, Job, Problem, Result
from mlirtuna.errors import UserError
from mlirtuna.problems import OPS

FIELDS = (
    "test_vector",
    "perf_config",
    "tflops",
    "kernel_time",
    "candidates",
    "winner_margin",
    "winner_noise",
)


@dataclass(frozen=True, slots=True)
class Winner:
    """One row of the winners table; kernel_time in ns; candidates = perf configs tried."""

    problem_id: int
    op: str
    test_vector: str
    perf_config: str
    tflops: float | None
    kernel_time: float | None
    candidates: int
    # Runner-up time / winner time - 1, and the noise of that difference (mlirtuna.stats);
    # None where the tuner had a single candidate or measured no spread.
    winner_margin: float | None = None
    winner_noise: float | None = None

    @property
    def within_noise(self) -> bool | None:
        """True when the runner-up is as fast as the winner within measurement noise."""
        if self.winner_margin is None or self.winner_noise is None:
            return None
        return self.winner_margin <= self.winner_noise

    def as_dict(self) -> dict[str, Any]:
        return {**asdict(self), "within_noise": self.within_noise}


def counted() -> ColumnElement[bool]:
    """Results that count: the job completed, or there is no job (imported from a .tsv).

    Needs `Job` outer-joined on Result.job_id. A result of a job put back to new or error by a
    requeue must not reach a tuning DB while the job is redone.
    """
    return sa.or_(Result.job_id.is_(None), Job.state == COMPLETED)


def counted_results(*columns: Any) -> sa.Select[Any]:
    """SELECT `columns` FROM result JOIN problem LEFT JOIN job WHERE counted().

    Callers add their own filters (session, op), joins (fusion_config, candidates) and order.
    """
    return (
        sa.select(*columns)
        .select_from(Result)
        .join(Problem, Problem.id == Result.problem_id)
        .outerjoin(Job, Job.id == Result.job_id)
        .where(counted())
    )


def tried_per_job(session_id: int) -> sa.Subquery:
    """(job_id, n): how many candidates each job of the session tried, grouped once."""
    return (
        sa.select(Candidate.job_id, sa.func.count().label("n"))
        .where(Candidate.session_id == session_id)
        .group_by(Candidate.job_id)
        .subquery()
    )


def check_op(op: str | None) -> None:
    if op is not None and op not in OPS:
        raise UserError(f"unknown op {op!r} (known: {', '.join(OPS)})")


def winners(db: Database, session_id: int, op: str | None = None) -> list[Winner]:
    """Every counted winner of a session with its candidate count: one query, counts grouped
    per job."""
    check_op(op)
    sessions.get(db, session_id)  # NotFound with a hint, rather than an empty table
    tried = tried_per_job(session_id)
    stmt = (
        counted_results(
            Result.problem_id,
            Problem.op,
            catalog.label_column(),  # a fusion module shows as file @function: key
            Result.perf_config,
            Result.tflops,
            Result.kernel_time,
            sa.func.coalesce(tried.c.n, 0),
            Result.winner_margin,
            Result.winner_noise,
        )
        .outerjoin(FusionConfig, FusionConfig.id == Problem.id)
        .outerjoin(tried, tried.c.job_id == Result.job_id)
        .where(Result.session_id == session_id)
        .order_by(Problem.op, Problem.test_vector)
    )
    if op is not None:
        stmt = stmt.where(Problem.op == op)
    with db.session() as s:
        return [Winner(*row) for row in s.execute(stmt)]
