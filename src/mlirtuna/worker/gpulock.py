"""One worker per GPU on a host: an exclusive flock per GPU in a lock directory shared by every
user of the host (MLIRTUNA_GPU_LOCK_DIR, `worker --gpu-lock-dir`; default
/tmp/mlirtuna-gpu-locks), held for as long as the worker runs and let go by the kernel when its
process ends, however it ends. The worker's tools hold it too (tuners/process.py starts each
through a guard that inherits the descriptor), so a GPU whose worker died stays locked until its
tool is gone as well. A second worker on the GPU is told who holds it (the holder writes its
pid, session and host into the file) and exits 2, or waits (`--wait-for-gpu`).

The directory is shared with every local user, so nothing in it is trusted: a lock file is
opened without following a link, used only if it is a regular file, and written (the holder's
line) only when it is this user's own file with no other name; a foreign directory that anyone
but its owner could rearrange (not sticky) is refused. A lock file another user left read-only
still locks (flock needs no write access). Only HOLDER_BYTES of a lock file are ever read.

`--gpus auto` takes the GPUs no worker holds by locking each one (try_acquire) and keeping what
it got: the supervisor hands each lock to the worker it starts as an inherited descriptor
(ENV_GPU_LOCK_FD, adopt), never checks a lock and lets it go, so two supervisors started together
split the GPUs between them instead of starting two workers on one.

Containers with a /tmp of their own do not share this directory: the claim's check in the
database (queue/sql.py, GPU_HOLDERS) covers them.
"""

from __future__ import annotations

import contextlib
import errno
import fcntl
import logging
import os
import stat
import threading
from dataclasses import dataclass
from pathlib import Path

from mlirtuna.defaults import DEFAULT_GPU_LOCK_DIR, ENV_GPU_LOCK_DIR, ENV_GPU_LOCK_FD
from mlirtuna.errors import UserError

log = logging.getLogger(__name__)

WAIT_POLL_S = 0.5  # how often a worker waiting for its GPU tries again
HOLDER_BYTES = 256  # the most of a lock file ever read: "worker pid P (session S) on HOST"
# Opening never follows a link, never hangs on a FIFO, never leaks into a tool by accident
# (tuners/process.py passes the descriptor to its guard on purpose).
_OPEN_FLAGS = os.O_NOFOLLOW | os.O_CLOEXEC | os.O_NONBLOCK


class GpuHeld(UserError):
    """The GPU is another worker's: one line, exit 2."""


def lock_dir(explicit: str | None = None) -> Path:
    return Path(explicit or os.environ.get(ENV_GPU_LOCK_DIR) or DEFAULT_GPU_LOCK_DIR)


def held_message(gpu: str, holder: str) -> str:
    return f"{gpu} is held by {holder}: one worker per GPU (--wait-for-gpu waits for it)"


@dataclass
class GpuLock:
    """A GPU this process holds; `release` (or the process's end) lets it go. `previous`: the
    holder line found in the file when it was taken (the last holder's, gone now)."""

    path: Path
    fd: int
    previous: str = ""
    own: bool = False  # this user's file with no other name: its holder line may be rewritten

    def name_holder(self, who: str) -> None:
        """Write `who` as the holder's line (only into an own file: module docstring)."""
        if self.own and self.fd >= 0:  # another user's file: locked, its text left alone
            with contextlib.suppress(OSError):  # a full disk: the holder goes unnamed
                os.ftruncate(self.fd, 0)
                os.pwrite(self.fd, f"{who}\n".encode(), 0)

    def release(self) -> None:
        if self.fd >= 0:
            os.close(self.fd)  # the flock goes with the last descriptor (a guard may hold one)
            self.fd = -1


def _refuse(directory: Path, what: str) -> UserError:
    return UserError(
        f"GPU lock dir {directory}: {what}; give another with --gpu-lock-dir "
        f"(or {ENV_GPU_LOCK_DIR})"
    )


