"""One claimed job's run, and its outcome settled through the fence (record, fail or give back).

A `Runner` holds what running a job needs (the session, the tuner, the heartbeat, the worker's
stop event) and nothing of claiming: the loop (loop.py) claims and hands each job to `work` with
the function that does its stage's work. Every job ends as one `Settled` (lease, outcome, error,
final), which `settle` records or fails.

With `--batch K` the loop hands a batch to batch.py (`batch.work`, `batch.tune`, `tune_many`),
which runs it on this module's public API: the heartbeat, `tools_for`/`tool_done` (a lost lease
stops the tool), the job timeout (`alarm`, `grace_s`) and `settle`.
"""

from __future__ import annotations

import contextlib
import logging
import signal
import threading
from collections.abc import Callable, Iterable, Iterator
from dataclasses import dataclass, field
from pathlib import Path
from typing import Literal, TypeVar

from mlirtuna import catalog, machine, queue, sessions, tuners
from mlirtuna.db import Database, faults
from mlirtuna.db.faults import first_line
from mlirtuna.db.models import BENCHMARK
from mlirtuna.defaults import (
    DEFAULT_BACKOFF_S,
    DEFAULT_BATCH_WAIT_S,
    DEFAULT_LEASE_S,
    DEFAULT_MAX_RETRIES,
    KILL_GRACE_S,
)
from mlirtuna.errors import (
    DatabaseError,
    RecordConflict,
    TunerError,
    Unsupported,
)
from mlirtuna.problems import Problem
from mlirtuna.queue import AlsoInTransaction, Lease, NextClaim, bundles
from mlirtuna.tuners.base import BatchTuner, TuneContext, TuneOutcome, Tuner
from mlirtuna.worker.heartbeat import Heartbeat

log = logging.getLogger(__name__)
T = TypeVar("T")

# A job as the tool left it: (lease, outcome, error, final). `final` True: the tuner cannot run
# this problem at all, so no retry; RELEASE: give it back, the tool never tuned it (its batch's
# tool stopped first).
RELEASE: Literal["release"] = "release"
Final = bool | Literal["release"]
Settled = tuple[Lease, TuneOutcome | None, str | None, Final]
# What one guarded piece of work gave: (its value, None, False) or (None, error text, final).
Tried = tuple[T | None, str | None, bool]
Finish = Callable[[], None]  # settles a job once the heartbeat let go of its lease
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
    batch: int = 1  # jobs claimed at once (rocmlir E3/E4: tuned in one tool call)
    # A split session's GPU worker with --batch K: how long it waits for K ready bundles while
    # compile jobs are still open (about one tool start-up), and whether it claims and unpacks
    # the next batch while the current call benchmarks.
    batch_wait_s: float = DEFAULT_BATCH_WAIT_S
    prefetch: bool = True
    # A split session's GPU worker whose tuner offers a benchmark stream (StreamingTuner) runs
    # its benchmark jobs through one long-lived process (stream.py) unless this is False.
    stream: bool = True
    mlir_build_dir: str | None = None
    cpu_mem_limit: int = 4 << 30
    machine_name: str = field(default_factory=machine.machine_name)
    # gpu: one-stage and benchmark jobs; compile: a split session's compile jobs, no GPU.
    role: str = "gpu"
    # One worker per GPU: a GPU another worker holds is waited for (True) or refused, exit 2.
    wait_for_gpu: bool = False
    gpu_lock_dir: str | None = None  # None: MLIRTUNA_GPU_LOCK_DIR, else the default (gpulock.py)
    # The GPU's key as the operator names it (--gpu-identity); None: read from the kernel.
    gpu_identity: str | None = None

    @property
    def heartbeat_s(self) -> float:
        return self.lease_s / 3


@dataclass
class WorkerStats:
    completed: int = 0
    failed: int = 0
    lost: int = 0  # leases lost before recording (another worker took the job over)
    released: int = 0
    prefetched: int = 0  # batches claimed and unpacked while the previous call benchmarked
    claimed_with_record: int = 0  # jobs claimed in the commit that recorded the one before


class GiveBack(BaseException):
    """Raised in the main thread by a second stop signal: give the current job back now."""


class JobTimedOut(BaseException):
    """Raised in the main thread by the worker's own alarm: the tuner ignored the job timeout.

    A BaseException, so that a tuner's `except Exception` cannot swallow it, while its
    `finally` and `except BaseException` (rocmlir stops its pipeline there) still run."""


QuickLists = dict[tuple[str, str], tuple[str, ...]]


