"""Running the tool: one subprocess, an argument list, a scrubbed environment, a process group.

The tool runs as an argument list (never a shell: config strings are data), in a new session
so that a timeout kills the whole pipeline it starts (rocmlir-gen | rocmlir-tuning-driver,
verification). It is started through a guard (guard.py), its parent in that session, which
kills it and everything it started when the worker dies, and holds the descriptors the worker
shares with its tools (share_with_tools: the GPU's lock) until all of them are gone. Its
output is read as it comes by a thread per pipe, and only its tail kept: a tool printing
gigabytes (a runaway log, a crash loop) costs a bounded amount of worker memory, never the
worker.
"""

from __future__ import annotations

import contextlib
import datetime as dt
import io
import os
import re
import shutil
import signal
import stat
import subprocess
import sys
import threading
import uuid
import weakref
from collections.abc import Iterator, Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import IO, cast

from mlirtuna.defaults import ENV_DB, ENV_DB_PASSWORD, ENV_TOOL_ENV
from mlirtuna.errors import TunerError, TunerTimeout

STDERR_TAIL_LINES = 40
STDOUT_KEEP_BYTES = 1 << 20  # --help and the banner lines are far smaller
STDERR_KEEP_BYTES = 256 << 10
MAX_LINE_BYTES = 1 << 20  # a line the tool writes that mlirtuna parses (a stream reply)
DRIVER_LINE_BYTES = 64 << 10  # a driver line ("<perfConfig>\t<ns>") longer than this is noise
# The environment a tool gets is an allowlist: what a shell, Python, ROCm and the tool itself
# need. Names, and prefixes ending in "*"; MLIRTUNA_TOOL_ENV adds more (comma-separated).
TOOL_ENV = (
    "PATH", "HOME", "USER", "LOGNAME", "SHELL", "TERM", "TZ", "LANG", "LANGUAGE", "LC_*",
    "TMPDIR", "TMP", "TEMP", "LD_LIBRARY_PATH", "PYTHON*", "VIRTUAL_ENV",
    "ROCM*", "HIP*", "HSA*", "ROCR*", "AMD*", "GPU_*", "MIOPEN*", "ROCBLAS*", "HIPBLASLT*",
    "ROCMLIR*", "MLIR*", "LLVM*", "OMP_*",
)  # fmt: skip
# Never passed, even when listed: the database's URL and passwords reach only mlirtuna.
SECRET_ENV = (
    ENV_DB, ENV_DB_PASSWORD, "PGPASSWORD", "MYSQL_PWD", "DATABASE_URL", "SQLALCHEMY_DATABASE_URI",
)  # fmt: skip
# Set in the tool's environment, different for each run: a process that left the tool's process
# group and session (setsid) still carries it, and is found and killed by it when the tool stops.
TOOL_MARK = "MLIRTUNA_TOOL_RUN"
_marks: weakref.WeakKeyDictionary[subprocess.Popen[bytes], str] = weakref.WeakKeyDictionary()
# The thread that started each running tool: a worker that loses a job's lease stops the tools
# of the thread that runs that job (kill_tools), and no other's.
_owners: weakref.WeakKeyDictionary[subprocess.Popen[bytes], int] = weakref.WeakKeyDictionary()
_owners_lock = threading.Lock()
GUARD = str(Path(__file__).with_name("guard.py"))
# Descriptors every tool's guard inherits and keeps open until the tool and all it started are
# gone: the worker's GPU lock (worker/gpulock.py), so that the GPU stays locked past a dead
# worker for as long as its tool runs. Set by the worker once it holds the lock.
_shared_fds: list[int] = []
# Any line of rocmlir-tuning-driver's output as E4 logs it with --debug,
# "<perfConfig>\t<ns|N/A|Discarded>" (read from a batch's stderr as it arrives). (?<!\S): a match
# starts only where a word does; without it every position inside a long perf config is tried
# again, quadratic in its length (0.3 s for a batch's stderr).
_DRIVER_RE = re.compile(
    rb"(?<!\S)(\S+)\t(Discarded|N/A|[-+0-9.eE]+|nan|inf)[ \t\r]*$", re.MULTILINE
)