def _make_dir(directory: Path) -> None:
    """Create the lock dir, sticky and world-writable like /tmp (every user's workers lock
    there), when it does not exist; only a directory this process created is chmod-ed."""
    try:
        directory.parent.mkdir(parents=True, exist_ok=True)
        os.mkdir(directory, 0o1777)
    except FileExistsError:
        return
    except OSError as e:
        raise _refuse(directory, f"cannot create it ({e.strerror})") from None
    # mkdir's mode is cut by the umask; the descriptor is the directory just made, not a link
    fd = os.open(directory, os.O_RDONLY | os.O_DIRECTORY | os.O_NOFOLLOW | os.O_CLOEXEC)
    try:
        os.fchmod(fd, 0o1777)
    finally:
        os.close(fd)


def open_dir(directory: Path) -> int:
    """The lock dir, opened (a descriptor its lock files are opened under, so it cannot be
    swapped between the checks and the open), once no other user can swap its files under us:
    UserError (one line, the path and the fix) for a file, a link or a directory of another
    user, or one that others may write into without the sticky bit."""
    _make_dir(directory)
    me = os.geteuid()
    try:
        link = os.lstat(directory)
        fd = os.open(directory, os.O_RDONLY | os.O_CLOEXEC | os.O_NONBLOCK)
    except OSError as e:
        raise _refuse(directory, f"cannot use it ({e.strerror})") from None
    info = os.fstat(fd)
    try:
        if stat.S_ISLNK(link.st_mode) and link.st_uid not in (me, 0):
            raise _refuse(directory, f"a link of uid {link.st_uid}, not a directory of this user's")
        if not stat.S_ISDIR(info.st_mode):
            raise _refuse(directory, "not a directory")
        if info.st_mode & stat.S_ISVTX:
            return fd  # like /tmp: only a file's owner may remove or rename it
        if info.st_uid not in (me, 0):
            raise _refuse(directory, f"owned by uid {info.st_uid} and not sticky (chmod +t it)")
        if info.st_mode & (stat.S_IWGRP | stat.S_IWOTH):
            raise _refuse(directory, "writable by others and not sticky (chmod +t it)")
    except UserError:
        os.close(fd)
        raise
    return fd


def _open(directory: Path, gpu_id: int) -> tuple[Path, int, bool]:
    """The GPU's lock file, opened without following a link: (path, descriptor, whether this
    process may write the holder's line into it). UserError for anything but a regular file."""
    name = f"gpu{gpu_id}.lock"
    path = directory / name
    dir_fd = open_dir(directory)
    try:
        for _ in range(3):  # a file removed between the two opens: create it again
            try:
                flags = os.O_RDWR | os.O_CREAT | os.O_EXCL | _OPEN_FLAGS
                fd = os.open(name, flags, 0o666, dir_fd=dir_fd)
                return path, _regular(path, fd), True
            except FileExistsError:
                pass
            except OSError as e:
                raise _bad_file(path, e) from None
            try:
                fd = _open_existing(name, dir_fd)
            except FileNotFoundError:
                continue
            except OSError as e:
                raise _bad_file(path, e) from None
            _regular(path, fd)
            return path, fd, _is_own(os.fstat(fd))
    finally:
        os.close(dir_fd)
    raise UserError(f"GPU lock file {path} keeps disappearing: another process removes it")


def _open_existing(name: str, dir_fd: int) -> int:
    try:
        return os.open(name, os.O_RDWR | _OPEN_FLAGS, dir_fd=dir_fd)
    except PermissionError:  # another user's file: flock works on a read-only descriptor
        return os.open(name, os.O_RDONLY | _OPEN_FLAGS, dir_fd=dir_fd)


def _regular(path: Path, fd: int) -> int:
    if not stat.S_ISREG(os.fstat(fd).st_mode):
        os.close(fd)
        raise UserError(f"GPU lock file {path} is not a regular file: remove it")
    os.set_blocking(fd, True)
    return fd


def _is_own(info: os.stat_result) -> bool:
    """A lock file whose holder line this process may rewrite: this user's, with no other name
    (a hard link planted to another of this user's files is never truncated)."""
    return info.st_uid == os.geteuid() and info.st_nlink == 1


def _bad_file(path: Path, e: OSError) -> UserError:
    if e.errno == errno.ELOOP:
        return UserError(f"GPU lock file {path} is a symbolic link: not followed; remove it")
    if e.errno == errno.EISDIR:
        return UserError(f"GPU lock file {path} is not a regular file: remove it")
    return UserError(f"GPU lock file {path}: cannot open it ({e.strerror})")


