"""A worker: claims jobs of one session, runs the tuner on its GPU, records through the fence.

One worker process per GPU (see manager.py). In a two-stage session a GPU worker benchmarks and
a `--role compile` worker, on any host with the build, compiles (stages.py). Stopping: the first
SIGINT/SIGTERM lets the current job finish, the second gives it back at once (state new, no
retry counted).

With `--batch K` it claims up to K jobs at once (queue.claim_many) and, where the tuner can
(rocmlir on E3/E4 builds), tunes them in one tool call, settling each job as its outcome arrives
(docs/architecture.md, "Batches"); the batch code is the `_*batch*`/`_tune_many` functions.
"""

from __future__ import annotations

import contextlib
import dataclasses
import logging
import os
import random
import signal
import threading
import time
from collections.abc import Callable, Iterable, Iterator
from dataclasses import dataclass, field

from sqlalchemy import exc as sa_exc

from mlirtuna import catalog, machine, queue, sessions, tuners
from mlirtuna.db import ROLLED_BACK, Database, fault_of
from mlirtuna.db.models import BENCHMARK, COMPILE, TUNE
from mlirtuna.defaults import DEFAULT_BACKOFF_S, DEFAULT_LEASE_S, DEFAULT_MAX_RETRIES
from mlirtuna.errors import DatabaseError, NotRun, TunerError, Unsupported, UserError
from mlirtuna.problems import Problem
from mlirtuna.queue import Claimant, Lease, jobs
from mlirtuna.queue.wakeup import Wakeup
from mlirtuna.tuners.base import TuneContext, TuneOutcome, Tuner
from mlirtuna.worker import stages

log = logging.getLogger(__name__)

# Idle polling: short, jittered and growing to a cap; never seconds-long random sleeps.
POLL_MIN_S, POLL_MAX_S = 0.1, 2.0
DB_RETRY_S = 1.0  # the first pause while the database is away; it doubles up to DB_RETRY_MAX_S
DB_RETRY_MAX_S = 15.0
DB_LOG_EVERY_S = 60.0  # while the database stays away, say so again this often (not per try)
SWEEP_S = 5.0  # how often a busy worker looks for expired leases
# The job timeout when --job-timeout is not given: generous per tuning space, so that only a
# tuner that hangs meets it. Every tuner runs under it, whether or not it honours ctx.timeout_s.
# A job of a batch settled as (lease, outcome, error, final); final RELEASE: give it back, the
# tool never tuned it (its batch's tool stopped first).
RELEASE = "release"
Settled = tuple[Lease, TuneOutcome | None, str | None, bool | str]
DEFAULT_JOB_TIMEOUT_S = {"quick": 3600.0, "full": 4 * 3600.0, "greedy": 4 * 3600.0,
                         "exhaustive": 24 * 3600.0}  # fmt: skip


@dataclass
class WorkerSettings:
    session_id: int
    tuner: str | None = None  # None: the session's (a different one is refused)
    gpu_id: int = -1  # -1: a CPU worker
    lease_s: float = DEFAULT_LEASE_S
    job_timeout_s: float | None = None
    max_retries: int = DEFAULT_MAX_RETRIES
    backoff_s: float = DEFAULT_BACKOFF_S
    until_empty: bool = False
    max_jobs: int | None = None
    batch: int = 1  # jobs claimed at once (rocmlir E3/E4: tuned in one tool call)
    mlir_build_dir: str | None = None
    cpu_mem_limit: int = 4 << 30
    machine_name: str = field(default_factory=machine.machine_name)
    # gpu: one-stage and benchmark jobs; compile: a split session's compile jobs, no GPU.
    role: str = "gpu"

    @property
    def heartbeat_s(self) -> float:
        return self.lease_s / 3


@dataclass
class WorkerStats:
    completed: int = 0
    failed: int = 0
    lost: int = 0  # leases lost before recording (another worker took the job over)
    released: int = 0


class GiveBack(BaseException):
    """Raised in the main thread by a second stop signal: give the current job back now."""


class JobTimedOut(BaseException):
    """Raised in the main thread by the worker's own alarm: the tuner ignored the job timeout.

    A BaseException, so that a tuner's `except Exception` cannot swallow it, while its
    `finally` and `except BaseException` (rocmlir stops its pipeline there) still run."""


