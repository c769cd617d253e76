"""Every candidate of one tuning (a session x problem): the valid ones best first, the failed and
the dropped ones, and the candidate table (filtered, sorted and paged in the database, each
perf config's named fields as columns)."""

from __future__ import annotations

from collections import Counter
from dataclasses import asdict, dataclass, field
from typing import Any

import sqlalchemy as sa

from mlirtuna import sessions
from mlirtuna.db import Database
from mlirtuna.db.models import Candidate, Result
from mlirtuna.errors import UserError
from mlirtuna.history import perffields
from mlirtuna.web.explore.problem import problem
from mlirtuna.web.explore.query import (
    ERROR_TEXT_READ,
    escape_like,
    first_line,
    flagged,
    numbers,
)
from mlirtuna.web.farm import clamp_page


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


# The scatter and the two lists of the problem page draw at most this many candidates each
# (the best valid ones, the first failed and dropped ones by id); the candidate table pages
# through every one. 200,000 candidates unpaged were 34 MB of JSON (issue 43).
CANDIDATES_SHOWN = 1000
REASONS_READ = 200  # distinct error texts read to count the reasons (most frequent first)


@dataclass(frozen=True)
class Candidates:
    session_id: int
    problem_id: int
    winner: str | None
    valid: list[CandidateRow]  # best first; at most CANDIDATES_SHOWN
    invalid: list[CandidateRow]  # failed: not applicable, did not compile, crashed, …
    dropped: list[CandidateRow] = field(default_factory=list)  # measured, then not re-measured
    # How many there are of each in all (the lists above are the first CANDIDATES_SHOWN).
    totals: dict[str, int] = field(default_factory=dict)
    invalid_reasons: dict[str, int] = field(default_factory=dict)  # first line: how many

    def as_dict(self) -> dict[str, Any]:
        return asdict(self)


def _candidate_row(
    perf_config: str, tflops: Any, kernel_time: Any, error: str | None, remeasured: Any
) -> CandidateRow:
    """A stored candidate, its numbers read as numbers or flagged (query.flagged)."""
    [as_tflops, as_time] = numbers(tflops, kernel_time)
    return CandidateRow(
        perf_config, as_tflops, as_time, flagged(error, tflops, kernel_time), bool(remeasured),
        perffields.fields(perf_config),
    )  # fmt: skip


def _kinds() -> dict[str, sa.ColumnElement[bool]]:
    """Valid, invalid (failed) and dropped (E4's "Discarded") candidates, as conditions."""
    C = Candidate
    valid = sa.and_(C.error.is_(None), C.kernel_time.is_not(None))
    dropped = sa.func.coalesce(C.error, "").like(f"{DROPPED_PREFIX}%")
    return {"valid": valid, "invalid": sa.and_(sa.not_(valid), sa.not_(dropped)),
            "dropped": dropped}  # fmt: skip


def candidates(db: Database, session_id: int, problem_id: int) -> Candidates:
    """The problem page's candidates of one session: the CANDIDATES_SHOWN best valid ones, the
    first failed and dropped ones, how many of each, and the failures' reasons."""
    sessions.get(db, session_id)
    problem(db, problem_id)
    C = Candidate
    mine = [C.session_id == session_id, C.problem_id == problem_id]
    columns = (C.perf_config, C.tflops, C.kernel_time, C.error, C.remeasured)
    order = {"valid": (sa.case((C.tflops.is_(None), 1), else_=0), C.tflops.desc(),
                       C.kernel_time, C.id)}  # fmt: skip
    shown: dict[str, list[CandidateRow]] = {}
    with db.session() as s:
        for kind, where in _kinds().items():
            stmt = sa.select(*columns).where(*mine, where)
            stmt = stmt.order_by(*order.get(kind, (C.id,))).limit(CANDIDATES_SHOWN)
            shown[kind] = [_candidate_row(*r) for r in s.execute(stmt)]
        # One scan of the tuning's rows for the three counts.
        counts = s.execute(
            sa.select(*(sa.func.sum(sa.case((w, 1), else_=0)) for w in _kinds().values()))
            .select_from(C)
            .where(*mine)
        ).one()
        totals = {kind: int(n or 0) for kind, n in zip(_kinds(), counts, strict=True)}
        # Grouped on a subquery's column: PostgreSQL takes substr(…, $1, $2) in the GROUP BY
        # for another expression than the one selected (its parameters are other binds).
        texts = (
            sa.select(sa.func.substr(C.error, 1, ERROR_TEXT_READ).label("text"))
            .where(*mine, _kinds()["invalid"])
            .subquery()
        )
        reasons = s.execute(
            sa.select(texts.c.text, sa.func.count())
            .group_by(texts.c.text)
            .order_by(sa.func.count().desc())
            .limit(REASONS_READ)
        ).all()
        winner = s.scalar(
            sa.select(Result.perf_config).where(
                Result.session_id == session_id, Result.problem_id == problem_id
            )
        )
    # A stored number that is none (query.flagged) makes a "valid" row a failed one.
    readable = [c.error is None and c.kernel_time is not None for c in shown["valid"]]
    valid = [c for c, ok in zip(shown["valid"], readable, strict=True) if ok]
    invalid = [c for c, ok in zip(shown["valid"], readable, strict=True) if not ok]
    invalid += shown["invalid"]
    counted: Counter[str] = Counter()
    for text, n in reasons:
        counted[first_line(text)] += n
    return Candidates(
        session_id, problem_id, winner, valid, invalid[:CANDIDATES_SHOWN], shown["dropped"],
        totals, dict(counted.most_common()),
    )  # fmt: skip


