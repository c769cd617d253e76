"""The benchmark stream: one long-lived `tuningRunner.py --benchmark-stream` per GPU, fed bundles.

A proposed rocMLIR extension (docs/formats.md, "Streaming benchmarks"; the stand-in speaks it
with FAKE_TUNINGRUNNER_STREAM=1). The process starts once with the session's flags and no
config; each request is one JSON line on its stdin naming a problem's op, config, unpacked
bundle directory and output file; it benchmarks the requests one at a time, in order, writes
each one's output, `.debug` and `.state` files (and its log lines to `<output>.log`) exactly as
a `--benchmark-artifacts` call for that one config would, and answers each with one JSON line
on stdout. So each reply is read with the same functions as a one-config call (read_outcome).

Replies are matched to requests as they are read, in the reader thread: a line naming no request
in flight (a foreign reply) is dropped there at the cost of its parse, so a flood of them never
queues ahead of the replies that are ours, and the queue holds at most one reply per request.
"""

from __future__ import annotations

import contextlib
import datetime as dt
import io
import json
import logging
import queue
import shutil
import subprocess
import threading
import time
from dataclasses import dataclass
from pathlib import Path
from typing import cast

import mlirtuna.tuners.process as process
import mlirtuna.tuners.rocmlir.eras as eras
from mlirtuna import keys, machine, textinput
from mlirtuna.errors import StreamBroken, TunerError, Unsupported
from mlirtuna.problems import Problem
from mlirtuna.tuners.base import StreamItem, TuneContext, TuneOutcome
from mlirtuna.tuners.rocmlir.artifacts import commit_refused
from mlirtuna.tuners.rocmlir.outcome import read_outcome

# Ops whose bundles go through the stream: conv and gemm. Attention's calls need
# --verify-mode none, a per-call flag the proposed request has no field for; fusion's module
# travels in a file per call. Those are benchmarked alone (one --benchmark-artifacts call).
STREAM_OPS = ("conv", "gemm")
STREAM_FLAG = "--benchmark-stream"
MAX_REPLY_BYTES = process.MAX_LINE_BYTES  # a reply is ~60 bytes; a longer line is refused
LOG_KEEP_BYTES = 64 << 10  # of a request's .log: its last lines say why it failed
MAX_ID_CHARS = 64  # request ids are "job-N-TOKEN": one per attempt (worker/stream.py)
CLOSE_WAIT_S = 1.0  # for a stream with nothing in flight to exit on EOF before it is stopped

log = logging.getLogger(__name__)


@dataclass(frozen=True)
class _Fed:
    """A request in flight: its problem, its output file, when it was fed."""

    problem: Problem
    out: Path
    fed_at: float


@dataclass(frozen=True)
class _Answered:
    """A reply matched to its request in the reader thread: `start`, when its benchmark can
    have begun (its feed, or the reply before it, whichever came later); `end`, when read."""

    key: str
    reply: Reply
    fed: _Fed
    start: float
    end: float


