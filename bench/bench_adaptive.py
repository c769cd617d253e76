"""Adaptive search on real GPUs: measurements to the best on a GPU the search never saw.

Reads every KERNEL/GPU.json.gz (Kernel Tuner caches, ../shared/data/real-tuning/) under --train
and --test. Per kernel and test GPU, each strategy searches the test file's space (its configs
and their parameter values, read off the cache keys) with --budget measurements, --seeds times:

- mlirtuna: the `adaptive` search strategy (mlirtuna.search), its history the training GPUs'
  times of the same configs;
- random (and any other registered search strategy named in --strategies, e.g. optuna-tpe):
  no history;
- kt:NAME: Kernel Tuner's strategy NAME (pip install kernel_tuner==1.5.0, the bench extra), run
  in its own simulation mode (`tune_cache`) on the test file, `max_fevals` = --budget, seeded
  through `random` and NumPy's global generator. It reads each time from the cache (the file's
  mean time, no noise) and cannot ask an oracle, so with --oracle it is left out.

Times come only from measuring: a strategy sees a time only for a config it asked for. Without
--oracle the bench answers from the test file: the median of 3 of that config's recorded repeats,
drawn with a generator seeded by the run, kernel and GPU (a noisy measurement, not the mean);
a failed config is `fail`. With --oracle CMD it starts CMD once, writes
`RUN<TAB>KERNEL<TAB>GPU<TAB>CONFIG_KEY` per measurement (RUN = STRATEGY:SEED) and reads back one
line, a time in ms or `fail`; the test files may then hold no times (the true time of a config is
then the median of the oracle's answers for it, the true best the best of those).

Score after n measurements: true best time / true time (the file's mean) of the best config
measured so far, i.e. the search's answer once the farm re-measures its top candidates. Without
--test: leave-one-GPU-out over --train (each GPU in turn is the test GPU, the others the history).

Prints the machine, per kernel x GPU x strategy the measurements to 0.95 and 0.99 of the true
best (median and IQR over seeds; `>BUDGET` when not reached) and the fraction of the best after
10/20/50/100 (geomean over seeds), a summary per strategy, and last the line
`goal: worst median measurements to 0.99 NN, geomean after 20 0.XXX` for mlirtuna's strategy.
--goal also checks it (every pair within a median of 40, geomean after 20 >= 0.98; exit 1 when
not met). --trace-out FILE writes every measurement as JSON lines.

    python bench/bench_adaptive.py --train ../shared/data/real-tuning/kernel-tuner-hub --goal
"""

from __future__ import annotations

import argparse
import contextlib
import gzip
import io
import json
import math
import os
import random
import shutil
import subprocess
import sys
import tempfile
import time
import warnings
import zlib
from dataclasses import dataclass, field
from importlib.util import find_spec
from pathlib import Path

import common
import kerneltuner as kt
import numpy as np

from mlirtuna import search

OURS = "mlirtuna"
#: RUN names of registry strategies in the bench (the issue calls ours `mlirtuna`).
REGISTRY_NAME = {OURS: "adaptive"}
DEFAULT_STRATEGIES = f"{OURS},random,kt:adaptive_tabu_greywolf,kt:genetic_algorithm,kt:bayes_opt"
SMOKE_STRATEGIES = f"{OURS},random"
REPEATS = 3  # a measurement: the median of this many recorded repeats
LEVELS = (0.95, 0.99)
AFTER = (10, 20, 50, 100)
GOAL_MEASUREMENTS = 40
GOAL_AFTER_20 = 0.98


class BenchError(Exception):
    """Bad input or a broken oracle: one line, exit 2, nothing written."""


@dataclass
class Case:
    """One kernel on one test GPU: the space, the history, the test file's times."""

    kernel: str
    gpu: str
    cache: kt.Cache
    keys: list[str]
    space: search.Space
    history: search.History
    file_times: np.ndarray  # NaN: failed or no time in the file


