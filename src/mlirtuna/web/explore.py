"""Looking into one session or one problem: paged winners, distributions, grouped errors, trends
of a problem across sessions and every candidate of a tuning. Used by the dashboard (and open to
scripts); `history.winners.winners` stays the one full list the CLI prints and exports.

Filtering, sorting and paging happen in the database; distributions are binned here from one
column, never from whole rows.
"""

from __future__ import annotations

import datetime as dt
import re
from collections import Counter
from dataclasses import asdict, dataclass, field
from typing import Any

import numpy as np
import sqlalchemy as sa
from sqlalchemy.orm import Session as OrmSession
from sqlalchemy.orm import aliased

from mlirtuna import catalog, sessions, stats
from mlirtuna.db import Database
from mlirtuna.db.models import (
    COMPLETED,
    CONFIG_TABLES,
    ERROR,
    Candidate,
    FusionConfig,
    Job,
    Problem,
    ProblemTag,
    Result,
    TuningSession,
)
from mlirtuna.errors import NotFound, UserError
from mlirtuna.history import perffields, winners
from mlirtuna.problems import conv as conv_problems
from mlirtuna.problems import gemm as gemm_problems
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
ERROR_TEXT_READ = 400  # characters of each error read to find its first line
ERROR_JOBS_LISTED = 50  # job links per error group


def _typed() -> list[Any]:
    """The config tables with a data_type column (a fusion module has none of its own)."""
    return [t for t in CONFIG_TABLES.values() if hasattr(t, "data_type")]


# A fusion module's data type is its tuning key's: joined under a name of its own, so that a
# query may also join FusionConfig for the label (_with_labels).
_FUSION = aliased(FusionConfig, name="fusion_types")


def _fusion_data_type() -> sa.ColumnElement[str]:
    """The data type of a fusion's tuning key: a GEMM key's `-t TYPE`, a conv key's prefix
    (convfp16: f16); NULL for another key."""
    key, op = _FUSION.tuning_key, _FUSION.key_op
    whens = [(sa.and_(op == "gemm", key.like(f"-t {t} %")), t) for t in gemm_problems.DATA_TYPES]
    whens += [
        (sa.and_(op == "conv", key.like(f"{prefix} %")), t)
        for prefix, t in conv_problems.PREFIX_TYPES.items()
    ]
    return sa.case(*whens, else_=sa.null())


def _data_type() -> sa.ColumnElement[str]:
    """The problem's data type, whichever config table holds it (a fusion: its key's; '' where
    none does)."""
    return sa.func.coalesce(*(t.data_type for t in _typed()), _fusion_data_type(), "")


