"""A searched job (issue 45): the session's search strategy chooses which configs to measure.

The worker measures in rounds: the space is the tuner's own list of the problem's candidates
(SearchableTuner.search_space), the history is what the farm's other sessions measured of the
same op with the same tuner family (other GPUs, other problems), and each round the search asks
for is one `tune` call with `ctx.perf_configs` set to it. Every round's measurements are kept
in search_step as soon as they are taken (fenced by the lease: queue.record_steps), and a new
attempt of the job (its worker died) tells the search those first: nothing measured before is
measured again, and the search goes on where it was (seeded by the job id, so it asks the same).
The outcome's candidates are every measurement with its round; the winner is the best valid one.
"""

from __future__ import annotations

import dataclasses
import datetime as dt
import logging
import math
from collections.abc import Callable, Sequence
from dataclasses import dataclass
from typing import Protocol, TypeVar

import numpy as np
import sqlalchemy as sa

from mlirtuna import catalog, queue, search, sessions, stats
from mlirtuna.db import Database
from mlirtuna.db.faults import first_line
from mlirtuna.db.models import Candidate as CandidateRow
from mlirtuna.db.models import Problem as ProblemRow
from mlirtuna.db.models import Result, SearchStep, TuningSession
from mlirtuna.errors import TunerError, TunerTimeout, Unsupported, UserError
from mlirtuna.keys import perf_config_format
from mlirtuna.problems import Problem
from mlirtuna.queue import Lease
from mlirtuna.tuners import registry
from mlirtuna.tuners.base import Candidate, SearchableTuner, TuneContext, TuneOutcome, Tuner

log = logging.getLogger(__name__)
T = TypeVar("T")

#: The history a search starts from: the newest (session, problem) pairs of the op, at most
#: this many, and at most HISTORY_ROWS measurements of them (a bounded query on a big farm).
HISTORY_UNITS = 32
HISTORY_ROWS = 20_000

#: The error of every config of a round the tool failed as a whole (Rounds.measure).
ROUND_FAILED = "round failed: "


class Retrying(Protocol):
    """The worker's retry policy around one database operation (Runner.retrying)."""

    def __call__(self, fn: Callable[[], T]) -> T: ...


@dataclass(frozen=True)
class SearchedJob:
    """What one searched job needs of its worker: the database (through `retrying`, the
    worker's retry policy), its session, tuner and lease."""

    db: Database
    session: sessions.Session
    tuner: Tuner
    lease: Lease
    retrying: Retrying


class LeaseLostMidSearch(TunerError):
    """A round's measurements could not be kept: the lease is no longer this worker's."""


def tune(job: SearchedJob, problem: Problem, ctx: TuneContext) -> TuneOutcome:
    """The job's search, round after round, up to the session's budget; the outcome as a
    tuner's (every measurement a candidate with its round, the best valid one the winner)."""
    tuner = job.tuner
    if not isinstance(tuner, SearchableTuner):
        raise Unsupported(f"the {tuner.name} tuner cannot measure chosen candidates (--search)")
    keys = tuner.search_space(problem, ctx)
    if not keys:
        raise Unsupported("the tuner lists no candidate for this problem")
    space = search.Space.from_keys(keys)
    history = job.retrying(lambda: farm_history(job, problem, keys))
    budget = job.session.search_budget or len(keys)
    run = strategy(job.session).start(space, history, budget, seed=job.lease.job_id)
    measured = _replay(job, problem, keys, run)
    rounds = Rounds(
        next_round=1 + max((c.search_round or 0 for c in measured.values()), default=-1)
    )
    while len(measured) < budget:
        asked = [i for i in run.ask() if keys[i] not in measured][: budget - len(measured)]
        if not asked:
            break
        taken = rounds.measure(tuner, problem, ctx, [keys[i] for i in asked])
        _keep(job, [c for c in taken if not (c.error or "").startswith(ROUND_FAILED)])
        for i, c in zip(asked, taken, strict=True):
            run.tell(i, _time(c))
            measured[c.perf_config] = c
    return _outcome(list(measured.values()), rounds, len(keys), budget, history)


def strategy(session: sessions.Session) -> search.Strategy:
    """The session's strategy; one this worker's mlirtuna does not have is Unsupported (no
    retry: every attempt on this host would fail the same way)."""
    try:
        return search.get(session.search or "")
    except UserError as exc:
        raise Unsupported(f"session {session.id}: {exc}") from None


