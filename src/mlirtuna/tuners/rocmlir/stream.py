"""The benchmark stream: one long-lived `tuningRunner.py --benchmark-stream` per GPU, fed bundles.

A proposed rocMLIR extension (docs/formats.md, "Streaming benchmarks"; the stand-in speaks it
with FAKE_TUNINGRUNNER_STREAM=1). The process starts once with the session's flags and no
config; each request is one JSON line on its stdin naming a problem's op, config, unpacked
bundle directory and output file; it benchmarks the requests one at a time, in order, writes
each one's output, `.debug` and `.state` files (and its log lines to `<output>.log`) exactly as
a `--benchmark-artifacts` call for that one config would, and answers each with one JSON line
on stdout. So each reply is read with the same functions as a one-config call (read_outcome).
"""

from __future__ import annotations

import contextlib
import datetime as dt
import io
import json
import queue
import shutil
import subprocess
import threading
import time
from pathlib import Path
from typing import Any, cast

import mlirtuna.tuners.rocmlir.eras as eras
import mlirtuna.tuners.rocmlir.process as process
from mlirtuna import keys, machine
from mlirtuna.errors import StreamBroken, TunerError, Unsupported
from mlirtuna.problems import Problem
from mlirtuna.tuners.base import StreamItem, TuneContext
from mlirtuna.tuners.rocmlir.artifacts import commit_refused
from mlirtuna.tuners.rocmlir.outcome import read_outcome

# Ops whose bundles go through the stream: conv and gemm. Attention's calls need
# --verify-mode none, a per-call flag the proposed request has no field for; fusion's module
# travels in a file per call. Those are benchmarked alone (one --benchmark-artifacts call).
STREAM_OPS = ("conv", "gemm")
STREAM_FLAG = "--benchmark-stream"
CLOSE_WAIT_S = 1.0  # for a stream with nothing in flight to exit on EOF before it is stopped


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
        self._replies: queue.Queue[dict[str, Any] | None] = queue.Queue()
        self._fed: dict[str, tuple[Problem, Path, float]] = {}
        self._last_reply = time.time()
        threading.Thread(target=self._read, daemon=True, name="stream-replies").start()

    def _read(self) -> None:
        """Reply lines from stdout into the queue; None once the process closed it."""
        pipe = self.proc.stdout
        assert pipe is not None
        with contextlib.suppress(OSError, ValueError), pipe:
            for raw in pipe:
                with contextlib.suppress(ValueError):
                    reply = json.loads(raw)
                    if isinstance(reply, dict) and "id" in reply:
                        self._replies.put(reply)
        self._replies.put(None)

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
        stdin = self.proc.stdin
        try:
            assert stdin is not None
            stdin.write((json.dumps(request) + "\n").encode())
            stdin.flush()
        except (OSError, ValueError) as exc:
            raise self._broken(f"cannot feed it ({exc})") from None
        self._fed[key] = (problem, out, time.time())

    def reply(self, timeout: float) -> StreamItem | None:
        try:
            got = self._replies.get(timeout=max(timeout, 0.0))
        except queue.Empty:
            return None
        if got is None:
            self._replies.put(None)  # every later call says the same
            raise self._broken("it exited")
        key = str(got["id"])
        fed = self._fed.pop(key, None)
        if fed is None:
            return None  # not a request of ours (a bad line's reply has id null)
        problem, out, fed_at = fed
        start, self._last_reply = max(fed_at, self._last_reply), time.time()
        log = out.with_name(out.name + ".log")
        text = log.read_text(encoding="utf-8", errors="replace") if log.is_file() else ""
        if got.get("error") and int(got.get("status", 1)) != 0:
            text += f"\nERROR: {got['error']}\n"
        run = process.Run(int(got.get("status", 1)), "", text, _utc(start), _utc(self._last_reply))
        try:
            if run.returncode != 0 and commit_refused(run.stderr):
                why = process.last_error_line(run.stderr)
                return key, Unsupported(f"tuningRunner refused the bundle: {why}")
            return key, read_outcome(problem, self.ctx, out, run, self.two_stage)
        except TunerError as exc:
            return key, exc
        finally:
            shutil.rmtree(out.parent, ignore_errors=True)

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


def _utc(seconds: float) -> dt.datetime:
    return dt.datetime.fromtimestamp(seconds, dt.UTC)