@dataclass(frozen=True)
class Run:
    """One finished run of the tool: its status, the tails of its output, when it ran."""

    returncode: int
    stdout: str
    stderr: str
    start: dt.datetime
    end: dt.datetime


def now() -> dt.datetime:
    """The time in UTC (runs are timed with aware datetimes)."""
    return dt.datetime.now(dt.UTC)


def scrubbed_env(environ: dict[str, str] | None = None) -> dict[str, str]:
    """The tool's environment: the variables of this process's (or `environ`) that TOOL_ENV or
    MLIRTUNA_TOOL_ENV allow, never a secret (SECRET_ENV, MLIRTUNA_ROLE_PASSWORD_*)."""
    env = os.environ if environ is None else environ
    extra = [x.strip() for x in env.get(ENV_TOOL_ENV, "").split(",") if x.strip()]
    allowed = [*TOOL_ENV, *extra]
    names = {a for a in allowed if not a.endswith("*")}
    prefixes = tuple(a[:-1] for a in allowed if a.endswith("*"))

    def passed(name: str) -> bool:
        if name in SECRET_ENV or name.startswith("MLIRTUNA_"):
            return False
        return name in names or name.startswith(prefixes)

    return {k: v for k, v in env.items() if passed(k)}


def start(
    argv: list[str], cwd: Path, env: dict[str, str], stdin: str | None = None, driver: bool = False
) -> tuple[subprocess.Popen[bytes], TailReader, TailReader]:
    """Start the tool, its stdout and stderr read by threads; `stdin`: text fed to it;
    `driver`: keep stderr's driver lines (TailReader)."""
    proc = popen(argv, cwd, env, fed=stdin is not None)
    with _owners_lock:  # a one-shot run (not a stream serving later jobs): its job's to stop
        _owners[proc] = threading.get_ident()
    if proc.stdin is not None:
        # The tool reads all of stdin before it starts (load_configs_from_stdin); a few
        # configs fit in the pipe's buffer, so this write does not wait for the tool.
        with contextlib.suppress(BrokenPipeError), proc.stdin:
            proc.stdin.write((stdin or "").encode())
    return (
        proc,
        TailReader(_buffered(proc.stdout), STDOUT_KEEP_BYTES),
        TailReader(_buffered(proc.stderr), STDERR_KEEP_BYTES, driver),
    )


def share_with_tools(*fds: int) -> None:
    """Every tool started from now on holds `fds` (through its guard) until it and all it
    started are gone; no argument: none (the worker let its lock go)."""
    _shared_fds[:] = fds


def popen(argv: list[str], cwd: Path, env: dict[str, str], *, fed: bool) -> subprocess.Popen[bytes]:
    """The tool started, through its guard, in its own process group and session, marked
    (TOOL_MARK) so that `stop` finds whatever it leaves behind; `fed`: its stdin a pipe, else
    /dev/null. The Popen is the guard's: its group, its status (the tool's), its pipes (the
    tool's)."""
    _check_runnable(argv, cwd, env)
    mark = f"{os.getpid()}-{uuid.uuid4().hex}"
    try:
        proc = subprocess.Popen(
            [sys.executable, "-I", "-S", GUARD, str(os.getpid()), *argv],
            cwd=cwd,
            env={**env, TOOL_MARK: mark},
            stdin=subprocess.PIPE if fed else subprocess.DEVNULL,
            stdout=subprocess.PIPE,
            stderr=subprocess.PIPE,
            start_new_session=True,  # its own process group: a timeout kills all of it
            pass_fds=tuple(_shared_fds),
        )
    except OSError as e:
        raise TunerError(f"cannot run {argv[0]} {argv[1]}: {e}") from e
    _marks[proc] = mark
    return proc


