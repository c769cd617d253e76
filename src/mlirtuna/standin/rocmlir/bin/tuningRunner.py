#!/usr/bin/env python3
"""A stand-in for rocMLIR's mlir/utils/performance/tuningRunner.py, for mlirtuna's tests.

It speaks the real tool's command line and file formats, for the eras chosen by
FAKE_TUNINGRUNNER_ERA (default E3; E2.5 and E4 are described at their sections below):

- E2 (late 2023 to 2025, what MITuna drives): argparse flags of that era (--rocmlir_gen_flags,
  --tflops, --compact-print, --tuning-space quick|full|exhaustive defaulting to exhaustive, no
  --abort-on-error/--gpus/--timeout); progress on stderr ("Tuning: ...", "Tested N configs ...",
  "Arch = ..."); one header per invocation, then "<arch>\\t<numCU>\\t<config as given>\\t<perf>
  [\\t<tflops>]"; --debug overwrites "<output>.debug" (pandas to_csv with the index column).
- E3 (2026): --op required, --gpus/--timeout/--abort-on-error/--retune/..., greedy space, logging
  as "INFO: ..."/"ERROR: ...", the ten-column header and rows written as each config finishes,
  "<output>.debug" appended (header once) as rocMLIR 3fc5be9e writes it (numChiplets after
  numCU; with --debug a last Stats column, the driver's statistics dict in ms as pandas writes
  it: {total_cpu_time, iterations} for a kernel under 1 ms, else {min, median, max, stddev,
  cv}; E4 adds Status), "<output>.state" on
  failure, already-tuned configs in the output file skipped unless --retune.

No GPU, no compiler: each config gets a deterministic candidate list whose times come from a
hash of (config, perf config); the space grows quick < full < greedy < exhaustive.

Environment:
  FAKE_GPU_ARCH (gfx942:sramecc+:xnack-), FAKE_GPU_NUM_CU (304), FAKE_GPU_NUM_CHIPLETS (8),
  FAKE_GPU_COUNT (8, the GPU ids E3's --gpus accepts), FAKE_TUNINGRUNNER_COMMIT (commitId),
  FAKE_TUNINGRUNNER_DELAY (seconds to sleep per config),
  FAKE_TUNINGRUNNER_LOG=path: append {"argv", "cwd", "env", "time"} as one JSON line per
    invocation (time: when it started, time.time(); env: the visible devices and GIT_DIR),
  FAKE_TUNINGRUNNER_CHILD_PIDFILE=path: where "hang" writes its child's pid,
  FAKE_TUNINGRUNNER_IGNORE_SIGTERM=1: "hang" ignores SIGTERM (so only SIGKILL stops it),
  FAKE_TUNINGRUNNER_FAULT: fail | hang | none | garbage | wrong_arch | empty | crash_partial
    | usage (E3: argparse's usage error, exit 2)
    (E2/E3), fail (E2.5: a "### " line), fail | gpu_timeout (E4: driver exit 3, gpu_timed_out),
  FAKE_TUNINGRUNNER_FAULT_CONFIG=TEXT: the fault hits only configs containing TEXT (E3, E4),
  FAKE_TUNINGRUNNER_TWO_STAGE=1: E3 also takes E4's --two-stage-topk K (the K fastest of the
    first pass measured again, "precisely"; the others' .debug TFlops empty, as Discarded).
  FAKE_E25_NUM_CHIPLETS=0: an earlier E2.5 build, without the numChiplets column.
  FAKE_TUNINGRUNNER_STARTUP_S, _COMPILE_MS, _BENCH_MS, _GPU_LOG: realistic time costs for
    benchmarks (fake_costs.py; default none),
  FAKE_TUNINGRUNNER_STDERR_BYTES=N: first print N bytes of noisy stderr (invalid UTF-8, NUL),
  as a runaway compiler log does; the env logged also names which database secrets it got.

E4's split of compiling and benchmarking (rocmlir-newest.md §2): `--compile-only DIR` (needs the
three --target-* flags, refuses --tuning-space lfbo) writes DIR/index.json and, per problem,
DIR/problems/<hash>/manifest.json.z and configs/NNNNNN.hsaco.z, into DIR.tmp renamed to DIR (the
previous DIR kept as DIR.old); it costs fake_costs.compile_candidates. The real tool compresses
with zstd, which Python 3.11's standard library lacks: the stand-in uses zlib, with the real
framing (an 8-byte little-endian size, then the compressed bytes). `--benchmark-artifacts DIR`
refuses a bundle of another GPU, or of another commit than FAKE_TUNINGRUNNER_COMMIT unless
--allow-commit-mismatch (an ERROR line, exit 1), benchmarks only the candidates whose manifest
status is success (fake_costs.benchmark_candidates) and writes rows, .debug and .state as E4's
one-stage run does.

--op fusion (E2, E3): `--test-dir/--test_dir DIR` only (E3 refuses `--config FILE.mlir` with the
real tool's usage error, exit 2); each module is keyed as rocmlir-gen --emit-tuning-key would key
it and tuned as that conv/gemm (fake_fusion.py); E3 writes the keys to `fusion_config_file` in
its working directory, as the real tool does.

Standard library only (the real tool needs numpy/pandas/tqdm; tests must not).
"""

from __future__ import annotations

import argparse
import contextlib
import datetime
import hashlib
import json
import math
import os
import shutil
import signal
import subprocess
import sys
import time
import zlib

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
import fake_costs
import fake_fusion
from fake_perfrunner import (  # noqa: F401 (perfRunner's names, as the real tool imports them)
    AttentionConfiguration,
    ConvConfiguration,
    ConvGemmConfiguration,
    GemmConfiguration,
    GemmGemmConfiguration,
)

ERA = os.environ.get("FAKE_TUNINGRUNNER_ERA", "E3").upper()
FAULT = os.environ.get("FAKE_TUNINGRUNNER_FAULT", "")
E2_OPS = ["conv", "gemm", "fusion", "attention"]
E3_OPS = ["conv", "gemm", "fusion", "attention", "gemm_gemm", "conv_gemm"]
E2_SPACES = ["quick", "full", "exhaustive"]
E3_SPACES = ["quick", "full", "greedy", "exhaustive"]
VERIFY_MODES = ["none", "cpu", "gpu"]
E2_TYPES = ["f32", "f16", "i8", "i8_i32", "i8_i8", "fp8", "fp8_f32", "fp8_fp8"]
E3_TYPES = ["f32", "f16", "bf16", "i8", "i8_i32", "i8_i8", "fp8", "fp8_f32", "fp8_fp8", "f4E2M1FN"]
SPACE_SIZES = {"quick": 8, "full": 40, "greedy": 60, "exhaustive": 150, "lfbo": 30}
# E2.5 and E4 are their predecessors' formats with additions: helpers that only care about the
# .debug columns and candidate measurements ask for the base era.
BASE_ERA = {"E2": "E2", "E2.5": "E2", "E3": "E3", "E4": "E3"}
V3_HEADER = (
    "# arch\tnumCUs\tnumChiplets\ttestVector\tperfConfig\tTFlops\ttuningSpace\tcommitId"
    "\ttimestamp\tdurationSec"
)


def _words(text: str) -> list[str]:
    return text.split()


# perfRunner's TABLE_COLUMNS per op (reportUtils *_TEST_PARAMETERS + LDSBankConflict + TFlops).
CONV_COLUMNS = _words(
    "Direction DataType Chip numCU FilterLayout InputLayout OutputLayout N C H W K Y X "
    "DilationH DilationW StrideH StrideW PaddingH PaddingW PerfConfig LDSBankConflict "
    "TFlops"
)
GEMM_COLUMNS_E2 = _words(
    "DataType OutDataType Chip numCU TransA TransB G M K N PerfConfig LDSBankConflict TFlops"
)
GEMM_COLUMNS_E3 = _words(
    "DataType OutDataType Chip numCU TransA TransB G M K N ScaledGemm ScaleADtype "
    "ScaleBDtype TransScaleA TransScaleB PerfConfig LDSBankConflict TFlops"
)
# E2's attention columns are a guess (not read in the sources); E3's are reportUtils'.
ATTN_COLUMNS_E2 = _words(
    "DataType Chip numCU TransQ TransK TransV TransO WithAttnScale G SeqLenQ SeqLenK "
    "HeadDimQK HeadDimV PerfConfig TFlops"
)
ATTN_COLUMNS_E3 = _words(
    "DataType Chip numCU TransQ TransK TransV TransO Causal ReturnLSE SplitKV "
    "SlidingWindowLookBack WithAttnScale WithAttnBias TransBias G SeqLenQ SeqLenK NumHeadsQ "
    "NumHeadsKV HeadDimQK HeadDimV PerfConfig TFlops"
)


# ---------------------------------------------------------------------------------------------
# Command lines of the two eras
# ---------------------------------------------------------------------------------------------


def e2_parser() -> argparse.ArgumentParser:
    """E2's flags, choices and defaults (help texts are the stand-in's own words)."""
    p = argparse.ArgumentParser(
        prog="rocMLIR tuning runner",
        description="Stand-in for the E2 rocMLIR tuning runner (conv, gemm, attention)",
        allow_abbrev=False,
    )
    add = p.add_argument
    add("--op", "--operation", choices=E2_OPS, default="conv", help="op to tune")
    add("-c", "--configs_file", type=str, default="conv-configs", help="config list to tune")
    add("-o", "--output", type=str, default="tuning_results_local.tsv", help="appended to")
    add("--mlir-build-dir", type=str, default=".", help="rocMLIR build directory")
    add("--config", type=str, nargs="*", help="tune just this config")
    add("--rocmlir_gen_flags", type=str, default=argparse.SUPPRESS, help="extra rocmlir-gen flags")
    add("--debug", "-d", action="store_true", default=False, help="also write <output>.debug")
    add("--tuning-space", default="exhaustive", choices=E2_SPACES, help="tuning space kind")
    add("--quiet", "-q", action="store_true", default=False, help="no progress lines")
    add("--verify-mode", default="gpu", choices=VERIFY_MODES, help="how the winner is verified")
    add("--test_dir", default="../mlir/test/fusion/resnet50-e2e", type=str, help="fusion tests")
    add("--data-type", nargs="+", choices=E2_TYPES, default=["f32", "f16", "i8"], help="gemm types")
    add("--tflops", action="store_true", default=False, help="add a TFlops column")
    add("--compact-print", action="store_true", default=False, help="print on changes only")
    return p


