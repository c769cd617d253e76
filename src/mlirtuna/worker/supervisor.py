"""Starting and supervising local workers: one process per GPU (or N CPU workers).

Each worker is a real `mlirtuna worker` process in a process group of its own, pinned to its
GPU with ROCR_VISIBLE_DEVICES, so a terminal's Ctrl-C reaches only this supervisor, which
forwards each signal once: the first lets every worker finish its job, the second gives jobs back.

A worker that dies on its own (SIGKILL, the OOM killer, a crash) is started again after a
backoff, at most RESTARTS.most times within RESTARTS.window_s, each death said in one line;
past that its slot is given up and named in the summary. One that exits 0 (done) or 2 (refused:
the same refusal would come again) is not started again.
"""

from __future__ import annotations

import logging
import os
import signal
import subprocess
import sys
import time
from collections.abc import Callable
from dataclasses import dataclass, field, replace

from mlirtuna import machine, tuners
from mlirtuna.db import Database
from mlirtuna.defaults import (
    DEFAULT_BATCH_WAIT_S,
    ENV_DB,
    ENV_GPU_IDENTITY,
    ENV_GPU_LOCK_DIR,
    ENV_GPU_LOCK_FD,
)
from mlirtuna.errors import UserError
from mlirtuna.worker import gpulock
from mlirtuna.worker.loop import gpu_holder_of, gpu_key
from mlirtuna.worker.runner import WorkerSettings

log = logging.getLogger(__name__)


@dataclass(frozen=True)
class Slot:
    """Where one worker runs: a GPU index (or -1 for a worker without a GPU), and the GPU's key
    where the operator names it (--gpu-identity). A worker without a GPU is a compile worker
    (`--role compile`) or a CPU tuner's; `number` tells the N of one host apart (1, 2, …)."""

    gpu_id: int
    identity: str | None = None
    number: int = 0  # 0: not numbered (a worker started alone)
    compile: bool = False

    @property
    def label(self) -> str:
        """What the worker is called where it is listed and in what it prints: `GPU 0`,
        `compile worker 2`, `CPU worker 1`."""
        if self.gpu_id >= 0:
            return f"GPU {self.gpu_id}"
        kind = "compile worker" if self.compile else "CPU worker"
        return f"{kind} {self.number}" if self.number else kind

    @property
    def worker_name(self) -> str:
        """The worker's name at the head of its lines: `worker GPU 0`, `compile worker 2`."""
        return f"worker {self.label}" if self.gpu_id >= 0 else self.label


def cpu_slots(count: int, compile: bool = False) -> list[Slot]:
    """`count` workers without a GPU (at least one), numbered from 1."""
    return [Slot(-1, number=n, compile=compile) for n in range(1, max(count, 1) + 1)]


MAX_GPU_ID = 0xFFFF  # far past any host's GPU count; an id must fit job.gpu_id (32 bits)


def plan(gpus: str, tuner: str, workers: int = 1) -> list[Slot]:
    """`auto`: every GPU rocminfo lists for a GPU tuner (its TunerKind says), else `workers`
    CPU workers; or `0,1,…`: one worker per GPU, always (two benchmarks on one GPU time each
    other's contention)."""
    if gpus == "auto":
        if tuners.kind(tuner).gpu:
            found = machine.gpus()
            if not found:
                raise UserError("no GPU found by rocminfo: give --gpus 0,1,… or use --tuner cpu")
            return [Slot(g.index) for g in found]
        return cpu_slots(workers)
    try:
        ids = [int(x) for x in gpus.split(",") if x.strip()]
    except ValueError:
        raise UserError(f"bad --gpus {gpus!r}: expected auto or a list like 0,1,2") from None
    if not ids or any(not 0 <= i <= MAX_GPU_ID for i in ids) or len(set(ids)) < len(ids):
        raise UserError(
            f"bad --gpus {gpus!r}: expected auto or a list like 0,1,2 (each once, "
            f"each 0 to {MAX_GPU_ID})"
        )
    if workers > 1:
        raise UserError(f"--workers {workers} with --gpus {gpus}: one worker per GPU, always")
    return [Slot(i) for i in ids]


