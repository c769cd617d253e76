"""The worker's loop: claim jobs of one session, hand each to its stage's work, until told to stop.

One worker process per GPU (supervisor.py). A job's run and its outcome are runner.py's, a
batch's batch.py's; a split session's compile and benchmark stages are stages.py's; this module
claims and dispatches. One
job at a time, the record of job N claims job N+1 in the same commit (queue.record_and_claim);
a worker that stops holding such a job gives it back (state new, no retry counted).
Stopping: the first SIGINT/SIGTERM lets the current job finish, the second gives it back at once
(state new, no retry counted).

With `--batch K` it claims up to K jobs at once (queue.claim_many) and hands them to the runner
as one batch. A split session's GPU worker waits, up to `batch_wait_s`, for a full batch while
compile jobs are still open (the leases it holds meanwhile are renewed), and claims and unpacks
batch N+1 while call N benchmarks (prefetch.py).
"""

from __future__ import annotations

import functools
import logging
import os
import random
import signal
import threading
import time
from collections.abc import Generator

import mlirtuna.worker.batch as batch
import mlirtuna.worker.stages as stages
from mlirtuna import machine, queue, sessions, tuners
from mlirtuna.db import Database, faults
from mlirtuna.db.models import BENCHMARK, COMPILE, TUNE
from mlirtuna.defaults import MAX_LEASE_S
from mlirtuna.errors import TunerError, UserError
from mlirtuna.queue import Claimant, Lease, jobs
from mlirtuna.queue.wakeup import Wakeup
from mlirtuna.tuners.base import StreamingTuner, Tuner
from mlirtuna.worker.gpulock import WAIT_POLL_S, GpuHeld, GpuLock, held_message
from mlirtuna.worker.prefetch import Prefetch
from mlirtuna.worker.runner import (
    Finish,
    GiveBack,
    QuickLists,
    Runner,
    Settled,
    WorkerSettings,
    WorkerStats,
)
from mlirtuna.worker.stream import Streamer

log = logging.getLogger(__name__)

# Idle polling: short, jittered and growing to a cap; never seconds-long random sleeps.
POLL_MIN_S, POLL_MAX_S = 0.1, 2.0
SWEEP_S = 5.0  # how often a busy worker looks for expired leases
BATCH_POLL_S = 0.1  # claims again this often while it waits for a full batch


