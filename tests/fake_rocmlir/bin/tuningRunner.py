#!/usr/bin/env python3
"""A stand-in for rocMLIR's mlir/utils/performance/tuningRunner.py, for mlirtuna's tests.

It speaks the real tool's command line and file formats, for two eras chosen by
FAKE_TUNINGRUNNER_ERA (default E3):

- E2 (late 2023 to 2025, what MITuna drives): argparse flags of that era (--rocmlir_gen_flags,
  --tflops, --compact-print, --tuning-space quick|full|exhaustive defaulting to exhaustive, no
  --abort-on-error/--gpus/--timeout); progress on stderr ("Tuning: ...", "Tested N configs ...",
  "Arch = ..."); one header per invocation, then "<arch>\\t<numCU>\\t<config as given>\\t<perf>
  [\\t<tflops>]"; --debug overwrites "<output>.debug" (pandas to_csv with the index column).
- E3 (2026): --op required, --gpus/--timeout/--abort-on-error/--retune/..., greedy space, logging
  as "INFO: ..."/"ERROR: ...", the ten-column header and rows written as each config finishes,
  "<output>.debug" appended (header once) with a MeasurementsMs column, "<output>.state" on
  failure, already-tuned configs in the output file skipped unless --retune.

No GPU, no compiler: each config gets a deterministic candidate list whose times come from a
hash of (config, perf config); the space grows quick < full < greedy < exhaustive.

Environment:
  FAKE_GPU_ARCH (gfx942:sramecc+:xnack-), FAKE_GPU_NUM_CU (304), FAKE_GPU_NUM_CHIPLETS (8),
  FAKE_GPU_COUNT (8, the GPU ids E3's --gpus accepts), FAKE_TUNINGRUNNER_COMMIT (commitId),
  FAKE_TUNINGRUNNER_DELAY (seconds to sleep per config),
  FAKE_TUNINGRUNNER_LOG=path: append {"argv", "cwd", "env"} as one JSON line per invocation,
  FAKE_TUNINGRUNNER_CHILD_PIDFILE=path: where "hang" writes its child's pid,
  FAKE_TUNINGRUNNER_IGNORE_SIGTERM=1: "hang" ignores SIGTERM (so only SIGKILL stops it),
  FAKE_TUNINGRUNNER_FAULT: fail | hang | none | garbage | wrong_arch | empty | crash_partial.

Standard library only (the real tool needs numpy/pandas/tqdm; tests must not).
"""

from __future__ import annotations

import argparse
import datetime
import hashlib
import json
import math
import os
import signal
import subprocess
import sys
import time

ERA = os.environ.get("FAKE_TUNINGRUNNER_ERA", "E3").upper()
FAULT = os.environ.get("FAKE_TUNINGRUNNER_FAULT", "")
SPACE_SIZES = {"quick": 8, "full": 40, "greedy": 60, "exhaustive": 150}
V3_HEADER = ("# arch\tnumCUs\tnumChiplets\ttestVector\tperfConfig\tTFlops\ttuningSpace\tcommitId"
             "\ttimestamp\tdurationSec")

CONV_COLUMNS = ["Direction", "DataType", "Chip", "numCU", "FilterLayout", "InputLayout",
                "OutputLayout", "N", "C", "H", "W", "K", "Y", "X", "DilationH", "DilationW",
                "StrideH", "StrideW", "PaddingH", "PaddingW", "PerfConfig", "LDSBankConflict",
                "TFlops"]
GEMM_COLUMNS_E2 = ["DataType", "OutDataType", "Chip", "numCU", "TransA", "TransB", "G", "M", "K",
                   "N", "PerfConfig", "LDSBankConflict", "TFlops"]
GEMM_COLUMNS_E3 = ["DataType", "OutDataType", "Chip", "numCU", "TransA", "TransB", "G", "M", "K",
                   "N", "ScaledGemm", "ScaleADtype", "ScaleBDtype", "TransScaleA", "TransScaleB",
                   "PerfConfig", "LDSBankConflict", "TFlops"]