def name_gpus(slots: list[Slot], identities: str | None) -> list[Slot]:
    """`--gpu-identity ID,…`: the GPUs of `slots`, in their order, named by the operator (one
    ID per GPU, each once, as machine.canonical_gpu_name spells it)."""
    if identities is None:
        return slots
    names = [machine.canonical_gpu_name(n) for n in identities.split(",")]
    gpus = [s for s in slots if s.gpu_id >= 0]
    if len(names) != len(gpus) or len(set(names)) < len(names):
        raise UserError(
            f"--gpu-identity {identities}: {len(names)} name(s) for {len(gpus)} GPU(s) "
            f"({', '.join(s.label for s in gpus) or 'a CPU tuner uses none'}): give one ID per "
            "GPU of --gpus, in its order, each once"
        )
    named = iter(names)
    return [replace(s, identity=next(named)) if s.gpu_id >= 0 else s for s in slots]


def slot_settings(settings: WorkerSettings, slot: Slot) -> WorkerSettings:
    """The settings of the worker that runs in `slot`."""
    return replace(settings, gpu_id=slot.gpu_id, gpu_identity=slot.identity)


def identify(settings: WorkerSettings, slots: list[Slot], standin: bool) -> None:
    """Refuses (one line, exit 2) before any worker starts where one would: a GPU tuner's
    worker on a GPU that cannot be told from another container's (worker/loop.py gpu_key);
    `standin`: the session is (or will be) a stand-in session. `run` asks before it writes."""
    for slot in slots:
        if slot.gpu_id >= 0 and settings.role == "gpu":
            gpu_key(slot_settings(settings, slot), settings.tuner or "", standin)


#: The GPU locks `free` took, by GPU index: each is handed to the worker started on its GPU.
Locks = dict[int, gpulock.GpuLock]


def free(
    db: Database, settings: WorkerSettings, slots: list[Slot], say: Callable[[str], None]
) -> tuple[list[Slot], Locks]:
    """`--gpus auto`: the slots whose GPU no worker holds, and their locks, taken and kept
    (this host's lock files: a look that let them go would let a second supervisor started at
    the same moment take them too), where no live attempt in the database holds it either (a
    container with a /tmp of its own); each GPU skipped is said. None left: GpuHeld (exit 2)."""
    if all(s.gpu_id < 0 for s in slots):
        return slots, {}
    directory = gpulock.lock_dir(settings.gpu_lock_dir)
    # the lock file's holder line until the worker started on the GPU writes its own
    who = f"supervisor pid {os.getpid()} (session {settings.session_id}) on {settings.machine_name}"
    taken: list[Slot] = []
    locks: Locks = {}
    try:
        for slot in slots:
            lock = gpulock.try_acquire(slot.gpu_id, who, directory)
            holder: object = "a worker here"
            if lock is not None:
                holder = gpu_holder_of(db, slot_settings(settings, slot))
                if not holder:
                    taken.append(slot)
                    locks[slot.gpu_id] = lock
                    continue
                lock.release()
            say(f"GPU {slot.gpu_id} skipped: held by {holder}")
    except BaseException:
        release(locks)
        raise
    if not taken:
        raise gpulock.GpuHeld("every GPU of this host is held by a worker: one worker per GPU")
    return taken, locks


def release(locks: Locks) -> None:
    """Let go of the locks this process still holds (each worker started holds its own)."""
    for lock in locks.values():
        lock.release()


def worker_argv(settings: WorkerSettings, slot: Slot) -> list[str]:
    argv = [
        sys.executable,
        "-m",
        "mlirtuna",
        "worker",
        "--session",
        str(settings.session_id),
        "--gpu-id",
        str(slot.gpu_id),
        "--lease",
        str(settings.lease_s),
        "--max-retries",
        str(settings.max_retries),
        "--retry-backoff",
        str(settings.backoff_s),
        "--cpu-mem-limit",
        str(settings.cpu_mem_limit),
    ]
    if settings.tuner is not None:  # None: the session's, as the worker itself decides
        argv += ["--tuner", settings.tuner]
    if settings.job_timeout_s is not None:
        argv += ["--job-timeout", str(settings.job_timeout_s)]
    if settings.until_empty:
        argv.append("--until-empty")
    if settings.max_jobs is not None:
        argv += ["--max-jobs", str(settings.max_jobs)]
    if settings.batch != 1:
        argv += ["--batch", str(settings.batch)]
    if settings.batch_wait_s != DEFAULT_BATCH_WAIT_S:
        argv += ["--batch-wait", str(settings.batch_wait_s)]
    if not settings.prefetch:
        argv.append("--no-prefetch")
    if not settings.stream:
        argv.append("--no-stream")
    if settings.mlir_build_dir:
        argv += ["--mlir-build-dir", settings.mlir_build_dir]
    if settings.role != "gpu":
        argv += ["--role", settings.role]
    if settings.wait_for_gpu:
        argv.append("--wait-for-gpu")
    if slot.identity:
        argv += ["--gpu-identity", slot.identity]
    if slot.number:
        argv += ["--worker-number", str(slot.number)]
    return argv


