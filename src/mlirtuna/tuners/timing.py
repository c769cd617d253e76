"""The timing harness of the CPU tuners: time budgets, one BLAS thread, robust statistics.

Like rocMLIR's tuning driver (`--warmup 25 --rep 100`, Triton's do_bench), a kernel is measured
for a *time budget*, not a fixed number of runs: it runs for `warmup_ms` untimed, then is timed
run by run until `rep_ms` have passed (and at least `min_samples` runs, at most
`max_samples`). The runs are summarised by `mlirtuna.stats.summarize` (median, min, IQR, sample
count, slow outliers discarded by Tukey's fence).

Two things keep a measurement about the kernel and nothing else:

- One BLAS thread (`one_blas_thread`, threadpoolctl). A multi-threaded OpenBLAS waits for
  every one of its threads at the end of each call, busy-spinning; on a machine where other
  workers or processes hold the cores, one descheduled thread stalls the call for a whole
  scheduler slice. That made candidates of the same kernel 10-100x slower at random (the 22x
  f16 attention case of issue 17; docs/benchmarks.md). Workers on one machine also stop
  fighting over cores.
- The clock is the calling thread's CPU time (`time.thread_time_ns`) by default: with one BLAS
  thread all of a kernel's work runs on the calling thread, so its CPU time is its run time
  without the slices other processes took from the core. Budgets and deadlines use the wall
  clock.

`measure` times one kernel; `measure_interleaved` times several in turns (A B C A B C ...) so
that a slow spell of the machine hits all of them alike: what the top-k re-measurement uses.
Both are for any tuner whose kernels are Python callables (the CPU tuners, e.g. fusion's).
"""

from __future__ import annotations

import contextlib
import time
from collections.abc import Callable, Iterator, Mapping
from dataclasses import dataclass

from threadpoolctl import threadpool_limits

from mlirtuna.stats import Spread, summarize

Kernel = Callable[[], None]
Clock = Callable[[], int]  # ns
#: Called after every timed run with the number of runs so far; raises to stop (a deadline).
Tick = Callable[[], None]


@dataclass(frozen=True)
class Budget:
    """How long to measure one kernel: warm-up and measurement time in ms, sample bounds."""

    warmup_ms: float = 10.0
    rep_ms: float = 40.0
    min_samples: int = 5
    max_samples: int = 10_000

    def __post_init__(self) -> None:
        if self.warmup_ms < 0 or self.rep_ms < 0:
            raise ValueError("warmup_ms and rep_ms must be >= 0")
        if not 1 <= self.min_samples <= self.max_samples:
            raise ValueError("need 1 <= min_samples <= max_samples")

    @classmethod
    def fixed(cls, repeats: int) -> Budget:
        """Exactly `repeats` timed runs and no warm-up beyond the first (verifying) run."""
        return cls(warmup_ms=0.0, rep_ms=0.0, min_samples=repeats, max_samples=repeats)


@contextlib.contextmanager
def one_blas_thread() -> Iterator[None]:
    """Limit BLAS (OpenBLAS, MKL, BLIS) to one thread in this process while measuring."""
    with threadpool_limits(limits=1, user_api="blas"):
        yield


def _noop() -> None:
    pass


def warm_up(kernel: Kernel, warmup_ms: float, tick: Tick = _noop) -> None:
    """Run `kernel` untimed until `warmup_ms` of wall time have passed (zero runs for 0)."""
    end = time.perf_counter() + warmup_ms / 1e3
    while time.perf_counter() < end:
        kernel()
        tick()


def measure(
    kernel: Kernel, budget: Budget, *, clock: Clock = time.thread_time_ns, tick: Tick = _noop
) -> Spread:
    """Warm up, then time `kernel` run by run for the budget; see the module docstring."""
    warm_up(kernel, budget.warmup_ms, tick)
    end = time.perf_counter() + budget.rep_ms / 1e3
    times: list[float] = []
    while len(times) < budget.max_samples and (
        len(times) < budget.min_samples or time.perf_counter() < end
    ):
        t0 = clock()
        kernel()
        times.append(max(clock() - t0, 1))
        tick()
    return summarize(times)


def measure_interleaved(
    kernels: Mapping[str, Kernel],
    budget: Budget,
    *,
    clock: Clock = time.thread_time_ns,
    tick: Tick = _noop,
) -> dict[str, Spread]:
    """Time several kernels in turns, A B C A B C ..., for `budget.rep_ms` each (in total
    len(kernels) * rep_ms), after a warm-up of `budget.warmup_ms` each."""
    names = list(kernels)
    for name in names:
        warm_up(kernels[name], budget.warmup_ms, tick)
    end = time.perf_counter() + len(names) * budget.rep_ms / 1e3
    times: dict[str, list[float]] = {name: [] for name in names}
    rounds = 0
    while rounds < budget.max_samples and (
        rounds < budget.min_samples or time.perf_counter() < end
    ):
        for name in names:
            t0 = clock()
            kernels[name]()
            times[name].append(max(clock() - t0, 1))
            tick()
        rounds += 1
    return {name: summarize(samples) for name, samples in times.items()}