# E2's attention columns are a guess (not read in the sources); E3's are reportUtils'.
ATTN_COLUMNS_E2 = ["DataType", "Chip", "numCU", "TransQ", "TransK", "TransV", "TransO",
                   "WithAttnScale", "G", "SeqLenQ", "SeqLenK", "HeadDimQK", "HeadDimV",
                   "PerfConfig", "TFlops"]
ATTN_COLUMNS_E3 = ["DataType", "Chip", "numCU", "TransQ", "TransK", "TransV", "TransO", "Causal",
                   "ReturnLSE", "SplitKV", "WithAttnScale", "WithAttnBias", "G", "SeqLenQ",
                   "SeqLenK", "NumHeadsQ", "NumHeadsKV", "HeadDimQK", "HeadDimV", "PerfConfig",
                   "TFlops"]


# ---------------------------------------------------------------------------------------------
# Command lines of the two eras
# ---------------------------------------------------------------------------------------------


def e2_parser() -> argparse.ArgumentParser:
    p = argparse.ArgumentParser(prog="rocMLIR tuning runner",
                                description="A script for tunning MLIR conv2d or gemm kernels",
                                allow_abbrev=False)
    p.add_argument("--op", "--operation", choices=["conv", "gemm", "fusion", "attention"],
                   default="conv", help="Operation for tuning")
    p.add_argument("-c", "--configs_file", type=str, default="conv-configs",
                   help="File of configurations to test")
    p.add_argument("-o", "--output", type=str, default="tuning_results_local.tsv",
                   help="File to output tuning results to. Will append to existing files")
    p.add_argument("--mlir-build-dir", type=str, default=".",
                   help="The build directory of MLIR based kernel generator")
    p.add_argument("--config", type=str, nargs="*",
                   help="The specific config to test, if you want to test one")
    p.add_argument("--rocmlir_gen_flags", type=str, default=argparse.SUPPRESS,
                   help="rocmlir-gen flags to toggle each feature")
    p.add_argument("--debug", "-d", action="store_true", default=False,
                   help="Print debug messages on failure or inapplicability")
    p.add_argument("--tuning-space", default="exhaustive", choices=["quick", "full", "exhaustive"],
                   help="Which space of tuning configs should be used while tuning")
    p.add_argument("--quiet", "-q", action="store_true", default=False,
                   help="Quiet mode (don't output each test result)")
    p.add_argument("--verify-mode", default="gpu", choices=["none", "cpu", "gpu"],
                   help="How to verify the winning tuned kernel")
    p.add_argument("--test_dir", default="../mlir/test/fusion/resnet50-e2e", type=str,
                   help="fusion E2E tests directory")
    p.add_argument("--data-type", nargs="+",
                   choices=["f32", "f16", "i8", "i8_i32", "i8_i8", "fp8", "fp8_f32", "fp8_fp8"],
                   default=["f32", "f16", "i8"], help="Force a set of datatypes")
    p.add_argument("--tflops", action="store_true", default=False,
                   help="Include the TFlops along with the winning perf-configs")
    p.add_argument("--compact-print", action="store_true", default=False,
                   help="Print info only when a change happens")
    return p