def _try_lock(fd: int) -> bool:
    try:
        fcntl.flock(fd, fcntl.LOCK_EX | fcntl.LOCK_NB)
    except BlockingIOError:
        return False
    return True


def holder_line(fd: int) -> str:
    """The holder's line in the lock file ("" if none): at most HOLDER_BYTES of the file are
    read (a huge or sparse file planted there costs nothing)."""
    try:
        data = os.pread(fd, HOLDER_BYTES, 0)
    except OSError:
        data = b""
    text = data.decode(errors="replace").split("\n", 1)[0].strip()
    return "".join(c if c.isprintable() else "?" for c in text)


def holder_text(fd: int) -> str:
    return holder_line(fd) or "another worker"


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
    path, fd, own = _open(directory, gpu_id)
    said = False
    while not _try_lock(fd):
        if not wait:
            holder = holder_text(fd)
            os.close(fd)
            raise GpuHeld(held_message(f"GPU {gpu_id}", holder))
        if not said:
            log.warning(
                "waiting for GPU %d: its lock on this host is held by %s, until that worker and "
                "every tool it started have ended",
                gpu_id, holder_text(fd),
            )  # fmt: skip
            said = True
        if stop is not None and stop.wait(WAIT_POLL_S):
            os.close(fd)
            return None
        if stop is None:
            threading.Event().wait(WAIT_POLL_S)
    return _held(path, fd, own, who)


def _held(path: Path, fd: int, own: bool, who: str) -> GpuLock:
    """The lock just taken on `fd`, its holder line rewritten to `who` where the file is own."""
    lock = GpuLock(path, fd, holder_line(fd), own)
    lock.name_holder(who)
    return lock


def try_acquire(gpu_id: int, who: str, directory: Path) -> GpuLock | None:
    """Hold GPU `gpu_id` for `who` if no worker on this host holds it now, else None: what
    `--gpus auto` takes, kept (a check that let the lock go would race another supervisor)."""
    path, fd, own = _open(directory, gpu_id)
    if not _try_lock(fd):
        os.close(fd)
        return None
    return _held(path, fd, own, who)


def is_free(gpu_id: int, directory: Path) -> bool:
    """Whether no worker on this host holds GPU `gpu_id` now: a look only, stale as soon as it
    returns (to take a free GPU, try_acquire)."""
    _, fd, _ = _open(directory, gpu_id)
    try:
        return _try_lock(fd)
    finally:
        os.close(fd)


def hand_down(lock: GpuLock, env: dict[str, str]) -> int:
    """Name `lock` in a child's environment; returns the descriptor the child must inherit
    (subprocess's pass_fds). The flock belongs to the open file, so it is the child's too, and
    stays with it once this process lets go of its own copy."""
    env[ENV_GPU_LOCK_FD] = str(lock.fd)
    return lock.fd


def adopt(gpu_id: int, who: str, directory: Path) -> GpuLock | None:
    """The lock of GPU `gpu_id` that the supervisor took for this worker and handed down
    (hand_down), now this worker's; None when none was (then `acquire` as usual). A descriptor
    that is not that GPU's lock file in `directory`, or whose lock is another's, is left alone
    and not adopted: the variable is a hint, the lock file decides."""
    text = os.environ.pop(ENV_GPU_LOCK_FD, "")  # not for the tools this worker starts
    if not text.isdigit():
        return None
    fd, name = int(text), f"gpu{gpu_id}.lock"
    try:
        dir_fd = open_dir(directory)
        try:
            named = os.stat(name, dir_fd=dir_fd, follow_symlinks=False)
        finally:
            os.close(dir_fd)
        info = os.fstat(fd)
    except (OSError, UserError):
        return None
    same = stat.S_ISREG(info.st_mode) and (info.st_dev, info.st_ino) == (named.st_dev, named.st_ino)
    if not same or not _try_lock(fd):  # the same open file as the supervisor's: its lock holds
        return None
    os.set_inheritable(fd, False)  # only the tools' guard gets it, on purpose
    return _held(directory / name, fd, _is_own(info), who)
