"""The older eras, which mlirtuna still reads but try-rocmlir never runs:

- E2 (late 2023 to 2025, what MITuna drives): argparse flags of that era (--rocmlir_gen_flags,
  --tflops, --compact-print, --tuning-space quick|full|exhaustive defaulting to exhaustive, no
  --abort-on-error/--gpus/--timeout); progress on stderr ("Tuning: ...", "Tested N configs ...",
  "Arch = ..."); one header per invocation, then "<arch>\\t<numCU>\\t<config as given>\\t<perf>
  [\\t<tflops>]"; --debug overwrites "<output>.debug" (pandas to_csv with the index column).
- E2.5 (rocMLIR, late 2025): E2's command line plus the greedy space; a "# commit:" line before
  each invocation's header, the space in the perfConfig column's parentheses, numChiplets after
  numCUs in the later builds (FAKE_E25_NUM_CHIPLETS=0 for the earlier ones), failures written
  into the file as "### " lines (and exit 1).

Their perf configs are v2 (attention attn:v1) and their .debug rows E3's without the columns
E3 added. Faults (faults.FAULT): hang, fail, none, empty, garbage, crash_partial (E2); hang,
fail, none (E2.5)."""

from __future__ import annotations

import argparse
import math
import os
import sys

import fake_fusion
from standin_runner import candidates, common, problems
from standin_runner.candidates import Result

from standin_overlay import faults

E2_OPS = ["conv", "gemm", "fusion", "attention"]
E2_SPACES = ["quick", "full", "exhaustive"]
E25_SPACES = ["quick", "full", "greedy", "exhaustive"]
E2_TYPES = ["f32", "f16", "i8", "i8_i32", "i8_i8", "fp8", "fp8_f32", "fp8_fp8"]
GEMM_COLUMNS = [*problems.debug_columns("gemm")[:10], "PerfConfig", "LDSBankConflict", "TFlops"]
# E2's attention columns are a guess (not read in the sources).
ATTN_COLUMNS = [
    "DataType", "Chip", "numCU", "TransQ", "TransK", "TransV", "TransO", "WithAttnScale", "G",
    "SeqLenQ", "SeqLenK", "HeadDimQK", "HeadDimV", "PerfConfig", "TFlops",
]  # fmt: skip


def debug_columns(op: str) -> list[str]:
    return {"conv": problems.CONV_COLUMNS, "gemm": GEMM_COLUMNS}.get(op, ATTN_COLUMNS)


def describe(op: str, config: str, gpu: common.Gpu) -> tuple[dict, float]:
    """E3's row without the columns E3 added (the order is the same)."""
    row, flops = problems.describe(op, config, gpu)
    kept = debug_columns(op)
    return {k: v for k, v in row.items() if k in kept}, flops


def perf_configs(op: str, space: str) -> list[str]:
    def spell(m: int, n: int, kpb: int, wave: int, split_k: int) -> str:
        if op == "attention":
            return f"attn:v1:{m},{n},64,{kpb},{wave},{wave},32,4,1,1,1"
        return f"v2:{m},{n},{kpb},{wave},32,4,{split_k},1,1"

    return [spell(*shape) for shape in candidates.shapes(space)]


def tune(op: str, config: str, space: str, gpu: common.Gpu, progress) -> Result:
    """The "driver" over the space; entries are .debug rows (TFlops NaN when N/A)."""
    if op == "fusion":  # a fused kernel is tuned as the conv/gemm its key names
        op, config = fake_fusion.op_of(config), fake_fusion.strip_key_flags(config)
    problem, flops = describe(op, config, gpu)
    result = Result(config)
    for i, pc in enumerate(perf_configs(op, space)):
        ns = candidates.candidate_time_ns(config, pc, flops) if faults.FAULT != "none" else None
        if i > 0 and i % 100 == 0:
            progress(i, result)
        result.driver_lines.append(f"{pc}\t{'N/A' if ns is None else repr(ns)}")
        entry = dict(problem)
        entry["PerfConfig"] = pc
        if "LDSBankConflict" in debug_columns(op):
            entry["LDSBankConflict"] = "NaN"  # perfRunner's value when rocprof metrics are absent
        entry["TFlops"] = candidates.compute_tflops(flops, ns)
        result.entries.append(entry)
        if not math.isnan(entry["TFlops"]) and entry["TFlops"] > result.max_tflops:
            result.max_tflops, result.winner = entry["TFlops"], pc
    return result


def parser() -> argparse.ArgumentParser:
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
    add("--verify-mode", default="gpu", choices=common.VERIFY_MODES,
        help="how the winner is verified")  # fmt: skip
    add("--test_dir", default="../mlir/test/fusion/resnet50-e2e", type=str, help="fusion tests")
    add("--data-type", nargs="+", choices=E2_TYPES, default=["f32", "f16", "i8"], help="gemm types")
    add("--tflops", action="store_true", default=False, help="add a TFlops column")
    add("--compact-print", action="store_true", default=False, help="print on changes only")
    return p