class Runner:
    """Runs the jobs a worker claimed, one at a time (a batch: batch.py), and settles each."""

    def __init__(
        self,
        db: Database,
        settings: WorkerSettings,
        session: sessions.Session,
        tuner: Tuner,
        stop: threading.Event | None = None,
        quick_lists: QuickLists | None = None,
    ) -> None:
        """`stop`: the worker's stop event (a stopping worker still waits out the database
        for a job it holds); `quick_lists`: a `list:NAME` session's stored lists."""
        self.db, self.settings, self.session, self.tuner = db, settings, session, tuner
        self.kind = tuners.kind(session.tuner)  # how its tools are stopped, its perf configs
        self.stop_requested = stop or threading.Event()
        self.quick_lists = quick_lists
        self.batch_tuner = tuner if isinstance(tuner, BatchTuner) else None
        self.current: Lease | None = None  # a job being run: signals and retries look here
        # The claim to send with each record (one job at a time: queue.record_and_claim), or
        # None to record alone; the worker sets it and takes `claimed`, the job it took.
        self.next_claim: Callable[[], NextClaim | None] | None = None
        self.claimed: Lease | None = None
        self.stats = WorkerStats()
        self.heartbeat = Heartbeat(db, settings.lease_s, settings.heartbeat_s, self._lease_lost)
        # The jobs whose tool runs now, and the thread running it: a lost lease stops the tool
        # once every job it runs for is lost (`_lease_lost`); guarded by `_running_lock`.
        self._running: dict[int, tuple[str | None, bool]] = {}  # job id -> (token, lost)
        self._running_thread = 0
        self._running_lock = threading.Lock()

    # -- the database ------------------------------------------------------------------------
    def retrying(self, fn: Callable[[], T]) -> T:
        """`fn` (a queue operation) under the worker's retry policy (faults.retrying): a
        stopping worker still waits out the database while it holds a job."""
        return faults.retrying(fn, self.stop_requested, lambda: self.current is not None)

    def problem(self, lease: Lease) -> Problem:
        """The lease's problem: read with the claim, or loaded now."""
        if lease.problem is not None:
            return lease.problem
        return self.retrying(lambda: self._load_problem(lease.problem_id))

    def _load_problem(self, problem_id: int) -> Problem:
        with self.db.session() as s:
            return catalog.load_problem(s, problem_id)

    # -- one job -------------------------------------------------------------------------------
    def work(self, lease: Lease, job: Callable[[Lease], Finish]) -> None:
        """Run `job` (its stage's work) while the heartbeat holds the lease, then settle it by
        the Finish it returns; a second stop signal gives the job back at once."""
        self.current = lease
        try:
            with self.heartbeat.hold(lease) as lost, self.tools_for([lease]):
                finish = job(lease)
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
                    first_line(exc),
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

    def tune_job(self, lease: Lease) -> Finish:
        """A one-stage job's work: tune it; the returned Finish records or fails it."""
        settled = self.tune(lease)
        return lambda: self.settle(*settled)

    def tune(self, lease: Lease) -> Settled:
        """The job tuned: a tuner failure never escapes as an exception."""
        problem = self.problem(lease)
        log.info("job %s: tuning %s", lease.job_id, problem.canonical())
        return lease, *self.guarded(lease, lambda: self._tune_one(lease, problem))

    def _tune_one(self, lease: Lease, problem: Problem) -> TuneOutcome:
        """One problem: the tuner's whole space, or a searched session's rounds (search.py)."""
        if self.session.search is None:
            return self.tuner.tune(problem, self.context(problem))
        # Imported here: it brings NumPy (60 ms of every worker's start-up), and a session
        # that is not searched never needs it.
        import mlirtuna.worker.search as searched

        job = searched.SearchedJob(self.db, self.session, self.tuner, lease, self.retrying)
        return searched.tune(job, problem, self.context(problem))

    def guarded(self, lease: Lease, work: Callable[[], T]) -> Tried[T]:
        """(work(), None, False) or (None, error text, final): `work` runs the tool under the
        job timeout, and none of its failures escapes as an exception."""
        timeout = self.job_timeout_s
        try:
            with alarm(timeout + grace_s(timeout)):
                return work(), None, False
        except JobTimedOut:
            return None, f"timed out after {timeout:g} s (the worker stopped the tuner)", False
        except Unsupported as exc:
            return None, error_text(exc), True
        except TunerError as exc:  # timeouts included
            return None, error_text(exc), False
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

    def context(self, problem: Problem | None = None) -> TuneContext:
        """Where and how the job runs, for the tuner; TunerError when a `list:NAME` session's
        list has nothing for this problem."""
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

    # -- settling ------------------------------------------------------------------------------
    def settle(
        self, lease: Lease, outcome: TuneOutcome | None, error: str | None, final: Final
    ) -> None:
        """Record or fail one job; `final` RELEASE: the tool never tuned it, give it back."""
        if final != RELEASE:
            self.finish(lease, outcome, error, final)
            return
        if self.retrying(lambda: queue.release(self.db, lease, error or "not tuned")):
            self.stats.released += 1
            log.info("job %s given back: %s", lease.job_id, first_line(error))
        else:
            self.stats.lost += 1

    def finish(
        self, lease: Lease, outcome: TuneOutcome | None, error: str | None, final: bool = False
    ) -> None:
        """Record the outcome through the fence (a benchmark job's bundle deleted with it), or
        fail the job with `error`."""
        if outcome is not None and (wrong := foreign_perf_config(self.session, outcome)):
            outcome, error, final = None, wrong, True
        if outcome is None:
            self.fail(lease, error, final)
            return
        for note in outcome.notes:
            log.info("job %s: %s", lease.job_id, note)
        also, committed = record_with(self.session, lease)
        try:
            recorded = self.record(lease, outcome, also)
        except RecordConflict as exc:
            # Final: every next try would clash with the same row (a poison job otherwise).
            self.fail(lease, str(exc), final=True)
            return
        if recorded:
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

    def record(self, lease: Lease, outcome: TuneOutcome, also: AlsoInTransaction | None) -> bool:
        """Record through the fence; with `next_claim`, claim the next job in the same commit
        (the job taken is left in `claimed`)."""
        claim = self.next_claim() if self.next_claim is not None else None
        if claim is None:
            return self.retrying(lambda: queue.record(self.db, lease, outcome, also))
        recorded, self.claimed = self.retrying(
            lambda: queue.record_and_claim(self.db, lease, outcome, claim, also)
        )
        if self.claimed is not None:
            self.stats.claimed_with_record += 1
        return recorded

    def fail(self, lease: Lease, error: str | None, final: bool) -> None:
        """Fail the job: retried after the backoff, or `error` once retries (or `final`) end."""
        state = self.retrying(
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
            log.warning("job %s: %s -> %s", lease.job_id, first_line(error), state)

    # -- a lost lease stops its tool (issue 23) --------------------------------------------
    @contextlib.contextmanager
    def tools_for(self, leases: list[Lease]) -> Iterator[None]:
        """While the block runs, the tools this thread starts work for these jobs."""
        with self._running_lock:
            self._running = {lease.job_id: (lease.token, False) for lease in leases}
            self._running_thread = threading.get_ident()
        try:
            yield
        finally:
            with self._running_lock:
                self._running = {}

    def tool_done(self, lease: Lease) -> None:
        """A job of the batch has its outcome: the tool no longer works for it."""
        with self._running_lock:
            self._running.pop(lease.job_id, None)
            self._stop_if_all_lost()

    def _lease_lost(self, lease: Lease) -> None:
        """From the heartbeat thread: a running job's lease is gone (another worker may have the
        job now). Once every job the tool still works for is lost, its output can never be
        recorded: stop it (its process group, as a timeout does) instead of running on."""
        with self._running_lock:
            held = self._running.get(lease.job_id)
            if held is None or held[0] != lease.token:
                return  # not (or no longer) running here
            self._running[lease.job_id] = (lease.token, True)
            self._stop_if_all_lost()

    def _stop_if_all_lost(self) -> None:
        # Under _running_lock: the next job's tool cannot start before `_running` names it.
        if self._running and all(lost for _, lost in self._running.values()):
            jobs = ",".join(str(j) for j in self._running)
            if self.kind.stop_tools(self._running_thread):
                log.warning("jobs %s: every lease lost; stopped the tool", jobs)

    def give_back(self, leases: Iterable[Lease], why: str) -> None:
        """Release these jobs (state new, no retry counted), one try each."""
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
                    first_line(exc),
                )