def _keep(job: SearchedJob, taken: list[Candidate]) -> None:
    """A round's measurements into search_step now, fenced: a dead worker loses none of them.
    A round the tool failed as a whole is not kept (nothing was measured: the job's next
    attempt may try those configs again); the fence is checked all the same."""
    if not job.retrying(lambda: queue.record_steps(job.db, job.lease, taken)):
        raise LeaseLostMidSearch(f"job {job.lease.job_id}: lease lost mid-search")


def _replay(
    job: SearchedJob, problem: Problem, keys: Sequence[str], run: search.Search
) -> dict[str, Candidate]:
    """What earlier attempts measured (search_step), told to the search first, as candidates
    (a perf config's first row only; one no longer in the space is left out)."""
    index = {k: i for i, k in enumerate(keys)}
    stored = job.retrying(lambda: queue.steps(job.db, job.lease.job_id))
    measured: dict[str, Candidate] = {}
    for step in stored:
        if step.perf_config in measured or step.perf_config not in index:
            continue
        c = _stored(step, problem.flops())
        run.tell(index[step.perf_config], _time(c))
        measured[c.perf_config] = c
    if measured:
        log.info("job %s: %d measurements replayed", job.lease.job_id, len(measured))
    return measured


def _stored(step: SearchStep, flops: int) -> Candidate:
    t = step.kernel_time
    if t is None or not t > 0:
        return Candidate(
            step.perf_config, error=step.error or "invalid", search_round=step.search_round
        )
    return Candidate(step.perf_config, t, flops / t / 1e3, search_round=step.search_round)


def _time(c: Candidate) -> float:
    return c.kernel_time_ns if c.valid and c.kernel_time_ns is not None else math.nan


@dataclass
class Rounds:
    """The rounds measured by this attempt: their number, the tool's output, when they ran."""

    next_round: int = 0
    output: list[str] = dataclasses.field(default_factory=list)
    start: dt.datetime | None = None
    end: dt.datetime | None = None

    def measure(
        self, tuner: Tuner, problem: Problem, ctx: TuneContext, chosen: list[str]
    ) -> list[Candidate]:
        """One `tune` call measuring exactly `chosen`: a candidate per config, in order. A round
        the tool failed as a whole (no valid config in it, a crash) makes each of its configs
        invalid with that error (for this attempt only: `_keep` does not store it); a timeout
        or an unsupported problem ends the job's attempt."""
        n = self.next_round
        self.next_round += 1
        try:
            outcome = tuner.tune(problem, dataclasses.replace(ctx, perf_configs=tuple(chosen)))
        except (TunerTimeout, Unsupported):
            raise
        except TunerError as exc:
            self.output.append(f"# round {n}: {len(chosen)} configs, failed: {first_line(exc)}")
            why = f"{ROUND_FAILED}{first_line(exc)}"
            return [Candidate(k, error=why, search_round=n) for k in chosen]
        self.output.append(f"# round {n}: {len(chosen)} configs\n{outcome.output.rstrip()}")
        self.start = self.start or outcome.compile_start
        self.end = outcome.compile_end or self.end
        by_name = {c.perf_config: c for c in outcome.candidates}
        return [
            dataclasses.replace(by_name[k], search_round=n)
            if k in by_name
            else Candidate(k, error="the tuner did not measure it", search_round=n)
            for k in chosen
        ]


def _outcome(
    measured: list[Candidate], rounds: Rounds, space: int, budget: int, history: search.History
) -> TuneOutcome:
    valid = sorted((c for c in measured if c.valid), key=lambda c: c.kernel_time_ns or math.inf)
    if not valid:
        first = measured[0].error if measured else "nothing measured"
        raise TunerError(f"no valid perf config: {len(measured)} measured, first: {first}")
    winner = valid[0]
    margin = None
    if len(valid) > 1 and winner.spread is not None and valid[1].spread is not None:
        margin = stats.margin(winner.spread, valid[1].spread)
    head = (
        f"# search: {len(measured)} of {space} configs measured (budget {budget}), "
        f"{rounds.next_round} rounds, history of {len(history.units)} (session, problem) units"
    )
    return TuneOutcome(
        candidates=measured,
        winner=winner,
        output="\n".join([head, *rounds.output]) + "\n",
        compile_start=rounds.start,
        compile_end=rounds.end,
        margin=margin,
    )


