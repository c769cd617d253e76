"""Does tuning matter? The CPU tuner's best, median and worst candidate per problem.

Problems: the example configs (examples/<op>-small, taken as written, no data-type expansion);
where those are missing, the tier-1 lists in tests/data filtered to CPU-sized problems (1e7 to
1e8 flops), four per op spread over that range. Each is tuned with `CpuTuner` over the `full`
space; every candidate is verified against a reference and timed (median over a time budget,
mlirtuna.tuners.timing). The ratios
say how much slower the median and the worst perf config are than the winner: the spread that
tuning removes. No database is involved. --smoke tunes the smallest problem of each op once.
Fusion problems are the rocMLIR test modules in tests/data/fusion (every one). --ops and --space
narrow a run (e.g. `--ops fusion,gemm_gemm,conv_gemm --space quick` on a busy machine).

    python bench/bench_tuning_spread.py [--smoke] [--ops OP,...] [--space SPACE] [--out FILE]
"""

from __future__ import annotations

import argparse
import statistics
import time
from pathlib import Path

import common
import numpy as np

from mlirtuna.problems import OPS, ExpandOptions, Problem
from mlirtuna.problems.configlist import read_config_list
from mlirtuna.tuners.base import TuneContext, TuneOutcome
from mlirtuna.tuners.cpu import CpuTuner

ROOT = Path(__file__).resolve().parent.parent
TIER1_FLOPS = (1e7, 1e8)
TIER1_PER_OP = 4


FUSION = ROOT / "tests" / "data" / "fusion"


def config_file(op: str) -> Path:
    if op == "fusion":
        return FUSION
    example = ROOT / "examples" / f"{op}-small"
    return example if example.exists() else ROOT / "tests" / "data" / f"tier1-{op}-configs"


def pick(op: str, smoke: bool) -> list[Problem]:
    """The problems to tune for `op`, smallest first."""
    path = config_file(op)
    if op == "fusion":
        from mlirtuna import catalog

        found = [catalog.read_problem(m) for m in catalog.module_files([str(FUSION / "resnet50"),
                 str(FUSION / "mixr-gemm")])]  # fmt: skip
        ranked = sorted(found, key=lambda p: (p.flops(), p.file_name))
        return ranked[:1] if smoke else ranked
    entries = read_config_list(str(path), op, ExpandOptions(expand=False)).entries
    unique = {e.problem.canonical(): e.problem for e in entries}.values()
    ranked = sorted(unique, key=lambda p: (p.flops(), p.canonical()))
    if path.parent.name != "examples":
        lo, hi = TIER1_FLOPS
        ranked = [p for p in ranked if lo <= p.flops() < hi]
        if len(ranked) > TIER1_PER_OP:
            step = (len(ranked) - 1) / (TIER1_PER_OP - 1)
            ranked = [ranked[round(i * step)] for i in range(TIER1_PER_OP)]
    return ranked[:1] if smoke else ranked


def spread_row(problem: Problem, outcome: TuneOutcome, seconds: float) -> list[object]:
    times = sorted(c.kernel_time_ns for c in outcome.candidates if c.valid and c.kernel_time_ns)
    best, worst, med = times[0], times[-1], statistics.median(times)
    return [
        problem.op,
        f"`{short(problem)}`",
        f"{problem.flops():.2g}",
        f"{len(times)}/{len(outcome.candidates)}",
        f"{best / 1e6:.3g}",
        f"{med / 1e6:.3g}",
        f"{worst / 1e6:.3g}",
        f"{med / best:.1f}x",
        f"{worst / best:.1f}x",
        f"{seconds:.1f}",
    ]


# Flags dropped from the table when they hold this value (they repeat a default).
DEFAULTS = {
    "conv": {"-m": "conv", "-t": "1", "-F": "1", "-l": "1", "-j": "1"},
    "gemm": {"-transO": "false"},
    "attention": {
        "-transO": "false", "-causal": "false", "-return_lse": "false", "-split_kv": "1",
        "-num_heads_q": "1", "-num_heads_kv": "1", "-with-attn-scale": "false",
        "-with-attn-bias": "false", "-transBias": "false",
    },
}  # fmt: skip


def short(problem: Problem) -> str:
    """The test vector without flags that hold their default, to keep the table narrow."""
    if problem.op == "fusion":
        return f"{problem.file_name} ({problem.key_op})"
    tokens = problem.canonical().split()
    defaults = DEFAULTS.get(problem.op, {})
    kept: list[str] = []
    i = 0
    while i < len(tokens):
        flag = tokens[i]
        if i + 1 < len(tokens) and defaults.get(flag) == tokens[i + 1]:
            i += 2
            continue
        kept.append(flag)
        i += 1
    return " ".join(kept)


def main() -> None:
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    p.add_argument("--smoke", action="store_true", help="the smallest problem per op, 1 repeat")
    p.add_argument("--out", type=Path, help="also write the Markdown to this file")
    p.add_argument("--ops", default=",".join(OPS), help="comma-separated ops [all]")
    p.add_argument("--space", default="full", help="tuning space [full]")
    args = p.parse_args()
    ops = args.ops.split(",")
    tuner = CpuTuner(repeats=1) if args.smoke else CpuTuner()
    ctx = TuneContext("cpu", "cpu", 1, 1, args.space, gpu_id=-1)
    rows = []
    for op in ops:
        for problem in pick(op, args.smoke):
            common.status(f"tuning {op} {problem.canonical()}")
            t0 = time.perf_counter()
            outcome = tuner.tune(problem, ctx)
            rows.append(spread_row(problem, outcome, time.perf_counter() - t0))
    headers = ["op", "problem", "flops", "valid/tried", "best ms", "median ms", "worst ms",
               "median/best", "worst/best", "tuning s"]  # fmt: skip
    sources = ", ".join(str(config_file(op).relative_to(ROOT)) for op in ops)
    text = "\n\n".join(
        [
            f"### Does tuning matter? CPU tuner, `{args.space}` space",
            common.machine_line(),
            f"Problems from {sources}, as written. Times are each candidate's median over "
            f"its time budget ({tuner.budget.rep_ms:g} ms, >= {tuner.budget.min_samples} "
            f"verified runs, one BLAS thread; the top 3 re-measured; NumPy {np.__version__}); "
            "`valid/tried` counts the candidates that passed verification.",
            common.table(headers, rows),
        ]
    )
    common.emit(text, args.out)


if __name__ == "__main__":
    main()
