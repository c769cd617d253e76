"""Statistics of kernel timings: the summary stored per candidate, the outlier rule, and the one
definition of "within noise" that tuners (winner margins) and compare (regressions) share.

A measurement is a list of per-run times. Its summary (`Spread`) is the median, the minimum, the
interquartile range and the number of samples kept, after discarding outliers by this rule:

    a sample above Q3 + max(1.5 * IQR, 1 % of the median) (Tukey's upper fence, never closer
    than 1 % above Q3, so that a timer's coarse ticks with an IQR of 0 keep their slow tick)
    is discarded.

Only slow samples are discarded: interference (a preempted thread, another process on the core,
a page fault) only ever makes a run slower, never faster, so a fast sample is real.

The noise of a median is the half-width of its ~95 % confidence interval, McGill, Tukey and
Larsen's notch (the one box plots draw): 1.57 * IQR / sqrt(n). Two medians are *within noise*
when their notches overlap, i.e. when |a - b| <= noise(a) + noise(b).
"""

from __future__ import annotations

import math
import statistics
from collections.abc import Sequence
from dataclasses import dataclass

#: Tukey's fence factor: samples above Q3 + FENCE * IQR are outliers ...
FENCE = 1.5
#: ... but the fence is at least this fraction of the median above Q3.
FENCE_FLOOR = 0.01
#: McGill et al.'s notch constant: median +- NOTCH * IQR / sqrt(n) is a ~95 % interval.
NOTCH = 1.57
# What a measurement of one kernel can physically be: no GPU reaches 10^6 TFlops (a MI300X
# peaks near 10^4 at fp8), and a number past it is a tool's fault, never a winner.
MAX_TFLOPS = 1e6
# ... and what one run of one kernel can take, in ns: nothing a GPU launches completes in under
# 1 ns (one clock of a 1 GHz part; a launch alone costs microseconds), and no tuning waits a day
# for one run. A time outside is a tool's or a file's fault, never a measurement: 1e-300 ms was
# once stored as a 1e-294 ns minimum, and 1e303 ms overflowed to inf and crashed summarize.
MIN_KERNEL_NS = 1.0
MAX_KERNEL_NS = 86_400e9


def kernel_time_fault(ns: float) -> str:
    """Why `ns` cannot be one run of a kernel ("" when it can): not a number, or outside
    MIN_KERNEL_NS to MAX_KERNEL_NS (inf included)."""
    if math.isnan(ns):
        return "not a number"
    if not MIN_KERNEL_NS <= ns <= MAX_KERNEL_NS:
        return (
            f"outside what one kernel run can take ({MIN_KERNEL_NS:g} ns to "
            f"{MAX_KERNEL_NS:g} ns, a day)"
        )
    return ""


@dataclass(frozen=True, slots=True)
class Spread:
    """The summary of one measurement, in ns (or any one unit): what a candidate row stores.

    `min` and `iqr` are None where the tool timed all runs with one timer and so gave their
    mean only (rocmlir-tuning-driver's small-kernel path): no spread is known, which is not
    a spread of 0."""

    median: float
    min: float | None
    iqr: float | None
    samples: int | None  # kept after discarding outliers; None: the tool did not say
    discarded: int = 0

    @property
    def noise(self) -> float:
        """Half-width of the median's ~95 % interval (the notch); 0 for a single sample."""
        return noise(self.iqr, self.samples)

    @property
    def rel_noise(self) -> float:
        return self.noise / self.median if self.median > 0 else math.inf


def quartiles(sorted_values: Sequence[float]) -> tuple[float, float]:
    """Q1 and Q3 by linear interpolation (numpy's default); the values must be sorted."""
    n = len(sorted_values)

    def at(q: float) -> float:
        pos = q * (n - 1)
        lo = math.floor(pos)
        hi = min(lo + 1, n - 1)
        return sorted_values[lo] + (sorted_values[hi] - sorted_values[lo]) * (pos - lo)

    return at(0.25), at(0.75)


