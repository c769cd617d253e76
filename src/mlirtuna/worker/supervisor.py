"""Starting and supervising local workers: one process per GPU (or N CPU workers).

Each worker is a real `mlirtuna worker` process in a process group of its own, pinned to its
GPU with ROCR_VISIBLE_DEVICES, so a terminal's Ctrl-C reaches only this supervisor, which
forwards each signal once: the first lets every worker finish its job, the second gives jobs back.
"""

from __future__ import annotations

import os
import signal
import subprocess
import sys
import time
from collections.abc import Callable
from dataclasses import dataclass, replace

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
):
    """Start one worker process per slot; the URL travels in the environment, not in argv.
    `locks` (from `free`): each is handed to its GPU's worker, then let go of here."""
    try:
        return _start(db_url, settings, slots, quiet, locks or {})
    finally:
        release(locks or {})


def _start(db_url: str, settings: WorkerSettings, slots: list[Slot], quiet: bool, locks: Locks):
    procs = []
    for slot in slots:
        env = {**os.environ, ENV_DB: db_url}
        env.pop(ENV_GPU_IDENTITY, None)  # each worker's own GPU name travels in its argv
        if settings.gpu_lock_dir:
            env[ENV_GPU_LOCK_DIR] = settings.gpu_lock_dir
        if slot.gpu_id >= 0:
            # Pin at the ROCr level: inside the worker the GPU is device 0 for HIP and rocMLIR.
            env["ROCR_VISIBLE_DEVICES"] = str(slot.gpu_id)
            env.pop("HIP_VISIBLE_DEVICES", None)
        env.pop(ENV_GPU_LOCK_FD, None)  # a lock of this process's own parent is not the child's
        lock = locks.get(slot.gpu_id)
        inherited = (gpulock.hand_down(lock, env),) if lock is not None else ()
        procs.append(
            subprocess.Popen(
                worker_argv(settings, slot),
                env=env,
                start_new_session=True,
                stdout=subprocess.DEVNULL,
                stderr=subprocess.DEVNULL if quiet else None,
                pass_fds=inherited,
            )
        )
        if lock is not None:
            lock.release()  # the worker's copy holds it now, for as long as the worker runs
    return procs


def supervise(
    procs: list[subprocess.Popen], tick: Callable[[], None] | None = None, interval: float = 0.5
) -> int:
    """Wait for the workers, forwarding SIGINT/SIGTERM; returns the number of signals received."""
    received: list[int] = []

    def forward(signum: int, _frame: object) -> None:
        received.append(signum)
        for p in procs:
            if p.poll() is None:
                p.send_signal(signum)

    old = {s: signal.signal(s, forward) for s in (signal.SIGINT, signal.SIGTERM)}
    try:
        while any(p.poll() is None for p in procs):
            if tick is not None:
                tick()
            time.sleep(interval)
        if tick is not None:
            tick()
    finally:
        for s, handler in old.items():
            signal.signal(s, handler)
    return len(received)