def _with_configs(stmt: sa.Select, problem_id: sa.ColumnExpressionArgument[int]) -> sa.Select:
    for table in _typed():
        stmt = stmt.outerjoin(table, table.id == problem_id)
    return stmt.outerjoin(_FUSION, _FUSION.id == problem_id)


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
    data_type = _data_type().label("data_type")
    n = sa.func.coalesce(tried.c.n, 0).label("candidates")
    conditions = _winner_conditions(session_id, where, data_type)
    base = _with_labels(
        _with_configs(winners.counted_results(Result.problem_id), Result.problem_id)
    ).where(*conditions)
    label = catalog.label_column()  # a fusion module reads file @function: key
    rows_stmt = _with_configs(
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
    rows_stmt = _with_labels(rows_stmt).where(*conditions)
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
        out.append(_data_type() == where.data_type)
    if where.tag:
        out.append(
            sa.exists().where(
                ProblemTag.problem_id == Result.problem_id, ProblemTag.tag == where.tag
            )
        )
    if where.search:
        like = f"%{_escape_like(where.search.strip())}%"
        out.append(
            sa.or_(
                catalog.label_column().like(like, escape="\\"),
                Problem.test_vector.like(like, escape="\\"),
                Result.perf_config.like(like, escape="\\"),
            )
        )
    return out


def _with_labels(stmt: sa.Select) -> sa.Select:
    """Outer-join FusionConfig on the problem: what catalog.label_column needs."""
    return stmt.outerjoin(FusionConfig, FusionConfig.id == Problem.id)


def _escape_like(text: str) -> str:
    return text.replace("\\", "\\\\").replace("%", "\\%").replace("_", "\\_")


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
    data_type = _data_type()
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
            _with_configs(sa.select(data_type).select_from(Result), Result.problem_id)
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
    numbers = [v for v in _numbers(*values) if v is not None]  # a wrong-typed row skipped
    return _histogram(np.asarray(numbers, dtype=float))


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
    seconds = np.fromiter(
        ((_dt(end) - _dt(start)).total_seconds() for start, end in rows), float, len(rows)
    )
    return _histogram(seconds)


def _dt(value: Any) -> dt.datetime:
    return value if isinstance(value, dt.datetime) else dt.datetime.fromisoformat(str(value))


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
        line = _first_line(text)
        pattern = mask_numbers(line)
        group = groups.setdefault(pattern, ErrorGroup(line, 0))
        if group.first_line != line:  # the lines differ in their numbers: show the pattern
            group.first_line = pattern
        group.count += 1
        if len(group.job_ids) < ERROR_JOBS_LISTED:
            group.job_ids.append(job_id)
    return sorted(groups.values(), key=lambda g: (-g.count, g.first_line))


_NUMBER = re.compile(r"\d+(?:\.\d+)?")


def mask_numbers(line: str) -> str:
    """An error line with each number written N: "timed out after 1/2/4 candidates" are one
    group ("timed out after N candidates")."""
    return _NUMBER.sub("N", line)


# queue.fail writes "attempt 2/3 failed: <why>" (or "attempt failed, not retried: <why>" for a
# failure retrying cannot fix); the count is not part of what went wrong.
_ATTEMPT = re.compile(r"^attempt (?:\d+/\d+ failed|failed, not retried): ")


def _first_line(text: str | None) -> str:
    stripped = (text or "").strip()
    return _ATTEMPT.sub("", stripped.splitlines()[0]) if stripped else "(no message)"


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
    data_type = _data_type()
    with db.session() as s:
        row = s.execute(
            _with_labels(
                _with_configs(
                    sa.select(
                        Problem.op,
                        Problem.test_vector,
                        data_type.label("data_type"),
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
                _dt(r.created_at).strftime("%Y-%m-%dT%H:%M:%SZ"),
                f"{r.arch_full} {r.num_cu}CU {r.num_chiplets}xCD {r.tuning_space} {r.tuner}",
                r.rocm_v,
                r.mlir_v,
                r.perf_config,
                r.tflops,
                r.kernel_time,
            )
            for r in s.execute(stmt)
        ]


@dataclass(frozen=True)
class CandidateRow:
    perf_config: str
    tflops: float | None
    kernel_time: float | None
    error: str | None
    remeasured: bool = False  # numbers from the top-k re-measurement
    fields: dict[str, int | str] = field(default_factory=dict)  # history.perffields


# rocMLIR E4's "Discarded" (tuners.rocmlir writes "Discarded by rocmlir-tuning-driver …"): a
# perf config measured in the first pass and then dropped (over its time budget, or outside the
# top k of a two-stage tuning). It compiled and ran: not re-measured, but not invalid either.
DROPPED_PREFIX = "Discarded"


def is_dropped(error: str | None) -> bool:
    return bool(error) and str(error).startswith(DROPPED_PREFIX)


@dataclass(frozen=True)
class Candidates:
    session_id: int
    problem_id: int
    winner: str | None
    valid: list[CandidateRow]  # best first
    invalid: list[CandidateRow]  # failed: not applicable, did not compile, crashed, …
    dropped: list[CandidateRow] = field(default_factory=list)  # measured, then not re-measured

    def as_dict(self) -> dict[str, Any]:
        return asdict(self)


def candidates(db: Database, session_id: int, problem_id: int) -> Candidates:
    """Every perf config tried for one problem in one session, valid ones best first."""
    sessions.get(db, session_id)
    problem(db, problem_id)
    with db.session() as s:
        rows = s.execute(
            sa.select(
                Candidate.perf_config,
                Candidate.tflops,
                Candidate.kernel_time,
                Candidate.error,
                Candidate.remeasured,
            )
            .where(Candidate.session_id == session_id, Candidate.problem_id == problem_id)
            .order_by(Candidate.id)
        ).all()
        winner = s.scalar(
            sa.select(Result.perf_config).where(
                Result.session_id == session_id, Result.problem_id == problem_id
            )
        )
    every = [
        CandidateRow(
            r[0], *_numbers(r[1], r[2]), _flagged(r[3], r[1], r[2]), bool(r[4]),
            perffields.fields(r[0]),
        )
        for r in rows
    ]  # fmt: skip
    valid = [c for c in every if c.error is None and c.kernel_time is not None]
    invalid = [c for c in every if c.error is not None or c.kernel_time is None]
    valid.sort(key=lambda c: (-(c.tflops or 0.0), c.kernel_time or 0.0))
    dropped = [c for c in invalid if is_dropped(c.error)]
    invalid = [c for c in invalid if not is_dropped(c.error)]
    return Candidates(session_id, problem_id, winner, valid, invalid, dropped)


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


def error_reasons(c: Candidates) -> dict[str, int]:
    """How many invalid candidates gave each reason (first line)."""
    return dict(Counter(_first_line(x.error) for x in c.invalid).most_common())


# ---------------------------------------------------------------- the candidate table

CANDIDATE_SORTS = (
    "tflops",
    "kernel_time",
    "time_min",
    "time_iqr",
    "samples",
    "perf_config",
    "remeasured",
)
CANDIDATE_SHOWS = ("all", "valid", "invalid", "remeasured", "dropped")


@dataclass(frozen=True)
class CandidateFilter:
    search: str | None = None  # a substring of the perf config
    show: str = "all"  # all | valid | invalid | remeasured | dropped
    sort: str = "tflops"
    descending: bool = True


@dataclass(frozen=True)
class TableRow:
    """One candidate with its time statistics (ns) and its perf config's named fields."""

    perf_config: str
    family: str
    fields: dict[str, int | str]
    tflops: float | None
    kernel_time: float | None  # the median of the samples
    time_min: float | None
    time_iqr: float | None  # the spread: interquartile range
    samples: int | None
    remeasured: bool
    winner: bool
    error: str | None
    dropped: bool = False  # E4 "Discarded": measured, then dropped without re-measurement


@dataclass(frozen=True)
class CandidatePage:
    session_id: int
    problem_id: int
    winner: str | None
    rule: str  # how the winner was chosen, one sentence
    remeasured: int  # candidates re-measured in the top-k pass
    total: int  # rows matching the filter
    offset: int
    columns: list[str]  # the perf-config fields of this page's rows
    rows: list[TableRow]

    def as_dict(self) -> dict[str, Any]:
        return asdict(self)


def winner_rule(topk: int, remeasured: int) -> str:
    """The winner-selection rule of a tuning, in one sentence."""
    if remeasured:
        return f"re-measured top {min(topk, remeasured)} side by side; winner by median time"
    return "no re-measurement; winner by median time of the search"


def candidate_page(
    db: Database,
    session_id: int,
    problem_id: int,
    where: CandidateFilter,
    offset: int = 0,
    limit: int = 50,
) -> CandidatePage:
    """One page of every candidate of a tuning, filtered, sorted and paged in the database."""
    if where.sort not in CANDIDATE_SORTS:
        raise UserError(f"unknown sort {where.sort!r} (known: {', '.join(CANDIDATE_SORTS)})")
    if where.show not in CANDIDATE_SHOWS:
        raise UserError(f"unknown show {where.show!r} (known: {', '.join(CANDIDATE_SHOWS)})")
    info = sessions.get(db, session_id)
    problem(db, problem_id)
    offset, limit = clamp_page(offset, limit)
    C = Candidate
    mine = [C.session_id == session_id, C.problem_id == problem_id]
    conditions = list(mine)
    valid = sa.and_(C.error.is_(None), C.kernel_time.is_not(None))
    dropped = sa.func.coalesce(C.error, "").like(f"{DROPPED_PREFIX}%")
    if where.show == "valid":
        conditions.append(valid)
    elif where.show == "invalid":  # failed; E4's dropped ones are shown apart
        conditions.append(sa.and_(sa.not_(valid), sa.not_(dropped)))
    elif where.show == "dropped":
        conditions.append(dropped)
    elif where.show == "remeasured":
        conditions.append(C.remeasured == sa.true())
    if where.search:
        like = f"%{_escape_like(where.search.strip())}%"
        conditions.append(C.perf_config.like(like, escape="\\"))
    key = getattr(C, where.sort)
    order = key.desc() if where.descending else key.asc()
    stmt = (
        sa.select(
            C.perf_config, C.tflops, C.kernel_time, C.time_min, C.time_iqr, C.samples,
            C.remeasured, C.error,
        )
        .where(*conditions)
        .order_by(sa.case((key.is_(None), 1), else_=0), order, C.id)
        .offset(offset)
        .limit(limit)
    )  # fmt: skip
    with db.session() as s:
        total = s.scalar(sa.select(sa.func.count()).select_from(C).where(*conditions)) or 0
        again = (
            s.scalar(
                sa.select(sa.func.count()).select_from(C).where(*mine, C.remeasured == sa.true())
            )
            or 0
        )
        winner = s.scalar(
            sa.select(Result.perf_config).where(
                Result.session_id == session_id, Result.problem_id == problem_id
            )
        )
        rows = [
            TableRow(
                r.perf_config, perffields.family(r.perf_config), perffields.fields(r.perf_config),
                *_numbers(r.tflops, r.kernel_time, r.time_min, r.time_iqr),
                r.samples if isinstance(r.samples, int) else None, bool(r.remeasured),
                r.perf_config == winner and r.error is None and (bool(r.remeasured) or not again),
                _flagged(r.error, r.tflops, r.kernel_time), is_dropped(r.error),
            )
            for r in s.execute(stmt)
        ]  # fmt: skip
    return CandidatePage(
        session_id,
        problem_id,
        winner,
        winner_rule(info.topk, again),
        again,
        total,
        offset,
        perffields.columns([r.perf_config for r in rows]),
        rows,
    )


# ---------------------------------------------------------------- rows of the wrong type
# SQLite stores what it is given: text in a REAL column, a perf-config field past a double.
# Such a row is flagged (its numbers read as None, its error says why) or skipped (a plot),
# never a 500.
WRONG_TYPE = "stored TFlops or time is not a number (the row was written outside mlirtuna)"
PLOT_FIELD_MAX = 2**53  # a perf-config field a float axis holds exactly


def _numbers(*values: Any) -> list[float | None]:
    return [stats.stored_number(v) for v in values]


def _flagged(error: str | None, *values: Any) -> str | None:
    """A candidate's error, or WRONG_TYPE when a stored number of it is not one."""
    wrong = any(v is not None and stats.stored_number(v) is None for v in values)
    return error if error is not None or not wrong else WRONG_TYPE


def _plottable(tflops: Any, best: Any, perf_config: str) -> bool:
    """A candidate parallel coordinates can draw: numbers where numbers are stored, and perf
    config fields a float holds."""
    if stats.stored_number(tflops) is None or stats.stored_number(best) is None:
        return False
    fields = perffields.fields(perf_config).values()
    return all(not isinstance(v, int) or abs(v) <= PLOT_FIELD_MAX for v in fields)


# ---------------------------------------------------------------- compare rows


def labels(db: Database, problem_ids: list[int]) -> dict[int, str]:
    """How each problem reads (catalog.label_column): a fusion's file @function: key."""
    wanted = sorted(set(problem_ids))
    out: dict[int, str] = {}
    with db.session() as s:
        for i in range(0, len(wanted), 500):
            stmt = _with_labels(
                sa.select(Problem.id, catalog.label_column()).where(
                    Problem.id.in_(wanted[i : i + 500])
                )
            )
            out.update({pid: label for pid, label in s.execute(stmt)})
    return out


def compare_rows(
    db: Database, groups: dict[str, list[Any]], entries_a: dict[str, Any], entries_b: dict[str, Any]
) -> dict[str, list[dict[str, Any]]]:
    """The compare page's rows (history.compare.Regression) with what the page links and shows:
    the problem id on each side, its label, and the larger relative noise of the two sides."""
    ids: dict[str, int | None] = {}
    for rows in groups.values():
        for r in rows:
            a, b = entries_a.get(r.test_vector), entries_b.get(r.test_vector)
            ids[r.test_vector] = (b and b.problem_id) or (a and a.problem_id) or None
    named = labels(db, [i for i in ids.values() if i is not None])
    out: dict[str, list[dict[str, Any]]] = {}
    for name, rows in groups.items():
        out[name] = []
        for r in rows:
            row = asdict(r)
            pid = ids[r.test_vector]
            row["problem_id"] = pid
            row["label"] = named.get(pid, r.test_vector) if pid is not None else r.test_vector
            sides = [
                e.rel_noise
                for e in (entries_a.get(r.test_vector), entries_b.get(r.test_vector))
                if e
            ]
            known = [n for n in (r.noise_a, r.noise_b, *sides) if n is not None]
            row["noise"] = max(known) if known else None
            out[name].append(row)
    return out


# ---------------------------------------------------------------- parallel coordinates

PARALLEL_LIMIT = 5000  # candidates a parallel-coordinates plot draws at most


@dataclass(frozen=True)
class Parallel:
    """A session's valid candidates of one op and data type, as parallel coordinates: one
    numeric axis per perf-config field, coloured by TFlops over the best of the same problem."""

    session_id: int
    op: str
    data_type: str
    total: int  # valid candidates of that op and data type
    axes: dict[str, list[float]]  # field -> one value per candidate drawn
    score: list[float]  # TFlops / the problem's best TFlops, in (0, 1]
    perf_configs: list[str]

    def as_dict(self) -> dict[str, Any]:
        return asdict(self)


def parallel(
    db: Database, session_id: int, op: str, data_type: str = "", limit: int = PARALLEL_LIMIT
) -> Parallel:
    """The first `limit` valid candidates (by id) of the op and data type ("": any); the axes
    are the fields every drawn candidate has as a number (history.perffields)."""
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
        valid.append(_data_type() == data_type)
    best = (
        sa.select(C.problem_id, sa.func.max(C.tflops).label("best"))
        .where(C.session_id == session_id, C.error.is_(None))
        .group_by(C.problem_id)
        .subquery()
    )
    base = _with_configs(
        sa.select(C.perf_config, C.tflops, best.c.best)
        .select_from(C)
        .join(Problem, Problem.id == C.problem_id)
        .join(best, best.c.problem_id == C.problem_id),
        C.problem_id,
    ).where(*valid)
    with db.session() as s:
        total = s.scalar(sa.select(sa.func.count()).select_from(base.subquery())) or 0
        rows = s.execute(base.order_by(C.id).limit(limit)).all()
    rows = [r for r in rows if _plottable(r.tflops, r.best, r.perf_config)]
    parsed = [perffields.fields(r.perf_config) for r in rows]
    names = perffields.columns([r.perf_config for r in rows])
    numeric = [n for n in names if all(isinstance(f.get(n), int) for f in parsed)]
    return Parallel(
        session_id,
        op,
        data_type,
        total,
        {n: [float(f[n]) for f in parsed] for n in numeric},
        [r.tflops / r.best if r.best else 0.0 for r in rows],
        [r.perf_config for r in rows],
    )