@dataclass
class Run:
    strategy: str
    seed: int
    case: Case
    configs: list[int] = field(default_factory=list)
    measured: list[float] = field(default_factory=list)  # ms; NaN = fail


def main() -> int:
    args = parse_args()
    t0, cpu0, load = time.monotonic(), time.process_time(), os.getloadavg()
    for d in (args.train, args.test):
        if d is not None and not d.is_dir():
            print(f"skipped: {d} is not there (the real-GPU data lives in ../shared)")
            return 0
    oracle = None
    try:
        train = kt.read_tree(args.train)
        test = kt.read_tree(args.test) if args.test else None
        oracle = Oracle(args.oracle) if args.oracle else None
        peers = Peers(args.strategies, oracle is not None)
        runs = run_all(args, train, test, peers, oracle)
    except (kt.CacheError, BenchError) as e:
        print(f"error: {e}", file=sys.stderr)
        return 2
    finally:
        if oracle is not None:
            oracle.close()
    if args.trace_out:
        write_trace(args.trace_out, runs)
    scores = score_all(runs, args.budget)
    text, met = report(args, scores, peers, load, time.monotonic() - t0, time.process_time() - cpu0)
    common.emit(text, args.out)
    return 0 if met or not args.goal else 1


def parse_args() -> argparse.Namespace:
    p = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    p.add_argument("--train", type=Path, required=True, help="DIR of KERNEL/GPU.json.gz")
    p.add_argument("--test", type=Path, help="DIR of test GPUs (default: leave-one-GPU-out)")
    p.add_argument("--budget", type=int, default=100, help="measurements per search")
    p.add_argument("--seeds", type=int, default=20, help="searches per strategy and pair")
    p.add_argument("--oracle", help="CMD answering RUN\\tKERNEL\\tGPU\\tCONFIG lines: ms or fail")
    p.add_argument("--trace-out", type=Path, help="write every measurement (JSON lines)")
    p.add_argument("--goal", action="store_true", help="check the goal (exit 1 when not met)")
    p.add_argument(
        "--strategies",
        help=f"comma-separated: {OURS}, registry names, kt:NAME (default: {DEFAULT_STRATEGIES})",
    )
    p.add_argument("--smoke", action="store_true", help="budget 12, 2 seeds, mlirtuna and random")
    p.add_argument("--out", type=Path, help="also write the report to this file")
    args = p.parse_args()
    if args.smoke:
        args.budget, args.seeds = min(args.budget, 12), min(args.seeds, 2)
        args.strategies = args.strategies or SMOKE_STRATEGIES
    args.strategies = [s.strip() for s in (args.strategies or DEFAULT_STRATEGIES).split(",")]
    args.strategies = [s for s in args.strategies if s]
    if args.budget < 1 or args.seeds < 1:
        p.error("--budget and --seeds must be >= 1")
    if OURS not in args.strategies:
        p.error(f"--strategies must hold {OURS} (the goal line is its)")
    for name in args.strategies:
        if not name.startswith("kt:") and REGISTRY_NAME.get(name, name) not in search.names():
            p.error(f"unknown strategy {name!r} (search strategies: {', '.join(search.names())})")
    return args


# -- the cases and the runs ----------------------------------------------------------------------


def splits(train: dict[str, kt.Cache], test: dict[str, kt.Cache] | None):
    """[(training caches, test GPU, test cache)]: each GPU left out in turn, or --test's."""
    if test is not None:
        return [(train, gpu, test[gpu]) for gpu in sorted(test)]
    return [
        ({g: c for g, c in train.items() if g != gpu}, gpu, train[gpu]) for gpu in sorted(train)
    ]


def make_case(kernel: str, gpu: str, cache: kt.Cache, training: dict[str, kt.Cache]) -> Case:
    keys = sorted(cache.times)
    units = sorted(training)
    times = np.array([[training[u].times.get(k, np.nan) for k in keys] for u in units])
    history = search.History(tuple(units), times.reshape(len(units), len(keys)))
    file_times = np.array([cache.times[k] for k in keys])
    return Case(kernel, gpu, cache, keys, search.Space.from_keys(keys), history, file_times)