def start(
    db_url: str,
    settings: WorkerSettings,
    slots: list[Slot],
    quiet: bool = False,
    locks: Locks | None = None,
) -> list[Child]:
    """Start one worker process per slot; the URL travels in the environment, not in argv.
    `locks` (from `free`): each is handed to its GPU's worker, then let go of here."""
    cpus = iter(range(1, len(slots) + 1))
    try:
        return [
            _child(db_url, settings, slot, quiet, locks or {},
                   f"GPU {slot.gpu_id} worker" if slot.gpu_id >= 0 else
                   f"{'compile' if settings.role == 'compile' else 'CPU'} worker {next(cpus)}")
            for slot in slots
        ]  # fmt: skip
    finally:
        release(locks or {})


def _child(
    db_url: str, settings: WorkerSettings, slot: Slot, quiet: bool, locks: Locks, name: str
) -> Child:
    """The worker of `slot`, started, and how to start it again: a restarted GPU worker waits
    for its GPU (the dead one's tools may hold the lock a moment longer) and, holding the lock,
    takes the dead one's jobs back at once (loop.py, _gpu_is_ours)."""
    again = replace(settings, wait_for_gpu=True)
    proc = _popen(db_url, settings, slot, quiet, locks.get(slot.gpu_id))
    return Child(name, proc, lambda: _popen(db_url, again, slot, quiet, None))


def _popen(
    db_url: str, settings: WorkerSettings, slot: Slot, quiet: bool, lock: gpulock.GpuLock | None
) -> subprocess.Popen:
    env = {**os.environ, ENV_DB: db_url}
    env.pop(ENV_GPU_IDENTITY, None)  # each worker's own GPU name travels in its argv
    if settings.gpu_lock_dir:
        env[ENV_GPU_LOCK_DIR] = settings.gpu_lock_dir
    if slot.gpu_id >= 0:
        # Pin at the ROCr level: inside the worker the GPU is device 0 for HIP and rocMLIR.
        env["ROCR_VISIBLE_DEVICES"] = str(slot.gpu_id)
        env.pop("HIP_VISIBLE_DEVICES", None)
    env.pop(ENV_GPU_LOCK_FD, None)  # a lock of this process's own parent is not the child's
    inherited = (gpulock.hand_down(lock, env),) if lock is not None else ()
    proc = subprocess.Popen(
        worker_argv(settings, slot),
        env=env,
        start_new_session=True,
        stdout=subprocess.DEVNULL,
        stderr=subprocess.DEVNULL if quiet else None,
        pass_fds=inherited,
    )
    if lock is not None:
        lock.release()  # the worker's copy holds it now, for as long as the worker runs
    return proc


# -- supervising: signals forwarded, a worker that died started again (bounded) -------------


@dataclass(frozen=True)
class Restarts:
    """How often a worker that died is started again: at most `most` times within `window_s`
    seconds (one more death in that window and its slot is given up), each after a wait that
    starts at `backoff_s` and doubles with every death in the window."""

    most: int = 3
    window_s: float = 600.0
    backoff_s: float = 1.0


RESTARTS = Restarts()
#: A worker's exit status for "refused" (a UserError: GPU held, wrong build, bad flag): the same
#: refusal would come again, so such a worker is not started again.
REFUSED = 2


@dataclass
class Child:
    """One worker process this supervisor started: its name, the process running now, how to
    start it again, the times it died (monotonic), a restart due, and how its slot ended."""

    name: str
    proc: subprocess.Popen
    again: Callable[[], subprocess.Popen] | None = None
    deaths: list[float] = field(default_factory=list)
    due: float | None = None  # when it is started again
    settled: bool = False  # the end of `proc` was looked at
    restarts: int = 0
    lost: str = ""  # given up after too many deaths: how it died
    failed: str = ""  # ended non-zero and not started again (refused, or while stopping)

    @property
    def running(self) -> bool:
        return self.proc.poll() is None