def e3_parser(
    available_gpus: list[int],
    prog: str = "tuningRunner.py",
    spaces: list[str] | None = None,
    retry_states: tuple[str, ...] = ("failed", "timed_out", "crashed"),
    required: bool = True,
    e4: bool = False,
) -> argparse.ArgumentParser:
    """E3's flags, choices and defaults (help texts are the stand-in's own words); E4 passes
    its own prog, spaces and retry states and adds its flags (e4_parser). `required` False:
    the config source and --op are checked by the caller (E4's --benchmark-stream has none)."""
    p = argparse.ArgumentParser(
        prog=prog,
        description="Stand-in for the E3 rocMLIR tuningRunner.py (conv, gemm, attention)",
        allow_abbrev=False,
    )
    source = p.add_mutually_exclusive_group(required=required)
    source.add_argument("-c", "--configs-file", "--configs_file", metavar="FILE", help="list")
    source.add_argument("--config", type=str, metavar="CONFIG", help="tune just this config")
    source.add_argument("--test-dir", "--test_dir", metavar="DIR", help="fusion tests")
    add = p.add_argument
    add("--op", "--operation", required=required, choices=E3_OPS, help="op to tune")
    add("-o", "--output", default="tuning_results_local.tsv", metavar="FILE", help="appended to")
    add("--mlir-build-dir", type=str, default=".", metavar="DIR", help="rocMLIR build directory")
    add("--rocmlir-gen-flags", "--rocmlir_gen_flags", default="", metavar="FLAGS", help="extra")
    add("-d", "--debug", action="store_true", default=False, help="also write <output>.debug")
    add("--tuning-space", default="full", choices=spaces or E3_SPACES, help="tuning space kind")
    logging_group = p.add_mutually_exclusive_group()
    logging_group.add_argument("-q", "--quiet", action="store_true", default=False, help="quiet")
    logging_group.add_argument("-v", "--verbose", action="store_true", default=False, help="loud")
    if not e4:  # rocmlirTriton has --verify-winning-config / --verify-all-perfconfigs instead
        add("--verify-mode", default="gpu", choices=VERIFY_MODES, help="how the winner is verified")
        add("--verify-perf-configs", action="store_true", default=False, help="verify every one")
    add("--data-type", nargs="+", choices=E3_TYPES, default=["f32", "f16", "i8"], metavar="TYPE")
    add("--scale-type", nargs="+", choices=["f32", "f8E8M0FNU"], default=None, metavar="TYPE")
    add("--tflops", action="store_true", default=False, help="deprecated: always written")
    add("--abort-on-error", action="store_true", default=False, help="stop at the first error")
    add("--retune", action="store_true", default=False, help="ignore configs already tuned")
    add(
        "--retry",
        nargs="+",
        choices=list(retry_states),
        default=[],
        metavar="STATE",
        help="retry configs in these states",
    )
    add("--timeout", type=int, default=None, metavar="SECONDS", help="per config")
    if not e4 or E4_VARIANT == "lfbo":
        add("--verify-timeout", type=int, default=None, metavar="S", help="per verification")
    add(
        "--gpus",
        type=int,
        nargs="+",
        choices=available_gpus,
        default=available_gpus,
        metavar="GPU_ID",
        help=f"physical GPU ids (available: {available_gpus})",
    )
    add("--num-cpus", type=int, default=None, metavar="N", help="compile threads")
    add("--wait-for-compiles", action="store_true", default=False, help="compile all first")
    add("-s", "--status", action="store_true", default=False, help="only show the status")
    if os.environ.get("FAKE_TUNINGRUNNER_TWO_STAGE"):
        add("--two-stage-topk", type=int, default=None, metavar="K", help="E4: re-measure top K")
    return p


# ---------------------------------------------------------------------------------------------
# The "GPU": arch, candidates, times
# ---------------------------------------------------------------------------------------------


class Gpu:
    def __init__(self) -> None:
        if FAULT == "wrong_arch":
            self.arch, self.num_cu, self.num_chiplets = "gfx90a:sramecc+:xnack-", 110, 1
        else:
            self.arch = os.environ.get("FAKE_GPU_ARCH", "gfx942:sramecc+:xnack-")
            self.num_cu = int(os.environ.get("FAKE_GPU_NUM_CU", "304"))
            self.num_chiplets = int(os.environ.get("FAKE_GPU_NUM_CHIPLETS", "8"))
        self.chip = self.arch.split(":")[0]


def perf_configs(op: str, space: str, era: str) -> list[str]:
    """A deterministic, realistic-looking space; each smaller space is a prefix of the next."""
    out = []
    for m in (32, 64, 128, 256):
        for n in (32, 64, 128, 256):
            for kpb in (2, 4, 8):
                for split_k in (1, 2, 4):
                    out.append(_perf_config(op, era, m, n, kpb, split_k))
    return out[: SPACE_SIZES[space]]


def _perf_config(op: str, era: str, m: int, n: int, kpb: int, split_k: int) -> str:
    wave = min(m, n, 64)
    if era == "E4":
        return e4_named_perf_config(op, m, n, kpb, wave, split_k)
    era = BASE_ERA[era]
    if op == "attention":
        if era == "E2":
            return f"attn:v1:{m},{n},64,{kpb},{wave},{wave},32,4,1,1,1"
        return f"attn:v3:{m},{n},64,{kpb},{wave},{wave},32,4,1,1,2,0,1"
    if era == "E2":
        return f"v2:{m},{n},{kpb},{wave},32,4,{split_k},1,1"
    return f"v4:{m},{n},{kpb},{wave},{wave},32,4,{split_k},1,2,0,0,1,1"


def _unit(*parts: str) -> float:
    digest = hashlib.sha256("\x00".join(parts).encode()).digest()
    return int.from_bytes(digest[:8], "big") / 2.0**64


def candidate_time_ns(config: str, perf_config: str, flops: float) -> float | None:
    """The "driver's" time in ns for one candidate, or None when it is not applicable."""
    if _unit("applicable", config, perf_config) < 0.15:
        return None
    peak_tflops = 150.0
    ns = flops / (peak_tflops * 1e3) * (1.0 + 9.0 * _unit("time", config, perf_config))
    return round(max(ns, 1000.0), 1)


def compute_tflops(flops: float, ns: float | None) -> float:
    if ns is None:
        return math.nan
    return flops / (float(ns) * 1e-9) / 1e12


def measurements_ms(config: str, perf_config: str, ns: float) -> list[float]:
    """The driver's timed runs (ms) of a candidate: the time itself and five either side within
    2 %, so that their median is the time (E3's tuningRunner passes --use-median)."""
    ms = ns * 1e-6
    near = [0.02 * _unit(f"m{i}", config, perf_config) for i in range(10)]
    return [ms, *(ms * (1 - d) for d in near[:5]), *(ms * (1 + d) for d in near[5:])]


# ---------------------------------------------------------------------------------------------
# Parsing the config string (enough of perfRunner's from_command_line for flops and .debug)
# ---------------------------------------------------------------------------------------------

CONV_TYPES = {
    "conv": "f32",
    "convfp16": "f16",
    "convbfp16": "bf16",
    "convint8": "i8",
    "convfp8": "fp8",
    "convfp8_fp8": "fp8_fp8",
}


def _flag_pairs(tokens: list[str]) -> dict[str, str]:
    if len(tokens) % 2:
        raise ValueError("odd number of tokens")
    return {tokens[i]: tokens[i + 1] for i in range(0, len(tokens), 2)}


def describe(op: str, config: str, gpu: Gpu, era: str) -> tuple[dict, float]:
    """(the per-problem part of a .debug row, flops) for a config string."""
    tokens = config.split()
    if op == "conv":
        return _describe_conv(tokens, gpu)
    if op == "gemm":
        return _describe_gemm(tokens, gpu, era)
    if op == "attention":
        return _describe_attention(tokens, gpu, era)
    raise ValueError("the stand-in tunes conv, gemm and attention only")