def e3_parser(available_gpus: list[int]) -> argparse.ArgumentParser:
    p = argparse.ArgumentParser(prog="tuningRunner.py",
                                description="Automated performance tuning for rocMLIR generated "
                                            "kernels",
                                allow_abbrev=False)
    source = p.add_mutually_exclusive_group(required=True)
    source.add_argument("-c", "--configs-file", "--configs_file", type=str, metavar="FILE",
                        help="Path to file containing list of configurations to tune. Use '-' "
                             "for stdin.")
    source.add_argument("--config", type=str, metavar="CONFIG",
                        help="Specific config to tune. Can be a config string or path to an "
                             ".mlir file.")
    source.add_argument("--test-dir", "--test_dir", type=str, metavar="DIR",
                        help="Directory containing fusion E2E tests to extract configs from. "
                             "Only used when --op=fusion.")
    p.add_argument("--op", "--operation", required=True,
                   choices=["conv", "gemm", "fusion", "attention", "gemm_gemm", "conv_gemm"],
                   help="Operation to tune")
    p.add_argument("-o", "--output", type=str, default="tuning_results_local.tsv",
                   metavar="FILE",
                   help="Output file path for tuning results in TSV format. Results will be "
                        "appended if file exists. Use '-' for stdout.")
    p.add_argument("--mlir-build-dir", type=str, default=".", metavar="DIR",
                   help="Path to rocMLIR build directory")
    p.add_argument("--rocmlir-gen-flags", "--rocmlir_gen_flags", type=str, default="",
                   metavar="FLAGS", help="Additional flags to pass to rocmlir-gen")
    p.add_argument("-d", "--debug", action="store_true", default=False,
                   help="Enable debug output including detailed measurements")
    p.add_argument("--tuning-space", default="full",
                   choices=["quick", "full", "greedy", "exhaustive"],
                   help="Tuning space kind to use")
    logging_group = p.add_mutually_exclusive_group()
    logging_group.add_argument("-q", "--quiet", action="store_true", default=False,
                               help="Suppress non-error output")
    logging_group.add_argument("-v", "--verbose", action="store_true", default=False,
                               help="Enable verbose output, including commands being executed")
    p.add_argument("--verify-mode", default="gpu", choices=["none", "cpu", "gpu"],
                   help="Verification mode to use when verifying perf configs")
    p.add_argument("--verify-perf-configs", action="store_true", default=False,
                   help="Verify each perf config during tuning, not just the winning config.")
    p.add_argument("--data-type", nargs="+", metavar="TYPE", default=["f32", "f16", "i8"],
                   choices=["f32", "f16", "bf16", "i8", "i8_i32", "i8_i8", "fp8", "fp8_f32",
                            "fp8_fp8", "f4E2M1FN"],
                   help="Force a set of data types for gemm tuning. Only used when --op=gemm.")
    p.add_argument("--scale-type", nargs="+", metavar="TYPE", default=None,
                   choices=["f32", "f8E8M0FNU"],
                   help="Force a set of scale types for gemm tuning. Only used when --op=gemm.")
    p.add_argument("--tflops", action="store_true", default=False,
                   help="[Deprecated, TFlops is always included] Include achieved TFLOPS in the "
                        "output")
    p.add_argument("--abort-on-error", action="store_true", default=False,
                   help="Abort tuning upon first error encounter")
    p.add_argument("--retune", action="store_true", default=False,
                   help="Force retuning of all configs, ignoring existing results in the output "
                        "file")
    p.add_argument("--retry", nargs="+", choices=["failed", "timed_out", "crashed"], default=[],
                   metavar="STATE", help="Retry configs in specified states")
    p.add_argument("--timeout", type=int, default=None, metavar="SECONDS",
                   help="Timeout in seconds for tuning each config")
    p.add_argument("--verify-timeout", type=int, default=None, metavar="SECONDS",
                   help="Timeout in seconds for each verification run")
    p.add_argument("--gpus", type=int, nargs="+", choices=available_gpus, default=available_gpus,
                   metavar="GPU_ID",
                   help="GPUs to use for tuning (available: %s, default: all)" % available_gpus)
    p.add_argument("--num-cpus", type=int, default=None, metavar="N",
                   help="Maximum CPU threads for compilation (default: auto-detect based on NUMA "
                        "topology)")
    p.add_argument("--wait-for-compiles", action="store_true", default=False,
                   help="Wait for all compilation tasks to complete before starting tuning.")
    p.add_argument("-s", "--status", action="store_true", default=False,
                   help="Only show tuning status without performing any tuning")
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
    if op == "attention":
        if era == "E2":
            return "attn:v1:%d,%d,%d,%d,%d,%d,32,4,1,1,1" % (m, n, 64, kpb, wave, wave)
        return "attn:v3:%d,%d,%d,%d,%d,%d,32,4,1,1,2,0,1" % (m, n, 64, kpb, wave, wave)
    if era == "E2":
        return "v2:%d,%d,%d,%d,32,4,%d,1,1" % (m, n, kpb, wave, split_k)
    return "v4:%d,%d,%d,%d,%d,32,4,%d,1,2,0,0,1,1" % (m, n, kpb, wave, wave, split_k)


def _unit(*parts: str) -> float:
    digest = hashlib.sha256("\x00".join(parts).encode()).digest()
    return int.from_bytes(digest[:8], "big") / 2.0 ** 64


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
    return [round(ns * 1e-6 * (0.98 + 0.04 * _unit("m%d" % i, config, perf_config)), 6)
            for i in range(10)]


