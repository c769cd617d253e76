"""When each worker benchmarked on a GPU, and whether two workers' benchmarks overlapped (one
worker per GPU: test_gpu_exclusive, test_gpu_identity)."""

from __future__ import annotations

import time

from mlirtuna.tuners.sleep import SleepTuner


class Timed(SleepTuner):
    """A sleep tuner that notes when each benchmark ran, per worker (the GPU's busy times)."""

    def __init__(self, seconds: float, runs: list, name: str) -> None:
        super().__init__(seconds)
        self.runs, self.worker = runs, name

    def tune(self, problem, ctx):
        start = time.monotonic()
        try:
            return super().tune(problem, ctx)
        finally:
            self.runs.append((self.worker, start, time.monotonic()))


def overlaps(spans: list[tuple]) -> list[tuple]:
    """Pairs of spans (worker, start, end) of different workers that overlap in time."""
    return [
        (a, b)
        for i, a in enumerate(spans)
        for b in spans[i + 1 :]
        if a[0] != b[0] and a[1] < b[2] and b[1] < a[2]
    ]