def _describe_conv(tokens: list[str], gpu: Gpu) -> tuple[dict, float]:
    dtype = CONV_TYPES[tokens[0]] if tokens and not tokens[0].startswith("-") else "f32"
    rest = tokens[1:] if tokens and not tokens[0].startswith("-") else tokens
    f = _flag_pairs(rest)
    n, c, hi, wi, k = (int(f[x]) for x in ("-n", "-c", "-H", "-W", "-k"))
    y, x, g = int(f["-y"]), int(f["-x"]), int(f.get("-g", "1"))
    p, q, u, v = (int(f.get(x, d)) for x, d in (("-p", "0"), ("-q", "0"), ("-u", "1"), ("-v", "1")))
    dil_h, dil_w = int(f.get("-l", "1")), int(f.get("-j", "1"))
    ho = (hi + 2 * p - (y - 1) * dil_h - 1) // u + 1
    wo = (wi + 2 * q - (x - 1) * dil_w - 1) // v + 1
    flops = 2.0 * n * (c // g) * k * ho * wo * y * x
    row = {
        "Direction": {"1": "fwd", "2": "bwd", "4": "wrw"}[f.get("-F", "1")],
        "DataType": dtype,
        "Chip": gpu.chip,
        "numCU": gpu.num_cu,
        "FilterLayout": _map_layout(f.get("-f", "NCHW"), {"N": "k", "C": "c"}),
        "InputLayout": _map_layout(f.get("-I", "NCHW"), {"N": "n", "C": "c"}),
        "OutputLayout": _map_layout(f.get("-O", "NCHW"), {"N": "n", "C": "k"}),
        "N": n,
        "C": c,
        "H": hi,
        "W": wi,
        "K": k,
        "Y": y,
        "X": x,
        "DilationH": dil_h,
        "DilationW": dil_w,
        "StrideH": u,
        "StrideW": v,
        "PaddingH": p,
        "PaddingW": q,
    }
    return row, flops


def _map_layout(layout: str, nc: dict) -> str:
    table = dict(nc, H="0", W="1", G="g")
    return "".join(table.get(ch, ch) for ch in layout).lower()


def _bool(text: str) -> bool:
    return text.lower() in ("1", "true")


def _describe_gemm(tokens: list[str], gpu: Gpu, era: str) -> tuple[dict, float]:
    f = _flag_pairs(tokens)
    g, m, k, n = (int(f[x]) for x in ("-g", "-m", "-k", "-n"))
    row = {
        "DataType": f["-t"],
        "OutDataType": f.get("-out_datatype", f["-t"]),
        "Chip": gpu.chip,
        "numCU": gpu.num_cu,
        "TransA": _bool(f.get("-transA", "false")),
        "TransB": _bool(f.get("-transB", "false")),
        "G": g,
        "M": m,
        "K": k,
        "N": n,
    }
    if era == "E3":
        row.update(
            {
                "ScaledGemm": False,
                "ScaleADtype": "",
                "ScaleBDtype": "",
                "TransScaleA": False,
                "TransScaleB": False,
            }
        )
    return row, 2.0 * g * m * k * n


def _describe_attention(tokens: list[str], gpu: Gpu, era: str) -> tuple[dict, float]:
    f = _flag_pairs(tokens)
    g, sq, sk = int(f["-g"]), int(f["-seq_len_q"]), int(f["-seq_len_k"])
    dqk, dv = int(f["-head_dim_qk"]), int(f["-head_dim_v"])
    hq, hkv = int(f.get("-num_heads_q", "1")), int(f.get("-num_heads_kv", "1"))
    heads = g * max(hq, hkv)
    flops = 2.0 * heads * sq * dqk * sk + 2.0 * heads * sq * sk * dv
    row = {"DataType": f["-t"], "Chip": gpu.chip, "numCU": gpu.num_cu}
    for col, flag in (
        ("TransQ", "-transQ"),
        ("TransK", "-transK"),
        ("TransV", "-transV"),
        ("TransO", "-transO"),
    ):
        row[col] = _bool(f.get(flag, "false"))
    if era == "E3":
        row.update(
            {
                "Causal": _bool(f.get("-causal", "false")),
                "ReturnLSE": _bool(f.get("-return_lse", "false")),
                "SplitKV": int(f.get("-split_kv", "1")),
            }
        )
    if era == "E3":
        row["SlidingWindowLookBack"] = int(f.get("-sliding_window_lookback", "-1"))
    row["WithAttnScale"] = _bool(f.get("-with-attn-scale", "false"))
    if era == "E3":
        row["WithAttnBias"] = _bool(f.get("-with-attn-bias", "false"))
        row["TransBias"] = _bool(f.get("-transBias", "false"))
    row.update({"G": g, "SeqLenQ": sq, "SeqLenK": sk})
    if era == "E3":
        row.update({"NumHeadsQ": hq, "NumHeadsKV": hkv})
    row.update({"HeadDimQK": dqk, "HeadDimV": dv})
    return row, flops


def debug_columns(op: str, era: str) -> list[str]:
    if op == "conv":
        return CONV_COLUMNS
    if op == "gemm":
        return GEMM_COLUMNS_E2 if era == "E2" else GEMM_COLUMNS_E3
    return ATTN_COLUMNS_E2 if era == "E2" else ATTN_COLUMNS_E3


# ---------------------------------------------------------------------------------------------
# Tuning one config
# ---------------------------------------------------------------------------------------------


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
    gpu: Gpu,
    era: str,
    debug: bool,
    progress,
    not_compiled: frozenset[str] = frozenset(),
) -> Result:
    """Run the "driver" over the space; entries are .debug rows (TFlops NaN when N/A). The perf
    configs in `not_compiled` (E4 --benchmark-artifacts: their manifest status is not success)
    are not run: N/A, as the one-stage run finds them."""
    if op == "fusion":  # a fused kernel is tuned as the conv/gemm its key names
        op, config = fake_fusion.op_of(config), fake_fusion.strip_key_flags(config)
    problem, flops = describe(op, config, gpu, BASE_ERA[era])
    result = Result(config)
    for i, pc in enumerate(perf_configs(op, space, era)):
        measured = FAULT != "none" and pc not in not_compiled
        ns = candidate_time_ns(config, pc, flops) if measured else None
        # E4's driver gives up on some candidates (over their time budget): "Discarded".
        discarded = (
            era == "E4" and E4_VARIANT == "lfbo" and ns is not None and e4_discarded(config, pc)
        )
        if i > 0 and i % 100 == 0:
            progress(i, result)
        shown = "Discarded" if discarded else ("N/A" if ns is None else repr(ns))
        result.driver_lines.append(f"{pc}\t{shown}")
        entry = with_chiplets(problem, gpu) if BASE_ERA[era] == "E3" else dict(problem)
        entry["PerfConfig"] = pc
        if "LDSBankConflict" in debug_columns(op, BASE_ERA[era]):
            entry["LDSBankConflict"] = "NaN"  # perfRunner's value when rocprof metrics are absent
        entry["TFlops"] = math.nan if discarded else compute_tflops(flops, ns)
        if era == "E4" and op == "gemm":
            entry = e4_gemm_entry(entry)
        if era == "E4" and debug:
            e4_debug_cells(entry, config, pc, ns, discarded)
        elif BASE_ERA[era] == "E3" and debug:
            measured = ns is not None and not discarded
            entry["Stats"] = driver_stats(config, pc, ns) if measured else None
        result.entries.append(entry)
        if not math.isnan(entry["TFlops"]) and entry["TFlops"] > result.max_tflops:
            result.max_tflops, result.winner = entry["TFlops"], pc
    return result


def with_chiplets(problem: dict, gpu: Gpu) -> dict:
    """E3's table_entry: numChiplets right after numCU."""
    entry = {}
    for name, value in problem.items():
        entry[name] = value
        if name == "numCU":
            entry["numChiplets"] = gpu.num_chiplets
    return entry


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


def debug_cell(value) -> str:
    """A value as pandas' to_csv writes it (NaN and None empty, lists as their repr)."""
    if value is None or (isinstance(value, float) and math.isnan(value)):
        return ""
    return str(value)


def hang() -> None:
    """Sleep forever, with a child in the same process group (as the real driver pipeline is)."""
    # FAKE_TUNINGRUNNER_SETSID_CHILD=1: the child leaves the group and ignores SIGTERM (a
    # daemon the driver left behind); FAKE_TUNINGRUNNER_TOOL_PIDFILE: where this pid goes.
    escape = os.environ.get("FAKE_TUNINGRUNNER_SETSID_CHILD") == "1"
    code = "import signal, time\n" + (
        "signal.signal(signal.SIGTERM, signal.SIG_IGN)\n" if escape else ""
    )
    child = subprocess.Popen([sys.executable, "-c", code + "while True: time.sleep(60)"],
                             start_new_session=escape)  # fmt: skip
    if os.environ.get("FAKE_TUNINGRUNNER_TOOL_PIDFILE"):
        with open(os.environ["FAKE_TUNINGRUNNER_TOOL_PIDFILE"], "w") as f:
            f.write(f"{os.getpid()}\n")
    pidfile = os.environ.get("FAKE_TUNINGRUNNER_CHILD_PIDFILE")
    if pidfile:
        with open(pidfile, "w") as f:
            f.write(f"{child.pid}\n")
    if os.environ.get("FAKE_TUNINGRUNNER_IGNORE_SIGTERM") == "1":
        signal.signal(signal.SIGTERM, signal.SIG_IGN)
    while True:
        time.sleep(60)


def fault_for(config: str) -> str:
    """FAKE_TUNINGRUNNER_FAULT, for the configs containing FAKE_TUNINGRUNNER_FAULT_CONFIG only
    when that is set (one bad config among several of one call)."""
    only = os.environ.get("FAKE_TUNINGRUNNER_FAULT_CONFIG")
    # E4 keys spell `-transO false`; the TEXT may be given without it
    plain = config.replace(" -transO false", "")
    return FAULT if not only or only in config or only in plain else ""


def maybe_delay() -> None:
    delay = float(os.environ.get("FAKE_TUNINGRUNNER_DELAY", "0") or 0)
    if delay > 0:
        time.sleep(delay)


def write_garbage(out) -> None:
    """A file whose second line has a non-numeric numCUs and too few fields."""
    out.write(
        V3_HEADER + "\n"
        if ERA == "E3"
        else "# arch\tnumCUs\ttestVector\tperfConfig\tTFlops (exhaustive)\n"
    )
    out.write("gfx942:sramecc+:xnack-\tthree hundred\t-t f16\n")


def crash_partial(out) -> None:
    out.write(
        V3_HEADER + "\n"
        if ERA == "E3"
        else "# arch\tnumCUs\ttestVector\tperfConfig\tTFlops (exhaustive)\n"
    )
    out.write("gfx942:sramecc+:xnack-\t30")
    out.flush()
    sys.stderr.write("Segmentation fault (core dumped)\n")
    sys.stderr.flush()
    os._exit(139)


def open_output(path: str):
    return sys.stdout if path == "-" else open(path, "a")


# ---------------------------------------------------------------------------------------------
# E2 main
# ---------------------------------------------------------------------------------------------


def e2_main(argv: list[str]) -> int:
    gpu = Gpu()
    args = e2_parser().parse_args(argv)
    if args.op not in ("conv", "gemm", "attention", "fusion"):
        raise RuntimeError("Tuning operation was not provided/found")
    if args.op == "fusion":
        configs = [key for _, key in fake_fusion.fusion_configs(None, args.test_dir)]
    else:
        configs = args.config if args.config else read_configs_file(args.configs_file)
    winners, all_entries = [], []
    for config in configs:
        print("Tuning:", config, file=sys.stderr)
        maybe_delay()
        if FAULT == "hang":
            hang()
        if FAULT == "fail":
            e2_fail()
        result = tune(
            args.op,
            config,
            args.tuning_space,
            gpu,
            "E2",
            args.debug,
            lambda i, r: e2_progress(args, i, r),
        )
        if args.debug:
            print("\n".join(result.driver_lines), file=sys.stderr)
        all_entries.extend(result.entries)
        if FAULT == "empty":
            # E2's quirk: a verification failure returns (None, None) and main() just returns.
            print(f"Verifying with perfConfig = {result.winner}", file=sys.stderr)
            print("Verification failed:\nOutput = \nErrors = [0 0 0]", file=sys.stderr)
            return 0
        e2_report(args, result)
        winners.append(result)
    if args.debug:
        e2_write_debug(args, all_entries)
    with open_output(args.output) as out:
        if FAULT == "garbage":
            write_garbage(out)
            return 0
        if FAULT == "crash_partial":
            crash_partial(out)
        e2_write_output(args, gpu, winners, out)
    return 0