# ---------------------------------------------------------------------------------------------
# Parsing the config string (enough of perfRunner's from_command_line for flops and .debug)
# ---------------------------------------------------------------------------------------------

CONV_TYPES = {"conv": "f32", "convfp16": "f16", "convbfp16": "bf16", "convint8": "i8",
              "convfp8": "fp8", "convfp8_fp8": "fp8_fp8"}


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
    row = {"Direction": {"1": "fwd", "2": "bwd", "4": "wrw"}[f.get("-F", "1")],
           "DataType": dtype, "Chip": gpu.chip, "numCU": gpu.num_cu,
           "FilterLayout": _map_layout(f.get("-f", "NCHW"), {"N": "k", "C": "c"}),
           "InputLayout": _map_layout(f.get("-I", "NCHW"), {"N": "n", "C": "c"}),
           "OutputLayout": _map_layout(f.get("-O", "NCHW"), {"N": "n", "C": "k"}),
           "N": n, "C": c, "H": hi, "W": wi, "K": k, "Y": y, "X": x, "DilationH": dil_h,
           "DilationW": dil_w, "StrideH": u, "StrideW": v, "PaddingH": p, "PaddingW": q}
    return row, flops


def _map_layout(layout: str, nc: dict) -> str:
    table = dict(nc, H="0", W="1", G="g")
    return "".join(table.get(ch, ch) for ch in layout).lower()


def _bool(text: str) -> bool:
    return text.lower() in ("1", "true")


def _describe_gemm(tokens: list[str], gpu: Gpu, era: str) -> tuple[dict, float]:
    f = _flag_pairs(tokens)
    g, m, k, n = (int(f[x]) for x in ("-g", "-m", "-k", "-n"))
    row = {"DataType": f["-t"], "OutDataType": f.get("-out_datatype", f["-t"]),
           "Chip": gpu.chip, "numCU": gpu.num_cu, "TransA": _bool(f.get("-transA", "false")),
           "TransB": _bool(f.get("-transB", "false")), "G": g, "M": m, "K": k, "N": n}
    if era == "E3":
        row.update({"ScaledGemm": False, "ScaleADtype": "", "ScaleBDtype": "",
                    "TransScaleA": False, "TransScaleB": False})
    return row, 2.0 * g * m * k * n


def _describe_attention(tokens: list[str], gpu: Gpu, era: str) -> tuple[dict, float]:
    f = _flag_pairs(tokens)
    g, sq, sk = int(f["-g"]), int(f["-seq_len_q"]), int(f["-seq_len_k"])
    dqk, dv = int(f["-head_dim_qk"]), int(f["-head_dim_v"])
    hq, hkv = int(f.get("-num_heads_q", "1")), int(f.get("-num_heads_kv", "1"))
    heads = g * max(hq, hkv)
    flops = 2.0 * heads * sq * dqk * sk + 2.0 * heads * sq * sk * dv
    row = {"DataType": f["-t"], "Chip": gpu.chip, "numCU": gpu.num_cu}
    for col, flag in (("TransQ", "-transQ"), ("TransK", "-transK"), ("TransV", "-transV"),
                      ("TransO", "-transO")):
        row[col] = _bool(f.get(flag, "false"))
    if era == "E3":
        row.update({"Causal": _bool(f.get("-causal", "false")),
                    "ReturnLSE": _bool(f.get("-return_lse", "false")),
                    "SplitKV": int(f.get("-split_kv", "1"))})
    row["WithAttnScale"] = _bool(f.get("-with-attn-scale", "false"))
    if era == "E3":
        row["WithAttnBias"] = _bool(f.get("-with-attn-bias", "false"))
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


