"""The "GPU" at work: each config gets a deterministic candidate list (quick < full < greedy <
exhaustive, each a prefix of the next) whose times come from a hash of (config, perf config);
`tune` runs the "driver" over it as tuningRunner's find_best_perfconfig does."""

from __future__ import annotations

import hashlib
import math

import fake_fusion

from standin_runner import common, problems

SPACE_SIZES = {"quick": 8, "full": 40, "greedy": 60, "exhaustive": 150}
# The stand-in's names for rocmlirTriton's named fields (19 for gemm, as the real form has).
E4_GEMM_KEYS = [
    "mPerBlock", "nPerBlock", "kPerBlock", "mPerWave", "nPerWave", "mnPerXdl", "kPack",
    "splitKFactor", "scheduleVersion", "outputSwizzle", "wavesPerEU", "gridGroupSize",
    "forceUnroll", "bCopyMore", "lds2Stage", "directToLds", "streamK", "kOuter", "kInner",
]  # fmt: skip
E4_ATTN_KEYS = [
    "mPerBlockG0", "mPerBlockG1", "nPerBlockG0", "kPackPerBlock", "mPerWave", "nPerWave",
    "mnPerXdl", "kPack", "splitKFactor", "scheduleVersion", "outputSwizzle", "wavesPerEU",
    "forceUnroll",
]  # fmt: skip


def shapes(space: str) -> list[tuple[int, int, int, int, int]]:
    """(m, n, kPerBlock, wave, splitK) of each candidate of the space, in the order tried."""
    out = []
    for m in (32, 64, 128, 256):
        for n in (32, 64, 128, 256):
            for kpb in (2, 4, 8):
                for split_k in (1, 2, 4):
                    out.append((m, n, kpb, min(m, n, 64), split_k))
    return out[: SPACE_SIZES[space]]


def perf_configs(op: str, space: str, era: str) -> list[str]:
    """The space's perf configs as the era spells them (E3: v4 / attn:v3; E4: named fields)."""
    spell = e4_perf_config if era == "E4" else e3_perf_config
    return [spell(op, *shape) for shape in shapes(space)]


def e3_perf_config(op: str, m: int, n: int, kpb: int, wave: int, split_k: int) -> str:
    if op == "attention":
        return f"attn:v3:{m},{n},64,{kpb},{wave},{wave},32,4,1,1,2,0,1"
    return f"v4:{m},{n},{kpb},{wave},{wave},32,4,{split_k},1,2,0,0,1,1"


def e4_perf_config(op: str, m: int, n: int, kpb: int, wave: int, split_k: int) -> str:
    if op == "attention":
        values = [m, n, 64, kpb, wave, wave, 32, 4, 1, 1, 2, 0, 1]
        pairs = zip(E4_ATTN_KEYS, values, strict=True)
        return "attn:" + ",".join(f"{k}={v}" for k, v in pairs)
    values = [m, n, kpb, wave, wave, 32, 4, split_k, 1, 2, 0, 0, 1, 1, 0, 0, 0, 1, 1]
    return "gemm:" + ",".join(f"{k}={v}" for k, v in zip(E4_GEMM_KEYS, values, strict=True))


def unit(*parts: str) -> float:
    """A number in [0, 1) fixed by `parts`: every "measurement" is one."""
    digest = hashlib.sha256("\x00".join(parts).encode()).digest()
    return int.from_bytes(digest[:8], "big") / 2.0**64


def candidate_time_ns(config: str, perf_config: str, flops: float) -> float | None:
    """The "driver's" time in ns for one candidate, or None when it is not applicable."""
    if unit("applicable", config, perf_config) < 0.15:
        return None
    peak_tflops = 150.0
    ns = flops / (peak_tflops * 1e3) * (1.0 + 9.0 * unit("time", config, perf_config))
    return round(max(ns, 1000.0), 1)


def compute_tflops(flops: float, ns: float | None) -> float:
    if ns is None:
        return math.nan
    return flops / (float(ns) * 1e-9) / 1e12


def measurements_ms(config: str, perf_config: str, ns: float) -> list[float]:
    """The driver's timed runs (ms) of a candidate: the time itself and five either side within
    2 %, so that their median is the time (E3's tuningRunner passes --use-median)."""
    ms = ns * 1e-6
    near = [0.02 * unit(f"m{i}", config, perf_config) for i in range(10)]
    return [ms, *(ms * (1 - d) for d in near[:5]), *(ms * (1 + d) for d in near[5:])]


# E3's tuningRunner (3fc5be9e) runs the driver in its legacy benchmark mode:
# --num-iterations=10 --warmup-iterations=1 --use-median.
LEGACY_ITERATIONS = 10