class Heartbeat:
    """Extends the leases the worker holds every `interval` seconds, from one long-lived thread.

    `hold(lease)` (one job) or `hold_many(leases)` (a batch) makes leases current; `drop(lease)`
    ends one of them once its job is recorded. Each lease has its own `lost` event, set when a
    renewal finds that lease taken away (requeued, cancelled, or expired and claimed by another
    worker): a lost lease marks only its own job. One thread per worker, not one per job:
    starting a thread per job cost more than the job's own queue work.
    """

    def __init__(self, db: Database, lease_s: float, interval: float) -> None:
        self.db, self.lease_s, self.interval = db, lease_s, interval
        self._cv = threading.Condition()
        self._held: dict[int, tuple[Lease, threading.Event]] = {}
        self._claims = 0  # counts holds: a fresh claim restarts the interval, a drop does not
        threading.Thread(target=self._loop, daemon=True, name="heartbeat").start()

    def _loop(self) -> None:
        while True:
            with self._cv:
                self._cv.wait_for(lambda: bool(self._held))
                claims = self._claims
                # Sleep one interval unless every job ends or a new claim arrives first.
                if self._cv.wait_for(
                    lambda claims=claims: not self._held or self._claims != claims, self.interval
                ):
                    continue
                held = list(self._held.values())
            for lease, lost in held:
                if not lost.is_set():
                    self._renew(lease, lost)

    def _renew(self, lease: Lease, lost: threading.Event) -> None:
        try:
            if not queue.heartbeat(self.db, lease, self.lease_s):
                with self._cv:
                    if not self._holds(lease):
                        return  # the job ended (and recorded) meanwhile
                log.warning("job %s: lease lost (taken over, requeued or cancelled)", lease.job_id)
                lost.set()
        except Exception as exc:  # the database may come back before the lease runs out
            log.warning("job %s: heartbeat failed: %s", lease.job_id, _first_line(exc))

    @contextlib.contextmanager
    def hold(self, lease: Lease) -> Iterator[threading.Event]:
        with self.hold_many([lease]) as lost:
            yield lost[lease.job_id]

    @contextlib.contextmanager
    def hold_many(self, leases: list[Lease]) -> Iterator[dict[int, threading.Event]]:
        """Renew all these leases until the block ends (or `drop` ends one earlier); yields
        each job's `lost` event by job id."""
        lost = {lease.job_id: threading.Event() for lease in leases}
        with self._cv:
            self._held.update({lease.job_id: (lease, lost[lease.job_id]) for lease in leases})
            self._claims += 1
            self._cv.notify_all()
        try:
            yield lost
        finally:
            with self._cv:
                for lease in leases:
                    self.drop_locked(lease)
                self._cv.notify_all()

    def drop(self, lease: Lease) -> None:
        """Stop renewing one lease (its job is recorded, failed or given back)."""
        with self._cv:
            self.drop_locked(lease)
            self._cv.notify_all()

    def drop_locked(self, lease: Lease) -> None:
        if self._holds(lease):
            del self._held[lease.job_id]

    def _holds(self, lease: Lease) -> bool:
        held = self._held.get(lease.job_id)
        return held is not None and held[0].token == lease.token