def _check_runnable(argv: list[str], cwd: Path, env: dict[str, str]) -> None:
    """TunerError, as starting the tool itself would raise, for a program that cannot be run
    (past the guard's start it could only say so on the tool's stderr, with status 127)."""
    program = argv[0]
    if os.sep in program:
        path = cwd / program
        found = path.is_file() and os.access(path, os.X_OK)
    else:
        found = shutil.which(program, path=env.get("PATH", os.defpath)) is not None
    if not found:
        raise TunerError(f"cannot run {program} {argv[1]}: not an executable file")


def _buffered(pipe: IO[bytes] | None) -> io.BufferedReader | None:
    # Popen's pipes are BufferedReaders (the default bufsize), which typeshed types as IO[bytes];
    # TailReader needs their read1.
    return cast("io.BufferedReader | None", pipe)


def run(
    argv: list[str],
    cwd: Path,
    env: dict[str, str],
    timeout: float | None,
    kill_grace_s: float,
    stdin: str | None = None,
) -> Run:
    """Run the tool to its end (`stdin`: text fed to it); TunerTimeout (its whole group
    killed) past `timeout` s."""
    began = now()
    proc, out, err = start(argv, cwd, env, stdin)
    try:
        proc.wait(timeout=timeout)
        out.join()
        err.join()
    except subprocess.TimeoutExpired:
        stop(proc, (out, err), kill_grace_s)
        raise TunerTimeout(
            f"tuningRunner ran past the job timeout of {timeout:g} s; "
            "killed its whole process group",
            detail=tail(err.text()),
        ) from None
    except BaseException:
        stop(proc, (out, err), kill_grace_s)  # e.g. KeyboardInterrupt: never leave a pipeline
        raise
    return Run(proc.returncode, out.text(), err.text(), began, now())


def stop(proc: subprocess.Popen[bytes], readers: Sequence[TailReader], kill_grace_s: float) -> None:
    """SIGTERM the process group, SIGKILL it after the grace period, and with it every process
    the tool started that left the group (setsid): its descendants, and whatever carries its
    mark. The SIGKILL is sent even when the wait is interrupted (the worker's own alarm)."""
    mark = _marks.get(proc)
    escaped = _descendants(proc.pid)  # while the tool lives, a setsid child is still its child
    try:
        _signal_group(proc.pid, signal.SIGTERM)
        for pid in escaped:
            _signal(pid, signal.SIGTERM)
        with contextlib.suppress(subprocess.TimeoutExpired):
            proc.wait(timeout=kill_grace_s)
    finally:
        _signal_group(proc.pid, signal.SIGKILL)  # also children that outlived their parent
        for pid in escaped | _descendants(proc.pid) | _marked(mark):
            _signal(pid, signal.SIGKILL)
        proc.wait()
        for reader in readers:
            # Something outside the group may still hold a pipe; do not wait for it forever.
            reader.join(kill_grace_s)


def kill_tools(thread: int) -> int:
    """SIGKILL, at once, every tool still running that `thread` started: its process group, its
    descendants and whatever carries its mark (as `stop` does, without the grace: its output
    will not be used). For a worker that lost the lease of the job the tool runs for; the thread
    waiting on the tool sees it end. The number of tools killed."""
    with _owners_lock:
        running = [p for p, owner in _owners.items() if owner == thread and p.returncode is None]
    for proc in running:
        escaped = _descendants(proc.pid)
        _signal_group(proc.pid, signal.SIGKILL)
        for pid in escaped | _marked(_marks.get(proc)):
            _signal(pid, signal.SIGKILL)
    return len(running)


