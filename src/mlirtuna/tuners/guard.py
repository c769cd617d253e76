"""The guard between a worker and each tool it runs: `python -I -S guard.py WORKER_PID ARGV…`.

A tool runs in a session of its own (so that a timeout kills its whole pipeline), which also
means nothing ends it when its worker is SIGKILLed: it would go on benchmarking beside the next
worker on that GPU. The guard is the tool's parent and dies with neither:
- PR_SET_PDEATHSIG tells it when its worker is gone (the signal also comes when the worker
  *thread* that started it ends: it then checks that its parent really changed);
- PR_SET_CHILD_SUBREAPER makes every orphaned descendant of the tool its child, even one that
  left the tool's session (setsid), so it can find, kill and reap all of them;
- it inherits the worker's GPU lock descriptor (pass_fds), so the host's flock on the GPU is
  held until the worker AND the guard are gone, and the guard ends only once every process the
  tool started is reaped.
When the tool ends, whatever it left behind is killed and reaped, and the guard ends the way the
tool did (its exit status, or the same signal), so its caller sees the tool's status.

It runs on the worker's interpreter with -I -S and imports nothing of mlirtuna (its start costs
a few milliseconds, once per tool run). Stdin, stdout and stderr are the tool's: inherited.
"""

from __future__ import annotations

import contextlib
import ctypes
import os
import signal
import sys

PR_SET_PDEATHSIG = 1  # <linux/prctl.h>
PR_SET_CHILD_SUBREAPER = 36
EXEC_FAILED = 127  # what a shell returns for a command it cannot run


class WorkerGone(Exception):
    """The worker that started this guard is dead."""


def _prctl(option: int, value: int) -> None:
    libc = ctypes.CDLL(None, use_errno=True)
    if libc.prctl(option, value, 0, 0, 0) != 0:
        raise OSError(ctypes.get_errno(), f"prctl({option})")


def _children_of(parents: set[int]) -> set[int]:
    """Every process whose parent is in `parents`, from /proc."""
    found = set()
    for name in os.listdir("/proc"):
        if not name.isdigit():
            continue
        try:
            with open(f"/proc/{name}/stat", "rb") as f:
                stat = f.read()
            parent = int(stat[stat.rindex(b")") + 2 :].split()[1])
        except (OSError, ValueError, IndexError):
            continue
        if parent in parents:
            found.add(int(name))
    return found


def _descendants() -> set[int]:
    found: set[int] = set()
    frontier = {os.getpid()}
    while frontier:
        frontier = _children_of(frontier) - found
        found |= frontier
    return found


def kill_all() -> None:
    """SIGKILL every descendant and reap them, until this guard has no child left (orphans of
    the tool become its children: they are reaped here too)."""
    while True:
        try:  # no child left (the usual end of a tool): no need to look through /proc
            if os.waitpid(-1, os.WNOHANG)[0]:
                continue
        except ChildProcessError:
            return
        for pid in _descendants():
            with contextlib.suppress(ProcessLookupError, PermissionError):
                os.kill(pid, signal.SIGKILL)
        try:
            os.waitpid(-1, 0)
        except ChildProcessError:
            return


def end_like(status: int) -> None:
    """Exit the way the tool did: its exit code, or killed by the same signal."""
    if os.WIFSIGNALED(status):
        sig = os.WTERMSIG(status)
        try:
            import resource

            resource.setrlimit(resource.RLIMIT_CORE, (0, 0))  # the tool's crash, not ours
            signal.signal(sig, signal.SIG_DFL)
        except (ValueError, OSError):
            pass  # SIGKILL/SIGSTOP keep their default anyway
        signal.pthread_sigmask(signal.SIG_UNBLOCK, [sig])
        os.kill(os.getpid(), sig)
    os._exit(os.waitstatus_to_exitcode(status) if os.WIFEXITED(status) else EXEC_FAILED)


def main(argv: list[str]) -> None:
    worker, tool_argv = int(argv[0]), argv[1:]
    tool, ending = 0, False  # ending: the tool's processes are being killed; nothing to add

    def on_signal(signum: int, _frame: object) -> None:
        if ending:
            return
        if os.getppid() != worker:
            raise WorkerGone
        if signum == signal.SIGTERM and tool:
            # Sent to this guard alone (the worker signals the tool's whole group): pass it on.
            with contextlib.suppress(ProcessLookupError):
                os.kill(tool, signal.SIGTERM)

    signal.signal(signal.SIGTERM, on_signal)
    signal.signal(signal.SIGHUP, on_signal)
    try:
        _prctl(PR_SET_PDEATHSIG, signal.SIGHUP)
        _prctl(PR_SET_CHILD_SUBREAPER, 1)
    except OSError as e:  # not Linux: the tool runs unguarded, as it did before the guard
        sys.stderr.write(f"mlirtuna guard: {e}: the tool is not tied to its worker\n")
    try:
        if os.getppid() != worker:  # gone before PR_SET_PDEATHSIG was set: nothing to run
            raise WorkerGone
        try:
            tool = os.posix_spawnp(
                tool_argv[0],
                tool_argv,
                os.environ,
                # Python ignores SIGPIPE and SIGXFSZ; the tool gets the defaults, as with Popen.
                setsigdef=(signal.SIGPIPE, signal.SIGXFSZ, signal.SIGTERM, signal.SIGHUP),
            )
        except OSError as e:
            sys.stderr.write(f"cannot run {tool_argv[0]}: {e.strerror}\n")
            os._exit(EXEC_FAILED)
        while True:
            pid, status = os.waitpid(-1, 0)
            if pid == tool:
                break  # an orphan reaped meanwhile: keep waiting for the tool
    except WorkerGone:
        ending = True
        kill_all()
        os._exit(EXEC_FAILED)
    ending = True
    kill_all()  # whatever the tool left behind must not go on using the GPU
    end_like(status)


if __name__ == "__main__":
    main(sys.argv[1:])