class Worker:
    def __init__(self, db: Database, settings: WorkerSettings, tuner: Tuner | None = None) -> None:
        self.db = db
        self.settings = settings
        self.stop_requested = threading.Event()
        self.current: Lease | None = None
        self.session = self._retrying(lambda: sessions.get(db, settings.session_id))
        settings.tuner = session_tuner(self.session, settings.tuner)
        self.tuner = tuner or tuners.make(settings.tuner, mlir_build_dir=settings.mlir_build_dir)
        self.quick_lists = _quick_lists(db, self.session)
        self.claim_stage = role_stage(self.session, settings.role)
        self.claimant = Claimant(settings.machine_name, settings.gpu_id, os.getpid())
        self.stats = WorkerStats()
        self._next_sweep = 0.0
        self.heartbeat = Heartbeat(db, settings.lease_s, settings.heartbeat_s)
        self.wakeup = Wakeup(db, settings.session_id)
        self.batch = self._batch_size()

    # -- signals -----------------------------------------------------------------------------
    def install_signal_handlers(self) -> None:
        for sig in (signal.SIGINT, signal.SIGTERM):
            signal.signal(sig, self._on_signal)

    def _on_signal(self, signum: int, _frame: object) -> None:
        if self.stop_requested.is_set() and self.current is not None:
            raise GiveBack()
        self.stop_requested.set()
        if self.current is not None:
            what = f"job {self.current.job_id}" if self.batch == 1 else "the current batch"
            log.warning("stopping after %s (signal again to give it back now)", what)

    # -- the loop ------------------------------------------------------------------------------
    def run(self) -> WorkerStats:
        try:
            return self._run()
        finally:
            self.wakeup.close()

    def _run(self) -> WorkerStats:
        idle = POLL_MIN_S
        said_idle = False  # an idle stretch is announced once, not at every poll
        while not self.stop_requested.is_set() and not self._enough():
            leases = self._claim()
            if not leases:
                if self.settings.until_empty and self._retrying(
                    lambda: jobs.is_drained(self.db, self.settings.session_id, [self.claim_stage])
                ):
                    break
                if not said_idle:
                    log.info(
                        "idle: no job of session %s to claim; waiting for new ones "
                        "(--until-empty exits instead)",
                        self.settings.session_id,
                    )
                    said_idle = True
                # Woken early on PostgreSQL when a job of the session becomes claimable.
                self.wakeup.wait(random.uniform(idle / 2, idle), self.stop_requested)
                idle = min(idle * 2, POLL_MAX_S)
                continue
            idle, said_idle = POLL_MIN_S, False
            if self.batch == 1:
                self._work(leases[0])
            else:
                self._work_batch(leases)
        return self.stats

    def _enough(self) -> bool:
        done = self.stats.completed + self.stats.failed + self.stats.lost
        return self.settings.max_jobs is not None and done >= self.settings.max_jobs

    def _claim(self) -> list[Lease]:
        # Expired leases are swept every SWEEP_S seconds and whenever nothing is claimable: a
        # dead worker's job comes back within its lease + SWEEP_S, and a busy queue does not pay
        # for a sweep on every claim.
        now = time.monotonic()
        swept = now >= self._next_sweep
        if swept:
            self._sweep(now)
        claim = self._claim_once if self.batch == 1 else self._claim_batch
        leases = claim()
        if not leases and not swept:
            self._sweep(now)
            leases = claim()
        return leases

    def _sweep(self, now: float) -> None:
        self._retrying(
            lambda: queue.reclaim_expired(
                self.db, max_retries=self.settings.max_retries, session_id=self.settings.session_id
            )
        )
        self._next_sweep = now + SWEEP_S

    def _claim_once(self) -> list[Lease]:
        # One token for every try: when a try's commit landed but its reply was lost (a server
        # restart at the wrong moment), the next try finds the job this token already holds
        # instead of leaving it running unowned until its lease runs out.
        token = queue.new_token()
        tries = 0

        def attempt() -> Lease | None:
            nonlocal tries
            tries += 1
            if tries > 1 and (held := queue.claimed_with(self.db, token)) is not None:
                return held
            return queue.claim(
                self.db,
                self.settings.session_id,
                self.claimant,
                self.settings.lease_s,
                token,
                self.claim_stage,
            )

        lease = self._retrying(attempt)
        return [lease] if lease is not None else []

    def _work(self, lease: Lease) -> None:
        self.current = lease
        try:
            with self.heartbeat.hold(lease) as lost:
                if lease.stage == TUNE:
                    outcome, error, final = self._tune(lease)
                    finish = lambda: self._finish(lease, outcome, error, final)  # noqa: E731
                else:
                    finish = stages.run(self, lease)  # a split session's compile or benchmark
                if lost.is_set():
                    self.stats.lost += 1
                    return
            finish()
        except GiveBack:
            self.stop_requested.set()
            # One try: a database that is away (restart, full disk) must not hold a worker told
            # twice to stop; the lease brings the job back then.
            try:
                queue.release(self.db, lease)
            except Exception as exc:
                log.warning(
                    "job %s: could not give it back (%s); it returns when its lease expires",
                    lease.job_id,
                    _first_line(exc),
                )
                return
            self.stats.released += 1
            log.warning("job %s given back", lease.job_id)
        except DatabaseError:
            # A database error that waiting will not cure: give the job back (one try, it may
            # fail the same way; then its lease brings it back) and let the worker stop.
            with contextlib.suppress(Exception):
                if queue.release(self.db, lease, "the worker stopped on a database error"):
                    self.stats.released += 1
            raise
        finally:
            self.current = None

    def _tune(self, lease: Lease):
        """(outcome, None, False) or (None, error text, final); a tuner failure never escapes
        as an exception. `final`: the tuner cannot run this problem at all, so no retry."""
        problem = lease.problem or self._retrying(lambda: self._problem(lease.problem_id))
        log.info("job %s: tuning %s", lease.job_id, problem.canonical())
        return self._guarded(lease, lambda: self.tuner.tune(problem, self._context(problem)))

    def _guarded(self, lease: Lease, work):
        """(work(), None, False) or (None, error text, final): `work` runs the tool under the
        job timeout, and none of its failures escapes as an exception."""
        timeout = self.job_timeout_s
        try:
            with _alarm(timeout + _grace_s(timeout)):
                return work(), None, False
        except JobTimedOut:
            return None, f"timed out after {timeout:g} s (the worker stopped the tuner)", False
        except Unsupported as exc:
            return None, _error_text(exc), True
        except TunerError as exc:  # timeouts included
            return None, _error_text(exc), False
        except Exception as exc:  # a tuner bug must cost one attempt, not the job
            log.exception("job %s: tuner crashed", lease.job_id)
            return None, f"tuner crashed: {type(exc).__name__}: {exc}", False

    # -- batches (--batch K): claim up to K jobs, tune them in one tool call where it can ------

    def _batch_size(self) -> int:
        """--batch, where it helps: a tuner with tune_many only when its build can (rocmlir
        E3/E4; E2 tunes one config per call); any other tuner tunes a claimed batch in turn."""
        k = max(1, self.settings.batch)
        if self.claim_stage == COMPILE:
            return 1  # compile hosts are not the scarce resource: one bundle per job
        can_batch = getattr(self.tuner, "can_batch", None)
        if k == 1 or can_batch is None:
            return k
        try:
            if can_batch():
                return k
        except TunerError as exc:  # the tool's --help failed: the first job will say why
            log.warning("--batch %s: cannot ask the tool (%s); one job at a time", k, exc)
            return 1
        log.info("--batch %s: this tool takes one config per call; one job at a time", k)
        return 1

    def _claim_batch(self) -> list[Lease]:
        # As _claim_once: the same tokens for every try, and a look for what a try whose reply
        # was lost took.
        limit = self.batch
        if self.settings.max_jobs is not None:
            done = self.stats.completed + self.stats.failed + self.stats.lost
            limit = max(1, min(limit, self.settings.max_jobs - done))
        tokens = [queue.new_token() for _ in range(limit)]
        tries = 0

        def attempt() -> list[Lease]:
            nonlocal tries
            tries += 1
            if tries > 1 and (held := queue.claimed_with_any(self.db, tokens)):
                return held
            return queue.claim_many(
                self.db,
                self.settings.session_id,
                self.claimant,
                self.settings.lease_s,
                limit,
                tokens,
                self.claim_stage,
            )

        return self._retrying(attempt)

    def _work_batch(self, leases: list[Lease]) -> None:
        """Tune a claimed batch, settling each job (record, fail or give back) as its outcome
        arrives; a second stop signal gives back every job not settled yet."""
        self.current = leases[0]
        pending = {lease.job_id: lease for lease in leases}
        try:
            # closing: a give-back stops the tool before the jobs are given back.
            with (
                self.heartbeat.hold_many(leases) as lost,
                contextlib.closing(self._tune_batch(leases)) as outcomes,
            ):
                for lease, outcome, error, final in outcomes:
                    self.heartbeat.drop(lease)
                    if lost[lease.job_id].is_set():
                        self.stats.lost += 1  # another worker has it now: record nothing
                    else:
                        self._settle(lease, outcome, error, final)
                    pending.pop(lease.job_id)
        except GiveBack:
            self.stop_requested.set()
            self._give_back(pending.values(), "given back by a stopping worker")
        except DatabaseError:
            self._give_back(pending.values(), "the worker stopped on a database error")
            raise
        finally:
            self.current = None

    def _settle(
        self, lease: Lease, outcome: TuneOutcome | None, error: str | None, final: bool | str
    ) -> None:
        """Record or fail one job of a batch; `final` RELEASE: the tool never tuned it."""
        if final != RELEASE:
            self._finish(lease, outcome, error, final)
            return
        if self._retrying(lambda: queue.release(self.db, lease, error or "not tuned")):
            self.stats.released += 1
            log.info("job %s given back: %s", lease.job_id, _first_line(error))
        else:
            self.stats.lost += 1

    def _give_back(self, leases: Iterable[Lease], why: str) -> None:
        # One try each: a database that is away must not hold a stopping worker; the leases
        # bring the jobs back then.
        for lease in list(leases):
            try:
                if queue.release(self.db, lease, why):
                    self.stats.released += 1
                    log.warning("job %s given back", lease.job_id)
            except Exception as exc:
                log.warning(
                    "job %s: could not give it back (%s); it returns when its lease expires",
                    lease.job_id,
                    _first_line(exc),
                )

    def _tune_batch(self, leases: list[Lease]) -> Iterator[Settled]:
        """(lease, outcome, error, final) for each job, as each is known: the jobs the tuner
        can batch in one call per op, every other one alone."""
        if leases[0].stage == BENCHMARK:  # a split session's bundles: one call for all
            yield from stages.benchmark(self, leases)
            return
        groups: dict[str, list[Lease]] = {}
        alone: list[Lease] = []
        for lease in leases:
            problem = lease.problem or self._retrying(lambda le=lease: self._problem(le.problem_id))
            lease = dataclasses.replace(lease, problem=problem)
            batchable = getattr(self.tuner, "batchable", None)
            if batchable is not None and self._batchable(batchable, problem):
                groups.setdefault(problem.op, []).append(lease)
            else:
                alone.append(lease)
        for group in groups.values():
            if len(group) == 1:
                alone.append(group[0])
            else:
                yield from self._tune_many(group)
        for lease in alone:
            yield (lease, *self._tune(lease))

    def _batchable(self, batchable: Callable[[Problem], bool], problem: Problem) -> bool:
        try:
            return bool(batchable(problem))
        except TunerError:
            return False  # tuned alone, where the failure is the job's own

    def _tune_many(self, group: list[Lease], tune_many=None) -> Iterator[Settled]:
        """One tool call for the group: each job's outcome as the tool writes it. The worker's
        alarm for the call is the job timeout times the batch size; when it fires, or the tuner
        fails as a whole, the job the tool was on fails and the ones not begun are given back.
        `tune_many(problems, ctx)`: the call (default the tuner's; a split session's benchmark
        passes its own, stages.py)."""
        try:
            ctx = self._context(group[0].problem)
        except TunerError as exc:
            for lease in group:
                yield lease, None, _error_text(exc), False
            return
        timeout = self.job_timeout_s * len(group)
        deadline = time.monotonic() + timeout + _grace_s(timeout)
        log.info("jobs %s: tuning %d problems in one call", _ids(group), len(group))
        left = list(group)
        outcomes = (tune_many or self.tuner.tune_many)([lease.problem for lease in group], ctx)
        with contextlib.closing(outcomes):
            while left:
                try:
                    with _alarm(max(deadline - time.monotonic(), 0.001)):
                        item = next(outcomes, None)
                except JobTimedOut:
                    why = f"timed out after {timeout:g} s (the worker stopped the tuner)"
                    yield from _unfinished(left, why)
                    return
                except TunerError as exc:  # the call as a whole: each job, as K=1 would
                    for lease in left:
                        yield lease, None, _error_text(exc), isinstance(exc, Unsupported)
                    return
                except Exception as exc:  # a tuner bug must cost one attempt, not the jobs
                    log.exception("jobs %s: tuner crashed", _ids(left))
                    for lease in left:
                        yield lease, None, f"tuner crashed: {type(exc).__name__}: {exc}", False
                    return
                if item is None:
                    for lease in left:
                        yield lease, None, "the tuner gave no outcome for it", False
                    return
                lease = group[item[0]]
                left.remove(lease)
                yield lease, *_batch_outcome(item[1])

    @property
    def job_timeout_s(self) -> float:
        """--job-timeout, else the default of the session's tuning space."""
        if self.settings.job_timeout_s:
            return self.settings.job_timeout_s
        return DEFAULT_JOB_TIMEOUT_S.get(
            self.session.tuning_space, max(DEFAULT_JOB_TIMEOUT_S.values())
        )

    def _problem(self, problem_id: int):
        with self.db.session() as s:
            return catalog.load_problem(s, problem_id)

    def _finish(self, lease: Lease, outcome, error: str | None, final: bool = False) -> None:
        if outcome is not None and (wrong := foreign_perf_config(self.session, outcome)):
            outcome, error, final = None, wrong, True
        if outcome is not None:
            for note in outcome.notes:
                log.info("job %s: %s", lease.job_id, note)
            also, committed = stages.record_with(self.session, lease)  # a benchmark's bundle
            if self._retrying(lambda: queue.record(self.db, lease, outcome, also)):
                committed()
                self.stats.completed += 1
                log.info(
                    "job %s: completed, %s at %.3g TFlops",
                    lease.job_id,
                    outcome.winner.perf_config,
                    outcome.winner.tflops or 0.0,
                )
            else:
                self.stats.lost += 1
            return
        self._fail(lease, error, final)

    def _fail(self, lease: Lease, error: str | None, final: bool) -> None:
        state = self._retrying(
            lambda: queue.fail(
                self.db,
                lease,
                error or "unknown error",
                max_retries=self.settings.max_retries,
                backoff_s=self.settings.backoff_s,
                final=final,
            )
        )
        if state is None:
            self.stats.lost += 1
        else:
            self.stats.failed += 1
            log.warning("job %s: %s -> %s", lease.job_id, _first_line(error), state)

    def _context(self, problem=None) -> TuneContext:
        sess = self.session
        listed = None
        if self.quick_lists is not None and problem is not None:
            key = (problem.op, str(getattr(problem, "data_type", "") or "-"))
            listed = self.quick_lists.get(key)
            if listed is None:
                raise TunerError(
                    f"quick list {sess.tuning_space} has no list for {sess.arch} {' '.join(key)}"
                )
        return TuneContext(
            arch=sess.arch,
            arch_full=sess.arch_full,
            num_cu=sess.num_cu,
            num_chiplets=sess.num_chiplets,
            tuning_space=sess.tuning_space,
            gpu_id=self.settings.gpu_id,
            timeout_s=self.job_timeout_s,
            mlir_build_dir=self.settings.mlir_build_dir,
            cpu_mem_limit=self.settings.cpu_mem_limit,
            perf_configs=listed,
            rep_ms=getattr(sess, "rep_ms", None),
            warmup_ms=getattr(sess, "warmup_ms", None),
            gpu_run_timeout_s=getattr(sess, "gpu_run_timeout_s", None),
            lfbo_effort=getattr(sess, "lfbo_effort", None),
            topk=sess.topk,
        )

    def _retrying(self, fn):
        """Run a queue operation, waiting out a database that is away (restart, cut link, SQLite
        lock held past the busy timeout) and running again a transaction the server rolled back
        (deadlock, lock timeout). Every try after a failure waits first, growing, even while the
        worker stops; an error that waiting cannot cure raises DatabaseError at once."""
        delay, away_since, told_at, rolled_back = DB_RETRY_S, None, -DB_LOG_EVERY_S, 0
        while True:
            try:
                result = fn()
                if away_since is not None:
                    log.warning("database back after %.0f s", time.monotonic() - away_since)
                return result
            except Exception as exc:
                fault = fault_of(exc)
                if fault is None:
                    if isinstance(exc, DatabaseError):
                        raise
                    if isinstance(exc, sa_exc.DBAPIError):
                        raise DatabaseError(f"database error: {_first_line(exc.orig)}") from exc
                    raise
                if fault == ROLLED_BACK:
                    log.info("transaction rolled back by the server (%s); again", _first_line(exc))
                    rolled_back += 1
                    time.sleep(random.uniform(0.0, min(0.05 * 2**rolled_back, DB_RETRY_S)))
                    continue
                now = time.monotonic()
                if away_since is None:
                    away_since = now
                if now - told_at >= DB_LOG_EVERY_S:
                    told_at = now
                    log.warning("database unavailable (%s); waiting", _first_line(exc))
            if self.stop_requested.is_set() and self.current is None:
                raise DatabaseError("stopped while the database was unavailable")
            # Jittered, so that a farm of workers does not return in lockstep.
            pause = random.uniform(delay / 2, delay)
            if self.stop_requested.is_set():
                time.sleep(pause)  # wait() would return at once: a stopping worker must pause too
            else:
                self.stop_requested.wait(pause)
            delay = min(delay * 2, DB_RETRY_MAX_S)


