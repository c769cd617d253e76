"""Tuners for worker tests, loaded with `--tuner plugins.claimlog:NAME` (tests/ on PYTHONPATH).

`Logging` keeps the test's own per-claim log: one line when it starts tuning a problem and one
when it ends, with the worker's pid and monotonic-clock times, so a test can prove that no two
workers ever held the same job at once. `Failing` always fails, to exercise retries.
"""

from __future__ import annotations

import os
import time

from mlirtuna.errors import TunerError
from mlirtuna.tuners.sleep import SleepTuner


def _log(line: str) -> None:
    path = os.environ["CLAIM_LOG"]
    # One write() per line with O_APPEND: lines from many processes never interleave.
    fd = os.open(path, os.O_WRONLY | os.O_CREAT | os.O_APPEND, 0o644)
    try:
        os.write(fd, (line + "\n").encode())
    finally:
        os.close(fd)


def _wait_for_peers() -> None:
    """With CLAIM_BARRIER=N, a worker's first job waits until N workers hold one, so a test that
    asserts "all N took part" does not depend on how fast each process starts on a loaded
    machine (a late starter used to find the queue drained)."""
    want = int(os.environ.get("CLAIM_BARRIER", "0"))
    if not want:
        return
    door = os.environ["CLAIM_LOG"] + ".barrier"
    os.makedirs(door, exist_ok=True)
    open(os.path.join(door, str(os.getpid())), "w").close()
    deadline = time.monotonic() + 120
    while len(os.listdir(door)) < want and time.monotonic() < deadline:
        time.sleep(0.02)


class _Logging(SleepTuner):
    first = True

    def tune(self, problem, ctx):
        if self.first:
            self.first = False
            _wait_for_peers()
        key = problem.canonical()
        _log(f"start\t{os.getpid()}\t{time.monotonic():.6f}\t{key}")
        outcome = super().tune(problem, ctx)
        _log(f"end\t{os.getpid()}\t{time.monotonic():.6f}\t{key}")
        return outcome


def Logging():
    return _Logging(float(os.environ.get("SLEEP_S", "0")))


class _Failing:
    name = "failing"

    def tune(self, problem, ctx):
        raise TunerError("tuningRunner exited 1", detail="ERROR: compile failed\n(stderr tail)")


def Failing():
    return _Failing()


def read_log(path) -> list[tuple[str, int, float, str]]:
    from pathlib import Path

    rows = []
    for line in Path(path).read_text().splitlines():
        kind, pid, when, key = line.split("\t", 3)
        rows.append((kind, int(pid), float(when), key))
    return rows
