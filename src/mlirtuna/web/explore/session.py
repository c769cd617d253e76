"""The session page's read model: paged winners with filters and facets, the distributions of
TFlops and job times, the failed jobs grouped by their error's first line.

Filtering, sorting and paging happen in the database; distributions are binned here from one
column, never from whole rows."""

from __future__ import annotations

from dataclasses import asdict, dataclass, field
from typing import Any

import numpy as np
import sqlalchemy as sa

from mlirtuna import catalog, sessions
from mlirtuna.db import Database, stored_time
from mlirtuna.db.models import COMPLETED, ERROR, Job, Problem, ProblemTag, Result
from mlirtuna.errors import UserError
from mlirtuna.history import winners
from mlirtuna.web.explore.query import (
    ERROR_TEXT_READ,
    data_type_column,
    escape_like,
    first_line,
    mask_numbers,
    numbers,
    with_configs,
    with_labels,
)
from mlirtuna.web.farm import clamp_page

WINNER_SORTS = (
    "test_vector",
    "op",
    "data_type",
    "perf_config",
    "tflops",
    "kernel_time",
    "candidates",
)
HISTOGRAM_BINS = 30
ERROR_JOBS_LISTED = 50  # job links per error group


@dataclass(frozen=True)
class WinnerRow:
    problem_id: int
    op: str
    data_type: str
    test_vector: str
    perf_config: str
    tflops: float | None
    kernel_time: float | None
    candidates: int
    job_id: int | None
    # Runner-up / winner time - 1 and the noise of that difference (mlirtuna.stats).
    winner_margin: float | None = None
    winner_noise: float | None = None


@dataclass(frozen=True)
class WinnerFilter:
    op: str | None = None
    tag: str | None = None
    data_type: str | None = None
    search: str | None = None  # a substring of the test vector or the perf config
    sort: str = "test_vector"
    descending: bool = False


@dataclass(frozen=True)
class WinnersPage:
    session_id: int
    total: int  # rows matching the filter
    offset: int
    rows: list[WinnerRow]

    def as_dict(self) -> dict[str, Any]:
        return asdict(self)


def winners_page(
    db: Database, session_id: int, where: WinnerFilter, offset: int = 0, limit: int = 50
) -> WinnersPage:
    """One page of a session's counted winners (winners.counted_results), filtered and sorted
    in the database."""
    winners.check_op(where.op)
    if where.sort not in WINNER_SORTS:
        raise UserError(f"unknown sort {where.sort!r} (known: {', '.join(WINNER_SORTS)})")
    sessions.get(db, session_id)
    offset, limit = clamp_page(offset, limit)
    tried = winners.tried_per_job(session_id)
    data_type = data_type_column().label("data_type")
    n = sa.func.coalesce(tried.c.n, 0).label("candidates")
    conditions = _winner_conditions(session_id, where, data_type)
    base = with_labels(
        with_configs(winners.counted_results(Result.problem_id), Result.problem_id)
    ).where(*conditions)
    label = catalog.label_column()  # a fusion module reads file @function: key
    rows_stmt = with_configs(
        winners.counted_results(
            Result.problem_id,
            Problem.op,
            data_type,
            label.label("test_vector"),
            Result.perf_config,
            Result.tflops,
            Result.kernel_time,
            n,
            Result.job_id,
            Result.winner_margin,
            Result.winner_noise,
        ).outerjoin(tried, tried.c.job_id == Result.job_id),
        Result.problem_id,
    )
    rows_stmt = with_labels(rows_stmt).where(*conditions)
    key = {
        "test_vector": label,
        "op": Problem.op,
        "data_type": data_type,
        "perf_config": Result.perf_config,
        "tflops": Result.tflops,
        "kernel_time": Result.kernel_time,
        "candidates": n,
    }[where.sort]
    order = key.desc() if where.descending else key.asc()
    # NULL TFlops sort last either way; the problem id makes pages stable.
    rows_stmt = rows_stmt.order_by(sa.case((key.is_(None), 1), else_=0), order, Result.problem_id)
    with db.session() as s:
        total = s.scalar(sa.select(sa.func.count()).select_from(base.subquery())) or 0
        rows = [WinnerRow(*r) for r in s.execute(rows_stmt.offset(offset).limit(limit))]
    return WinnersPage(session_id, total, offset, rows)


def _winner_conditions(
    session_id: int, where: WinnerFilter, data_type: sa.ColumnElement[str]
) -> list[sa.ColumnElement[bool]]:
    out: list[sa.ColumnElement[bool]] = [Result.session_id == session_id]
    if where.op:
        out.append(Problem.op == where.op)
    if where.data_type:
        out.append(data_type_column() == where.data_type)
    if where.tag:
        out.append(
            sa.exists().where(
                ProblemTag.problem_id == Result.problem_id, ProblemTag.tag == where.tag
            )
        )
    if where.search:
        like = f"%{escape_like(where.search.strip())}%"
        out.append(
            sa.or_(
                catalog.label_column().like(like, escape="\\"),
                Problem.test_vector.like(like, escape="\\"),
                Result.perf_config.like(like, escape="\\"),
            )
        )
    return out


