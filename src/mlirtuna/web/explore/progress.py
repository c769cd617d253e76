"""How a tuning got where it did, as optuna-dashboard shows a study: a problem's candidates in
the order they were tried with the best so far (history), and a session's empirical
distribution of TFlops over the best of each problem (EDF: how close the search's candidates
came to the winner, one curve per session)."""

from __future__ import annotations

import math
from dataclasses import asdict, dataclass
from typing import Any

import numpy as np
import sqlalchemy as sa

from mlirtuna import sessions
from mlirtuna.db import Database
from mlirtuna.db.models import Candidate
from mlirtuna.web.explore.problem import problem
from mlirtuna.web.explore.query import numbers

EDF_SAMPLE = 20_000  # candidates an EDF is drawn from at most (spread over the session by id)
EDF_POINTS = 101  # points of the curve: the 0th to 100th percentile


@dataclass(frozen=True)
class History:
    """One tuning's candidates in the order tried (candidate id), with the best so far."""

    session_id: int
    problem_id: int
    perf_configs: list[str]
    tflops: list[float | None]  # None: the candidate failed
    best_so_far: list[float | None]  # None until a valid candidate came

    def as_dict(self) -> dict[str, Any]:
        return asdict(self)


def history(db: Database, session_id: int, problem_id: int) -> History:
    sessions.get(db, session_id)
    problem(db, problem_id)
    C = Candidate
    with db.session() as s:
        rows = s.execute(
            sa.select(C.perf_config, C.tflops, C.error)
            .where(C.session_id == session_id, C.problem_id == problem_id)
            .order_by(C.id)
        ).all()
    tflops = [
        t if err is None and t is not None and math.isfinite(t) else None for _, t, err in rows
    ]
    best: list[float | None] = []
    so_far: float | None = None
    for value in tflops:
        if value is not None and (so_far is None or value > so_far):
            so_far = value
        best.append(so_far)
    return History(session_id, problem_id, [r[0] for r in rows], tflops, best)


@dataclass(frozen=True)
class Edf:
    """The empirical distribution of TFlops / the problem's best over a session's valid
    candidates: `share[i]` of them reach at most `ratio[i]`."""

    session_id: int
    total: int  # valid candidates of the session
    sampled: int  # candidates the curve was drawn from (every one when total <= EDF_SAMPLE)
    ratio: list[float]
    share: list[float]

    def as_dict(self) -> dict[str, Any]:
        return asdict(self)


def edf(db: Database, session_id: int) -> Edf:
    """The session's EDF, from at most EDF_SAMPLE candidates: every k-th by id when there are
    more (the whole session, not its first hours)."""
    sessions.get(db, session_id)
    C = Candidate
    valid = [C.session_id == session_id, C.error.is_(None), C.tflops > 0]
    best = (
        sa.select(C.problem_id, sa.func.max(C.tflops).label("best"))
        .where(*valid)
        .group_by(C.problem_id)
        .subquery()
    )
    with db.session() as s:
        total = s.scalar(sa.select(sa.func.count()).select_from(C).where(*valid)) or 0
        step = max(1, math.ceil(total / EDF_SAMPLE))
        stmt = (
            sa.select(C.tflops, best.c.best)
            .join(best, best.c.problem_id == C.problem_id)
            .where(*valid)
        )
        if step > 1:
            stmt = stmt.where(C.id % step == 0)
        pairs = s.execute(stmt).all()
    ratios = (numbers(t, b) for t, b in pairs)  # a wrong-typed row skipped
    values = np.array([t / b for t, b in ratios if t is not None and b], dtype=float)
    values = np.sort(values[np.isfinite(values)])
    if values.size == 0:
        return Edf(session_id, total, 0, [], [])
    share = np.linspace(0.0, 1.0, EDF_POINTS)
    ratio = np.quantile(values, share)
    return Edf(
        session_id, total, int(values.size), [float(r) for r in ratio], [float(q) for q in share]
    )