def e2_fail() -> None:
    print(
        "Traceback (most recent call last):\n"
        '  File "./bin/tuningRunner.py", line 318, in <module>\n'
        "    sys.exit(main())\n"
        "RuntimeError: ERROR: rocmlir-tuning-driver failed (FAKE_TUNINGRUNNER_FAULT=fail)",
        file=sys.stderr,
    )
    sys.exit(1)


def e2_progress(args, i: int, result: Result) -> None:
    if not args.quiet and not args.compact_print:
        print(
            f"Tested {i} configs, best perf {result.max_tflops} TFlops on perf_config "
            f"{result.winner}",
            file=sys.stderr,
        )


def e2_report(args, result: Result) -> None:
    tv, pc, tf = result.test_vector, result.winner, result.max_tflops
    if args.verify_mode != "none":
        print(f"Verifying with perfConfig = {pc}", file=sys.stderr)
        print(
            f"Tuned and verified : {tv} : {pc} with {tf} TFlops and {tf * 0.97} on verification",
            file=sys.stderr,
        )
        if args.verify_mode == "gpu":
            print("Note: Verify tflops counts verification kernel", file=sys.stderr)
    else:
        print(f"Tuned : {tv} : {pc} with {tf} TFlops", file=sys.stderr)


def e2_write_debug(args, entries: list[dict]) -> None:
    columns = list(entries[0].keys()) if entries else []
    # pandas' to_csv(sep='\t') with its default index=True: an unnamed first column.
    lines = ["\t".join(["", *columns])]
    for i, e in enumerate(entries):
        lines.append("\t".join([str(i)] + [debug_cell(e[c]) for c in columns]))
    print("\n".join(lines[:20]), file=sys.stderr)  # stands in for print(allData)
    with open(f"{args.output}.debug", "w") as f:
        f.write("\n".join(lines) + "\n")


def e2_write_output(args, gpu: Gpu, winners: list[Result], out) -> None:
    space = args.tuning_space
    if args.tflops:
        print(f"# arch\tnumCUs\ttestVector\tperfConfig\tTFlops ({space})", file=out)
    else:
        print(f"# arch\tnumCUs\ttestVector\tperfConfig ({space})", file=out)
    for r in winners:
        if args.tflops:
            print(
                f"Arch = {gpu.arch}({gpu.num_cu} CUs), vector = '{r.test_vector}', "
                f"perfConfig = {r.winner}, TFlops = {r.max_tflops}",
                file=sys.stderr,
            )
            print(
                f"{gpu.arch}\t{gpu.num_cu}\t{r.test_vector}\t{r.winner}\t{r.max_tflops}",
                file=out,
            )
        else:
            print(
                f"Arch = {gpu.arch}({gpu.num_cu} CUs), vector = '{r.test_vector}', "
                f"perfConfig = {r.winner}",
                file=sys.stderr,
            )
            print(f"{gpu.arch}\t{gpu.num_cu}\t{r.test_vector}\t{r.winner}", file=out)


# perfRunner's GemmConfiguration.from_command_line at rocMLIR 3fc5be9e: its flags, its required.
E3_GEMM_FLAGS = ("-t", "-g", "-m", "-k", "-n", "-transA", "-transB", "-out_datatype",
                 "-perf_config", "-perf_priority", "-scale_a_dtype", "-scale_b_dtype",
                 "-transScaleA", "-transScaleB")  # fmt: skip
E3_GEMM_REQUIRED = ("-t", "-out_datatype", "-g", "-m", "-k", "-n", "-transA", "-transB")


def e3_check_gemm(config: str, from_file: bool) -> None:
    """The real tool canonicalizes every line before tuning any: one it cannot parse is a
    ValueError traceback, exit 1, nothing tuned (no rows, no .state). With -c, the tool's own
    expansion supplies -out_datatype/-transA/-transB first."""
    tokens = config.split()
    pairs = dict(zip(tokens[::2], tokens[1::2], strict=False))
    why = None
    for opt, val in pairs.items():
        if opt != "-scaledGemm" and opt not in E3_GEMM_FLAGS:
            why = f"Unknown GEMM config argument {opt} -> {val}"
            break
    missing = [f for f in E3_GEMM_REQUIRED if f not in pairs]
    if from_file:
        missing = [f for f in missing if f not in ("-out_datatype", "-transA", "-transB")]
    if why is None and missing:
        why = "Incomplete GEMM configuration"
    if why is None:
        return
    error = f"Failed to parse '{config}' as GemmConfiguration: {why}"
    if from_file:
        source = "/tmp/tuning_configs_fake.txt"
        error = f"Failed to canonicalize config from {source} '{config}': {error}"
    print("Traceback (most recent call last):", file=sys.stderr)
    print('  File "tuningRunner.py", line 2165, in main', file=sys.stderr)
    print(f"ValueError: {error}", file=sys.stderr)
    sys.exit(1)


def read_configs_file(path: str) -> list[str]:
    if path == "-":
        lines = [line.strip() for line in sys.stdin]
    else:
        with open(path) as f:
            lines = [line.strip() for line in f]
    return [line for line in lines if line and not line.startswith("#")]


# ---------------------------------------------------------------------------------------------
# E3 main
# ---------------------------------------------------------------------------------------------


class Log:
    def __init__(self, quiet: bool) -> None:
        self.quiet = quiet

    def _emit(self, level: str, msg: str) -> None:
        lines = msg.splitlines() or [""]
        print(
            "{}: {}".format(level, "\n".join([lines[0]] + ["    " + x for x in lines[1:]])),
            file=sys.stderr,
        )

    def info(self, msg: str) -> None:
        if not self.quiet:
            self._emit("INFO", msg)

    def warning(self, msg: str) -> None:
        if not self.quiet:
            self._emit("WARNING", msg)

    def error(self, msg: str) -> None:
        self._emit("ERROR", msg)


def e3_main(argv: list[str]) -> int:
    available = list(range(int(os.environ.get("FAKE_GPU_COUNT", "8"))))
    rocr, hip = os.environ.get("ROCR_VISIBLE_DEVICES"), os.environ.get("HIP_VISIBLE_DEVICES")
    parser = e3_parser(available)
    args = parser.parse_args(argv)
    if FAULT == "usage":  # a command line the tool refuses: argparse's error, exit 2
        parser.error("argument --op: refused (FAKE_TUNINGRUNNER_FAULT=usage)")
    if args.op == "fusion" and not args.test_dir:  # the real tool: modules from a directory
        parser.error("argument --op=fusion: requires --test-dir to be specified")
    if args.test_dir and args.op != "fusion":
        parser.error("argument --test-dir: only valid with --op=fusion")
    log = Log(args.quiet)
    if rocr or hip:
        names = [
            n
            for n in (
                f"ROCR_VISIBLE_DEVICES={rocr}" if rocr else "",
                f"HIP_VISIBLE_DEVICES={hip}" if hip else "",
            )
            if n
        ]
        log.warning(
            "Ignoring {}. This script manages GPU visibility internally. Use '--gpus' "
            "to select specific GPUs.".format(" and ".join(names))
        )
    gpu = Gpu()
    if args.op not in ("conv", "gemm", "attention", "fusion"):
        log.error("the stand-in tunes conv, gemm, attention and fusion only")
        return 1
    if args.op == "fusion":
        configs = [key for _, key in fake_fusion.fusion_configs(None, args.test_dir)]
        with open("fusion_config_file", "w") as f:  # in the working directory, as the real one
            f.writelines(f"{fake_fusion.strip_key_flags(c)}\n" for c in configs)
    else:
        configs = [args.config] if args.config else read_configs_file(args.configs_file)
        if args.op == "gemm":
            for config in configs:  # every line parsed before anything is tuned
                e3_check_gemm(config, from_file=not args.config)
    context = f"{gpu.chip}/{gpu.num_cu}/{gpu.num_chiplets}/{args.tuning_space}"
    pending = configs if args.retune else [c for c in configs if not e3_already_tuned(args, gpu, c)]
    if len(pending) < len(configs):
        log.info(
            f"Skipping {len(configs) - len(pending)} already tuned config(s) - use '--retune' "
            "to retune"
        )
    if args.status:
        log.info(f"{len(pending)}/{len(configs)} config(s) pending tuning")
        return 0
    if not pending:
        log.info("No configurations to tune")
        return 0
    gpu_id = args.gpus[0]
    log.info(f"Using 1 GPU(s)\nGPU {gpu_id}: NUMA node 0, 16 compile threads")
    failed: dict[str, str] = {}
    header_written = False
    debug_path = None if args.output == "-" else f"{args.output}.debug"
    if args.debug and debug_path is None:
        log.warning("Debug output disabled when writing to stdout")
    with open_output(args.output) as out:
        for config in pending:
            start = time.time()
            timestamp = datetime.datetime.now(datetime.UTC).strftime("%Y-%m-%dT%H:%M:%SZ")
            state = e3_tune_one(args, gpu, gpu_id, config, log, out)
            if isinstance(state, str):
                failed[config] = state
                log.error(f"Tuning unsuccessful for '{config}' on GPU {gpu_id}")
                if args.abort_on_error:
                    break
                continue
            if not header_written:
                print(V3_HEADER, file=out)
                header_written = True
            duration = max(time.time() - start, 0.01)
            print(
                "\t".join(
                    [
                        gpu.arch,
                        str(gpu.num_cu),
                        str(gpu.num_chiplets),
                        config,
                        state.winner,
                        str(state.max_tflops),
                        args.tuning_space,
                        os.environ.get(
                            "FAKE_TUNINGRUNNER_COMMIT", "0123456789abcdef0123456789abcdef01234567"
                        ),
                        timestamp,
                        f"{duration:.1f}",
                    ]
                ),
                file=out,
            )
            out.flush()
            if args.debug and debug_path:
                e3_append_debug(debug_path, state.entries)
            log.info(f"Tuning successful for '{config}' on GPU {gpu_id}")
    if failed:
        e3_write_state(args.output, context, failed)
        log.error("Encountered errors during tuning")
        return 1
    log.info("Tuning completed successfully")
    return 0