@dataclass(frozen=True)
class Facets:
    """The values the winners of a session can be filtered by."""

    ops: list[str]
    data_types: list[str]
    tags: list[str]

    def as_dict(self) -> dict[str, Any]:
        return asdict(self)


def facets(db: Database, session_id: int) -> Facets:
    sessions.get(db, session_id)
    data_type = data_type_column()
    mine = Result.session_id == session_id
    with db.session() as s:
        ops = s.scalars(
            sa.select(Problem.op)
            .join(Result, Result.problem_id == Problem.id)
            .where(mine)
            .distinct()
            .order_by(Problem.op)
        ).all()
        types = s.scalars(
            with_configs(sa.select(data_type).select_from(Result), Result.problem_id)
            .where(mine)
            .distinct()
            .order_by(data_type)
        ).all()
        tags = s.scalars(
            sa.select(ProblemTag.tag)
            .join(Result, Result.problem_id == ProblemTag.problem_id)
            .where(mine)
            .distinct()
            .order_by(ProblemTag.tag)
        ).all()
    return Facets(list(ops), [t for t in types if t], list(tags))


@dataclass(frozen=True)
class Histogram:
    """Counts per bin; `edges` has one more value than `counts`."""

    count: int
    edges: list[float]
    counts: list[int]
    median: float | None = None
    mean: float | None = None
    total: float | None = None

    def as_dict(self) -> dict[str, Any]:
        return asdict(self)


def _histogram(values: np.ndarray, bins: int = HISTOGRAM_BINS) -> Histogram:
    values = values[np.isfinite(values)]
    if values.size == 0:
        return Histogram(0, [], [])
    counts, edges = np.histogram(values, bins=min(bins, max(int(values.size), 1)))
    return Histogram(
        int(values.size),
        [float(e) for e in edges],
        [int(c) for c in counts],
        float(np.median(values)),
        float(values.mean()),
        float(values.sum()),
    )


def tflops_distribution(db: Database, session_id: int) -> Histogram:
    """The winners' TFlops of a session, binned."""
    sessions.get(db, session_id)
    with db.session() as s:
        values = s.scalars(
            sa.select(Result.tflops).where(
                Result.session_id == session_id, Result.tflops.is_not(None)
            )
        ).all()
    kept = [v for v in numbers(*values) if v is not None]  # a wrong-typed row skipped
    return _histogram(np.asarray(kept, dtype=float))


def job_times(db: Database, session_id: int) -> Histogram:
    """Seconds per completed job (claim to record), binned; `total` is the tuning time spent."""
    sessions.get(db, session_id)
    with db.session() as s:
        rows = s.execute(
            sa.select(Job.claimed_at, Job.finished_at).where(
                Job.session_id == session_id,
                Job.state == COMPLETED,
                Job.claimed_at.is_not(None),
                Job.finished_at.is_not(None),
            )
        ).all()
    times = [(stored_time(start), stored_time(end)) for start, end in rows]
    seconds = np.fromiter(  # a row with a time that is none: skipped (db.stored_time)
        ((end - start).total_seconds() for start, end in times if start and end), float
    )
    return _histogram(seconds)


@dataclass
class ErrorGroup:
    """Jobs whose error text starts with the same line."""

    first_line: str
    count: int
    job_ids: list[int] = field(default_factory=list)  # the first ERROR_JOBS_LISTED of them


def error_groups(db: Database, session_id: int) -> list[ErrorGroup]:
    """The session's failed jobs grouped by the first line of their error, most frequent first."""
    sessions.get(db, session_id)
    with db.session() as s:
        rows = s.execute(
            sa.select(Job.id, sa.func.substr(Job.result, 1, ERROR_TEXT_READ))
            .where(Job.session_id == session_id, Job.state == ERROR)
            .order_by(Job.id)
        ).all()
    groups: dict[str, ErrorGroup] = {}
    for job_id, text in rows:
        line = first_line(text)
        pattern = mask_numbers(line)
        group = groups.setdefault(pattern, ErrorGroup(line, 0))
        if group.first_line != line:  # the lines differ in their numbers: show the pattern
            group.first_line = pattern
        group.count += 1
        if len(group.job_ids) < ERROR_JOBS_LISTED:
            group.job_ids.append(job_id)
    return sorted(groups.values(), key=lambda g: (-g.count, g.first_line))
