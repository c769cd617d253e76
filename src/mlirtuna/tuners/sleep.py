"""A tuner for tests and benchmarks: sleeps a given time and returns a fixed winner.

It measures the queue and the workers, not kernels; it is never the default (`--tuner sleep:0.2`).
"""

from __future__ import annotations

import time

from mlirtuna.errors import TunerTimeout, UserError
from mlirtuna.problems import Problem
from mlirtuna.tuners.base import Candidate, TuneContext, TuneOutcome
from mlirtuna.tuners.registry import TunerKind

FIXED_PERF_CONFIG = "sleep:v1:1"


class SleepTuner:
    name = "sleep"

    def __init__(self, seconds: float = 0.0) -> None:
        self.seconds = seconds

    def tune(self, problem: Problem, ctx: TuneContext) -> TuneOutcome:
        if ctx.timeout_s is not None and self.seconds > ctx.timeout_s:
            time.sleep(ctx.timeout_s)
            raise TunerTimeout(f"sleep tuner ran past the job timeout of {ctx.timeout_s:g} s")
        if self.seconds > 0:
            time.sleep(self.seconds)
        ns = max(self.seconds * 1e9, 1.0)
        winner = Candidate(FIXED_PERF_CONFIG, ns, problem.flops() / ns / 1e3)
        return TuneOutcome(candidates=[winner], winner=winner, output=f"slept {self.seconds:g} s")


def _make(arg: str, _build_dir: str | None) -> SleepTuner:
    try:
        return SleepTuner(float(arg or 0))
    except ValueError:
        raise UserError(f"bad tuner sleep:{arg}: expected sleep:SECONDS") from None


KIND = TunerKind(name="sleep", make=_make, perf_prefix="sleep", arg="SECONDS")