def e3_tune_one(args, gpu: Gpu, gpu_id: int, config: str, log: Log, out):
    """The Result, or the state name ("failed"/"timed_out") when tuning this config failed."""
    delay = float(os.environ.get("FAKE_TUNINGRUNNER_DELAY", "0") or 0)
    if args.timeout is not None and delay > args.timeout:
        time.sleep(args.timeout)
        log.error(
            f"[GPU {gpu_id}] Tuning timed out after {args.timeout}s\nReproduce: "
            f"ROCR_VISIBLE_DEVICES={gpu_id} rocmlir-gen ... | rocmlir-tuning-driver ..."
        )
        return "timed_out"
    maybe_delay()
    fault = fault_for(config)
    pipeline = f"rocmlir-gen {config} | rocmlir-tuning-driver --tuning-space={args.tuning_space}"
    if fault == "hang":
        hang()
    if fault == "fail":
        log.error(
            f"[GPU {gpu_id}] Tuning pipeline failed\nExit code: 1\nReproduce: "
            f"ROCR_VISIBLE_DEVICES={gpu_id} {pipeline}\nSTDERR:\nCompilation failed"
        )
        return "failed"
    fake_costs.one_stage(len(perf_configs(args.op, args.tuning_space, "E3")), gpu_id)
    result = tune(args.op, config, args.tuning_space, gpu, "E3", args.debug, lambda i, r: None)
    if getattr(args, "two_stage_topk", None):
        two_stage(result, config, args.two_stage_topk)
    if result.winner == "None":
        log.error(f"[GPU {gpu_id}] No valid perf config found")
        return "failed"
    if fault == "empty":
        sys.exit(0)  # forced: the real E3 exits 1 here; the E2 quirk, for both eras
    if fault == "garbage":
        write_garbage(out)
        sys.exit(0)
    if fault == "crash_partial":
        crash_partial(out)
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
        factor = 0.97 + 0.06 * _unit("precise", config, e["PerfConfig"])
        e["TFlops"] /= factor
        if e.get("Stats"):
            stats = e["Stats"]
            kept = ("cv", "iterations")  # the rest are times (ms)
            e["Stats"] = {k: v if k in kept else float(f"{v * factor:e}") for k, v in stats.items()}
        if e.get("MeasurementsMs"):
            e["MeasurementsMs"] = [float(f"{m * factor:e}") for m in e["MeasurementsMs"]]
        if e["TFlops"] > result.max_tflops:
            result.max_tflops, result.winner = e["TFlops"], e["PerfConfig"]


def e3_already_tuned(args, gpu: Gpu, config: str) -> bool:
    if args.output == "-" or not os.path.exists(args.output):
        return False
    with open(args.output) as f:
        for line in f:
            fields = line.rstrip("\n").split("\t")
            if line.startswith("#") or len(fields) != 10:
                continue
            if (
                fields[0] in (gpu.arch, gpu.chip)
                and fields[1] == str(gpu.num_cu)
                and fields[2] == str(gpu.num_chiplets)
                and fields[3] == config
                and fields[6] == args.tuning_space
                and fields[4] != "None"
            ):
                return True
    return False


def e3_append_debug(path: str, entries: list[dict]) -> None:
    columns = list(entries[0].keys())
    write_header = not (os.path.exists(path) and os.path.getsize(path) > 0)
    with open(path, "a") as f:
        if write_header:
            f.write("\t".join(columns) + "\n")
        for e in entries:
            f.write("\t".join(debug_cell(e[c]) for c in columns) + "\n")


def e3_write_state(output: str, context: str, failed: dict) -> None:
    if output == "-":
        return
    path = output + ".state"
    data = {"contexts": {}}
    if os.path.exists(path):
        with open(path) as f:
            data = json.load(f)
    data["contexts"].setdefault(context, {}).update(failed)
    with open(path, "w") as f:
        json.dump(data, f, indent=2)


# ---------------------------------------------------------------------------------------------
# E2.5 (rocMLIR, late 2025): E2's command line plus the greedy space; a "# commit:" line before
# each invocation's header, the space in the perfConfig column's parentheses, numChiplets after
# numCUs in the later builds (FAKE_E25_NUM_CHIPLETS=0 for the earlier ones), failures written
# into the file as "### " lines (and exit 1).
# ---------------------------------------------------------------------------------------------

E25_SPACES = ["quick", "full", "greedy", "exhaustive"]


def e25_parser() -> argparse.ArgumentParser:
    p = e2_parser()
    for action in p._actions:  # the one change to E2's flags: a greedy space, default full
        if action.dest == "tuning_space":
            action.choices, action.default = E25_SPACES, "full"
    p.description = "Stand-in for the E2.5 rocMLIR tuning runner (conv, gemm, attention)"
    return p


def e25_header(space: str, tflops: bool) -> str:
    chiplets = "\tnumChiplets" if os.environ.get("FAKE_E25_NUM_CHIPLETS", "1") == "1" else ""
    tail = f"perfConfig ({space})" + ("\tTFlops" if tflops else "")
    return f"# arch\tnumCUs{chiplets}\ttestVector\t{tail}"


def e25_main(argv: list[str]) -> int:
    gpu = Gpu()
    args = e25_parser().parse_args(argv)
    if args.op not in ("conv", "gemm", "attention"):
        raise RuntimeError("Tuning operation was not provided/found")
    configs = args.config if args.config else read_configs_file(args.configs_file)
    with_chiplets = os.environ.get("FAKE_E25_NUM_CHIPLETS", "1") == "1"
    lines = [f"# commit: {commit_id()}", e25_header(args.tuning_space, args.tflops)]
    entries: list[dict] = []
    failed = False
    for config in configs:
        print("Tuning:", config, file=sys.stderr)
        maybe_delay()
        if FAULT == "hang":
            hang()
        result = None
        if FAULT != "fail":
            result = tune(args.op, config, args.tuning_space, gpu, "E2.5", args.debug, noop)
        if result is None or result.winner == "None":
            reason = "rocmlir-tuning-driver failed" if result is None else "no valid perf config"
            lines.append(f"### Tuning failed for '{config}': {reason}")
            print(f"ERROR: {reason} for '{config}'", file=sys.stderr)
            failed = True
            continue
        entries.extend(result.entries)
        fields = [gpu.arch, str(gpu.num_cu)]
        if with_chiplets:
            fields.append(str(gpu.num_chiplets))
        fields += [config, result.winner]
        if args.tflops:
            fields.append(str(result.max_tflops))
        lines.append("\t".join(fields))
        e2_report(args, result)
    if args.debug and entries:
        e2_write_debug(args, entries)
    with open_output(args.output) as out:
        out.write("\n".join(lines) + "\n")
    return 1 if failed else 0


def noop(*_args) -> None:
    return None


def commit_id() -> str:
    """FAKE_TUNINGRUNNER_COMMIT, else the commit the build's marker states (where a real
    tuningRunner asks git of its checkout; mlirtuna reads the same line at `session new`)."""
    return os.environ.get("FAKE_TUNINGRUNNER_COMMIT", MARKER_COMMIT)


def marker_commit() -> str:
    bin_dir = os.path.dirname(os.path.realpath(__file__))
    try:
        with open(os.path.join(bin_dir, os.pardir, "MLIRTUNA_STANDIN.md")) as f:
            text = f.read(16384)
    except OSError:
        return "unknown"  # what E3 writes when git cannot say
    for line in text.splitlines():
        if line.startswith("commit: "):
            return line.split()[1]
    return "unknown"  # what E3 writes when git cannot say


MARKER_COMMIT = marker_commit()


# ---------------------------------------------------------------------------------------------
# E4 (rocmlirTriton's tuningRunner 520c8752 with perfRunner eb003bed, the set the conformance
# tier runs): E3's ten columns and .state, plus its own flags (time budgets, GPU run timeout,
# two-stage top k, cross compilation), named perf configs, every config canonicalized as its
# perfRunner prints it (gemm: `-transO false|true` after -transB, no -supportsSplitK); `-c`
# lines without -transO expanded to both values, as get_gemm_configurations does; with --debug,
# `MeasurementsMs` (every run's time in ms, the driver's --show-all-measurements) and `Status`
# (Measured, N/A, Discarded: outside the top k); driver exit status 3 (the GPU run timed out)
# recorded as state gpu_timed_out (FAKE_TUNINGRUNNER_FAULT=gpu_timeout).
# FAKE_TUNINGRUNNER_E4=lfbo: the other stored rocmlirTriton tuningRunner (the lfbo space,
# --lfbo-effort, --verify-timeout), whose keys also end `-supportsSplitK` and whose driver
# drops some candidates over their time budget ("Discarded" without a top k, its lines logged).
# ---------------------------------------------------------------------------------------------

E4_VARIANT = os.environ.get("FAKE_TUNINGRUNNER_E4", "")
E4_SPACES = ["quick", "full", "exhaustive"] + (["lfbo"] if E4_VARIANT == "lfbo" else [])
E4_RETRY_STATES = ("failed", "timed_out", "gpu_timed_out", "crashed")
GPU_TIMEOUT_EXIT_CODE = 3
# The stand-in's names for rocmlirTriton's named fields (19 for gemm, as the real form has).
E4_GEMM_KEYS = [
    "mPerBlock",
    "nPerBlock",
    "kPerBlock",
    "mPerWave",
    "nPerWave",
    "mnPerXdl",
    "kPack",
    "splitKFactor",
    "scheduleVersion",
    "outputSwizzle",
    "wavesPerEU",
    "gridGroupSize",
    "forceUnroll",
    "bCopyMore",
    "lds2Stage",
    "directToLds",
    "streamK",
    "kOuter",
    "kInner",
]
E4_ATTN_KEYS = [
    "mPerBlockG0",
    "mPerBlockG1",
    "nPerBlockG0",
    "kPackPerBlock",
    "mPerWave",
    "nPerWave",
    "mnPerXdl",
    "kPack",
    "splitKFactor",
    "scheduleVersion",
    "outputSwizzle",
    "wavesPerEU",
    "forceUnroll",
]