def driver_stats(config: str, perf_config: str, ns: float) -> dict:
    """rocmlir-tuning-driver --show-stats' JSON for the candidate as tuningRunner stores it in
    the entry (pandas then writes the dict's repr into the Stats column). In ms, the driver's
    unit (only its time column is ns): a kernel under 1 ms is timed by one CPU timer over
    max(10, ceil(1 ms / its time)) iterations, `{total_cpu_time, iterations}`; a longer one run
    by run, `{min, median, max, stddev, cv}` (cv in percent), numbers as %e prints them."""
    ms = ns * 1e-6
    if ms < 1.0:
        iterations = max(LEGACY_ITERATIONS, math.ceil(1.0 / ms))
        return {"total_cpu_time": float(f"{ms * iterations:e}"), "iterations": iterations}
    runs = sorted(measurements_ms(config, perf_config, ns))
    mean = sum(runs) / len(runs)
    stddev = math.sqrt(sum((v - mean) ** 2 for v in runs) / len(runs))
    numbers = {"min": runs[0], "median": runs[len(runs) // 2], "max": runs[-1]}
    numbers |= {"stddev": stddev, "cv": stddev / mean * 100}
    return {k: float(f"{v:e}") for k, v in numbers.items()}


def e4_measurements(config: str, perf_config: str, ns: float) -> list[float]:
    """--show-all-measurements: every run's hipEventElapsedTime in ms, in the order run, as
    llvm::raw_ostream prints a double (%e) and json.loads reads it back. Eleven runs whose
    median is the candidate's time (the driver's --use-median): five faster, five slower."""
    ms = ns * 1e-6
    below = [ms * (1 - 0.02 * unit(f"lo{i}", config, perf_config)) for i in range(5)]
    above = [ms * (1 + 0.02 * unit(f"hi{i}", config, perf_config)) for i in range(5)]
    runs = [ms, *below, *above]
    order = sorted(range(11), key=lambda i: unit(f"order{i}", config, perf_config))
    return [float(f"{runs[i]:e}") for i in order]


def e4_discarded(config: str, perf_config: str) -> bool:
    """Whether E4's driver gives up on a candidate over its time budget: 520c8752's never does
    (a seam: a test build's overlay plays a driver that does)."""
    return False


def e4_debug_cells(entry: dict, config: str, pc: str, ns: float | None, discarded: bool) -> None:
    """find_best_perfconfig with --debug: MeasurementsMs (None unless measured) and Status."""
    measured = ns is not None and not discarded
    if measured:
        entry["MeasurementsMs"] = e4_measurements(config, pc, ns)
        entry["Status"] = "Measured"
    else:
        entry["MeasurementsMs"] = None
        entry["Status"] = "Discarded" if discarded else "N/A"


class Result:
    def __init__(self, test_vector: str) -> None:
        self.test_vector = test_vector
        self.entries: list[dict] = []
        self.driver_lines: list[str] = []  # what rocmlir-tuning-driver printed: "<perf>\t<ns|N/A>"
        self.winner = "None"
        self.max_tflops = -math.inf


def tune(
    op: str,
    config: str,
    space: str,
    gpu: common.Gpu,
    era: str,
    debug: bool,
    not_compiled: frozenset[str] = frozenset(),
) -> Result:
    """Run the "driver" over the space (era E3 or E4); entries are .debug rows (TFlops NaN when
    N/A). The perf configs in `not_compiled` (E4 --benchmark-artifacts: their manifest status is
    not success) are not run: N/A, as the one-stage run finds them."""
    if op == "fusion":  # a fused kernel is tuned as the conv/gemm its key names
        op, config = fake_fusion.op_of(config), fake_fusion.strip_key_flags(config)
    problem, flops = problems.describe(op, config, gpu)
    result = Result(config)
    for pc in perf_configs(op, space, era):
        ns = candidate_time_ns(config, pc, flops) if pc not in not_compiled else None
        # E4's driver gives up on some candidates (over their time budget): "Discarded".
        discarded = era == "E4" and ns is not None and e4_discarded(config, pc)
        shown = "Discarded" if discarded else ("N/A" if ns is None else repr(ns))
        result.driver_lines.append(f"{pc}\t{shown}")
        entry = problems.with_chiplets(problem, gpu)
        entry["PerfConfig"] = pc
        if "LDSBankConflict" in problems.debug_columns(op):
            entry["LDSBankConflict"] = "NaN"  # perfRunner's value when rocprof metrics are absent
        entry["TFlops"] = math.nan if discarded else compute_tflops(flops, ns)
        if era == "E4" and op == "gemm":
            entry = problems.e4_gemm_entry(entry)
        if era == "E4" and debug:
            e4_debug_cells(entry, config, pc, ns, discarded)
        elif debug:
            measured = ns is not None and not discarded
            entry["Stats"] = driver_stats(config, pc, ns) if measured else None
        result.entries.append(entry)
        if not math.isnan(entry["TFlops"]) and entry["TFlops"] > result.max_tflops:
            result.max_tflops, result.winner = entry["TFlops"], pc
    return result


def two_stage(result: Result, config: str, k: int) -> None:
    """E4's --two-stage-topk: the k fastest measured again (a deterministic +-3 % "precise"
    pass); the rest Discarded (TFlops NaN); the winner is the fastest of the second pass."""
    ranked = sorted(
        (e for e in result.entries if not math.isnan(e["TFlops"])), key=lambda e: -e["TFlops"]
    )
    top = {id(e) for e in ranked[:k]}
    result.max_tflops, result.winner = -math.inf, "None"
    for e in result.entries:
        if id(e) not in top:
            e["TFlops"] = math.nan
            if "Stats" in e:
                e["Stats"] = None
            if e.get("Status") == "Measured":  # measured in the coarse pass only
                e["Status"], e["MeasurementsMs"] = "Discarded", None
            continue
        factor = 0.97 + 0.06 * unit("precise", config, e["PerfConfig"])
        e["TFlops"] /= factor
        if e.get("Stats"):
            stats = e["Stats"]
            kept = ("cv", "iterations")  # the rest are times (ms)
            e["Stats"] = {k: v if k in kept else float(f"{v * factor:e}") for k, v in stats.items()}
        if e.get("MeasurementsMs"):
            e["MeasurementsMs"] = [float(f"{m * factor:e}") for m in e["MeasurementsMs"]]
        if e["TFlops"] > result.max_tflops:
            result.max_tflops, result.winner = e["TFlops"], e["PerfConfig"]
