"""Are the CPU tuner's winners repeatable? Tune the same problems twice and compare the runs.

Problems: the example configs (examples/<op>-small, as written; 13 problems), the `full` space.
Each condition tunes every problem twice, run A then run B, and reports:

- same winner: the share of problems where A and B chose the same perf config;
- same or within noise: ... or where A's winner, as B measured it, is within noise of B's winner
  (`mlirtuna.stats.within_noise`: the medians' ~95 % intervals overlap);
- Spearman: the rank correlation of the candidates' times in A and in B (median and worst over
  the problems);
- A's winner in B / B's best: how much slower run A's winner is in run B than B's winner
  (geomean and max over the problems): what picking by run A costs when run B is the truth.
  Times are the stored medians; "on min" is the same ratio on the samples' minimum. Where A's
  winner is not in B's top k, its B time is one search-pass measurement.

Conditions: the harness before issue 17 ("fixed": 5 timed runs on the wall clock, BLAS with as
many threads as NumPy starts, winner straight from the search) and after it ("budget": time
budgets on one BLAS thread, thread CPU time, top-3 re-measured interleaved), each on a quiet
machine and next to a busy neighbour (a process doing single-threaded NumPy matmuls the whole
time). --smoke tunes one problem per op in the quick space.

    python bench/bench_repeatability.py [--smoke] [--conditions budget-quiet,...] [--out FILE]
"""

from __future__ import annotations

import argparse
import dataclasses
import math
import os
import statistics
import subprocess
import sys
import time
from collections.abc import Iterator
from contextlib import contextmanager
from pathlib import Path

import common
from bench_tuning_spread import pick, short

from mlirtuna import stats
from mlirtuna.problems import OPS, Problem
from mlirtuna.tuners.base import Candidate, TuneContext, TuneOutcome
from mlirtuna.tuners.cpu import CpuTuner

CONDITIONS = ("fixed-quiet", "fixed-busy", "budget-quiet", "budget-busy")
NEIGHBOUR = """
import numpy as np
a = np.random.default_rng(0).random((384, 384), dtype=np.float32)
while True:
    a = (a @ a) / 384
"""


class FixedRepeats(CpuTuner):
    """The harness before issue 17: 5 timed runs on the wall clock, BLAS threads as NumPy
    starts them (no threadpoolctl limit), the winner straight from the search (no top-k)."""

    def __init__(self) -> None:
        super().__init__(repeats=5, clock=time.perf_counter_ns)

    def tune(self, problem: Problem, ctx: TuneContext) -> TuneOutcome:
        return self._tune(problem, dataclasses.replace(ctx, topk=1))


@contextmanager
def neighbour(busy: bool) -> Iterator[None]:
    if not busy:
        yield
        return
    env = {**os.environ, "OPENBLAS_NUM_THREADS": "1", "OMP_NUM_THREADS": "1"}
    proc = subprocess.Popen([sys.executable, "-c", NEIGHBOUR], env=env)
    try:
        time.sleep(0.5)  # let it start
        yield
    finally:
        proc.kill()
        proc.wait()


def times(outcome: TuneOutcome) -> dict[str, Candidate]:
    return {c.perf_config: c for c in outcome.candidates if c.valid}


@dataclasses.dataclass
class Pair:
    problem: Problem
    a: TuneOutcome
    b: TuneOutcome

    @property
    def same_winner(self) -> bool:
        return self.a.winner.perf_config == self.b.winner.perf_config

    @property
    def a_in_b(self) -> Candidate:
        return times(self.b)[self.a.winner.perf_config]

    @property
    def within_noise(self) -> bool:
        x, y = self.a_in_b.spread, self.b.winner.spread
        if x is None or y is None:
            return False
        return stats.within_noise(x.median, x.noise, y.median, y.noise)

    @property
    def ratio(self) -> float:
        return (self.a_in_b.kernel_time_ns or 0.0) / (self.b.winner.kernel_time_ns or 1.0)

    @property
    def ratio_min(self) -> float:
        """The same ratio on the samples' minimum (what the shortlist ranks by)."""
        x, y = self.a_in_b.spread, self.b.winner.spread
        return x.min / y.min if x and y else self.ratio

    @property
    def spearman(self) -> float | None:
        ta, tb = times(self.a), times(self.b)
        common_configs = sorted(ta.keys() & tb.keys())
        return stats.spearman(
            [ta[k].kernel_time_ns or 0.0 for k in common_configs],
            [tb[k].kernel_time_ns or 0.0 for k in common_configs],
        )