class Stream:
    """One running `--benchmark-stream` process (the BenchmarkStream protocol)."""

    def __init__(
        self, argv: list[str], cwd: Path, env: dict[str, str], ctx: TuneContext,
        two_stage: bool, kill_grace_s: float, key_form: str = keys.PLAIN,
    ) -> None:  # fmt: skip
        self.ctx, self.two_stage, self.kill_grace_s = ctx, two_stage, kill_grace_s
        self.key_form = key_form  # how each fed config is spelled (eras.tool_vector)
        self.proc = process.popen(argv, cwd, env, fed=True)
        self.tmp = machine.make_temp_dir("stream")
        self.stderr = process.TailReader(
            cast("io.BufferedReader | None", self.proc.stderr), process.STDERR_KEEP_BYTES
        )
        self._replies: queue.Queue[_Answered | None] = queue.Queue()
        self._lock = threading.Lock()  # _fed: fed here, matched in the reader thread
        self._fed: dict[str, _Fed] = {}
        self._last_reply = time.time()
        self.foreign = 0  # reply lines that named no request in flight (dropped)
        threading.Thread(target=self._read, daemon=True, name="stream-replies").start()

    def _read(self) -> None:
        """Reply lines from stdout (each read up to MAX_REPLY_BYTES and checked by parse_reply,
        which never raises), matched to their requests; None once the process closed it."""
        pipe = self.proc.stdout
        assert pipe is not None
        with contextlib.suppress(OSError, ValueError), pipe:
            for raw in process.capped_lines(pipe, MAX_REPLY_BYTES):
                if raw is None or raw.strip():
                    self._match(parse_reply(raw))
        self._replies.put(None)

    def _match(self, got: Reply) -> None:
        """Queue a reply with its request; drop one that names no request in flight."""
        now = time.time()
        with self._lock:
            # A reply that names no request is the oldest one's: requests are answered in order.
            key = got.key if got.key is not None else next(iter(self._fed), None)
            fed = self._fed.pop(key, None) if key is not None else None
            if key is None or fed is None:
                self._foreign(got)
                return
            start, self._last_reply = max(fed.fed_at, self._last_reply), now
        self._replies.put(_Answered(key, got, fed, start, now))

    def _foreign(self, got: Reply) -> None:
        """Count a reply to no request in flight; say so once per stream, not per line."""
        self.foreign += 1
        if self.foreign == 1:
            log.warning("the benchmark stream answered a request it was not sent (id %s); "
                        "such replies are dropped", textinput.clip(repr(got.key)))  # fmt: skip

    def feed(self, key: str, problem: Problem, artifacts: Path) -> None:
        out = self.tmp / key / "tuning.tsv"
        out.parent.mkdir(parents=True, exist_ok=True)
        request = {
            "id": key,
            "op": problem.op,
            "config": eras.tool_vector(problem, self.key_form),
            "artifacts": str(artifacts),
            "output": str(out),
        }
        with self._lock:  # known before it is sent: its reply may come at once
            self._fed[key] = _Fed(problem, out, time.time())
        stdin = self.proc.stdin
        try:
            assert stdin is not None
            stdin.write((json.dumps(request) + "\n").encode())
            stdin.flush()
        except (OSError, ValueError) as exc:
            raise self._broken(f"cannot feed it ({exc})") from None

    def reply(self, timeout: float) -> StreamItem | None:
        try:
            got = self._replies.get(timeout=max(timeout, 0.0))
        except queue.Empty:
            return None
        if got is None:
            self._replies.put(None)  # every later call says the same
            raise self._broken("it exited")
        key, out = got.key, got.fed.out
        try:
            return key, self._outcome(got.reply, got.fed.problem, out, got.start, got.end)
        except TunerError as exc:
            return key, exc
        except Exception as exc:  # whatever the tool wrote costs its job, never the worker
            return key, TunerError(f"cannot read the benchmark stream's reply to {key}: "
                                   f"{type(exc).__name__}: {exc}")  # fmt: skip
        finally:
            shutil.rmtree(out.parent, ignore_errors=True)

    def _outcome(
        self, got: Reply, problem: Problem, out: Path, start: float, end: float
    ) -> TuneOutcome:
        """One request's outcome from its reply and the files it wrote (read_outcome's)."""
        process.check_outputs(out)
        log = out.with_name(out.name + ".log")
        text = process.read_tail(log, LOG_KEEP_BYTES) if log.is_file() else ""
        if got.fault is not None:
            raise TunerError(
                f"the benchmark stream's reply is malformed: {got.fault}", detail=process.tail(text)
            )
        if got.error and got.status != 0:
            text += f"\nERROR: {got.error}\n"
        run = process.Run(got.status, "", text, _utc(start), _utc(end))
        if run.returncode != 0 and commit_refused(run.stderr):
            raise Unsupported(
                f"tuningRunner refused the bundle: {process.last_error_line(run.stderr)}"
            )
        return read_outcome(problem, self.ctx, out, run, self.two_stage)

    def _broken(self, what: str) -> StreamBroken:
        code = self.proc.poll()
        status = "" if code is None else f", exit status {code}"
        return StreamBroken(
            f"the benchmark stream (tuningRunner {STREAM_FLAG}) stopped: {what}{status}",
            detail=process.tail(self.stderr.text()),
        )

    @property
    def pid(self) -> int:
        return self.proc.pid

    def close(self) -> None:
        """EOF on its stdin (it ends once the request in hand is done), then, if it is still
        there after CLOSE_WAIT_S, its whole group stopped (a hung one killed)."""
        with contextlib.suppress(OSError, ValueError):
            if self.proc.stdin is not None:
                self.proc.stdin.close()
        with contextlib.suppress(subprocess.TimeoutExpired):
            self.proc.wait(timeout=CLOSE_WAIT_S if not self._fed else 0.01)
        if self.proc.poll() is None:
            process.stop(self.proc, (self.stderr,), self.kill_grace_s)
        else:
            self.stderr.join(self.kill_grace_s)
        shutil.rmtree(self.tmp, ignore_errors=True)


@dataclass(frozen=True)
class Reply:
    """One reply line as read: the request it names (None: it names none readable), the
    status of that request's call, its error text; `fault` says why the line is not a valid
    reply (then the request fails with that line, and its status means nothing)."""

    key: str | None
    status: int = 1
    error: str = ""
    fault: str | None = None


def parse_reply(raw: bytes | None) -> Reply:
    """A reply line checked field by field (docs/formats.md): a JSON object (flat: a value
    nested deeper is refused) whose `id` is a string, `status` an exit status (an integer 0 to
    255, not "zero", NaN, 1e999 or [0]) and `error` a string. None: a line over
    MAX_REPLY_BYTES. Invalid UTF-8 is replaced (U+FFFD), so the reply still counts."""
    if raw is None:
        return Reply(None, fault=f"a reply line longer than {MAX_REPLY_BYTES} bytes")
    text = raw.decode("utf-8", errors="replace").strip()
    try:
        reply = json.loads(text)
    except (ValueError, RecursionError):  # RecursionError: nested past the parser's depth
        return Reply(None, fault=f"not JSON: {textinput.quote(text)}")
    if not isinstance(reply, dict):
        return Reply(None, fault=f"not a JSON object: {textinput.quote(text)}")
    rid, status, error = reply.get("id"), reply.get("status"), reply.get("error", "")
    key = rid if isinstance(rid, str) and len(rid) <= MAX_ID_CHARS else None
    if key is None:
        return Reply(None, fault=f"id {textinput.clip(repr(rid))} is not a request's id")
    if type(status) is not int or not 0 <= status <= 255:
        return Reply(key, fault=f"status {textinput.clip(repr(status))} is not an exit status")
    if error is None:
        error = ""
    if not isinstance(error, str):
        return Reply(key, fault=f"error {textinput.clip(repr(error))} is not text")
    return Reply(key, status, error)


def _utc(seconds: float) -> dt.datetime:
    return dt.datetime.fromtimestamp(seconds, dt.UTC)