def run_all(args, train, test, peers, oracle) -> list[Run]:
    runs: list[Run] = []
    for kernel in sorted(train):
        if test is None and len(train[kernel]) < 2:
            common.status(f"{kernel}: one GPU only, nothing to leave out: skipped")
            continue
        for training, gpu, cache in splits(
            train[kernel], (test or {}).get(kernel) if test else None
        ):
            case = make_case(kernel, gpu, cache, training)
            if oracle is None and not np.isfinite(case.file_times).any():
                raise BenchError(f"{cache.path}: no times in the test file (use --oracle CMD)")
            for name in peers.running(args.strategies):
                t = time.process_time()
                for seed in range(args.seeds):
                    runs.append(run_one(name, seed, case, args.budget, oracle, peers))
                peers.cpu[name] = peers.cpu.get(name, 0.0) + time.process_time() - t
                common.status(f"{kernel} {gpu} {name}: {time.process_time() - t:.1f} s CPU")
    peers.cleanup()
    return runs


def run_one(name: str, seed: int, case: Case, budget: int, oracle, peers) -> Run:
    run = Run(name, seed, case)
    if name.startswith("kt:"):
        for i in peers.kt_sequence(case, name[3:], seed, budget):
            run.configs.append(i)
            run.measured.append(case.file_times[i])
        return run
    measure = Measurer(run, oracle)
    s = search.get(REGISTRY_NAME.get(name, name)).start(case.space, case.history, budget, seed)
    while len(run.configs) < budget:
        asked = s.ask()
        if not asked:
            break
        for i in asked[: budget - len(run.configs)]:
            s.tell(i, measure(i))
    return run


class Measurer:
    """A run's measurements: the oracle's answer, or the median of REPEATS of the config's
    recorded repeats drawn by a generator seeded per run, kernel and GPU."""

    def __init__(self, run: Run, oracle: Oracle | None) -> None:
        self.run, self.oracle = run, oracle
        tag = f"{run.strategy}:{run.seed}\t{run.case.kernel}\t{run.case.gpu}"
        self.rng = np.random.default_rng(zlib.crc32(tag.encode()))

    def __call__(self, i: int) -> float:
        case, key = self.run.case, self.run.case.keys[i]
        if self.oracle is not None:
            ms = self.oracle.measure(
                f"{self.run.strategy}:{self.run.seed}", case.kernel, case.gpu, key
            )
        else:
            ms = self.from_file(case, key, i)
        self.run.configs.append(i)
        self.run.measured.append(ms)
        return ms

    def from_file(self, case: Case, key: str, i: int) -> float:
        if not math.isfinite(case.file_times[i]):
            return math.nan
        reps = case.cache.repeats.get(key)
        if not reps:
            return float(case.file_times[i])
        drawn = self.rng.choice(reps, size=min(REPEATS, len(reps)), replace=False)
        return float(np.median(drawn))


class Oracle:
    """CMD, started once: one line per measurement in, one line (ms or `fail`) out."""

    def __init__(self, cmd: str) -> None:
        self.cmd = cmd
        self.proc = subprocess.Popen(
            cmd, shell=True, stdin=subprocess.PIPE, stdout=subprocess.PIPE, text=True, bufsize=1
        )

    def measure(self, run: str, kernel: str, gpu: str, key: str) -> float:
        line = f"{run}\t{kernel}\t{gpu}\t{key}"
        assert self.proc.stdin is not None and self.proc.stdout is not None
        try:
            self.proc.stdin.write(line + "\n")
            self.proc.stdin.flush()
        except BrokenPipeError:
            raise BenchError(f"oracle {self.cmd!r} exited before {line!r}") from None
        answer = self.proc.stdout.readline()
        if not answer:
            raise BenchError(f"oracle {self.cmd!r} ended without answering {line!r}")
        text = answer.strip()
        if text.lower() == "fail":
            return math.nan
        try:
            ms = float(text)
        except ValueError:
            ms = math.nan
        if not (math.isfinite(ms) and ms > 0):
            raise BenchError(
                f"oracle answered {text!r} to {line!r}: expected a time in ms or `fail`"
            )
        return ms

    def close(self) -> None:
        with contextlib.suppress(OSError):
            if self.proc.stdin:
                self.proc.stdin.close()
        try:
            self.proc.wait(timeout=10)
        except subprocess.TimeoutExpired:
            self.proc.kill()
            self.proc.wait()


