"""Tune less: skip what an equivalent session already tuned, reuse its results, and re-tune only
what a new rocMLIR commit made stale (`jobs load --skip-tuned / --reuse / --changed-since`,
`session diff`).

Two sessions are *equivalent* when everything that decides a tuning result is the same: arch_full,
num_cu, num_chiplets, tuning space, rocMLIR commit (mlir_v), the search and its budget (a
searched session's winners are not the whole space's), and the tuner (a .tsv imported from
rocMLIR counts as the rocmlir tuner), and both or neither were tuned on mlirtuna's stand-in build
(a stand-in session's made-up numbers never reach a real session unless it is named:
`--changed-since SESSION`). A result "counts" as winners.counted() says: its job
completed, or it was imported.
"""

from __future__ import annotations

import datetime as dt
import math
import random
from collections.abc import Callable, Iterable
from dataclasses import asdict, dataclass, field
from typing import Any

import sqlalchemy as sa
from sqlalchemy.orm import Session as OrmSession

import mlirtuna.history.winners as winners
from mlirtuna import sessions
from mlirtuna.db import Database, db_now
from mlirtuna.db.models import COMPLETED, Job, Problem, Result, TuningSession
from mlirtuna.errors import UserError
from mlirtuna.keys import perf_config_format  # the one place for families
from mlirtuna.queue import jobs
from mlirtuna.sessions import Session

#: The session fields that decide a tuning result (besides the tuner's family).
#: A searched session (issue 45) measured only some of its space: its winners are not a whole
#: space's, nor another strategy's or budget's (search and search_budget; None: whole space).
CONTEXT_FIELDS = (
    "arch_full", "num_cu", "num_chiplets", "tuning_space", "mlir_v", "search", "search_budget",
)  # fmt: skip
#: Rules of `jobs load --changed-since`.
RULES = ("all", "family-changed")


def measured_by(tuner: str) -> str:
    """The tuner that measured a session's results: its own (`sleep:0.1` is the sleep tuner);
    imported .tsv files come from rocMLIR's tuningRunner, the tuner whose perf configs carry no
    prefix (rocmlir, the registry says)."""
    import mlirtuna.history.tsvimport as tsvimport
    from mlirtuna import tuners

    name = sessions.tuner_name(tuner)
    return tuners.tuner_of("") if name == tsvimport.TUNER else name


def same_context(a: Session | TuningSession, b: Session | TuningSession) -> bool:
    """The same context and the same tuner measured (measured_by), stand-in or not."""
    same = all(getattr(a, f) == getattr(b, f) for f in CONTEXT_FIELDS)
    return same and measured_by(a.tuner) == measured_by(b.tuner)


def equivalent(a: Session | TuningSession, b: Session | TuningSession) -> bool:
    return same_context(a, b) and bool(a.standin) == bool(b.standin)


# -- queries -------------------------------------------------------------------------------------


@dataclass(frozen=True)
class Tuned:
    """A counted result another session holds for a problem."""

    result_id: int
    session_id: int
    problem_id: int
    perf_config: str
    tflops: float | None
    origin: int  # the session that really tuned it (follows earlier reuse)
    kernel_time: float | None = None
    tuned_at: dt.datetime | None = None
    duration_s: float | None = None
    key_suffix: str = ""


def _equivalent_ids(
    s: OrmSession, target: TuningSession, left_out: list[int] | None = None
) -> list[int]:
    """The sessions equivalent to `target`; `left_out` gets the stand-in sessions of its
    context that a real target does not take."""
    stmt = sa.select(TuningSession).where(
        *(getattr(TuningSession, f) == getattr(target, f) for f in CONTEXT_FIELDS),
        TuningSession.id != target.id,
        TuningSession.retired_at.is_(None),  # retired: kept for history, never picked again
    )
    rows = [row for row in s.scalars(stmt) if same_context(row, target)]
    if left_out is not None:
        left_out += [row.id for row in rows if row.standin and not target.standin]
    return [row.id for row in rows if equivalent(row, target)]


def _counted_results(s: OrmSession, session_ids: Iterable[int]) -> dict[int, Tuned]:
    """{problem_id: newest counted result} over these sessions (the highest session id wins)."""
    ids = list(session_ids)
    if not ids:
        return {}
    stmt = (
        winners.counted_results(
            Result.id,
            Result.session_id,
            Result.problem_id,
            Result.perf_config,
            Result.tflops,
            Result.reused_from,
            Result.kernel_time,
            Result.tuned_at,
            Result.duration_s,
            Result.key_suffix,
        )
        .where(Result.session_id.in_(ids))
        .order_by(Result.session_id, Result.id)
    )
    out: dict[int, Tuned] = {}
    for rid, sid, pid, pc, tf, src, ns, at, dur, suffix in s.execute(stmt):
        out[pid] = Tuned(rid, sid, pid, pc, tf, src or sid, ns, at, dur, suffix or "")
    return out