def _processes() -> dict[int, int]:
    """Every process's parent, from /proc ({} where there is none)."""
    parents = {}
    with contextlib.suppress(OSError):
        for name in os.listdir("/proc"):
            if name.isdigit():
                with contextlib.suppress(OSError, ValueError, IndexError):
                    stat = Path(f"/proc/{name}/stat").read_bytes()
                    parents[int(name)] = int(stat[stat.rindex(b")") + 2 :].split()[1])
    return parents


def _descendants(root: int) -> set[int]:
    parents, frontier = _processes(), {root}
    found: set[int] = set()
    while frontier:
        frontier = {pid for pid, parent in parents.items() if parent in frontier} - found
        found |= frontier
    return found


def _marked(mark: str | None) -> set[int]:
    """The processes whose environment carries the tool run's mark (this user's only)."""
    if mark is None:
        return set()
    needle = f"{TOOL_MARK}={mark}".encode()
    found: set[int] = set()
    for pid in _processes():
        with contextlib.suppress(OSError):
            if needle in Path(f"/proc/{pid}/environ").read_bytes().split(b"\0"):
                found.add(pid)
    return found


def _signal(pid: int, sig: int) -> None:
    with contextlib.suppress(ProcessLookupError, PermissionError):
        os.kill(pid, sig)


def _signal_group(pgid: int, sig: int) -> None:
    with contextlib.suppress(ProcessLookupError, PermissionError):  # the group is gone already
        os.killpg(pgid, sig)


def tail(text: str, lines: int = STDERR_TAIL_LINES) -> str:
    """The last lines of the tool's output: what an error's detail keeps."""
    return "\n".join(text.splitlines()[-lines:])


def stderr_block(stderr: str) -> str:
    """The stderr tail as a titled block, appended to what a job keeps as the tool's output."""
    last = tail(stderr)
    if not last:
        return ""
    return f"\n--- tuningRunner stderr (last {STDERR_TAIL_LINES} lines) ---\n{last}\n"


def last_error_line(stderr: str) -> str:
    """The line that says what went wrong: E3's first "ERROR:" line (later ones only summarise),
    else the last line naming an error (a Python traceback ends with it), else the last line."""
    lines = [line.strip() for line in stderr.splitlines() if line.strip()]
    logged = [line for line in lines if line.startswith("ERROR:")]
    if logged:
        return logged[0]
    errors = [line for line in lines if "Error" in line or "ERROR" in line]
    return (errors or lines or [""])[-1]


def read_tail(path: Path, keep: int) -> str:
    """The last `keep` bytes of a file the tool wrote, as text (a cut character becomes U+FFFD);
    TunerError when it is a link or not a regular file (see open_output)."""
    with open_output(path) as f:
        f.seek(0, os.SEEK_END)
        f.seek(max(f.tell() - keep, 0))
        return f.read(keep).decode("utf-8", errors="replace")


def open_output(path: Path) -> io.BufferedReader:
    """A file the tool wrote, opened for reading without following a link (O_NOFOLLOW) and only
    if it is a regular file: a tool that replaced its output by a link to another file (or a
    FIFO) never gets that file's text quoted into a job's error. TunerError otherwise."""
    try:
        fd = os.open(path, os.O_RDONLY | os.O_NOFOLLOW | os.O_NONBLOCK | os.O_CLOEXEC)
    except OSError as exc:
        raise TunerError(f"cannot read the tool's output {path.name}: {exc.strerror}") from None
    if not stat.S_ISREG(os.fstat(fd).st_mode):
        os.close(fd)
        raise TunerError(f"the tool's output {path.name} is not a regular file")
    os.set_blocking(fd, True)
    return open(fd, "rb")


def output_lines(path: Path) -> Iterator[str]:
    """The lines of a file the tool wrote (open_output), ends kept, invalid UTF-8 replaced;
    TunerError at a line longer than MAX_LINE_BYTES (it is not read whole)."""
    with open_output(path) as f:
        for lineno, line in enumerate(capped_lines(f), 1):
            if line is None:
                raise TunerError(f"{path}:{lineno}: a line longer than {MAX_LINE_BYTES} bytes")
            yield line.decode("utf-8", errors="replace")