def _batch_outcome(
    result: TuneOutcome | TunerError,
) -> tuple[TuneOutcome | None, str | None, bool | str]:
    """(outcome, error, final) of one job of a batch; final RELEASE for a job not tuned."""
    if isinstance(result, NotRun):
        return None, _error_text(result), RELEASE
    if isinstance(result, TunerError):
        return None, _error_text(result), isinstance(result, Unsupported)
    return result, None, False


def _unfinished(left: list[Lease], why: str) -> Iterator[Settled]:
    """A batch stopped by the worker's alarm: the job the tool was on (the first not settled:
    it tunes in order) fails, the others go back."""
    for i, lease in enumerate(left):
        if i == 0:
            yield lease, None, why, False
        else:
            yield lease, None, f"not tuned: its batch stopped ({_first_line(why)})", RELEASE


def _ids(leases: list[Lease]) -> str:
    return ",".join(str(lease.job_id) for lease in leases)


def _grace_s(timeout: float) -> float:
    """How long past the job timeout a tuner may take to stop itself before the worker does."""
    return min(30.0, max(0.5, timeout / 4))


def _quick_lists(db: Database, session: sessions.Session):
    """The stored quick list of a `list:NAME` session, read once per worker (None otherwise)."""
    name = sessions.quick_list_name(session.tuning_space)
    return sessions.load_quick_list(db, name, session.arch) if name is not None else None