def record_with(session: sessions.Session, lease: Lease) -> tuple[AlsoInTransaction | None, Finish]:
    """What a job's record also does, and what follows its commit: a benchmark job deletes its
    bundle in the same transaction (its file, if any, once committed), unless the session keeps
    artifacts."""
    if lease.stage != BENCHMARK or session.keep_artifacts:
        return None, _nothing
    removed: list[Path | None] = []
    also = bundles.delete_with(lease.session_id, lease.problem_id, removed)
    return also, lambda: bundles.remove_files(removed)


def _nothing() -> None:
    return None


def foreign_perf_config(session: sessions.Session, outcome: TuneOutcome) -> str | None:
    """Why an outcome must not be recorded in this session (perf configs of another tuner's
    family, e.g. cpu:… in a rocmlir session: TunerKind.owns), or None."""
    kind = tuners.kind(session.tuner)
    for c in [outcome.winner, *outcome.candidates]:
        if not kind.owns(c.perf_config):
            return (
                f"perf config {c.perf_config} is of the {tuners.tuner_of(c.perf_config)} tuner, "
                f"not of session {session.id}'s tuner {session.tuner_name}: nothing recorded"
            )
    return None


def grace_s(timeout: float) -> float:
    """How long past the job timeout a tuner may take to stop itself before the worker does:
    longer than a tool's own SIGTERM-to-SIGKILL grace, so that the worker's alarm does not cut
    the tool's stop short (process.stop kills the group even then)."""
    return max(2 * KILL_GRACE_S, min(30.0, timeout / 4))


@contextlib.contextmanager
def alarm(seconds: float) -> Iterator[None]:
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


def error_text(exc: TunerError) -> str:
    """A tuner error as a job's error text: its message, then its detail (the tool's output)."""
    return f"{exc}\n{exc.detail}".strip() if exc.detail else str(exc)