# ---------------------------------------------------------------- the candidate table

CANDIDATE_SORTS = (
    "tflops",
    "kernel_time",
    "time_min",
    "time_iqr",
    "samples",
    "perf_config",
    "remeasured",
    "search_round",
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
    search_round: int | None = None  # a searched session's round that measured it (issue 45)


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
    # What the rule decided on, fastest first: the re-measured valid candidates (at most
    # DECIDED_SHOWN), or without re-measurement the fastest of the search.
    decided_on: list[TableRow] = field(default_factory=list)

    def as_dict(self) -> dict[str, Any]:
        return asdict(self)


DECIDED_SHOWN = 10  # rows of "why it won" at most
SEARCH_SHOWN = 3  # without re-measurement: the search's fastest shown beside the rule


def winner_rule(topk: int, remeasured: int, search: str | None = None) -> str:
    """The winner-selection rule of a tuning, in one sentence."""
    if search is not None:
        return f"searched ({search}); winner by median time of every round's measurements"
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
    kinds = _kinds()  # "invalid": failed; E4's dropped ones are shown apart
    valid = kinds["valid"]
    if where.show in kinds:
        conditions.append(kinds[where.show])
    elif where.show == "remeasured":
        conditions.append(C.remeasured == sa.true())
    if where.search:
        like = f"%{escape_like(where.search.strip())}%"
        conditions.append(C.perf_config.like(like, escape="\\"))
    key = getattr(C, where.sort)
    order = key.desc() if where.descending else key.asc()
    stmt = (
        sa.select(
            C.perf_config, C.tflops, C.kernel_time, C.time_min, C.time_iqr, C.samples,
            C.remeasured, C.error, C.search_round,
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

        # A searched session's winner is the fastest of every round (worker/search.py), each
        # round's top-k re-measured or not; otherwise re-measured candidates decide.
        by_rounds = info.search is not None

        def row(r: sa.Row) -> TableRow:
            [tflops, kernel_time, time_min, time_iqr] = numbers(
                r.tflops, r.kernel_time, r.time_min, r.time_iqr
            )
            return TableRow(
                r.perf_config, perffields.family(r.perf_config), perffields.fields(r.perf_config),
                tflops, kernel_time, time_min, time_iqr,
                r.samples if isinstance(r.samples, int) else None, bool(r.remeasured),
                r.perf_config == winner and r.error is None
                and (bool(r.remeasured) or not again or by_rounds),
                flagged(r.error, r.tflops, r.kernel_time), is_dropped(r.error),
                r.search_round if isinstance(r.search_round, int) else None,
            )  # fmt: skip

        rows = [row(r) for r in s.execute(stmt)]
        decided_stmt = (
            sa.select(*stmt.selected_columns)
            .where(*mine, valid, *([C.remeasured == sa.true()] if again and not by_rounds else []))
            .order_by(C.kernel_time, C.id)
            .limit(DECIDED_SHOWN if again or by_rounds else SEARCH_SHOWN)
        )
        decided_on = [row(r) for r in s.execute(decided_stmt)]
    return CandidatePage(
        session_id,
        problem_id,
        winner,
        winner_rule(info.topk, again, info.search),
        again,
        total,
        offset,
        perffields.columns([r.perf_config for r in rows]),
        rows,
        decided_on,
    )


# ---------------------------------------------------------------- compare rows