@dataclass(frozen=True)
class Supervised:
    """How supervising ended: the signals received (forwarded to the workers), and each worker
    started again (name -> times), given up (name -> how it died), or that ended non-zero
    without a restart (name -> how)."""

    signals: int
    restarted: dict[str, int]
    lost: dict[str, str]
    failed: dict[str, str]

    @property
    def ok(self) -> bool:
        return not self.lost and not self.failed

    def summary(self) -> str:
        """One line for the operator; "" when every worker ran to its end untouched."""
        parts = [f"{name} started again {n} time{'s' if n != 1 else ''}"
                 for name, n in self.restarted.items()]  # fmt: skip
        parts += [f"{name} lost ({why})" for name, why in self.lost.items()]
        parts += [f"{name} {how}" for name, how in self.failed.items()]
        return f"workers: {'; '.join(parts)}" if parts else ""


def how_it_ended(returncode: int) -> str:
    """`killed by SIGKILL` or `exited 1`."""
    if returncode < 0:
        try:
            return f"killed by {signal.Signals(-returncode).name}"
        except ValueError:
            return f"killed by signal {-returncode}"
    return f"exited {returncode}"


def supervise(
    children: list[Child],
    tick: Callable[[], None] | None = None,
    interval: float = 0.5,
    say: Callable[[str], None] = log.warning,
    restarts: Restarts | None = None,
) -> Supervised:
    """Wait for the workers, forwarding SIGINT/SIGTERM (after which none is started again). A
    worker that died (a signal, or an exit other than 0 and REFUSED: a crash) is started again
    after a backoff, at most `restarts.most` times within its window; each death is said in
    one line (which worker, how, what happens now). `restarts`: RESTARTS by default."""
    restarts = restarts or RESTARTS
    received: list[int] = []

    def forward(signum: int, _frame: object) -> None:
        received.append(signum)
        for c in children:
            if c.running:
                c.proc.send_signal(signum)

    old = {s: signal.signal(s, forward) for s in (signal.SIGINT, signal.SIGTERM)}
    try:
        while True:
            for c in children:
                watch(c, bool(received), restarts, say)
            if not any(c.running or c.due is not None for c in children):
                break
            if tick is not None:
                tick()
            time.sleep(interval)
        if tick is not None:
            tick()
    finally:
        for s, handler in old.items():
            signal.signal(s, handler)
    return Supervised(
        signals=len(received),
        restarted={c.name: c.restarts for c in children if c.restarts},
        lost={c.name: c.lost for c in children if c.lost},
        failed={c.name: c.failed for c in children if c.failed},
    )


def watch(c: Child, stopping: bool, restarts: Restarts, say: Callable[[str], None]) -> None:
    """One look at one worker: start it again when that is due; when it has just ended, note
    how (a restart scheduled, its slot given up, or its failure kept for the summary)."""
    now = time.monotonic()
    if c.due is not None:
        if stopping:  # told to stop: a worker waiting for its restart stays stopped
            c.due, c.failed = None, f"{how_it_ended(c.proc.returncode)}, not started again"
        elif now >= c.due and c.again is not None:
            c.due, c.restarts, c.settled = None, c.restarts + 1, False
            c.proc = c.again()
        return
    if c.settled or c.running:
        return
    c.settled = True
    code = c.proc.returncode
    if code == 0:
        return
    if stopping or code == REFUSED or c.again is None:
        c.failed = how_it_ended(code)
        return
    c.deaths = [t for t in c.deaths if now - t < restarts.window_s] + [now]
    how = f"{c.name} (pid {c.proc.pid}) {how_it_ended(code)}"
    window = f"{restarts.window_s / 60:g} min"
    if len(c.deaths) > restarts.most:
        c.lost = f"{how_it_ended(code)}, {len(c.deaths)} times within {window}"
        say(
            f"{how}: not started again ({len(c.deaths)} deaths within {window}; at most "
            f"{restarts.most} restarts): its slot stays idle, and its jobs go to other workers "
            "as their leases end"
        )
        return
    wait = restarts.backoff_s * 2 ** (len(c.deaths) - 1)
    c.due = now + wait
    say(f"{how}: starting it again in {wait:g} s (restart {len(c.deaths)} of at most "
        f"{restarts.most} within {window})")  # fmt: skip