class Peers:
    """Kernel Tuner's strategies: which run (and why the others do not), and running them."""

    def __init__(self, names: list[str], oracle: bool) -> None:
        self.why_not: dict[str, str] = {}
        self.cpu: dict[str, float] = {}
        self.tmp: Path | None = None
        self.files: dict[tuple[str, str], Path] = {}
        kts = [n for n in names if n.startswith("kt:")]
        if not kts:
            return
        if oracle:
            why = (
                "with --oracle: Kernel Tuner's simulation mode reads every time from its cache "
                "file and its live mode compiles and runs the kernel itself; neither asks an oracle"
            )
        elif find_spec("kernel_tuner") is None:
            why = "kernel_tuner is not installed (pip install kernel_tuner==1.5.0: the bench extra)"
        else:
            from kernel_tuner.interface import strategy_map

            for n in kts:
                if n[3:] not in strategy_map:
                    self.why_not[n] = f"Kernel Tuner has no strategy {n[3:]!r}"
            return
        self.why_not.update(dict.fromkeys(kts, why))

    def running(self, names: list[str]) -> list[str]:
        return [n for n in names if n not in self.why_not]

    def kt_sequence(self, case: Case, strategy: str, seed: int, budget: int) -> list[int]:
        """The configs Kernel Tuner's strategy measured, in order, each once, up to budget."""
        from kernel_tuner.interface import tune_cache

        path = self.json_of(case)
        random.seed(seed)
        np.random.seed(seed)  # Kernel Tuner's strategies draw from the global one
        with warnings.catch_warnings(), contextlib.redirect_stdout(io.StringIO()):
            warnings.simplefilter("ignore")
            results, _ = tune_cache(
                str(path), strategy=strategy, strategy_options={"max_fevals": budget}, quiet=True
            )
        index = {k: i for i, k in enumerate(case.keys)}
        params = self.params_of(path)
        seen: dict[int, None] = {}
        for r in results:
            i = index.get(",".join(str(r[p]) for p in params))
            if i is not None:
                seen.setdefault(i)
        return list(seen)[:budget]

    def json_of(self, case: Case) -> Path:
        """The test cache as plain JSON (Kernel Tuner reads no gzip), written once, without
        the repeat lists (`times`: a strategy sees the mean, and the file is a tenth the size
        to parse on every run)."""
        key = (case.kernel, case.gpu)
        if key not in self.files:
            self.tmp = self.tmp or Path(tempfile.mkdtemp(prefix="bench_adaptive_"))
            path = self.tmp / f"{case.kernel}_{case.gpu}.json"
            opener = gzip.open if case.cache.path.name.endswith(".gz") else open
            with opener(case.cache.path, "rt", encoding="utf-8") as f:
                data = json.load(f)
            for entry in data["cache"].values():
                if isinstance(entry, dict):
                    entry.pop("times", None)
            path.write_text(json.dumps(data), encoding="utf-8")
            self.files[key] = path
        return self.files[key]

    @staticmethod
    def params_of(path: Path) -> list[str]:
        with open(path, encoding="utf-8") as f:
            return list(json.load(f)["tune_params_keys"])

    def cleanup(self) -> None:
        if self.tmp is not None:
            shutil.rmtree(self.tmp, ignore_errors=True)