class Worker:
    """Claims the jobs of one session (one at a time, or `--batch K`) and runs each through its
    Runner until stopped, the queue drained (`until_empty`) or `max_jobs` done."""

    def __init__(self, db: Database, settings: WorkerSettings, tuner: Tuner | None = None) -> None:
        check_lease(settings.lease_s)
        self.db = db
        self.settings = settings
        self.stop_requested = threading.Event()
        session = faults.retrying(
            lambda: sessions.get(db, settings.session_id), self.stop_requested
        )
        settings.tuner = session_tuner(session, settings.tuner)
        if tuners.kind(settings.tuner).uses_build:  # the session's build, nothing else
            sessions.check_build_for(session, sessions.build_dir_of(settings.mlir_build_dir))
        tuner = tuner or tuners.make(settings.tuner, mlir_build_dir=settings.mlir_build_dir)
        quick_lists = _quick_lists(db, session)
        self.claim_stage = role_stage(session, settings.role)
        self.claimant = _claimant(settings, session)
        self.runner = Runner(db, settings, session, tuner, self.stop_requested, quick_lists)
        self._next_sweep = 0.0
        self.wakeup = Wakeup(db, settings.session_id)
        self.batch = self._batch_size()
        self._prefetch: Prefetch | None = None
        # This host's flock on the worker's GPU, once it holds it (cli/workercmd.py).
        self.gpu_lock: GpuLock | None = None
        if self.batch == 1:  # one durable commit per job: each record claims the next job
            self.runner.next_claim = self._next_claim

    @property
    def session(self) -> sessions.Session:
        return self.runner.session

    @property
    def tuner(self) -> Tuner:
        return self.runner.tuner

    @property
    def stats(self) -> WorkerStats:
        return self.runner.stats

    # -- signals -----------------------------------------------------------------------------
    def install_signal_handlers(self) -> None:
        for sig in (signal.SIGINT, signal.SIGTERM):
            signal.signal(sig, self._on_signal)

    def _on_signal(self, signum: int, _frame: object) -> None:
        current = self.runner.current
        if self.stop_requested.is_set() and current is not None:
            raise GiveBack()
        self.stop_requested.set()
        if current is not None:
            what = f"job {current.job_id}" if self.batch == 1 else "the current batch"
            log.warning("stopping after %s (signal again to give it back now)", what)

    # -- the loop ------------------------------------------------------------------------------
    def run(self) -> WorkerStats:
        # Temp dirs a killed worker on this host left behind (never a live worker's).
        for stale in machine.sweep_stale_temp():
            log.info("removed %s: its worker is gone", stale)
        try:
            return self._run()
        finally:
            self.wakeup.close()

    def _run(self) -> WorkerStats:
        if not self._gpu_is_ours():
            return self.stats
        try:
            return self._loop()
        finally:
            if (claimed := self.runner.claimed) is not None:  # taken with the last record
                self.runner.claimed = None
                self.runner.give_back([claimed], "given back by a stopping worker")
            if self._prefetch is not None:  # stopping: the next batch goes back untouched
                prefetch, self._prefetch = self._prefetch, None
                prefetch.give_back()

    def _loop(self) -> WorkerStats:
        streaming = self._streaming_tuner()
        if streaming is not None:
            # The stream claims ahead on its own (it keeps jobs fed): a record must not also
            # claim one for the one-job loop, which never runs while the stream does.
            chained, self.runner.next_claim = self.runner.next_claim, None
            if self._stream(streaming):
                return self.stats
            self.runner.next_claim = chained  # it could not start: the one-job loop runs
        idle = POLL_MIN_S
        said_idle = False  # an idle stretch is announced once, not at every poll
        while not self.stop_requested.is_set() and not self._enough():
            leases, prepared = self._next()
            if not leases:
                if self.settings.until_empty and self.runner.retrying(
                    lambda: jobs.is_drained(self.db, self.settings.session_id, [self.claim_stage])
                ):
                    break
                if not said_idle:
                    log.info(
                        "idle: no job of session %s to claim; %s",
                        self.settings.session_id,
                        # --until-empty waits for jobs other workers hold (they may fail back)
                        "waiting while other workers hold its last jobs"
                        if self.settings.until_empty
                        else "waiting for new ones (--until-empty exits instead)",
                    )
                    said_idle = True
                # Woken early on PostgreSQL when a job of the session becomes claimable.
                self.wakeup.wait(random.uniform(idle / 2, idle), self.stop_requested)
                idle = min(idle * 2, POLL_MAX_S)
                continue
            idle, said_idle = POLL_MIN_S, False
            if self.stop_requested.is_set() and self.batch > 1:
                # Told to stop while it claimed (or waited for a prefetch): not begun, so back.
                for lease in leases:
                    self.runner.heartbeat.drop(lease)
                self.runner.give_back(leases, "given back by a stopping worker")
                if prepared is not None:
                    prepared.discard()
                break
            if self.batch == 1:
                self.runner.work(leases[0], self._one)
                continue
            if self.claim_stage == COMPILE:  # one --compile-only call, a bundle per job
                stages.compile_batch(self.runner, leases)
                continue
            if self._prefetching and not self.stop_requested.is_set():
                self._prefetch = Prefetch(
                    self.runner, functools.partial(self._claim, len(leases)), self.stop_requested
                )
            batch.work(self.runner, leases, functools.partial(self._many, prepared=prepared))
        return self.stats

    # -- one worker per GPU ----------------------------------------------------------------------
    def _gpu_is_ours(self) -> bool:
        """Whether no other worker holds a live attempt on this worker's GPU (the claim refuses
        such a GPU anyway: this says who holds it). Held: GpuHeld (exit 2), or with
        `wait_for_gpu`, or when the holder is a worker of this host that is gone, wait for its
        leases to expire; a holder proven gone (`_dead_here`) has its jobs taken back at once.
        False when told to stop meanwhile."""
        said = False
        while not self.stop_requested.is_set():
            holder = faults.retrying(
                lambda: queue.gpu_holder(self.db, self.claimant), self.stop_requested
            )
            if holder is None:
                return True
            if self._dead_here(holder) and self._take_back(holder):
                continue  # another holder may be next (none, usually)
            gone = holder.machine_name == self.settings.machine_name and not _alive(holder.pid)
            if not (self.settings.wait_for_gpu or gone):
                raise GpuHeld(held_message(f"GPU {self.claimant.gpu}", str(holder)))
            if not said:
                log.warning("%s", waiting_line(f"GPU {self.claimant.gpu}", holder, gone))
                said = True
            self.stop_requested.wait(WAIT_POLL_S)
        return False

    def _dead_here(self, holder: queue.GpuHolder) -> bool:
        """Whether `holder` is certainly gone, tool and all: a worker of this host whose line
        this worker found in the GPU's lock file when it took the flock (so it used this very
        lock file, and its flock, which its tools' guards share until every tool process is
        reaped, is free now), and whose pid is gone (a live pid may be a reused one: not
        proof enough, its leases are waited for)."""
        lock = self.gpu_lock
        return (
            lock is not None
            and holder.worker is not None
            and holder.machine_name == self.settings.machine_name
            and lock.previous == str(holder)
            and not _alive(holder.pid)
        )

    def _take_back(self, holder: queue.GpuHolder) -> int:
        """The dead holder's jobs taken back (said in one line); 0 when none could be (a row
        another transaction holds: the holder is waited for as before, then asked again)."""
        worker = holder.worker or ""  # _dead_here: never empty
        taken = faults.retrying(
            lambda: queue.take_back(
                self.db, holder.machine_name, holder.pid, worker,
                max_retries=self.settings.max_retries,
            ),
            self.stop_requested,
        )  # fmt: skip
        if taken:
            log.warning(
                "GPU %d: worker pid %d on %s is gone (its tool too): its %d job%s taken back now",
                self.settings.gpu_id, holder.pid, holder.machine_name, taken,
                "" if taken == 1 else "s",
            )  # fmt: skip
        return taken

    # -- the benchmark stream (stream.py) ---------------------------------------------------
    def _streaming_tuner(self) -> StreamingTuner | None:
        """The tuner, where this worker benchmarks through a stream: a split session's GPU
        worker (stream not turned off) whose tuner's build offers it."""
        tuner = self.tuner
        if self.claim_stage != BENCHMARK or not self.settings.stream:
            return None
        if not isinstance(tuner, StreamingTuner):
            return None
        try:
            return tuner if tuner.can_stream() else None
        except TunerError as exc:  # the tool's --help failed: the batch path says why per job
            log.warning("cannot ask the tool for a benchmark stream (%s)", exc)
            return None

    def _stream(self, tuner: StreamingTuner) -> bool:
        """Benchmark through the stream (stream.py); False: it could not start."""
        idle = [POLL_MIN_S, False]  # the poll interval, and whether idleness was announced

        def wait_idle() -> bool:
            if self._enough():
                return False
            if self.settings.until_empty and self.runner.retrying(
                lambda: jobs.is_drained(self.db, self.settings.session_id, [self.claim_stage])
            ):
                return False
            if not idle[1]:
                log.info("idle: no job of session %s to claim", self.settings.session_id)
                idle[1] = True
            self.wakeup.wait(random.uniform(idle[0] / 2, idle[0]), self.stop_requested)
            idle[0] = min(idle[0] * 2, POLL_MAX_S)
            return True

        def claim(limit: int) -> list[Lease]:
            if self.settings.max_jobs is not None:
                limit = min(limit, self.settings.max_jobs - self._done() - len(streamer.inflight))
            if limit < 1:
                return []
            now = time.monotonic()
            if now >= self._next_sweep:
                self._sweep(now)
            leases = self._claim_batch(limit)
            if leases:
                idle[0], idle[1] = POLL_MIN_S, False
            return leases

        streamer = Streamer(self.runner, tuner, claim, wait_idle)
        return streamer.run()

    def _next(self) -> tuple[list[Lease], stages.Prepared | None]:
        """The next batch: the job claimed with the last record, the prefetched batch (less
        the jobs whose lease was lost), else claimed now."""
        if (claimed := self.runner.claimed) is not None:
            self.runner.claimed = None
            return [claimed], None
        if self._prefetch is not None:
            prefetch, self._prefetch = self._prefetch, None
            leases, prepared = prefetch.take()
            if leases:
                return leases, prepared
        return self._claim(), None

    @property
    def _prefetching(self) -> bool:
        return self.claim_stage == BENCHMARK and self.batch > 1 and self.settings.prefetch

    def _one(self, lease: Lease) -> Finish:
        """One job's work by its stage: tune, or a split session's compile or benchmark."""
        if lease.stage == TUNE:
            return self.runner.tune_job(lease)
        return stages.run(self.runner, lease)

    def _many(
        self, leases: list[Lease], prepared: stages.Prepared | None = None
    ) -> Generator[Settled, None, None]:
        """A batch's work: a split session's bundles (`prepared`: unpacked ahead) in one
        benchmark call, else tuned."""
        if leases[0].stage == BENCHMARK:
            return stages.benchmark(self.runner, leases, prepared)
        return batch.tune(self.runner, leases)

    def _enough(self) -> bool:
        return self.settings.max_jobs is not None and self._done() >= self.settings.max_jobs

    def _done(self) -> int:
        return self.stats.completed + self.stats.failed + self.stats.lost

    # -- claiming ------------------------------------------------------------------------------
    def _claim(self, in_flight: int = 0) -> list[Lease]:
        """Claim the next job, or batch (`in_flight`: jobs of a batch still running, which
        count against --max-jobs). Expired leases are swept first when due."""
        # Expired leases are swept every SWEEP_S seconds and whenever nothing is claimable: a
        # dead worker's job comes back within its lease + SWEEP_S, and a busy queue does not pay
        # for a sweep on every claim.
        now = time.monotonic()
        swept = now >= self._next_sweep
        if swept:
            self._sweep(now)

        def claim() -> list[Lease]:
            return self._claim_once() if self.batch == 1 else self._claim_full(in_flight)

        leases = claim()
        if not leases and not swept:
            self._sweep(now)
            leases = claim()
        return leases

    def _next_claim(self) -> queue.NextClaim | None:
        """The claim sent with a job's record (one job at a time), or None when this worker
        takes no more: told to stop, or --max-jobs reached with the job being recorded."""
        if self.stop_requested.is_set():
            return None
        if self.settings.max_jobs is not None and self._done() + 1 >= self.settings.max_jobs:
            return None
        now = time.monotonic()
        if now >= self._next_sweep:
            self._sweep(now)
        s = self.settings
        return queue.NextClaim(s.session_id, self.claimant, s.lease_s, self.claim_stage)

    def _sweep(self, now: float) -> None:
        self.runner.retrying(
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

        lease = self.runner.retrying(attempt)
        return self._on_our_gpu([lease] if lease is not None else [])

    def _claim_full(self, in_flight: int) -> list[Lease]:
        """Up to K jobs. A split session's GPU worker that got fewer while compile jobs are
        still open claims again every BATCH_POLL_S until it holds K, compiling ends, or
        `batch_wait_s` have passed; the heartbeat renews what it holds meanwhile."""
        limit = self.batch
        if self.settings.max_jobs is not None:
            limit = min(limit, self.settings.max_jobs - self._done() - in_flight)
            if limit < 1:
                return []
        held = self._claim_batch(limit)
        if self.claim_stage != BENCHMARK or not held:
            return held
        self.runner.heartbeat.add(held)
        deadline = time.monotonic() + self.settings.batch_wait_s
        while len(held) < limit and not self.stop_requested.is_set():
            compiling = not self.runner.retrying(
                lambda: jobs.is_drained(self.db, self.settings.session_id, [COMPILE])
            )
            if compiling:
                self.stop_requested.wait(min(BATCH_POLL_S, max(deadline - time.monotonic(), 0)))
            # One more claim after compiling ended: its last bundles are claimable by then.
            more = self._claim_batch(limit - len(held))
            self.runner.heartbeat.add(more)
            held += more
            if not compiling or time.monotonic() >= deadline:
                break
        return held

    def _claim_batch(self, limit: int) -> list[Lease]:
        # As _claim_once: the same tokens for every try, and a look for what a try whose reply
        # was lost took.
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

        return self._on_our_gpu(self.runner.retrying(attempt))

    def _on_our_gpu(self, leases: list[Lease]) -> list[Lease]:
        """One worker per GPU. Two workers claiming in the same instant can both pass the
        claim's check (each reads before the other commits), so after its commit a worker
        looks again and gives its jobs back when another worker holds a live attempt on its
        GPU: of two such claims the later commit always sees the earlier, so at most one
        keeps its jobs (both may give back; they claim again after a jittered wait). A claim
        sent with a record (record_and_claim) needs no look: its worker held the GPU all along
        and the record and the claim commit together."""
        if not leases or not self.claimant.gpu:
            return leases
        holder = self.runner.retrying(lambda: queue.gpu_holder(self.db, self.claimant))
        if holder is None:
            return leases
        gpu = f"GPU {self.claimant.gpu}"
        log.warning("%s: its jobs given back", held_message(gpu, str(holder)))
        self.runner.give_back(leases, f"given back: {gpu} held by {holder}")
        return []

    def _batch_size(self) -> int:
        """--batch, where it helps: a BatchTuner only when its build can (rocmlir E3/E4; E2
        tunes one config per call); any other tuner tunes a claimed batch in turn."""
        k = max(1, self.settings.batch)
        batch_tuner = self.runner.batch_tuner
        if k == 1 or batch_tuner is None:
            return k
        try:
            if batch_tuner.can_batch():
                return k
        except TunerError as exc:  # the tool's --help failed: the first job will say why
            log.warning("--batch %s: cannot ask the tool (%s); one job at a time", k, exc)
            return 1
        log.info("--batch %s: this tool takes one config per call; one job at a time", k)
        return 1


def _quick_lists(db: Database, session: sessions.Session) -> QuickLists | None:
    """The stored quick list of a `list:NAME` session, read once per worker (None otherwise)."""
    name = sessions.quick_list_name(session.tuning_space)
    return sessions.load_quick_list(db, name, session.arch) if name is not None else None


def _claimant(settings: WorkerSettings, session: sessions.Session) -> Claimant:
    """Who this worker claims as: with a GPU (role gpu), the GPU's key and performance level
    (gpu_key)."""
    if settings.gpu_id < 0 or settings.role != "gpu":
        return Claimant(settings.machine_name, settings.gpu_id, os.getpid())
    key, perf_level = gpu_key(settings, settings.tuner or session.tuner, session.standin)
    return Claimant(settings.machine_name, settings.gpu_id, os.getpid(), key, perf_level)


def gpu_key(settings: WorkerSettings, tuner: str, standin: bool) -> tuple[str, str]:
    """The key (attempt.gpu) and performance level of the GPU a worker of `tuner` runs on. A
    stand-in session's worker (on the stand-in build: sessions.check_build_for) touches no GPU:
    `standin:MACHINE:INDEX`. Else the name the operator gave (--gpu-identity), else what the
    kernel shows every container of the host alike (machine.gpu_identity): two containers on
    one GPU must compute one key, or both benchmark at once. A GPU tuner's worker that cannot
    tell refuses (exit 2); another tuner's (no GPU touched) keys MACHINE:INDEX."""
    where = f"{settings.machine_name}:{settings.gpu_id}"
    if standin:
        return f"standin:{where}", ""
    identity = machine.gpu_identity(settings.gpu_id)
    key = settings.gpu_identity or identity.key
    if not key and tuners.kind(tuner).gpu:
        raise UserError(
            f"cannot tell which GPU --gpus {settings.gpu_id} is on this host (no GPU node in "
            "the KFD topology under /sys/class/kfd whose render node this process opens): two "
            "containers on one GPU could benchmark at once; name it with --gpu-identity ID "
            "(the same ID on every container that sees this GPU, e.g. its Uuid from rocminfo)"
        )
    return key or where, identity.perf_level


def waiting_line(gpu: str, holder: queue.GpuHolder, gone: bool) -> str:
    """What a worker waiting for its GPU waits for, and until when: the holder's live attempt,
    whose lease (the database's) ends at a time it names. A holder gone from this host renews
    it no more: its jobs are taken back then. A live one (--wait-for-gpu) renews it with each
    heartbeat while it works, so the time is the earliest it can end."""
    lease = holder.lease_line or "its lease end is unknown"
    if gone:
        return (
            f"waiting for {gpu}: its holder, {holder}, is gone, and {lease}; then its jobs are "
            "taken back and this worker starts"
        )
    return (
        f"waiting for {gpu} (--wait-for-gpu): held by {holder}; {lease} at the earliest (each "
        "heartbeat renews it while that worker works); this worker starts when it holds none"
    )


def _alive(pid: int) -> bool:
    try:
        os.kill(pid, 0)
    except ProcessLookupError:
        return False
    except OSError:  # another user's process
        return True
    return True


def check_lease(lease_s: float) -> None:
    """UserError for a lease no worker may take: a longer one than MAX_LEASE_S is not trusted
    (the claim's GPU check ignores it and lease expiry ends it)."""
    if not 0 < lease_s <= MAX_LEASE_S:
        raise UserError(
            f"--lease {lease_s:g}: give more than 0 and at most {MAX_LEASE_S:g} seconds (a "
            "longer lease is not trusted: the claim's GPU check ignores it and lease expiry "
            "ends it)"
        )


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


__all__ = [
    "POLL_MAX_S",
    "POLL_MIN_S",
    "SWEEP_S",
    "Worker",
    "check_lease",
    "role_stage",
    "session_tuner",
]


def claimant_of(db: Database, settings: WorkerSettings) -> Claimant:
    """Who a worker of these settings would claim as; UserError where it would refuse to
    benchmark (_gpu_key): the supervisor asks before it starts any."""
    return _claimant(settings, sessions.get(db, settings.session_id))


def gpu_holder_of(db: Database, settings: WorkerSettings) -> queue.GpuHolder | None:
    """The worker holding a live attempt on the GPU of a worker of these settings (`--gpus
    auto`)."""
    return queue.gpu_holder(db, claimant_of(db, settings))