def role_stage(session: sessions.Session, role: str) -> str:
    """The job stage a worker of this role claims in this session: a GPU worker tunes, or, in
    a split session, benchmarks; a compile worker compiles (split sessions only)."""
    if role == "gpu":
        return BENCHMARK if session.two_stage else TUNE
    if role != "compile":
        raise UserError(f"--role {role!r}: expected gpu or compile")
    if not session.two_stage:
        raise UserError(
            f"session {session.id} has no compile jobs: open it with --split compile,benchmark"
        )
    return COMPILE


def session_tuner(session: sessions.Session, asked: str | None) -> str:
    """The tuner a worker of this session runs: the session decides; `asked` may only repeat
    it (sleep:SECONDS may set the seconds of a sleep session)."""
    if asked is None or asked == session.tuner:
        return session.tuner
    if sessions.tuner_name(asked) != session.tuner_name:
        raise UserError(
            f"--tuner {asked} differs from session {session.id}'s tuner {session.tuner}: "
            f"leave --tuner out, or open a session for {asked}"
        )
    return asked


def foreign_perf_config(session: sessions.Session, outcome: TuneOutcome) -> str | None:
    """Why an outcome must not be recorded in this session (perf configs of another tuner's
    family, e.g. cpu:… in a rocmlir session), or None."""
    own = session.tuner_name
    if own not in tuners.FAMILIES:
        return None  # a plugin's perf configs are its own business
    for c in [outcome.winner, *outcome.candidates]:
        family = tuners.perf_config_family(c.perf_config)
        if family != own:
            return (
                f"perf config {c.perf_config} is of the {family} tuner, not of session "
                f"{session.id}'s tuner {own}: nothing recorded"
            )
    return None


@contextlib.contextmanager
def _alarm(seconds: float) -> Iterator[None]:
    """Raise JobTimedOut in this (main) thread after `seconds`: a tuner that ignores the timeout
    (a plugin in a loop, a tool that never returns) is stopped all the same. Signals reach only
    the main thread, so elsewhere (a worker run in a thread, as some tests do) it is a no-op."""
    if threading.current_thread() is not threading.main_thread():
        yield
        return

    def fire(_signum: int, _frame: object) -> None:
        raise JobTimedOut()

    old = signal.signal(signal.SIGALRM, fire)
    signal.setitimer(signal.ITIMER_REAL, seconds)
    try:
        yield
    finally:
        signal.setitimer(signal.ITIMER_REAL, 0)
        signal.signal(signal.SIGALRM, old)


def _error_text(exc: TunerError) -> str:
    return f"{exc}\n{exc.detail}".strip() if exc.detail else str(exc)


def _first_line(exc: object) -> str:
    text = str(exc).strip()
    return text.splitlines()[0] if text else type(exc).__name__
