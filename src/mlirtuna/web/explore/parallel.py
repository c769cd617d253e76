"""The parallel-coordinates plot's read model: a session's valid candidates of one op and data
type, one numeric axis per perf-config field."""

from __future__ import annotations

from dataclasses import asdict, dataclass
from typing import Any

import sqlalchemy as sa

from mlirtuna import sessions
from mlirtuna.db import Database
from mlirtuna.db.models import Candidate, Problem
from mlirtuna.history import perffields, winners
from mlirtuna.web.explore.query import data_type_column, plottable, with_configs

PARALLEL_LIMIT = 5000  # candidates a parallel-coordinates plot draws at most


@dataclass(frozen=True)
class Parallel:
    """A session's valid candidates of one op and data type, as parallel coordinates: one
    numeric axis per perf-config field, coloured by TFlops over the best of the same problem."""

    session_id: int
    op: str
    data_type: str
    total: int  # valid candidates of that op and data type
    axes: dict[str, list[float]]  # field -> one value per candidate drawn; varying fields only
    score: list[float]  # TFlops / the problem's best TFlops, in (0, 1]
    perf_configs: list[str]
    # Numeric fields with one value in every drawn candidate: an axis of one value is drawn by
    # plotly over an invented range, and explains nothing; left out, and named.
    constant: list[str]

    def as_dict(self) -> dict[str, Any]:
        return asdict(self)


def parallel(
    db: Database, session_id: int, op: str, data_type: str = "", limit: int = PARALLEL_LIMIT
) -> Parallel:
    """The first `limit` valid candidates (by id) of the op and data type ("": any); the axes
    are the fields every drawn candidate has as a number (history.perffields) and that take more
    than one value among them."""
    winners.check_op(op)
    sessions.get(db, session_id)
    limit = min(max(limit, 1), PARALLEL_LIMIT)
    C = Candidate
    valid = [
        C.session_id == session_id,
        C.error.is_(None),
        C.kernel_time.is_not(None),
        C.tflops.is_not(None),
        Problem.op == op,
    ]
    if data_type:
        valid.append(data_type_column() == data_type)
    best = (
        sa.select(C.problem_id, sa.func.max(C.tflops).label("best"))
        .where(C.session_id == session_id, C.error.is_(None))
        .group_by(C.problem_id)
        .subquery()
    )
    base = with_configs(
        sa.select(C.perf_config, C.tflops, best.c.best)
        .select_from(C)
        .join(Problem, Problem.id == C.problem_id)
        .join(best, best.c.problem_id == C.problem_id),
        C.problem_id,
    ).where(*valid)
    with db.session() as s:
        total = s.scalar(sa.select(sa.func.count()).select_from(base.subquery())) or 0
        rows = s.execute(base.order_by(C.id).limit(limit)).all()
    rows = [r for r in rows if plottable(r.tflops, r.best, r.perf_config)]
    parsed = [perffields.fields(r.perf_config) for r in rows]
    names = perffields.columns([r.perf_config for r in rows])
    numeric = [n for n in names if all(isinstance(f.get(n), int) for f in parsed)]
    constant = [n for n in numeric if len({f[n] for f in parsed}) == 1]
    return Parallel(
        session_id,
        op,
        data_type,
        total,
        {n: [float(f[n]) for f in parsed] for n in numeric if n not in constant},
        [r.tflops / r.best if r.best else 0.0 for r in rows],
        [r.perf_config for r in rows],
        constant,
    )