def e4_named_perf_config(op: str, m: int, n: int, kpb: int, wave: int, split_k: int) -> str:
    if op == "attention":
        values = [m, n, 64, kpb, wave, wave, 32, 4, 1, 1, 2, 0, 1]
        pairs = zip(E4_ATTN_KEYS, values, strict=True)
        return "attn:" + ",".join(f"{k}={v}" for k, v in pairs)
    values = [m, n, kpb, wave, wave, 32, 4, split_k, 1, 2, 0, 0, 1, 1, 0, 0, 0, 1, 1]
    return "gemm:" + ",".join(f"{k}={v}" for k, v in zip(E4_GEMM_KEYS, values, strict=True))


def e4_discarded(config: str, perf_config: str) -> bool:
    return _unit("discarded", config, perf_config) < 0.1


def e4_parser(available_gpus: list[int]) -> argparse.ArgumentParser:
    p = e3_parser(
        available_gpus, "rocmlirTriton tuning runner", E4_SPACES, E4_RETRY_STATES, False, True
    )
    p.description = "Stand-in for the E4 rocmlirTriton tuning runner (conv, gemm, attention)"
    add = p.add_argument
    add("--target-arch", default=None, metavar="ARCH", help="compile for this arch")
    add("--target-num-cu", type=int, default=None, metavar="N", help="compile for N CUs")
    add("--target-num-chiplets", type=int, default=None, metavar="N", help="and N chiplets")
    artifacts = p.add_mutually_exclusive_group()
    artifacts.add_argument("--compile-only", metavar="DIR", help="compile bundles, no GPU")
    artifacts.add_argument("--benchmark-artifacts", metavar="DIR", help="benchmark bundles")
    if os.environ.get("FAKE_TUNINGRUNNER_STREAM") == "1":  # the proposed extension (below)
        artifacts.add_argument(
            "--benchmark-stream", action="store_true", default=False,
            help="benchmark bundles named by JSON requests on stdin, one at a time",
        )  # fmt: skip
    add("--allow-commit-mismatch", action="store_true", default=False, help="other commits' ok")
    add("--gpu-run-timeout", type=int, default=None, metavar="S", help="per GPU run")
    add("--perf-config-timeout", type=int, default=None, metavar="S", help="per candidate")
    add("--rep", type=int, default=100, metavar="MS", help="benchmark time budget")
    add("--warmup", type=int, default=25, metavar="MS", help="warm-up time budget")
    if E4_VARIANT == "lfbo":
        add("--lfbo-effort", choices=["quick", "full"], default="quick", help="lfbo effort")
    add("--two-stage", action="store_true", default=False, help="re-measure the best")
    add("--two-stage-topk", type=int, default=0, metavar="K", help="how many to re-measure")
    add("--verify-winning-config", action="store_true", default=False, help="verify the winner")
    add("--verify-all-perfconfigs", action="store_true", default=False, help="verify all")
    add("--flush-last-level-cache", action="store_true", default=False, help="flush the LLC")
    return p


E4_GEMM_VALUE_FLAGS = ("-t", "-out_datatype", "-transA", "-transB", "-transO", "-g", "-m")
E4_GEMM_VALUE_FLAGS += ("-n", "-k")


def e4_gemm_canonical(config: str) -> str:
    """perfRunner eb003bed's GemmConfiguration.from_command_line then to_command_line: -transO
    false unless given, always printed after -transB; ValueError as the real parser raises."""
    tokens = config.split()
    values: dict[str, str] = {}
    i = 0
    while i < len(tokens):
        if i + 1 >= len(tokens):
            raise ValueError(f"Missing value for argument {tokens[i]}")
        opt, val = tokens[i], tokens[i + 1]
        if opt == "-supportsSplitK" and E4_VARIANT == "lfbo":  # its keys' own suffix
            i += 2
            continue
        if opt not in E4_GEMM_VALUE_FLAGS and opt != "-perf_config":
            raise ValueError(f"Unknown GEMM config argument {opt} -> {val}")
        values[opt] = val
        i += 2
    if any(f not in values for f in E4_GEMM_VALUE_FLAGS if f != "-transO"):
        raise ValueError("Incomplete GEMM configuration")

    def b(flag: str) -> str:
        return "true" if values.get(flag, "false").lower() in ("1", "true") else "false"

    return (
        f"-t {values['-t']} -out_datatype {values['-out_datatype'].lower()} "
        f"-transA {b('-transA')} -transB {b('-transB')} -transO {b('-transO')} "
        f"-g {int(values['-g'])} -m {int(values['-m'])} -n {int(values['-n'])} "
        f"-k {int(values['-k'])}"
    )


def e4_key(op: str, config: str) -> str:
    """The key the tool canonicalizes a config to (its perfRunner's to_command_line): gemm in
    perfRunner's own form; the stand-in trusts the other ops' lines to be canonical already.
    The lfbo variant appends -supportsSplitK (false for attention)."""
    if op == "gemm":
        # kept verbatim when it cannot be parsed, as canonicalize_configs does: it fails later
        with contextlib.suppress(ValueError):
            config = e4_gemm_canonical(config)
    if E4_VARIANT != "lfbo" or "-supportsSplitK" in config.split():
        return config
    return f"{config} -supportsSplitK {'false' if op == 'attention' else 'true'}"


def e4_expand_gemm(lines: list[str]) -> list[str]:
    """get_gemm_configurations for lines that give -t, -out_datatype, -transA and -transB: a
    line without `-transO ` becomes two configs, -transO false and -transO true (after the
    line's other flags are in; order: -transO false's of every line, then true's)."""
    configs: list[str] = []
    for trans_o in ("false", "true"):
        for line in lines:
            one = line if "-transO " in line else f"-transO {trans_o} {line}"
            if one not in configs:
                configs.append(one)
    return configs


def e4_gemm_entry(entry: dict) -> dict:
    """GEMM_TEST_PARAMETERS of reportUtils 046da074: TransO after TransB."""
    out = {}
    for name, value in entry.items():
        out[name] = value
        if name == "TransB":
            out["TransO"] = entry.get("TransO", False)
    return out


def e4_measurements(config: str, perf_config: str, ns: float) -> list[float]:
    """--show-all-measurements: every run's hipEventElapsedTime in ms, in the order run, as
    llvm::raw_ostream prints a double (%e) and json.loads reads it back. Eleven runs whose
    median is the candidate's time (the driver's --use-median): five faster, five slower."""
    ms = ns * 1e-6
    below = [ms * (1 - 0.02 * _unit(f"lo{i}", config, perf_config)) for i in range(5)]
    above = [ms * (1 + 0.02 * _unit(f"hi{i}", config, perf_config)) for i in range(5)]
    runs = [ms, *below, *above]
    order = sorted(range(11), key=lambda i: _unit(f"order{i}", config, perf_config))
    return [float(f"{runs[i]:e}") for i in order]


def e4_debug_cells(entry: dict, config: str, pc: str, ns: float | None, discarded: bool) -> None:
    """find_best_perfconfig with --debug: MeasurementsMs (None unless measured) and Status."""
    measured = ns is not None and not discarded
    if measured:
        entry["MeasurementsMs"] = e4_measurements(config, pc, ns)
        entry["Status"] = "Measured"
    else:
        entry["MeasurementsMs"] = None
        entry["Status"] = "Discarded" if discarded else "N/A"


def e4_main(argv: list[str]) -> int:
    available = list(range(int(os.environ.get("FAKE_GPU_COUNT", "8"))))
    parser = e4_parser(available)
    args = parser.parse_args(argv)
    log = Log(args.quiet)
    if getattr(args, "benchmark_stream", False):
        return e4_stream(args, log)
    if not (args.config or args.configs_file or args.test_dir):
        parser.error("one of the arguments -c/--configs-file --config --test-dir is required")
    if args.op is None:
        parser.error("the following arguments are required: --op/--operation")
    if args.op not in ("conv", "gemm", "attention"):
        log.error("the stand-in tunes conv, gemm and attention only")
        return 1
    if args.tuning_space == "lfbo" and args.compile_only:
        return usage_error("--tuning-space lfbo is not allowed with --compile-only")
    targets = (args.target_arch, args.target_num_cu, args.target_num_chiplets)
    if any(v is not None for v in targets) and not (args.compile_only or args.benchmark_artifacts):
        return usage_error(
            "--target-arch, --target-num-cu and --target-num-chiplets are only allowed with "
            "--compile-only or --benchmark-artifacts"
        )
    configs = [args.config] if args.config else read_configs_file(args.configs_file)
    if args.op == "gemm" and not args.config:
        configs = e4_expand_gemm(configs)  # perfRunner.get_gemm_configurations
    configs = [e4_key(args.op, c) for c in configs]  # canonicalize_configs
    if args.compile_only:
        return e4_compile_only(args, configs, log)
    gpu = Gpu()
    gpu_id = args.gpus[0]
    if not args.benchmark_artifacts:
        measure = e4_one_stage(args, gpu, gpu_id)
    else:
        measure = e4_bundle_benchmark(args, gpu, gpu_id, configs, log)
        if measure is None:
            return 1
        if isinstance(measure, int):
            return measure
    log.info(f"Using 1 GPU(s)\nGPU {gpu_id}: rep {args.rep} ms, warmup {args.warmup} ms")
    return e4_tune_all(args, gpu, gpu_id, configs, measure, log)


def e4_one_stage(args, gpu: Gpu, gpu_id: int):
    """Measure one config the one-stage way: compile every candidate, then benchmark them."""

    def measure(config: str) -> Result | str:
        fake_costs.one_stage(len(perf_configs(args.op, args.tuning_space, "E4")), gpu_id)
        return tune(args.op, config, args.tuning_space, gpu, "E4", args.debug, noop)

    return measure