def _session_row(s: OrmSession, session_id: int) -> TuningSession:
    row = s.get(TuningSession, session_id)
    if row is None:
        raise UserError(f"no session {session_id}: `mlirtuna session list` shows them")
    return row


# -- copying results (one transaction with the load) --------------------------------------------


def _copy(s: OrmSession, session_id: int, found: dict[int, Tuned]) -> None:
    """A completed job and a result marked `reused_from` per problem, in this session."""
    if not found:
        return
    now = s.scalar(sa.select(db_now()))
    s.execute(
        sa.insert(Job.__table__),
        [
            {
                "session_id": session_id,
                "problem_id": t.problem_id,
                "state": COMPLETED,
                "priority": 0,
                "reason": "reused",
                "result": f"reused from session {t.origin} (result {t.result_id})",
                "finished_at": now,
            }
            for t in found.values()
        ],
    )
    job_ids = dict(
        s.execute(
            sa.select(Job.problem_id, Job.id).where(
                Job.session_id == session_id, Job.reason == "reused"
            )
        ).all()
    )
    s.execute(
        sa.insert(Result.__table__),
        [
            {
                "session_id": session_id,
                "problem_id": t.problem_id,
                "job_id": job_ids[t.problem_id],
                "perf_config": t.perf_config,
                "kernel_time": t.kernel_time,
                "tflops": t.tflops,
                "tuned_at": t.tuned_at,
                "duration_s": t.duration_s,
                "key_suffix": t.key_suffix,
                "reused_from": t.origin,
            }
            for t in found.values()
        ],
    )


def _not_yet_loaded(s: OrmSession, session_id: int, problem_ids: Iterable[int]) -> set[int]:
    have = set(s.scalars(sa.select(Job.problem_id).where(Job.session_id == session_id)))
    return {p for p in problem_ids if p not in have}


# -- jobs load --skip-tuned / --changed-since ---------------------------------------------------


@dataclass
class ReuseReport:
    """What `jobs load` did beyond adding jobs."""

    added: int = 0
    existing: int = 0
    skipped: int = 0  # left out: already tuned (skip-tuned) or not stale (changed-since)
    reused: int = 0  # of those, copied into the session
    rule: str | None = None
    sample: int | None = None
    sources: dict[int, int] = field(default_factory=dict)  # {session: results reused from it}
    standin_left_out: list[int] = field(default_factory=list)  # equivalent but the stand-in's
    cannot_run: dict[str, list[str]] = field(default_factory=dict)  # jobs.LoadReport's

    def as_dict(self) -> dict[str, Any]:
        return asdict(self)


def _skip_tuned(report: ReuseReport, reuse: bool) -> Callable:
    def keep(s: OrmSession, session_id: int, selected: dict[int, int]) -> dict[int, int]:
        left_out: list[int] = []  # a retried transaction runs this again: assigned, not added
        found = _counted_results(s, _equivalent_ids(s, _session_row(s, session_id), left_out))
        report.standin_left_out = left_out
        fresh = _not_yet_loaded(s, session_id, selected)
        done = {p: found[p] for p in fresh if p in found}
        report.skipped = len(done)
        if reuse:
            _copy(s, session_id, done)
            _count_reuse(report, done)
        return {p: prio for p, prio in selected.items() if p not in done}

    return keep


def _count_reuse(report: ReuseReport, done: dict[int, Tuned]) -> None:
    report.reused = len(done)
    for t in done.values():
        report.sources[t.origin] = report.sources.get(t.origin, 0) + 1


def _changed_since(
    report: ReuseReport, old_id: int, rule: str, sample: int | None, seed: int, reuse: bool
) -> Callable:
    def keep(s: OrmSession, session_id: int, selected: dict[int, int]) -> dict[int, int]:
        target = _session_row(s, session_id)
        old = _counted_results(s, [_session_row(s, old_id).id])
        fresh = sorted(p for p in _not_yet_loaded(s, session_id, selected) if p in old)
        if sample is not None:
            stale = set(random.Random(seed).sample(fresh, min(sample, len(fresh))))
        elif rule == "family-changed":
            stale = _family_changed(s, target, {p: old[p] for p in fresh})
        else:
            stale = set(fresh)
        rest = {p: old[p] for p in fresh if p not in stale}
        report.skipped = len(rest)
        if reuse and sample is None:
            _copy(s, session_id, rest)
            _count_reuse(report, rest)
        return {p: prio for p, prio in selected.items() if p in stale}

    return keep


