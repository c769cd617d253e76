"""A tuner for tests and benchmarks: sleeps a given time and returns a fixed winner.

It measures the queue and the workers, not kernels; it is never the default (`--tuner sleep:0.2`).
It is a SearchableTuner too: a space of SEARCH_CONFIGS made-up perf configs, one sleep per call
(a searched session's round), so that a search's rounds can be made slow in tests.
"""

from __future__ import annotations

import time

from mlirtuna.errors import TunerTimeout, UserError
from mlirtuna.problems import Problem
from mlirtuna.tuners.base import Candidate, TuneContext, TuneOutcome
from mlirtuna.tuners.registry import TunerKind

FIXED_PERF_CONFIG = "sleep:v1:1"
SEARCH_CONFIGS = 64  # sleep:v1:1 … sleep:v1:64; config N "takes" N times the first's time


class SleepTuner:
    name = "sleep"

    def __init__(self, seconds: float = 0.0) -> None:
        self.seconds = seconds

    def search_space(self, problem: Problem, ctx: TuneContext) -> list[str]:
        return [f"sleep:v1:{n}" for n in range(1, SEARCH_CONFIGS + 1)]

    def tune(self, problem: Problem, ctx: TuneContext) -> TuneOutcome:
        if ctx.timeout_s is not None and self.seconds > ctx.timeout_s:
            time.sleep(ctx.timeout_s)
            raise TunerTimeout(f"sleep tuner ran past the job timeout of {ctx.timeout_s:g} s")
        if self.seconds > 0:
            time.sleep(self.seconds)
        ns = max(self.seconds * 1e9, 1.0)
        names = ctx.perf_configs or (FIXED_PERF_CONFIG,)
        candidates = [_made_up(name, ns, problem.flops()) for name in names]
        winner = min(candidates, key=lambda c: c.kernel_time_ns or 0.0)
        return TuneOutcome(candidates=candidates, winner=winner, output=f"slept {self.seconds:g} s")


def _made_up(name: str, ns: float, flops: int) -> Candidate:
    """Config sleep:v1:N at N times the slept time (deterministic: no kernel ran)."""
    n = name.rpartition(":")[2]
    t = ns * (int(n) if n.isdigit() else 1)
    return Candidate(name, t, flops / t / 1e3)


def _make(arg: str, _build_dir: str | None) -> SleepTuner:
    try:
        return SleepTuner(float(arg or 0))
    except ValueError:
        raise UserError(f"bad tuner sleep:{arg}: expected sleep:SECONDS") from None


KIND = TunerKind(name="sleep", make=_make, perf_prefix="sleep", arg="SECONDS")