def e4_tune_all(args, gpu: Gpu, gpu_id: int, configs: list[str], measure, log: Log) -> int:
    """Both E4 modes that use a GPU: each config measured (`measure` gives its Result or the
    failed state), its row written and flushed at once, `.debug` appended, `.state` at the end."""
    context = f"{gpu.chip}/{gpu.num_cu}/{gpu.num_chiplets}/{args.tuning_space}"
    failed: dict[str, str] = {}
    bundle_faults = 0
    header_written = False
    debug_path = None if args.output == "-" else f"{args.output}.debug"
    with open_output(args.output) as out:
        for config in configs:
            key = e4_key(args.op, config)
            if args.op == "gemm":
                e4_parse_or_crash(args, context, failed, key)
            start = time.time()
            stamp = datetime.datetime.now(datetime.UTC).strftime("%Y-%m-%dT%H:%M:%SZ")
            maybe_delay()
            fault = fault_for(config)
            if fault in ("gpu_timeout", "fail"):
                code = GPU_TIMEOUT_EXIT_CODE if fault == "gpu_timeout" else 1
                state = "gpu_timed_out" if code == GPU_TIMEOUT_EXIT_CODE else "failed"
                log.error(
                    f"[GPU {gpu_id}] Tuning pipeline failed\nExit code: {code}\n"
                    + ("GPU run timed out" if state == "gpu_timed_out" else "Compilation failed")
                )
                failed[key] = state
                continue
            result = measure(config)
            if result is None:  # a bundle fault: the next run retries it
                bundle_faults += 1
                continue
            if isinstance(result, str):
                failed[key] = result
                continue
            if args.two_stage_topk and not args.benchmark_artifacts:
                # rocmlirTriton benchmarks a bundle in one precise pass: no top k there
                two_stage(result, config, args.two_stage_topk)
            if args.debug and E4_VARIANT == "lfbo":  # 520c8752 keeps the driver's lines
                for line in result.driver_lines:
                    log.info(f"[GPU {gpu_id}] {line}")
            if result.winner == "None":
                log.error(f"[GPU {gpu_id}] No valid perf config found")
                failed[key] = "failed"
                continue
            if not header_written:
                print(V3_HEADER, file=out)
                header_written = True
            fields = [gpu.arch, str(gpu.num_cu), str(gpu.num_chiplets), key, result.winner]
            fields += [str(result.max_tflops), args.tuning_space, commit_id(), stamp]
            fields.append(f"{max(time.time() - start, 0.01):.1f}")
            print("\t".join(fields), file=out)
            out.flush()
            if args.debug and debug_path:
                e3_append_debug(debug_path, result.entries)
    if failed:
        e3_write_state(args.output, context, failed)
        log.error("Encountered errors during tuning")
        return 1
    return 1 if bundle_faults else 0


def e4_parse_or_crash(args, context: str, failed: dict, key: str) -> None:
    """tune_config's from_command_line raises ValueError for a line canonicalize_configs kept
    verbatim: it escapes the worker thread and ends the run (traceback, exit 1); the config it
    was on is left `interrupted` in `.state` (finalize_interrupted), rows already written stay."""
    try:
        e4_gemm_canonical(key)
    except ValueError as e:
        failed[key] = "interrupted"
        e3_write_state(args.output, context, failed)
        print("Traceback (most recent call last):", file=sys.stderr)
        print('  File "tuningRunner.py", line 1310, in tune_config', file=sys.stderr)
        print(f"ValueError: {e}", file=sys.stderr)
        sys.exit(1)


def usage_error(message: str) -> int:
    """What argparse prints for a usage error (status 2)."""
    print(f"usage: rocmlirTriton tuning runner\nerror: {message}", file=sys.stderr)
    return 2


# --compile-only / --benchmark-artifacts (rocmlir-newest.md §2). The real tool compresses with
# zstd; Python 3.11's standard library has none, so the stand-in uses zlib with the same
# framing: an 8-byte little-endian size of the uncompressed bytes, then the compressed bytes.
ZSTD_STAND_IN = "zlib"


def problem_hash(arch: str, num_cu: int, chiplets: int, space: str, flags: str, tv: str) -> str:
    text = f"{arch}|{num_cu}|{chiplets}|{space}|{flags}|{tv}"
    return hashlib.sha1(text.encode()).hexdigest()[:16]


def write_framed(path: str, data: bytes) -> None:
    with open(path, "wb") as f:
        f.write(len(data).to_bytes(8, "little") + zlib.compress(data))


def read_framed(path: str) -> bytes:
    with open(path, "rb") as f:
        raw = f.read()
    size, data = int.from_bytes(raw[:8], "little"), zlib.decompress(raw[8:])
    if len(data) != size:
        raise ValueError(f"{path}: {len(data)} bytes, its header says {size}")
    return data


class Target:
    """The GPU a --compile-only run compiles for (no GPU here: from the --target-* flags)."""

    def __init__(self, arch: str, num_cu: int, num_chiplets: int) -> None:
        self.arch, self.num_cu, self.num_chiplets = arch, num_cu, num_chiplets
        self.chip = arch.split(":")[0]


def e4_compile_only(args, configs: list[str], log: Log) -> int:
    """run_compile_only: for each config, its bundle into DIR/problems/<hash>/ and its entry
    merged into DIR/index.json (no rocmlirGenFlags). A config that fails to compile is
    discarded (no folder, no entry), the others stay; any failure makes the exit status 1.
    Already compiled at this commit (index entry and manifest there): skipped unless --retune."""
    flags = (args.target_arch, args.target_num_cu, args.target_num_chiplets)
    if any(v is None for v in flags):
        missing = [
            n
            for n, v in zip(
                ("--target-arch", "--target-num-cu", "--target-num-chiplets"), flags, strict=True
            )
            if v is None
        ]
        return usage_error(
            "argument --compile-only: requires " + ", ".join(missing) + " (the compile host is "
            "GPU-less; target identity cannot be auto-discovered)"
        )  # fmt: skip
    target = Target(*flags)
    root = args.compile_only
    os.makedirs(os.path.join(root, "problems"), exist_ok=True)
    run_id = hashlib.sha1(f"{time.time()}{os.getpid()}".encode()).hexdigest()
    failed = 0
    for position, key in enumerate(configs, start=1):
        progress = f"[{position}/{len(configs)}]"
        digest = problem_hash(target.arch, target.num_cu, target.num_chiplets,
                              args.tuning_space, args.rocmlir_gen_flags, key)  # fmt: skip
        problem_dir = os.path.join(root, "problems", digest)
        entry = e4_index(root, target, args)["problems"].get(digest, {})
        done = os.path.isfile(os.path.join(problem_dir, "manifest.json.z"))
        if not args.retune and entry.get("commitId") == commit_id() and done:
            log.info(f"{progress} Skipping already-compiled problem {digest}")
            e4_merge_index(root, target, args, digest, key, run_id)
            continue
        maybe_delay()
        if fault_for(key) == "fail":
            shutil.rmtree(problem_dir, ignore_errors=True)
            e4_remove_from_index(root, digest)
            log.error(
                f"{progress} compile-only kernel bundle failed for '{key}' (problem {digest})\n"
                "Exit code: 1\nCompilation failed"
            )
            failed += 1
            continue
        e4_compile_problem(args, key, target, problem_dir)
        e4_merge_index(root, target, args, digest, key, run_id)
        log.info(f"{progress} Compiled problem {digest}")
    log.info(f"Compile phase: {len(configs) - failed} compiled, {failed} failed, "
             f"of {len(configs)} problem(s)")  # fmt: skip
    return 1 if failed else 0


def e4_index(directory: str, target: Target, args) -> dict:
    path = os.path.join(directory, "index.json")
    if os.path.exists(path):
        with open(path) as f:
            return json.load(f)
    return {"problems": {}}


def e4_write_index(directory: str, index: dict) -> None:
    path = os.path.join(directory, "index.json")
    with open(f"{path}.tmp", "w") as f:
        json.dump(index, f, indent=2)
        f.write("\n")
    os.replace(f"{path}.tmp", path)


def e4_merge_index(directory: str, target: Target, args, digest: str, key: str, run: str) -> None:
    """_merge_index_json: the header from this call, this problem's entry, the others kept."""
    index = e4_index(directory, target, args)
    index.update(arch=target.arch, numCUs=target.num_cu, numChiplets=target.num_chiplets,
                 tuningSpace=args.tuning_space, lastRunId=run)  # fmt: skip
    index.setdefault("problems", {})[digest] = {
        "testVector": key, "commitId": commit_id(), "runId": run,
    }  # fmt: skip
    e4_write_index(directory, index)


def e4_remove_from_index(directory: str, digest: str) -> None:
    path = os.path.join(directory, "index.json")
    if not os.path.exists(path):
        return
    with open(path) as f:
        index = json.load(f)
    if digest in index.get("problems", {}):
        del index["problems"][digest]
        e4_write_index(directory, index)


def e4_compile_problem(args, config: str, target: Target, directory: str) -> None:
    """manifest.json.z and one configs/NNNNNN.hsaco.z per candidate that compiled."""
    pcs = perf_configs(args.op, args.tuning_space, "E4")
    fake_costs.compile_candidates(len(pcs))
    _, flops = describe(args.op, config, target, "E3")
    shutil.rmtree(directory, ignore_errors=True)
    os.makedirs(os.path.join(directory, "configs"))
    entries = []
    for i, pc in enumerate(pcs):
        if candidate_time_ns(config, pc, flops) is None:  # rocmlir-gen rejects it
            entries.append({"perfConfig": pc, "status": "not_applicable", "blob": None})
            continue
        blob = f"configs/{i:06d}.hsaco.z"
        code = f"hsaco for {target.arch} {config} {pc}\n".encode() * 8
        write_framed(os.path.join(directory, blob), code)
        entries.append({"perfConfig": pc, "status": "success", "blob": blob, "kernels": 1})
    manifest = {
        "hipVersion": "6.4.43482",
        "arch": target.arch,
        "numCUs": target.num_cu,
        "numChiplets": target.num_chiplets,
        "numConfigs": len(pcs),
        "buffers": [],
        "configs": entries,
    }
    write_framed(os.path.join(directory, "manifest.json.z"), json.dumps(manifest).encode())