def summarize(samples: Sequence[float]) -> Spread:
    """The Spread of `samples` after the outlier rule of the module docstring."""
    if not samples:
        raise ValueError("no samples to summarize")
    if not all(math.isfinite(t) for t in samples):  # inf's IQR is nan: no sample would be kept
        raise ValueError("a sample to summarize is not a finite number")
    ordered = sorted(samples)
    q1, q3 = quartiles(ordered)
    fence = q3 + max(FENCE * (q3 - q1), FENCE_FLOOR * statistics.median(ordered))
    kept = [t for t in ordered if t <= fence]
    k1, k3 = quartiles(kept)
    return Spread(
        median=float(statistics.median(kept)),
        min=float(kept[0]),
        iqr=float(k3 - k1),
        samples=len(kept),
        discarded=len(ordered) - len(kept),
    )


def noise(iqr: float | None, samples: int | None) -> float:
    """The notch half-width for a stored (iqr, samples) pair; 0 when it is unknown."""
    if not iqr or not samples or samples < 2:
        return 0.0
    return NOTCH * iqr / math.sqrt(samples)


def rel_noise(median: float | None, iqr: float | None, samples: int | None) -> float | None:
    """Noise relative to the median, or None when nothing about the spread is known (or a
    stored value is not a number: see stored_number)."""
    median, iqr, count = stored_number(median), stored_number(iqr), stored_number(samples)
    if median is None or median <= 0 or iqr is None or count is None or count < 1:
        return None
    return noise(iqr, int(count)) / median


def stored_number(value: object) -> float | None:
    """A number column's value as read back, or None when it is not a finite number: SQLite
    keeps whatever it was given (text in a REAL column, an integer past a double), so a read
    model skips or flags such a row instead of failing on it."""
    if isinstance(value, bool) or not isinstance(value, int | float):
        return None
    try:
        number = float(value)
    except OverflowError:
        return None
    return number if math.isfinite(number) else None


def within_noise(a: float, noise_a: float, b: float, noise_b: float) -> bool:
    """True when the intervals a +- noise_a and b +- noise_b overlap."""
    return abs(a - b) <= noise_a + noise_b


@dataclass(frozen=True, slots=True)
class Margin:
    """How far the winner is ahead of the runner-up, both relative to the winner's time:
    `margin` = runner-up / winner - 1, `noise` = the two notches summed / winner (None when
    the tuner measured no spread)."""

    margin: float
    noise: float | None

    @property
    def within_noise(self) -> bool | None:
        return None if self.noise is None else self.margin <= self.noise


def margin(winner: Spread, runner_up: Spread) -> Margin:
    """Their margin; its noise only when both sample counts are known (without one, the
    notch is unknown, not zero)."""
    base = winner.median if winner.median > 0 else 1.0
    known = winner.samples is not None and runner_up.samples is not None
    return Margin(
        margin=runner_up.median / base - 1.0,
        noise=(winner.noise + runner_up.noise) / base if known else None,
    )


def spearman(xs: Sequence[float], ys: Sequence[float]) -> float | None:
    """Spearman's rank correlation (average ranks for ties); None for fewer than 2 pairs or a
    constant side."""
    if len(xs) != len(ys):
        raise ValueError("spearman needs two sequences of equal length")
    if len(xs) < 2:
        return None
    rx, ry = _ranks(xs), _ranks(ys)
    mx, my = statistics.fmean(rx), statistics.fmean(ry)
    cov = math.fsum((a - mx) * (b - my) for a, b in zip(rx, ry, strict=True))
    vx = math.fsum((a - mx) ** 2 for a in rx)
    vy = math.fsum((b - my) ** 2 for b in ry)
    if vx == 0 or vy == 0:
        return None
    return cov / math.sqrt(vx * vy)


def _ranks(values: Sequence[float]) -> list[float]:
    order = sorted(range(len(values)), key=values.__getitem__)
    ranks = [0.0] * len(values)
    i = 0
    while i < len(order):
        j = i
        while j + 1 < len(order) and values[order[j + 1]] == values[order[i]]:
            j += 1
        for k in range(i, j + 1):
            ranks[order[k]] = (i + j) / 2 + 1
        i = j + 1
    return ranks