def read_output(path: Path, cap: int) -> bytes | None:
    """A small file the tool wrote (a `.state`), whole; None when it is missing, a link, not a
    regular file, or over `cap` bytes (it is not read past that)."""
    try:
        with open_output(path) as f:
            data = f.read(cap + 1)
    except TunerError:
        return None
    return data if len(data) <= cap else None


def check_outputs(out: Path) -> None:
    """The files of one call's `--output FILE` (FILE, .debug, .state, .log) that exist are
    regular files, not links: TunerError, before any is read, otherwise."""
    for path in (out, *(out.with_name(out.name + s) for s in (".debug", ".state", ".log"))):
        with contextlib.suppress(FileNotFoundError):
            info = path.lstat()
            if not stat.S_ISREG(info.st_mode):
                kind = "a link" if stat.S_ISLNK(info.st_mode) else "not a regular file"
                raise TunerError(f"the tool's output {path.name} is {kind}: not read")


def capped_lines(pipe: IO[bytes], cap: int = MAX_LINE_BYTES) -> Iterator[bytes | None]:
    """The lines of a pipe, each read up to `cap` bytes: a longer one is yielded once as None
    (at once, not when it ends: a line that never ends must not hold up its reader) and the rest
    of it discarded as it comes, so memory stays within `cap` whatever the tool writes."""
    skipping = False
    while line := pipe.readline(cap):
        whole = line.endswith(b"\n")
        if skipping:
            skipping = not whole
        elif whole or len(line) < cap:  # shorter than the cap without an end: the last line
            yield line
        else:
            skipping = True
            yield None


class TailReader:
    """Reads a pipe to its end in a thread of its own, keeping only the last `keep` bytes.
    With `driver`, it also keeps every driver line (`<perfConfig>\t<verdict>`) in order as it
    reads, so none is lost to the trimming and none is searched for twice."""

    def __init__(self, pipe: io.BufferedReader | None, keep: int, driver: bool = False) -> None:
        self.keep, self.data, self.dropped = keep, bytearray(), 0
        self.pipe = pipe
        self.driver: list[tuple[str, str]] | None = [] if driver else None
        self._partial = b""
        self.thread = threading.Thread(target=self._read, daemon=True)
        self.thread.start()

    def _read(self) -> None:
        if self.pipe is None:
            return
        with contextlib.suppress(OSError, ValueError), self.pipe:  # ValueError: closed by a stop
            while chunk := self.pipe.read1(64 << 10):
                self.data += chunk
                if self.driver is not None:
                    self._collect(chunk, self.driver)
                if len(self.data) > 2 * self.keep:  # trim in bulk, not on every chunk
                    self.dropped += len(self.data) - self.keep
                    del self.data[: len(self.data) - self.keep]

    def _collect(self, chunk: bytes, driver: list[tuple[str, str]]) -> None:
        text = self._partial + chunk
        end = text.rfind(b"\n") + 1  # only whole lines: the rest comes with the next chunk
        # A line that never ends is no driver line: dropped, so the partial line stays bounded.
        self._partial = text[end:] if len(text) - end <= DRIVER_LINE_BYTES else b""
        driver.extend(  # list.extend is atomic: the poller reads it from another thread
            [
                (pc.decode(errors="replace"), v.decode())
                for pc, v in _DRIVER_RE.findall(text, 0, end)
            ]
        )

    def join(self, timeout: float | None = None) -> None:
        self.thread.join(timeout)
        if self.thread.is_alive() and self.pipe is not None:
            with contextlib.suppress(OSError):
                self.pipe.close()

    def text(self) -> str:
        data = bytes(self.data[-self.keep :])
        # A cut may split a character: "replace" turns its stray bytes into U+FFFD.
        return data.decode("utf-8", errors="replace")