def run_condition(name: str, problems: list[Problem], space: str) -> tuple[list[Pair], float]:
    harness, load = name.split("-")
    tuner = FixedRepeats() if harness == "fixed" else CpuTuner()
    ctx = TuneContext("cpu", "cpu", 1, 1, space, gpu_id=-1)
    start = time.perf_counter()
    with neighbour(load == "busy"):
        runs = []
        for run in "AB":
            outcomes = []
            for problem in problems:
                common.status(f"{name} run {run}: {problem.op} {short(problem)}")
                outcomes.append(tuner.tune(problem, ctx))
            runs.append(outcomes)
    pairs = [Pair(p, a, b) for p, a, b in zip(problems, *runs, strict=True)]
    return pairs, time.perf_counter() - start


def summary_row(name: str, pairs: list[Pair], seconds: float) -> list[object]:
    n = len(pairs)
    same = sum(p.same_winner for p in pairs)
    close = sum(p.same_winner or p.within_noise for p in pairs)
    rhos = [r for r in (p.spearman for p in pairs) if r is not None]
    ratios = [p.ratio for p in pairs]
    geomean = _geomean(ratios)
    mins = [p.ratio_min for p in pairs]
    return [
        name,
        f"{same}/{n} ({100 * same / n:.0f}%)",
        f"{close}/{n} ({100 * close / n:.0f}%)",
        f"{statistics.median(rhos):.2f} / {min(rhos):.2f}" if rhos else "-",
        f"{geomean:.3f}",
        f"{max(ratios):.2f}",
        f"{_geomean(mins):.3f} / {max(mins):.2f}",
        f"{seconds:.0f}",
    ]


def _geomean(values: list[float]) -> float:
    return math.exp(statistics.fmean(math.log(v) for v in values))


def detail_rows(pairs: list[Pair]) -> list[list[object]]:
    out = []
    for p in pairs:
        rho = p.spearman
        out.append(
            [
                p.problem.op,
                f"`{short(p.problem)}`",
                "same" if p.same_winner else ("noise" if p.within_noise else "differs"),
                "-" if rho is None else f"{rho:.2f}",
                f"{p.ratio:.3f}",
                f"{p.ratio_min:.3f}",
                _margin(p.b),
            ]
        )
    return out


def _margin(outcome: TuneOutcome) -> str:
    m = outcome.margin
    if m is None:
        return "-"
    noise = "" if m.noise is None else f" (noise {m.noise:.1%})"
    return f"{m.margin:+.1%}{noise}"


def main() -> None:
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    p.add_argument("--smoke", action="store_true", help="one problem per op, quick space")
    p.add_argument(
        "--conditions", default=",".join(CONDITIONS), help=f"subset of {','.join(CONDITIONS)}"
    )
    p.add_argument("--out", type=Path, help="also write the Markdown to this file")
    args = p.parse_args()
    names = [c for c in args.conditions.split(",") if c]
    unknown = set(names) - set(CONDITIONS)
    if unknown:
        p.error(f"unknown conditions: {', '.join(sorted(unknown))}")
    space = "quick" if args.smoke else "full"
    problems = [prob for op in OPS for prob in pick(op, args.smoke)]
    summary, details = [], []
    for name in names:
        pairs, seconds = run_condition(name, problems, space)
        summary.append(summary_row(name, pairs, seconds))
        details.append((name, pairs))
    headers = ["condition", "same winner", "same or within noise", "Spearman median / min",
               "A's winner in B / B's best, geomean", "max", "same on min times, geomean / max",
               "seconds"]  # fmt: skip
    detail_headers = ["op", "problem", "winner", "Spearman", "A in B / B best", "on min",
                      "B's margin"]  # fmt: skip
    parts = [
        f"### Repeatability of the CPU tuner, `{space}` space, two runs per condition",
        common.machine_line(),
        f"{len(problems)} problems (examples/*-small as written). Goal for budget-quiet: same "
        "winner or within noise >= 90 %, geomean <= 1.03, max <= 1.2.",
        common.table(headers, summary),
    ]
    for name, pairs in details:
        parts += [f"#### {name}, per problem", common.table(detail_headers, detail_rows(pairs))]
    common.emit("\n\n".join(parts), args.out)


if __name__ == "__main__":
    main()