def main(argv: list[str]) -> int:
    gpu = common.Gpu()
    args = parser().parse_args(argv)
    if args.op not in ("conv", "gemm", "attention", "fusion"):
        raise RuntimeError("Tuning operation was not provided/found")
    if args.op == "fusion":
        configs = [key for _, key in fake_fusion.fusion_configs(None, args.test_dir)]
    else:
        configs = args.config if args.config else common.read_configs_file(args.configs_file)
    winners, all_entries = [], []
    for config in configs:
        print("Tuning:", config, file=sys.stderr)
        faults.maybe_delay()
        if faults.FAULT == "hang":
            faults.hang()
        if faults.FAULT == "fail":
            fail()
        result = tune(args.op, config, args.tuning_space, gpu, lambda i, r: progress(args, i, r))
        if args.debug:
            print("\n".join(result.driver_lines), file=sys.stderr)
        all_entries.extend(result.entries)
        if faults.FAULT == "empty":
            # E2's quirk: a verification failure returns (None, None) and main() just returns.
            print(f"Verifying with perfConfig = {result.winner}", file=sys.stderr)
            print("Verification failed:\nOutput = \nErrors = [0 0 0]", file=sys.stderr)
            return 0
        report(args, result)
        winners.append(result)
    if args.debug:
        write_debug(args, all_entries)
    with common.open_output(args.output) as out:
        if faults.FAULT == "garbage":
            faults.write_garbage(out)
            return 0
        if faults.FAULT == "crash_partial":
            faults.crash_partial(out)
        write_output(args, gpu, winners, out)
    return 0


def fail() -> None:
    print(
        "Traceback (most recent call last):\n"
        '  File "./bin/tuningRunner.py", line 318, in <module>\n'
        "    sys.exit(main())\n"
        "RuntimeError: ERROR: rocmlir-tuning-driver failed (FAKE_TUNINGRUNNER_FAULT=fail)",
        file=sys.stderr,
    )
    sys.exit(1)


def progress(args, i: int, result: Result) -> None:
    if not args.quiet and not args.compact_print:
        print(
            f"Tested {i} configs, best perf {result.max_tflops} TFlops on perf_config "
            f"{result.winner}",
            file=sys.stderr,
        )


def report(args, result: Result) -> None:
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


def write_debug(args, entries: list[dict]) -> None:
    columns = list(entries[0].keys()) if entries else []
    # pandas' to_csv(sep='\t') with its default index=True: an unnamed first column.
    lines = ["\t".join(["", *columns])]
    for i, e in enumerate(entries):
        lines.append("\t".join([str(i)] + [common.debug_cell(e[c]) for c in columns]))
    print("\n".join(lines[:20]), file=sys.stderr)  # stands in for print(allData)
    with open(f"{args.output}.debug", "w") as f:
        f.write("\n".join(lines) + "\n")


def write_output(args, gpu: common.Gpu, winners: list[Result], out) -> None:
    space = args.tuning_space
    tail = "\tTFlops" if args.tflops else ""
    if args.tflops:
        print(f"# arch\tnumCUs\ttestVector\tperfConfig\tTFlops ({space})", file=out)
    else:
        print(f"# arch\tnumCUs\ttestVector\tperfConfig ({space})", file=out)
    for r in winners:
        said = f"Arch = {gpu.arch}({gpu.num_cu} CUs), vector = '{r.test_vector}', "
        said += f"perfConfig = {r.winner}" + (f", TFlops = {r.max_tflops}" if tail else "")
        print(said, file=sys.stderr)
        fields = [gpu.arch, str(gpu.num_cu), r.test_vector, r.winner]
        print("\t".join(fields + ([str(r.max_tflops)] if tail else [])), file=out)


# -- E2.5 ----------------------------------------------------------------------------------------


def e25_parser() -> argparse.ArgumentParser:
    p = parser()
    for action in p._actions:  # the one change to E2's flags: a greedy space, default full
        if action.dest == "tuning_space":
            action.choices, action.default = E25_SPACES, "full"
    p.description = "Stand-in for the E2.5 rocMLIR tuning runner (conv, gemm, attention)"
    return p


def with_chiplets() -> bool:
    return os.environ.get("FAKE_E25_NUM_CHIPLETS", "1") == "1"


def e25_header(space: str, tflops: bool) -> str:
    chiplets = "\tnumChiplets" if with_chiplets() else ""
    tail = f"perfConfig ({space})" + ("\tTFlops" if tflops else "")
    return f"# arch\tnumCUs{chiplets}\ttestVector\t{tail}"


def e25_main(argv: list[str]) -> int:
    gpu = common.Gpu()
    args = e25_parser().parse_args(argv)
    if args.op not in ("conv", "gemm", "attention"):
        raise RuntimeError("Tuning operation was not provided/found")
    configs = args.config if args.config else common.read_configs_file(args.configs_file)
    lines = [f"# commit: {common.commit_id()}", e25_header(args.tuning_space, args.tflops)]
    entries: list[dict] = []
    failed = False
    for config in configs:
        print("Tuning:", config, file=sys.stderr)
        faults.maybe_delay()
        if faults.FAULT == "hang":
            faults.hang()
        result = None
        if faults.FAULT != "fail":
            result = tune(args.op, config, args.tuning_space, gpu, lambda *_: None)
        if result is None or result.winner == "None":
            reason = "rocmlir-tuning-driver failed" if result is None else "no valid perf config"
            lines.append(f"### Tuning failed for '{config}': {reason}")
            print(f"ERROR: {reason} for '{config}'", file=sys.stderr)
            failed = True
            continue
        entries.extend(result.entries)
        fields = [gpu.arch, str(gpu.num_cu)]
        if with_chiplets():
            fields.append(str(gpu.num_chiplets))
        fields += [config, result.winner]
        if args.tflops:
            fields.append(str(result.max_tflops))
        lines.append("\t".join(fields))
        report(args, result)
    if args.debug and entries:
        write_debug(args, entries)
    with common.open_output(args.output) as out:
        out.write("\n".join(lines) + "\n")
    return 1 if failed else 0
