"""The problem page's read model: what the problem is, its winner across sessions (the trend),
the sessions that tuned it."""

from __future__ import annotations

from dataclasses import asdict, dataclass
from typing import Any

import sqlalchemy as sa
from sqlalchemy.orm import Session as OrmSession

from mlirtuna import catalog
from mlirtuna.db import Database
from mlirtuna.db.models import CONFIG_TABLES, Problem, ProblemTag, Result, TuningSession
from mlirtuna.errors import NotFound
from mlirtuna.web.explore.query import data_type_column, numbers, with_configs, with_labels


@dataclass(frozen=True)
class ProblemInfo:
    id: int
    op: str
    test_vector: str
    data_type: str
    tags: list[str]
    sessions: int  # sessions with a winner for it
    # A fusion problem: the module's text and the key rocMLIR's tuning DB files its winner under.
    module: str | None = None
    tuning_key: str | None = None
    label: str = ""  # how people read it: the test vector, or a fusion's file @function: key

    def as_dict(self) -> dict[str, Any]:
        return asdict(self)


def problem(db: Database, problem_id: int) -> ProblemInfo:
    dtype = data_type_column()
    with db.session() as s:
        row = s.execute(
            with_labels(
                with_configs(
                    sa.select(
                        Problem.op,
                        Problem.test_vector,
                        dtype.label("data_type"),
                        catalog.label_column().label("label"),
                    ),
                    Problem.id,
                )
            ).where(Problem.id == problem_id)
        ).first()
        if row is None:
            raise NotFound(f"no problem {problem_id}")
        tags = s.scalars(
            sa.select(ProblemTag.tag)
            .where(ProblemTag.problem_id == problem_id)
            .order_by(ProblemTag.tag)
        ).all()
        n = s.scalar(sa.select(sa.func.count()).where(Result.problem_id == problem_id)) or 0
        module = _module(s, row.op, problem_id)
    return ProblemInfo(
        problem_id, row.op, row.test_vector, row.data_type, list(tags), n, *module, row.label
    )


def _module(s: OrmSession, op: str, problem_id: int) -> tuple[str | None, str | None]:
    """(module text, tuning key) where the op's config table keeps a module, else Nones."""
    table: Any = CONFIG_TABLES.get(op)
    if table is None or not hasattr(table, "module_text"):
        return None, None
    row = s.execute(
        sa.select(table.module_text, getattr(table, "tuning_key", sa.null())).where(
            table.id == problem_id
        )
    ).first()
    return (row[0], row[1]) if row is not None else (None, None)


@dataclass(frozen=True)
class TrendPoint:
    """The winner of one problem in one session, with the session's context."""

    session_id: int
    created_at: str
    context: str  # arch_full, CUs, chiplets, space, tuner: the line it is drawn on
    rocm_v: str
    mlir_v: str
    perf_config: str
    tflops: float | None
    kernel_time: float | None


def trend(db: Database, problem_id: int) -> list[TrendPoint]:
    """The problem's winner in every session that tuned it, oldest session first."""
    problem(db, problem_id)
    S = TuningSession
    stmt = (
        sa.select(
            S.id, S.created_at, S.arch_full, S.num_cu, S.num_chiplets, S.tuning_space, S.tuner,
            S.rocm_v, S.mlir_v, Result.perf_config, Result.tflops, Result.kernel_time,
        )
        .join(S, S.id == Result.session_id)
        .where(Result.problem_id == problem_id)
        .order_by(S.created_at, S.id)
    )  # fmt: skip
    with db.session() as s:
        return [
            TrendPoint(
                r.id,
                r.created_at.strftime("%Y-%m-%dT%H:%M:%SZ") if r.created_at else "",
                f"{r.arch_full} {r.num_cu}CU {r.num_chiplets}xCD {r.tuning_space} {r.tuner}",
                r.rocm_v,
                r.mlir_v,
                r.perf_config,
                *numbers(r.tflops, r.kernel_time),
            )
            for r in s.execute(stmt)
        ]


def sessions_of_problem(db: Database, problem_id: int) -> list[int]:
    """Sessions with a winner for the problem, newest first (the candidate scatter's choices)."""
    with db.session() as s:
        return list(
            s.scalars(
                sa.select(Result.session_id)
                .where(Result.problem_id == problem_id)
                .order_by(Result.session_id.desc())
            )
        )