def e4_bundle_benchmark(args, gpu: Gpu, gpu_id: int, configs: list[str], log: Log):
    """The `measure` of --benchmark-artifacts DIR, or None (an ERROR logged) when the bundle
    is for another GPU or, without --allow-commit-mismatch, from another commit."""
    directory = args.benchmark_artifacts
    with open(os.path.join(directory, "index.json")) as f:
        index = json.load(f)
    # As rocmlirTriton: the index against the target this call resolved (--target-* where
    # given, else this GPU: HIP's full arch name), field by field, before anything runs.
    resolved = {
        "arch": (args.target_arch or gpu.arch, "--target-arch"),
        "numCUs": (args.target_num_cu or gpu.num_cu, "--target-num-cu"),
        "numChiplets": (args.target_num_chiplets or gpu.num_chiplets, "--target-num-chiplets"),
        "tuningSpace": (args.tuning_space, "--tuning-space"),
    }
    missing = [name for name in resolved if name not in index]
    if missing:
        log.error(f"artifact index {os.path.join(directory, 'index.json')} is missing required "
                  f"field{'s' if len(missing) != 1 else ''}: {', '.join(missing)}")  # fmt: skip
        return None
    differences = [
        f"artifacts compiled for {name} {index[name]!r} but this host resolved {local!r}; "
        f"pass {option}={index[name]}"
        for name, (local, option) in resolved.items()
        if index[name] != local
    ]
    if differences:
        log.error("\n".join(differences))
        return None
    target = (index["arch"].split(":")[0], index["numCUs"], index["numChiplets"])
    if target != (gpu.chip, gpu.num_cu, gpu.num_chiplets):
        log.error(
            f"bundle compiled for {target[0]}/{target[1]} CUs/{target[2]} chiplets, GPU "
            f"{gpu_id} is {gpu.chip}/{gpu.num_cu} CUs/{gpu.num_chiplets} chiplets"
        )
        return None

    def measure(config: str) -> Result | str | None:
        """A Result, a failed state, or None: a bundle fault (nothing in .state, exit 1)."""
        key = e4_key(args.op, config)
        digest = problem_hash(
            index["arch"],
            index["numCUs"],
            index["numChiplets"],
            args.tuning_space,
            args.rocmlir_gen_flags,
            key,
        )
        problem_dir = os.path.join(directory, "problems", digest)
        if not os.path.isdir(problem_dir):
            log.error(f"[GPU {gpu_id}] no artifacts for '{key}' (problem {digest}) in "
                      f"{problem_dir}; the bundle is incomplete for this target")  # fmt: skip
            return None
        compiled_at = index["problems"].get(digest, {}).get("commitId")
        if compiled_at != commit_id() and not args.allow_commit_mismatch:
            log.error(f"[GPU {gpu_id}] build-commit mismatch for problem {digest}: artifacts "
                      f"compiled at '{compiled_at}' but benchmarking from '{commit_id()}'; pass "
                      "--allow-commit-mismatch to override")  # fmt: skip
            return None
        manifest = json.loads(read_framed(os.path.join(problem_dir, "manifest.json.z")))
        compiled = [c for c in manifest["configs"] if c["status"] == "success"]
        for c in compiled:  # a candidate is run from its code object
            read_framed(os.path.join(problem_dir, c["blob"]))
        fake_costs.benchmark_candidates(len(compiled), gpu_id)
        skipped = frozenset(c["perfConfig"] for c in manifest["configs"]) - {
            c["perfConfig"] for c in compiled
        }
        return tune(args.op, config, args.tuning_space, gpu, "E4", args.debug, noop, skipped)

    return measure


# --benchmark-stream: a PROPOSED extension of E4 (mlirtuna's docs/formats.md, "Streaming
# benchmarks"), offered only with FAKE_TUNINGRUNNER_STREAM=1. One long-lived process per GPU:
# after its start-up it reads one JSON request a line from stdin,
#   {"id": "17", "op": "gemm", "config": "<config>", "artifacts": "DIR", "output": "FILE"}
# benchmarks it exactly as `--op OP --config CONFIG --benchmark-artifacts DIR --output FILE`
# with the process's other flags would (FILE, FILE.debug, FILE.state; its log lines, driver lines
# included, go to FILE.log instead of stderr), then writes one reply line on stdout,
#   {"id": "17", "status": 0, "error": ""}
# status: the exit status that call would have had (2: a request it cannot parse). Requests are
# benchmarked one at a time, in order; EOF on stdin ends the process (status 0).
# FAKE_TUNINGRUNNER_FAULT=stream_crash (with _FAULT_CONFIG) kills the process at that request,
# stream_hang makes it hang there, stream_bad_reply answers it with status "zero", stream_skip
# never answers it (and answers the next ones);
# FAKE_TUNINGRUNNER_FAULT=stream_exit makes it exit 1 at start, before reading any request (a
# GPU it cannot open), and FAKE_TUNINGRUNNER_STREAM_FOREIGN=N prints, after its first reply, N
# reply lines naming requests nobody made (a stdout that something else writes to as well).
# ---------------------------------------------------------------------------------------------


def e4_stream(args, log: Log) -> int:
    gpu = Gpu()
    gpu_id = args.gpus[0]
    if FAULT == "stream_exit":
        log.error(f"GPU {gpu_id}: cannot start the benchmark stream (FAKE_TUNINGRUNNER_FAULT)")
        return 1
    log.info(f"Using 1 GPU(s)\nGPU {gpu_id}: benchmark stream ready")
    foreign = int(os.environ.get("FAKE_TUNINGRUNNER_STREAM_FOREIGN", "0"))
    for line in sys.stdin:
        if not line.strip():
            continue
        request, rid = None, None
        try:
            request = json.loads(line)
            rid = str(request["id"])
            fields = [str(request[k]) for k in ("op", "config", "artifacts", "output")]
        except (ValueError, KeyError, TypeError) as e:
            e4_reply(rid, 2, f"bad request: {e!r}")
            continue
        op, config, artifacts, output = fields
        if fault_for(config) == "stream_crash":
            os._exit(134)
        if fault_for(config) == "stream_hang":  # a GPU run that never returns
            while True:
                time.sleep(60)
        if fault_for(config) == "stream_skip":  # read, never answered (a lost request)
            continue
        if fault_for(config) == "stream_bad_reply":  # a reply no exit status is (issue 34 M6)
            print(json.dumps({"id": rid, "status": "zero", "error": ""}), flush=True)
            continue
        try:
            status = e4_stream_one(args, gpu, gpu_id, op, config, artifacts, output)
            error = "" if status == 0 else "see the request's .log"
        except Exception as e:  # a request's own failure never ends the stream
            status, error = 1, f"{type(e).__name__}: {e}"
        e4_reply(rid, status, error)
        if foreign:
            e4_foreign(foreign)
            foreign = 0
    return 0


def e4_foreign(count: int) -> None:
    out = sys.stdout
    for n in range(count):
        out.write(json.dumps({"id": f"job-{n}-foreign", "status": 0, "error": ""}) + "\n")
    out.flush()


def e4_reply(rid, status: int, error: str) -> None:
    print(json.dumps({"id": rid, "status": status, "error": error}), flush=True)


def e4_stream_one(args, gpu: Gpu, gpu_id: int, op, config, artifacts, output) -> int:
    one = argparse.Namespace(**vars(args))
    one.op, one.config, one.configs_file = op, config, None
    one.benchmark_artifacts, one.output = artifacts, output
    with open(f"{output}.log", "w") as logfile:
        saved, sys.stderr = sys.stderr, logfile
        try:
            if op not in ("conv", "gemm", "attention"):
                log_error = Log(False)
                log_error.error("the stand-in tunes conv, gemm and attention only")
                return 1
            request_log = Log(args.quiet)
            measure = e4_bundle_benchmark(one, gpu, gpu_id, [config], request_log)
            if measure is None:
                return 1
            return e4_tune_all(one, gpu, gpu_id, [config], measure, request_log)
        finally:
            sys.stderr = saved


# ---------------------------------------------------------------------------------------------


def log_invocation(argv: list[str]) -> None:
    path = os.environ.get("FAKE_TUNINGRUNNER_LOG")
    if not path:
        return
    env = {
        k: os.environ[k]
        for k in ("ROCR_VISIBLE_DEVICES", "HIP_VISIBLE_DEVICES", "GIT_DIR")
        if k in os.environ
    }
    secrets = ("MLIRTUNA_DB", "MLIRTUNA_DB_PASSWORD", "PGPASSWORD", "MYSQL_PWD")
    env.update({k: "<set>" for k in secrets if k in os.environ})
    with open(path, "a") as f:
        entry = {"era": ERA, "argv": argv, "cwd": os.getcwd(), "env": env, "time": time.time(),
                 "pid": os.getpid()}  # fmt: skip
        f.write(json.dumps(entry) + "\n")


def spew_stderr(total: int) -> None:
    """`total` bytes of stderr, 1 MiB at a time: never held whole, as a real runaway log."""
    line = b"warning: \xff\xfe not UTF-8, a NUL \x00 and \xe2\x82 a cut character\n"
    block = line * ((1 << 20) // len(line) + 1)
    while total > 0:
        chunk = block[: min(total, len(block))]
        sys.stderr.buffer.write(chunk)
        total -= len(chunk)
    sys.stderr.buffer.flush()


def main(argv: list[str] | None = None) -> int:
    argv = sys.argv[1:] if argv is None else argv
    log_invocation(argv)
    if "--help" not in argv:
        spew_stderr(int(os.environ.get("FAKE_TUNINGRUNNER_STDERR_BYTES", "0") or 0))
        fake_costs.startup()
    if ERA == "E2":
        return e2_main(argv)
    if ERA == "E3":
        return e3_main(argv)
    if ERA == "E2.5":
        return e25_main(argv)
    if ERA == "E4":
        return e4_main(argv)
    print(f"FAKE_TUNINGRUNNER_ERA must be E2, E2.5, E3 or E4, not {ERA!r}", file=sys.stderr)
    return 2


if __name__ == "__main__":
    sys.exit(main())
