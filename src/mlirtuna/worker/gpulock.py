"""One worker per GPU on a host: an exclusive flock per GPU in a lock directory shared by every
user of the host (MLIRTUNA_GPU_LOCK_DIR, `worker --gpu-lock-dir`; default
/tmp/mlirtuna-gpu-locks), held for as long as the worker runs and let go by the kernel when its
process ends, however it ends. A second worker on the GPU is told who holds it (the holder
writes its pid, session and host into the file) and exits 2, or waits (`--wait-for-gpu`).

Containers with a /tmp of their own do not share this directory: the claim's check in the
database (queue/sql.py, GPU_HOLDERS) covers them.
"""

from __future__ import annotations

import contextlib
import fcntl
import logging
import os
import threading
from dataclasses import dataclass
from pathlib import Path

from mlirtuna.defaults import DEFAULT_GPU_LOCK_DIR, ENV_GPU_LOCK_DIR
from mlirtuna.errors import UserError

log = logging.getLogger(__name__)

WAIT_POLL_S = 0.5  # how often a worker waiting for its GPU tries again


class GpuHeld(UserError):
    """The GPU is another worker's: one line, exit 2."""


def lock_dir(explicit: str | None = None) -> Path:
    return Path(explicit or os.environ.get(ENV_GPU_LOCK_DIR) or DEFAULT_GPU_LOCK_DIR)


def held_message(gpu: str, holder: str) -> str:
    return f"{gpu} is held by {holder}: one worker per GPU (--wait-for-gpu waits for it)"


@dataclass
class GpuLock:
    """A GPU this process holds; `release` (or the process's end) lets it go."""

    path: Path
    fd: int

    def release(self) -> None:
        if self.fd >= 0:
            os.close(self.fd)  # the flock goes with the descriptor
            self.fd = -1


def _open(directory: Path, gpu_id: int) -> tuple[Path, int]:
    if not directory.is_dir():
        directory.mkdir(parents=True, exist_ok=True)
        with contextlib.suppress(OSError):  # every user's workers lock here: sticky, like /tmp
            directory.chmod(0o1777)
    path = directory / f"gpu{gpu_id}.lock"
    try:
        fd = os.open(path, os.O_RDWR | os.O_CREAT, 0o666)
    except PermissionError:  # another user's file: flock works on a read-only descriptor
        fd = os.open(path, os.O_RDONLY)
    return path, fd


def _try_lock(fd: int) -> bool:
    try:
        fcntl.flock(fd, fcntl.LOCK_EX | fcntl.LOCK_NB)
    except BlockingIOError:
        return False
    return True


def _holder(path: Path) -> str:
    try:
        text = path.read_text(errors="replace").strip()[:200]
    except OSError:
        text = ""
    return text or "another worker"


def acquire(
    gpu_id: int,
    who: str,
    directory: Path,
    wait: bool = False,
    stop: threading.Event | None = None,
) -> GpuLock | None:
    """Hold GPU `gpu_id` on this host for `who` ("worker pid P (session S) on HOST"). Held by
    another worker: GpuHeld, or with `wait` try again until it is free (None when `stop` is
    set first)."""
    path, fd = _open(directory, gpu_id)
    said = False
    while not _try_lock(fd):
        if not wait:
            os.close(fd)
            raise GpuHeld(held_message(f"GPU {gpu_id}", _holder(path)))
        if not said:
            log.warning("waiting for GPU %d: %s", gpu_id, held_message("it", _holder(path)))
            said = True
        if stop is not None and stop.wait(WAIT_POLL_S):
            os.close(fd)
            return None
        if stop is None:
            threading.Event().wait(WAIT_POLL_S)
    with contextlib.suppress(OSError):  # a read-only descriptor: the holder is not named
        os.ftruncate(fd, 0)
        os.pwrite(fd, f"{who}\n".encode(), 0)
    return GpuLock(path, fd)


def is_free(gpu_id: int, directory: Path) -> bool:
    """Whether no worker on this host holds GPU `gpu_id` now (`--gpus auto` takes only these)."""
    _, fd = _open(directory, gpu_id)
    try:
        return _try_lock(fd)
    finally:
        os.close(fd)