def tune(op: str, config: str, space: str, gpu: Gpu, era: str, debug: bool,
         progress) -> Result:
    """Run the "driver" over the space; entries are .debug rows (TFlops NaN when N/A)."""
    problem, flops = describe(op, config, gpu, era)
    result = Result(config)
    for i, pc in enumerate(perf_configs(op, space, era)):
        ns = None if FAULT == "none" else candidate_time_ns(config, pc, flops)
        if i > 0 and i % 100 == 0:
            progress(i, result)
        result.driver_lines.append("%s\t%s" % (pc, "N/A" if ns is None else repr(ns)))
        entry = dict(problem)
        entry["PerfConfig"] = pc
        if "LDSBankConflict" in debug_columns(op, era):
            entry["LDSBankConflict"] = "NaN"  # perfRunner's value when rocprof metrics are absent
        entry["TFlops"] = compute_tflops(flops, ns)
        if era == "E3" and debug:
            entry["MeasurementsMs"] = measurements_ms(config, pc, ns) if ns is not None else None
        result.entries.append(entry)
        if not math.isnan(entry["TFlops"]) and entry["TFlops"] > result.max_tflops:
            result.max_tflops, result.winner = entry["TFlops"], pc
    return result


def debug_cell(value) -> str:
    """A value as pandas' to_csv writes it (NaN and None empty, lists as their repr)."""
    if value is None or (isinstance(value, float) and math.isnan(value)):
        return ""
    return str(value)


def hang() -> None:
    """Sleep forever, with a child in the same process group (as the real driver pipeline is)."""
    child = subprocess.Popen([sys.executable, "-c", "import time\nwhile True: time.sleep(60)"])
    pidfile = os.environ.get("FAKE_TUNINGRUNNER_CHILD_PIDFILE")
    if pidfile:
        with open(pidfile, "w") as f:
            f.write("%d\n" % child.pid)
    if os.environ.get("FAKE_TUNINGRUNNER_IGNORE_SIGTERM") == "1":
        signal.signal(signal.SIGTERM, signal.SIG_IGN)
    while True:
        time.sleep(60)


def maybe_delay() -> None:
    delay = float(os.environ.get("FAKE_TUNINGRUNNER_DELAY", "0") or 0)
    if delay > 0:
        time.sleep(delay)


def write_garbage(out) -> None:
    """A file whose second line has a non-numeric numCUs and too few fields."""
    out.write(V3_HEADER + "\n" if ERA == "E3" else
              "# arch\tnumCUs\ttestVector\tperfConfig\tTFlops (exhaustive)\n")
    out.write("gfx942:sramecc+:xnack-\tthree hundred\t-t f16\n")


def crash_partial(out) -> None:
    out.write(V3_HEADER + "\n" if ERA == "E3" else
              "# arch\tnumCUs\ttestVector\tperfConfig\tTFlops (exhaustive)\n")
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
    if args.op not in ("conv", "gemm", "attention"):
        raise RuntimeError("Tuning operation was not provided/found")
    configs = args.config if args.config else read_configs_file(args.configs_file)
    winners, all_entries = [], []
    for config in configs:
        print("Tuning:", config, file=sys.stderr)
        maybe_delay()
        if FAULT == "hang":
            hang()
        if FAULT == "fail":
            e2_fail()
        result = tune(args.op, config, args.tuning_space, gpu, "E2", args.debug,
                      lambda i, r: e2_progress(args, i, r))
        if args.debug:
            print("\n".join(result.driver_lines), file=sys.stderr)
        all_entries.extend(result.entries)
        if FAULT == "empty":
            # E2's quirk: a verification failure returns (None, None) and main() just returns.
            print("Verifying with perfConfig = %s" % result.winner, file=sys.stderr)
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
    print("Traceback (most recent call last):\n"
          '  File "./bin/tuningRunner.py", line 318, in <module>\n'
          "    sys.exit(main())\n"
          "RuntimeError: ERROR: rocmlir-tuning-driver failed (FAKE_TUNINGRUNNER_FAULT=fail)",
          file=sys.stderr)
    sys.exit(1)


def e2_progress(args, i: int, result: Result) -> None:
    if not args.quiet and not args.compact_print:
        print("Tested %d configs, best perf %s TFlops on perf_config %s"
              % (i, result.max_tflops, result.winner), file=sys.stderr)