# -- the farm's history ----------------------------------------------------------------------


def farm_history(job: SearchedJob, problem: Problem, keys: Sequence[str]) -> search.History:
    """What other sessions measured of this op with the same tuner family (their candidates'
    search-pass times, valid ones only): one row per (session, problem) they tuned, the newest
    HISTORY_UNITS of them, each measured config carried to this problem's keys (what its tuner's
    kind says a listed name means: TunerKind.listed, as quick lists read it). Stand-in
    sessions' made-up numbers teach a real session nothing."""
    families = sorted({perf_config_format(k) for k in keys})
    index = {k: i for i, k in enumerate(keys)}
    with job.db.session() as s:
        units = _units(s, job.session, problem.op, families)
        if not units:
            return search.History.empty(search.Space.from_keys(keys))
        rows = s.execute(_measurements(units, families)).all()
        problems = {pid: catalog.load_problem(s, pid) for pid in {p for _, p in units}}
    sums = np.zeros((len(units), len(keys)))
    counts = np.zeros((len(units), len(keys)))
    row_of = {unit: u for u, unit in enumerate(units)}
    carry: dict[int, Callable[[str], list[str]]] = {}
    for sid, pid, perf_config, t in rows:
        if pid not in carry:
            carry[pid] = _carry(problems[pid], problem)
        for key in carry[pid](perf_config):
            if key in index and t is not None and t > 0:
                sums[row_of[(sid, pid)], index[key]] += t
                counts[row_of[(sid, pid)], index[key]] += 1
    with np.errstate(invalid="ignore", divide="ignore"):
        times = np.where(counts > 0, sums / np.maximum(counts, 1), np.nan)
    kept = [u for u in range(len(units)) if np.isfinite(times[u]).any()]
    names = tuple(f"session {units[u][0]} problem {units[u][1]}" for u in kept)
    return search.History(names, times[kept].reshape(len(kept), len(keys)))


def _carry(measured_on: Problem, to: Problem) -> Callable[[str], list[str]]:
    """A config measured on `measured_on` -> the configs of `to` it stands for: its portable
    names there (Listed.expand), each resolved on `to` (the cpu tuner clips block sizes to
    dims; a tuner that clips nothing: the same name)."""
    cache: dict[str, tuple[registry.Listed, registry.Listed]] = {}

    def carry(perf_config: str) -> list[str]:
        family = registry.tuner_of(perf_config)
        if family not in cache:
            cache[family] = (
                registry.listed_on(measured_on, family),
                registry.listed_on(to, family),
            )
        there, here = cache[family]
        return list(dict.fromkeys(here.resolve(name) for name in there.expand(perf_config)))

    return carry


def _units(s, session: sessions.Session, op: str, families: list[str]) -> list[tuple[int, int]]:
    """The newest (session, problem) pairs other sessions tuned of `op` with a winner in these
    perf-config families: read off `result` (one row per pair), so the query stays small on a
    farm of millions of candidates; a result that was imported or reused has no candidates
    here (no job of its own) and is left out."""
    R = Result
    stmt = (
        sa.select(R.session_id, R.problem_id)
        .join(ProblemRow, ProblemRow.id == R.problem_id)
        .join(TuningSession, TuningSession.id == R.session_id)
        .where(
            ProblemRow.op == op,
            R.session_id != session.id,
            R.perf_family.in_(families),
            R.job_id.is_not(None),
            R.reused_from.is_(None),
            TuningSession.standin == session.standin,
        )
        .order_by(R.session_id.desc(), R.problem_id.desc())
        .limit(HISTORY_UNITS)
    )
    return [(int(sid), int(pid)) for sid, pid in s.execute(stmt)]


def _measurements(units: list[tuple[int, int]], families: list[str]) -> sa.Select:
    C = CandidateRow
    pairs = sa.or_(*(sa.and_(C.session_id == sid, C.problem_id == pid) for sid, pid in units))
    return (
        sa.select(C.session_id, C.problem_id, C.perf_config, C.search_time)
        .where(pairs, C.perf_family.in_(families), C.search_time.is_not(None), C.error.is_(None))
        .limit(HISTORY_ROWS)
    )
