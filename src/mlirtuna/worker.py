"""A worker: claims jobs of one session, runs the tuner on its GPU, records through the fence.

One worker process per GPU (see manager.py). Stopping: the first SIGINT/SIGTERM lets the current
job finish, the second gives it back at once (state new, no retry counted).
"""

from __future__ import annotations

import contextlib
import logging
import os
import random
import signal
import threading
import time
from collections.abc import Iterator
from dataclasses import dataclass, field

from sqlalchemy import exc as sa_exc

from mlirtuna import configs, jobs, machine, queue, sessions, tuners
from mlirtuna.db import ROLLED_BACK, Database, fault_of
from mlirtuna.defaults import DEFAULT_BACKOFF_S, DEFAULT_LEASE_S, DEFAULT_MAX_RETRIES
from mlirtuna.errors import DatabaseError, TunerError, Unsupported, UserError
from mlirtuna.queue import Claimant, Lease
from mlirtuna.tuners.base import TuneContext, TuneOutcome, Tuner
from mlirtuna.wakeup import Wakeup

log = logging.getLogger(__name__)

# Idle polling: short, jittered and growing to a cap; never seconds-long random sleeps.
POLL_MIN_S, POLL_MAX_S = 0.1, 2.0
DB_RETRY_S = 1.0  # the first pause while the database is away; it doubles up to DB_RETRY_MAX_S
DB_RETRY_MAX_S = 15.0
DB_LOG_EVERY_S = 60.0  # while the database stays away, say so again this often (not per try)
SWEEP_S = 5.0  # how often a busy worker looks for expired leases
# The job timeout when --job-timeout is not given: generous per tuning space, so that only a
# tuner that hangs meets it. Every tuner runs under it, whether or not it honours ctx.timeout_s.
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
    mlir_build_dir: str | None = None
    cpu_mem_limit: int = 4 << 30
    machine_name: str = field(default_factory=machine.machine_name)

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
    """Extends the lease the worker holds every `interval` seconds, from one long-lived thread.

    `hold(lease)` makes a lease current for the duration of a job; its `lost` event is set when a
    renewal finds the lease taken away (requeued, cancelled, or expired and claimed by another
    worker). One thread per worker, not one per job: starting a thread per job cost more than
    the job's own queue work.
    """

    def __init__(self, db: Database, lease_s: float, interval: float) -> None:
        self.db, self.lease_s, self.interval = db, lease_s, interval
        self._cv = threading.Condition()
        self._lease: Lease | None = None
        self._lost = threading.Event()
        threading.Thread(target=self._loop, daemon=True, name="heartbeat").start()

    def _loop(self) -> None:
        while True:
            with self._cv:
                self._cv.wait_for(lambda: self._lease is not None)
                lease, lost = self._lease, self._lost
                # Sleep one interval unless the job ends (or another begins) first.
                if self._cv.wait_for(lambda held=lease: self._lease is not held, self.interval):
                    continue
            self._renew(lease, lost)

    def _renew(self, lease: Lease, lost: threading.Event) -> None:
        try:
            if not queue.heartbeat(self.db, lease, self.lease_s):
                with self._cv:
                    if self._lease is not lease:  # the job ended (and recorded) meanwhile
                        return
                log.warning("job %s: lease lost (taken over, requeued or cancelled)", lease.job_id)
                lost.set()
                with self._cv:
                    self._cv.wait_for(lambda: self._lease is not lease)
        except Exception as exc:  # the database may come back before the lease runs out
            log.warning("job %s: heartbeat failed: %s", lease.job_id, _first_line(exc))

    @contextlib.contextmanager
    def hold(self, lease: Lease) -> Iterator[threading.Event]:
        with self._cv:
            self._lease, self._lost = lease, threading.Event()
            lost = self._lost
            self._cv.notify_all()
        try:
            yield lost
        finally:
            with self._cv:
                self._lease = None
                self._cv.notify_all()


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
        self.claimant = Claimant(settings.machine_name, settings.gpu_id, os.getpid())
        self.stats = WorkerStats()
        self._next_sweep = 0.0
        self.heartbeat = Heartbeat(db, settings.lease_s, settings.heartbeat_s)
        self.wakeup = Wakeup(db, settings.session_id)

    # -- signals -----------------------------------------------------------------------------
    def install_signal_handlers(self) -> None:
        for sig in (signal.SIGINT, signal.SIGTERM):
            signal.signal(sig, self._on_signal)

    def _on_signal(self, signum: int, _frame: object) -> None:
        if self.stop_requested.is_set() and self.current is not None:
            raise GiveBack()
        self.stop_requested.set()
        if self.current is not None:
            log.warning(
                "stopping after job %s (signal again to give it back now)", self.current.job_id
            )

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
            lease = self._claim()
            if lease is None:
                if self.settings.until_empty and self._retrying(
                    lambda: jobs.is_drained(self.db, self.settings.session_id)
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
            self._work(lease)
        return self.stats

    def _enough(self) -> bool:
        done = self.stats.completed + self.stats.failed + self.stats.lost
        return self.settings.max_jobs is not None and done >= self.settings.max_jobs

    def _claim(self) -> Lease | None:
        # Expired leases are swept every SWEEP_S seconds and whenever nothing is claimable: a
        # dead worker's job comes back within its lease + SWEEP_S, and a busy queue does not pay
        # for a sweep on every claim.
        now = time.monotonic()
        swept = now >= self._next_sweep
        if swept:
            self._sweep(now)
        lease = self._claim_once()
        if lease is None and not swept:
            self._sweep(now)
            lease = self._claim_once()
        return lease

    def _sweep(self, now: float) -> None:
        self._retrying(
            lambda: queue.reclaim_expired(
                self.db, max_retries=self.settings.max_retries, session_id=self.settings.session_id
            )
        )
        self._next_sweep = now + SWEEP_S

    def _claim_once(self) -> Lease | None:
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
                self.db, self.settings.session_id, self.claimant, self.settings.lease_s, token
            )

        return self._retrying(attempt)

    def _work(self, lease: Lease) -> None:
        self.current = lease
        try:
            with self.heartbeat.hold(lease) as lost:
                outcome, error, final = self._tune(lease)
                if lost.is_set():
                    self.stats.lost += 1
                    return
            self._finish(lease, outcome, error, final)
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
        timeout = self.job_timeout_s
        try:
            log.info("job %s: tuning %s", lease.job_id, problem.canonical())
            with _alarm(timeout + _grace_s(timeout)):
                return self.tuner.tune(problem, self._context(problem)), None, False
        except JobTimedOut:
            return None, f"timed out after {timeout:g} s (the worker stopped the tuner)", False
        except Unsupported as exc:
            return None, _error_text(exc), True
        except TunerError as exc:  # timeouts included
            return None, _error_text(exc), False
        except Exception as exc:  # a tuner bug must cost one attempt, not the job
            log.exception("job %s: tuner crashed", lease.job_id)
            return None, f"tuner crashed: {type(exc).__name__}: {exc}", False

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
            return configs.load_problem(s, problem_id)

    def _finish(self, lease: Lease, outcome, error: str | None, final: bool = False) -> None:
        if outcome is not None and (wrong := foreign_perf_config(self.session, outcome)):
            outcome, error, final = None, wrong, True
        if outcome is not None:
            for note in outcome.notes:
                log.info("job %s: %s", lease.job_id, note)
            if self._retrying(lambda: queue.record(self.db, lease, outcome)):
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


def _grace_s(timeout: float) -> float:
    """How long past the job timeout a tuner may take to stop itself before the worker does."""
    return min(30.0, max(0.5, timeout / 4))


def _quick_lists(db: Database, session: sessions.Session):
    """The stored quick list of a `list:NAME` session, read once per worker (None otherwise)."""
    from mlirtuna import quick

    name = quick.list_name(session.tuning_space)
    return quick.load_space(db, name, session.arch) if name is not None else None


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