def e2_report(args, result: Result) -> None:
    tv, pc, tf = result.test_vector, result.winner, result.max_tflops
    if args.verify_mode != "none":
        print("Verifying with perfConfig = %s" % pc, file=sys.stderr)
        print("Tuned and verified : %s : %s with %s TFlops and %s on verification"
              % (tv, pc, tf, tf * 0.97), file=sys.stderr)
        if args.verify_mode == "gpu":
            print("Note: Verify tflops counts verification kernel", file=sys.stderr)
    else:
        print("Tuned : %s : %s with %s TFlops" % (tv, pc, tf), file=sys.stderr)


def e2_write_debug(args, entries: list[dict]) -> None:
    columns = list(entries[0].keys()) if entries else []
    # pandas' to_csv(sep='\t') with its default index=True: an unnamed first column.
    lines = ["\t".join([""] + columns)]
    for i, e in enumerate(entries):
        lines.append("\t".join([str(i)] + [debug_cell(e[c]) for c in columns]))
    print("\n".join(lines[:20]), file=sys.stderr)  # stands in for print(allData)
    with open("%s.debug" % args.output, "w") as f:
        f.write("\n".join(lines) + "\n")


def e2_write_output(args, gpu: Gpu, winners: list[Result], out) -> None:
    space = args.tuning_space
    if args.tflops:
        print("# arch\tnumCUs\ttestVector\tperfConfig\tTFlops (%s)" % space, file=out)
    else:
        print("# arch\tnumCUs\ttestVector\tperfConfig (%s)" % space, file=out)
    for r in winners:
        if args.tflops:
            print("Arch = %s(%d CUs), vector = '%s', perfConfig = %s, TFlops = %s"
                  % (gpu.arch, gpu.num_cu, r.test_vector, r.winner, r.max_tflops),
                  file=sys.stderr)
            print("%s\t%d\t%s\t%s\t%s" % (gpu.arch, gpu.num_cu, r.test_vector, r.winner,
                                          r.max_tflops), file=out)
        else:
            print("Arch = %s(%d CUs), vector = '%s', perfConfig = %s"
                  % (gpu.arch, gpu.num_cu, r.test_vector, r.winner), file=sys.stderr)
            print("%s\t%d\t%s\t%s" % (gpu.arch, gpu.num_cu, r.test_vector, r.winner), file=out)


def read_configs_file(path: str) -> list[str]:
    stream = sys.stdin if path == "-" else open(path)
    with stream:
        lines = [line.strip() for line in stream]
    return [line for line in lines if line and not line.startswith("#")]


# ---------------------------------------------------------------------------------------------
# E3 main
# ---------------------------------------------------------------------------------------------


class Log:
    def __init__(self, quiet: bool) -> None:
        self.quiet = quiet

    def _emit(self, level: str, msg: str) -> None:
        lines = msg.splitlines() or [""]
        print("%s: %s" % (level, "\n".join([lines[0]] + ["    " + x for x in lines[1:]])),
              file=sys.stderr)

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
    args = e3_parser(available).parse_args(argv)
    log = Log(args.quiet)
    if rocr or hip:
        names = [n for n in ("ROCR_VISIBLE_DEVICES=%s" % rocr if rocr else "",
                             "HIP_VISIBLE_DEVICES=%s" % hip if hip else "") if n]
        log.warning("Ignoring %s. This script manages GPU visibility internally. Use '--gpus' "
                    "to select specific GPUs." % " and ".join(names))
    gpu = Gpu()
    if args.op not in ("conv", "gemm", "attention"):
        log.error("the stand-in tunes conv, gemm and attention only")
        return 1
    configs = [args.config] if args.config else read_configs_file(args.configs_file)
    context = "%s/%d/%d/%s" % (gpu.chip, gpu.num_cu, gpu.num_chiplets, args.tuning_space)
    pending = configs if args.retune else [c for c in configs
                                           if not e3_already_tuned(args, gpu, c)]
    if len(pending) < len(configs):
        log.info("Skipping %d already tuned config(s) - use '--retune' to retune"
                 % (len(configs) - len(pending)))
    if args.status:
        log.info("%d/%d config(s) pending tuning" % (len(pending), len(configs)))
        return 0
    if not pending:
        log.info("No configurations to tune")
        return 0
    gpu_id = args.gpus[0]
    log.info("Using 1 GPU(s)\nGPU %d: NUMA node 0, 16 compile threads" % gpu_id)
    failed: dict[str, str] = {}
    header_written = False
    debug_path = None if args.output == "-" else "%s.debug" % args.output
    if args.debug and debug_path is None:
        log.warning("Debug output disabled when writing to stdout")
    with open_output(args.output) as out:
        for config in pending:
            start = time.time()
            timestamp = datetime.datetime.now(datetime.timezone.utc).strftime(
                "%Y-%m-%dT%H:%M:%SZ")
            state = e3_tune_one(args, gpu, gpu_id, config, log, out)
            if isinstance(state, str):
                failed[config] = state
                log.error("Tuning unsuccessful for '%s' on GPU %d" % (config, gpu_id))
                if args.abort_on_error:
                    break
                continue
            if not header_written:
                print(V3_HEADER, file=out)
                header_written = True
            duration = max(time.time() - start, 0.01)
            print("\t".join([gpu.arch, str(gpu.num_cu), str(gpu.num_chiplets), config,
                             state.winner, str(state.max_tflops), args.tuning_space,
                             os.environ.get("FAKE_TUNINGRUNNER_COMMIT",
                                            "0123456789abcdef0123456789abcdef01234567"),
                             timestamp, "%.1f" % duration]), file=out)
            out.flush()
            if args.debug and debug_path:
                e3_append_debug(debug_path, state.entries)
            log.info("Tuning successful for '%s' on GPU %d" % (config, gpu_id))
    if failed:
        e3_write_state(args.output, context, failed)
        log.error("Encountered errors during tuning")
        return 1
    log.info("Tuning completed successfully")
    return 0