def _family_changed(s: OrmSession, target: TuningSession, old: dict[int, Tuned]) -> set[int]:
    """Problems whose old winner's family is not one the new commit's winners use (per op)."""
    same_build = s.scalars(
        sa.select(TuningSession.id).where(
            TuningSession.mlir_v == target.mlir_v,
            TuningSession.arch_full == target.arch_full,
            TuningSession.standin == target.standin,  # made-up winners decide nothing real
        )
    )
    new = _counted_results(s, list(same_build))
    ops = dict(s.execute(sa.select(Problem.id, Problem.op)).all())
    families: dict[str, set[str]] = {}
    for t in new.values():
        families.setdefault(ops[t.problem_id], set()).add(perf_config_format(t.perf_config))
    missing = sorted({ops[p] for p in old} - set(families))
    if missing:
        raise UserError(
            f"no winners at commit {target.mlir_v or '(unknown)'} on {target.arch_full} for "
            f"{', '.join(missing)} yet, so the new perf config family is unknown: tune a sample "
            "first (--sample N), then load with --rule family-changed"
        )
    return {p for p, t in old.items() if perf_config_format(t.perf_config) not in families[ops[p]]}


def load(
    db: Database,
    session_id: int,
    *,
    skip_tuned: bool = False,
    reuse: bool = False,
    changed_since: int | None = None,
    rule: str = "all",
    sample: int | None = None,
    seed: int = 0,
    **selection: Any,
) -> ReuseReport:
    """`jobs.load` narrowed by --skip-tuned or --changed-since; one transaction either way."""
    if skip_tuned and changed_since is not None:
        raise UserError("--skip-tuned and --changed-since are two different questions: pick one")
    if reuse and not (skip_tuned or changed_since is not None):
        raise UserError("--reuse copies what --skip-tuned or --changed-since leaves out: add one")
    if rule not in RULES:
        raise UserError(f"unknown --rule {rule!r} (known: {', '.join(RULES)})")
    if sample is not None and (sample < 1 or changed_since is None):
        raise UserError("--sample N needs --changed-since and N >= 1")
    if sample is not None and reuse:
        raise UserError("--sample measures whether a re-tune is needed: it does not --reuse")
    report = ReuseReport(rule=rule if changed_since is not None else None, sample=sample)
    if changed_since is not None:
        sessions.get(db, changed_since)
        if not any(selection.get(k) for k in ("tag", "file", "all_problems")):
            selection["all_problems"] = True  # every problem the old session tuned
        keep = _changed_since(report, changed_since, rule, sample, seed, reuse)
    elif skip_tuned:
        keep = _skip_tuned(report, reuse)
    else:
        keep = None
    loaded = jobs.load(db, session_id, keep=keep, **selection)
    report.added, report.existing = loaded.added, loaded.existing
    report.cannot_run = loaded.cannot_run
    return report


# -- session diff --------------------------------------------------------------------------------


@dataclass
class SessionDiff:
    a: int
    b: int
    differences: dict[str, tuple[Any, Any]]  # field: (value in a, value in b)
    equivalent: bool
    only_a: int
    only_b: int
    both: int
    to_retune: list[int]  # problems tuned in a without a counted result in b's context
    winners_changed: int  # of `both`: a different perf config won
    tflops_geomean: float | None  # geomean of tflops(b) / tflops(a) over `both`
    families: dict[str, dict[str, int]]  # {"a"|"b": {family: winners}}

    def as_dict(self) -> dict[str, Any]:
        d = asdict(self)
        d["differences"] = {k: list(v) for k, v in self.differences.items()}
        return d


_SHOWN = (*CONTEXT_FIELDS, "arch", "tuner", "rocm_v", "docker")


def diff(db: Database, a_id: int, b_id: int) -> SessionDiff:
    """What differs between two sessions, and what a session with b's context must re-tune."""
    a, b = sessions.get(db, a_id), sessions.get(db, b_id)
    differences = {
        f: (getattr(a, f), getattr(b, f)) for f in _SHOWN if getattr(a, f) != getattr(b, f)
    }
    with db.session() as s:
        ra, rb = _counted_results(s, [a_id]), _counted_results(s, [b_id])
        covered = _counted_results(s, [*_equivalent_ids(s, _session_row(s, b_id)), b_id])
    both = sorted(set(ra) & set(rb))
    ratios = [
        new / old
        for p in both
        if (old := ra[p].tflops or 0.0) > 0 and (new := rb[p].tflops or 0.0) > 0
    ]
    return SessionDiff(
        a=a_id,
        b=b_id,
        differences=differences,
        equivalent=equivalent(a, b),
        only_a=len(set(ra) - set(rb)),
        only_b=len(set(rb) - set(ra)),
        both=len(both),
        to_retune=sorted(set(ra) - set(covered)),
        winners_changed=sum(ra[p].perf_config != rb[p].perf_config for p in both),
        tflops_geomean=geomean(ratios),
        families={
            "a": _family_counts(ra.values()),
            "b": _family_counts(rb.values()),
        },
    )


def _family_counts(tuned: Iterable[Tuned]) -> dict[str, int]:
    out: dict[str, int] = {}
    for t in tuned:
        fam = perf_config_format(t.perf_config)
        out[fam] = out.get(fam, 0) + 1
    return dict(sorted(out.items()))


def geomean(values: list[float]) -> float | None:
    return math.exp(sum(math.log(v) for v in values) / len(values)) if values else None