def write_trace(path: Path, runs: list[Run]) -> None:
    """Every measurement as a JSON line, written whole or not at all."""
    tmp = path.with_name(path.name + ".tmp")
    with open(tmp, "w", encoding="utf-8") as f:
        for run in runs:
            for n, (i, ms) in enumerate(zip(run.configs, run.measured, strict=True), start=1):
                row = {
                    "run": f"{run.strategy}:{run.seed}",
                    "kernel": run.case.kernel,
                    "gpu": run.case.gpu,
                    "n": n,
                    "config": run.case.keys[i],
                    "ms": ms if math.isfinite(ms) else None,
                }
                f.write(json.dumps(row) + "\n")
    os.replace(tmp, path)


# -- scoring -------------------------------------------------------------------------------------


def true_times(runs: list[Run]) -> dict[tuple[str, str], np.ndarray]:
    """Per (kernel, GPU): each config's true time, the file's mean; where the file has none,
    the median of what the runs measured of it (an oracle's answers)."""
    out: dict[tuple[str, str], np.ndarray] = {}
    seen: dict[tuple[str, str], dict[int, list[float]]] = {}
    for run in runs:
        key = (run.case.kernel, run.case.gpu)
        out.setdefault(key, run.case.file_times.copy())
        got = seen.setdefault(key, {})
        for i, ms in zip(run.configs, run.measured, strict=True):
            if math.isfinite(ms):
                got.setdefault(i, []).append(ms)
    for key, times in out.items():
        for i, values in seen[key].items():
            if not math.isfinite(times[i]):
                times[i] = float(np.median(values))
    return out


def score_all(runs: list[Run], budget: int) -> dict[tuple[str, str, str], dict[str, list[float]]]:
    """Per (kernel, GPU, strategy): per seed the measurements to each level (inf: not within
    the budget) and the fraction of the true best after each AFTER count."""
    truth = true_times(runs)
    out: dict[tuple[str, str, str], dict[str, list[float]]] = {}
    for run in runs:
        times = truth[run.case.kernel, run.case.gpu]
        best = float(np.nanmin(times)) if np.isfinite(times).any() else math.nan
        got = np.array([times[i] for i in run.configs], dtype=float)
        got = np.where(np.isfinite(got), got, np.inf)
        frac = best / np.minimum.accumulate(got) if len(got) else np.zeros(0)
        cell = out.setdefault((run.case.kernel, run.case.gpu, run.strategy), {})
        for level in LEVELS:
            hit = np.flatnonzero(frac >= level - 1e-12)
            cell.setdefault(f"to{level}", []).append(float(hit[0] + 1) if len(hit) else math.inf)
        for n in AFTER:
            value = float(frac[min(n, len(frac)) - 1]) if len(frac) else 0.0
            cell.setdefault(f"after{n}", []).append(value)
    return out


def geomean(values) -> float:
    v = np.asarray(list(values), dtype=float)
    return float(np.exp(np.log(np.clip(v, 1e-12, None)).mean())) if len(v) else math.nan


def median(values) -> float:
    return float(np.median(np.asarray(values, dtype=float)))


def count_cell(values: list[float], budget: int) -> str:
    """Median (IQR) of measurements to a level; `>BUDGET` where not reached."""

    def fmt(v: float) -> str:
        return f">{budget}" if not math.isfinite(v) else f"{v:.0f}"

    v = np.asarray(values, dtype=float)
    q1, q3 = (np.percentile(v, q, method="nearest") for q in (25, 75))
    return f"{fmt(median(v))} ({fmt(q1)}-{fmt(q3)})"


# -- the report ----------------------------------------------------------------------------------