def e3_tune_one(args, gpu: Gpu, gpu_id: int, config: str, log: Log, out):
    """The Result, or the state name ("failed") when tuning this config failed."""
    maybe_delay()
    pipeline = ("rocmlir-gen %s | rocmlir-tuning-driver --tuning-space=%s --num-iterations=10"
                % (config, args.tuning_space))
    if FAULT == "hang":
        hang()
    if FAULT == "fail":
        log.error("[GPU %d] Tuning pipeline failed\nExit code: 1\nReproduce: "
                  "ROCR_VISIBLE_DEVICES=%d %s\nSTDERR:\nCompilation failed" % (gpu_id, gpu_id,
                                                                             pipeline))
        return "failed"
    result = tune(args.op, config, args.tuning_space, gpu, "E3", args.debug, lambda i, r: None)
    if result.winner == "None":
        log.error("[GPU %d] No valid perf config found" % gpu_id)
        return "failed"
    if FAULT == "empty":
        sys.exit(0)  # forced: the real E3 exits 1 here; the E2 quirk, for both eras
    if FAULT == "garbage":
        write_garbage(out)
        sys.exit(0)
    if FAULT == "crash_partial":
        crash_partial(out)
    return result


def e3_already_tuned(args, gpu: Gpu, config: str) -> bool:
    if args.output == "-" or not os.path.exists(args.output):
        return False
    with open(args.output) as f:
        for line in f:
            fields = line.rstrip("\n").split("\t")
            if line.startswith("#") or len(fields) != 10:
                continue
            if (fields[0] in (gpu.arch, gpu.chip) and fields[1] == str(gpu.num_cu)
                    and fields[2] == str(gpu.num_chiplets) and fields[3] == config
                    and fields[6] == args.tuning_space and fields[4] != "None"):
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


def log_invocation(argv: list[str]) -> None:
    path = os.environ.get("FAKE_TUNINGRUNNER_LOG")
    if not path:
        return
    env = {k: os.environ[k] for k in ("ROCR_VISIBLE_DEVICES", "HIP_VISIBLE_DEVICES")
           if k in os.environ}
    with open(path, "a") as f:
        f.write(json.dumps({"era": ERA, "argv": argv, "cwd": os.getcwd(), "env": env}) + "\n")


def main(argv: list[str] | None = None) -> int:
    argv = sys.argv[1:] if argv is None else argv
    log_invocation(argv)
    if ERA == "E2":
        return e2_main(argv)
    if ERA == "E3":
        return e3_main(argv)
    print("FAKE_TUNINGRUNNER_ERA must be E2 or E3, not %r" % ERA, file=sys.stderr)
    return 2


if __name__ == "__main__":
    sys.exit(main())
