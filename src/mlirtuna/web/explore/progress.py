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
from sqlalchemy.orm import Session as OrmSession

from mlirtuna import sessions
from mlirtuna.db import Database
from mlirtuna.db.models import Candidate
from mlirtuna.stats import stored_number
from mlirtuna.web.explore.candidates import is_dropped
from mlirtuna.web.explore.problem import problem
from mlirtuna.web.explore.query import numbers

EDF_SAMPLE = 20_000  # candidates an EDF is drawn from at most (spread over the session by id)
EDF_POINTS = 101  # points of the curve: the 0th to 100th percentile


# The history plot draws at most this many points: every k-th candidate in the order tried,
# and the candidates that raised the best so far (at most half of them, spread evenly, the last
# kept), so the best-so-far line is the whole tuning's at any size (issue 43: 200,000
# candidates unsampled were megabytes of JSON).
HISTORY_POINTS = 4000


@dataclass(frozen=True)
class History:
    """One tuning's candidates in the order tried (candidate id), with the best so far; at most
    HISTORY_POINTS of them (`total`: how many there are, `index`: each one's place, from 1)."""

    session_id: int
    problem_id: int
    total: int
    index: list[int]
    perf_configs: list[str]
    tflops: list[float | None]  # None: the candidate failed or was dropped
    dropped: list[bool]  # E4's "Discarded": measured, then dropped by the driver (not a failure)
    best_so_far: list[float | None]  # None until a valid candidate came

    def as_dict(self) -> dict[str, Any]:
        return asdict(self)


def history(db: Database, session_id: int, problem_id: int) -> History:
    """The tuning's history, sampled (HISTORY_POINTS): one pass over the candidates' numbers,
    then the perf configs of the points kept."""
    sessions.get(db, session_id)
    problem(db, problem_id)
    C = Candidate
    mine = [C.session_id == session_id, C.problem_id == problem_id]
    ids: list[int] = []
    tflops: list[float | None] = []
    dropped: list[bool] = []
    with db.session() as s:
        rows = s.execute(sa.select(C.id, C.tflops, C.error).where(*mine).order_by(C.id))
        for cid, value, error in rows:
            ids.append(cid)
            tflops.append(stored_number(value) if error is None else None)
            dropped.append(is_dropped(error))
        best, raised = _best_so_far(tflops)
        kept = _sample(len(ids), raised)
        configs = _perf_configs(s, [ids[i] for i in kept])
    return History(
        session_id, problem_id, len(ids), [i + 1 for i in kept],
        [configs[ids[i]] for i in kept], [tflops[i] for i in kept], [dropped[i] for i in kept],
        [best[i] for i in kept],
    )  # fmt: skip


def _best_so_far(tflops: list[float | None]) -> tuple[list[float | None], list[int]]:
    """The best TFlops up to each candidate, and the places where it rose."""
    best: list[float | None] = []
    raised: list[int] = []
    so_far: float | None = None
    for i, value in enumerate(tflops):
        if value is not None and (so_far is None or value > so_far):
            so_far = value
            raised.append(i)
        best.append(so_far)
    return best, raised


def _sample(total: int, raised: list[int]) -> list[int]:
    """The places drawn: all of them up to HISTORY_POINTS; beyond, every k-th and the rises."""
    if total <= HISTORY_POINTS:
        return list(range(total))
    half = HISTORY_POINTS // 2
    step = math.ceil(total / half)
    rises = raised[:: math.ceil(len(raised) / half)] + raised[-1:] if raised else []
    return sorted({*range(0, total, step), total - 1, *rises})


def _perf_configs(s: OrmSession, ids: list[int]) -> dict[int, str]:
    out: dict[int, str] = {}
    for i in range(0, len(ids), 500):
        chunk = ids[i : i + 500]
        stmt = sa.select(Candidate.id, Candidate.perf_config).where(Candidate.id.in_(chunk))
        out.update((cid, config) for cid, config in s.execute(stmt))
    return out


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