def report(args, scores, peers, load, seconds, cpu) -> tuple[str, bool]:
    names = [n for n in args.strategies if n not in peers.why_not]
    after = [n for n in AFTER if n <= args.budget] or [args.budget]
    mode = (
        f"trained on {args.train}, tested on {args.test}"
        if args.test
        else f"leave-one-GPU-out over {args.train}"
    )
    measure = (
        f"answers from the oracle `{args.oracle}`"
        if args.oracle
        else f"answers from the test file (median of {REPEATS} of the config's recorded repeats)"
    )
    rows = []
    for (kernel, gpu, name), cell in sorted(scores.items(), key=lambda kv: row_order(kv[0], names)):
        rows.append(
            (
                kernel,
                gpu,
                name,
                *(count_cell(cell[f"to{lv}"], args.budget) for lv in LEVELS),
                *(f"{geomean(cell[f'after{n}']):.3f}" for n in after),
            )
        )
    parts = [
        "# Adaptive search on real GPUs (bench/bench_adaptive.py)",
        "",
        common.machine_line()
        + f" Load average at start: {load[0]:.2f} {load[1]:.2f} {load[2]:.2f}.",
        f"Searches {mode}; budget {args.budget}, {args.seeds} seeds per strategy; {measure}. "
        "Cells: measurements to 0.95 / 0.99 of the true best, median (IQR) over seeds; "
        "fraction of the true best (best config measured so far) after n, geomean over seeds.",
        "",
        common.table(
            [
                "kernel",
                "test GPU",
                "strategy",
                "to 0.95",
                "to 0.99",
                *(f"after {n}" for n in after),
            ],
            rows,
        ),
        "",
        "Per strategy over the kernels x test GPUs (geomean of the cells above; worst median):",
        "",
        common.table(
            ["strategy", *(f"after {n}" for n in after), "worst median to 0.99", "CPU s"],
            [summary_row(scores, n, after, args.budget, peers.cpu.get(n, 0.0)) for n in names],
        ),
        "",
    ]
    for name, why in peers.why_not.items():
        parts.append(f"{name}: not run: {why}.")
    if any(n.startswith("kt:") for n in names):
        parts.append(
            "Kernel Tuner's strategies ran in its simulation mode: each sees the file's mean "
            "time of the configs it measures (no noise); a config is counted once, at its first "
            "measurement."
        )
    worst, geo20 = goal_numbers(scores, args.budget)
    met = worst <= GOAL_MEASUREMENTS and geo20 >= GOAL_AFTER_20
    if args.goal:
        parts.append(
            f"Goal (every pair within a median of {GOAL_MEASUREMENTS} measurements to 0.99, "
            f"geomean after 20 >= {GOAL_AFTER_20}): {'met' if met else 'NOT met'}."
        )
    parts.append(f"Ran in {seconds:.1f} s wall, {cpu:.1f} s CPU.")
    shown = f">{args.budget}" if not math.isfinite(worst) else f"{worst:.0f}"
    parts.append(f"goal: worst median measurements to 0.99 {shown}, geomean after 20 {geo20:.3f}")
    return "\n".join(parts), met


def row_order(key: tuple[str, str, str], names: list[str]):
    kernel, gpu, name = key
    return (kernel, gpu, names.index(name) if name in names else len(names))


def summary_row(scores, name, after, budget, cpu) -> tuple:
    cells = [c for (_, _, n), c in scores.items() if n == name]
    worst = max((median(c["to0.99"]) for c in cells), default=math.nan)
    shown = f">{budget}" if not math.isfinite(worst) else f"{worst:.0f}"
    geo = [geomean(geomean(c[f"after{n}"]) for c in cells) for n in after]
    return (name, *(f"{g:.3f}" for g in geo), shown, f"{cpu:.1f}")


def goal_numbers(scores, budget) -> tuple[float, float]:
    """mlirtuna's worst median measurements to 0.99 and geomean after 20 over the pairs."""
    cells = [c for (_, _, n), c in scores.items() if n == OURS]
    worst = max((median(c["to0.99"]) for c in cells), default=math.inf)
    geo20 = geomean(geomean(c["after20"]) for c in cells) if cells else 0.0
    return worst, geo20


if __name__ == "__main__":
    sys.exit(main())
