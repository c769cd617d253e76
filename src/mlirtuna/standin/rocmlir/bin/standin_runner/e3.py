"""E3 (rocMLIR 3fc5be9e, 2026): --op required, --gpus/--timeout/--abort-on-error/--retune/...,
the greedy space, logging as "INFO: ..."/"ERROR: ...", the ten-column header and rows written
as each config finishes, "<output>.debug" appended (header once; numChiplets after numCU; with
--debug a last Stats column, the driver's statistics), "<output>.state" on failure,
already-tuned configs in the output file skipped unless --retune. E4's command line is this
one's plus its own flags (e4.parser)."""

from __future__ import annotations

import argparse
import datetime
import os
import time

import fake_costs
import fake_fusion

from standin_runner import candidates, common, problems
from standin_runner.candidates import Result


def parser(
    available_gpus: list[int],
    prog: str = "tuningRunner.py",
    spaces: list[str] | None = None,
    retry_states: tuple[str, ...] = ("failed", "timed_out", "crashed"),
    required: bool = True,
    e4: bool = False,
) -> argparse.ArgumentParser:
    """E3's flags, choices and defaults (help texts are the stand-in's own words); E4 passes
    its own prog, spaces and retry states and adds its flags (e4.parser). `required` False:
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
    add("--op", "--operation", required=required, choices=common.E3_OPS, help="op to tune")
    add("-o", "--output", default="tuning_results_local.tsv", metavar="FILE", help="appended to")
    add("--mlir-build-dir", type=str, default=".", metavar="DIR", help="rocMLIR build directory")
    add("--rocmlir-gen-flags", "--rocmlir_gen_flags", default="", metavar="FLAGS", help="extra")
    add("-d", "--debug", action="store_true", default=False, help="also write <output>.debug")
    add("--tuning-space", default="full", choices=spaces or common.E3_SPACES,
        help="tuning space kind")  # fmt: skip
    logging_group = p.add_mutually_exclusive_group()
    logging_group.add_argument("-q", "--quiet", action="store_true", default=False, help="quiet")
    logging_group.add_argument("-v", "--verbose", action="store_true", default=False, help="loud")
    if not e4:  # rocmlirTriton has --verify-winning-config / --verify-all-perfconfigs instead
        add("--verify-mode", default="gpu", choices=common.VERIFY_MODES,
            help="how the winner is verified")  # fmt: skip
        add("--verify-perf-configs", action="store_true", default=False, help="verify every one")
    add("--data-type", nargs="+", choices=common.E3_TYPES, default=["f32", "f16", "i8"],
        metavar="TYPE")  # fmt: skip
    add("--scale-type", nargs="+", choices=["f32", "f8E8M0FNU"], default=None, metavar="TYPE")
    add("--tflops", action="store_true", default=False, help="deprecated: always written")
    add("--abort-on-error", action="store_true", default=False, help="stop at the first error")
    add("--retune", action="store_true", default=False, help="ignore configs already tuned")
    add("--retry", nargs="+", choices=list(retry_states), default=[], metavar="STATE",
        help="retry configs in these states")  # fmt: skip
    add("--timeout", type=int, default=None, metavar="SECONDS", help="per config")
    if not e4:
        add("--verify-timeout", type=int, default=None, metavar="S", help="per verification")
    add("--gpus", type=int, nargs="+", choices=available_gpus, default=available_gpus,
        metavar="GPU_ID", help=f"physical GPU ids (available: {available_gpus})")  # fmt: skip
    add("--num-cpus", type=int, default=None, metavar="N", help="compile threads")
    add("--wait-for-compiles", action="store_true", default=False, help="compile all first")
    add("-s", "--status", action="store_true", default=False, help="only show the status")
    return p


def parse(argv: list[str]) -> tuple[argparse.ArgumentParser, argparse.Namespace]:
    """The command line, read (a usage error exits 2, as argparse's)."""
    p = parser(common.available_gpus())
    args = p.parse_args(argv)
    if args.op == "fusion" and not args.test_dir:  # the real tool: modules from a directory
        p.error("argument --op=fusion: requires --test-dir to be specified")
    if args.test_dir and args.op != "fusion":
        p.error("argument --test-dir: only valid with --op=fusion")
    return p, args


def main(argv: list[str]) -> int:
    rocr, hip = os.environ.get("ROCR_VISIBLE_DEVICES"), os.environ.get("HIP_VISIBLE_DEVICES")
    _, args = parse(argv)
    log = common.Log(args.quiet)
    if rocr or hip:
        names = [f"{k}={v}" for k, v in (("ROCR_VISIBLE_DEVICES", rocr),
                                         ("HIP_VISIBLE_DEVICES", hip)) if v]  # fmt: skip
        log.warning(
            "Ignoring {}. This script manages GPU visibility internally. Use '--gpus' "
            "to select specific GPUs.".format(" and ".join(names))
        )
    gpu = common.Gpu()
    if args.op not in (*problems.TUNED_OPS, "fusion"):
        log.error(problems.refusal("fusion"))
        return 1
    configs = read_configs(args)
    pending = configs if args.retune else [c for c in configs if not already_tuned(args, gpu, c)]
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
    return tune_all(args, gpu, pending, log)


def read_configs(args: argparse.Namespace) -> list[str]:
    """The configs to tune: fusion modules' keys (written to `fusion_config_file` in the working
    directory, as the real tool does), else the list or the one config; every gemm line parsed
    before anything is tuned."""
    if args.op == "fusion":
        configs = [key for _, key in fake_fusion.fusion_configs(None, args.test_dir)]
        with open("fusion_config_file", "w") as f:
            f.writelines(f"{fake_fusion.strip_key_flags(c)}\n" for c in configs)
        return configs
    configs = [args.config] if args.config else common.read_configs_file(args.configs_file)
    if args.op == "gemm":
        for config in configs:
            problems.e3_check_gemm(config, from_file=not args.config)
    return configs


def tune_all(args: argparse.Namespace, gpu: common.Gpu, pending: list[str], log: common.Log) -> int:
    """Each config tuned on the first GPU given, its row written and flushed at once."""
    context = f"{gpu.chip}/{gpu.num_cu}/{gpu.num_chiplets}/{args.tuning_space}"
    gpu_id = args.gpus[0]
    log.info(f"Using 1 GPU(s)\nGPU {gpu_id}: NUMA node 0, 16 compile threads")
    failed: dict[str, str] = {}
    header_written = False
    debug_path = None if args.output == "-" else f"{args.output}.debug"
    if args.debug and debug_path is None:
        log.warning("Debug output disabled when writing to stdout")
    with common.open_output(args.output) as out:
        for config in pending:
            start = time.time()
            timestamp = datetime.datetime.now(datetime.UTC).strftime("%Y-%m-%dT%H:%M:%SZ")
            state = tune_one(args, gpu, gpu_id, config, log, out)
            if isinstance(state, str):
                failed[config] = state
                log.error(f"Tuning unsuccessful for '{config}' on GPU {gpu_id}")
                if args.abort_on_error:
                    break
                continue
            if not header_written:
                print(common.V3_HEADER, file=out)
                header_written = True
            duration = max(time.time() - start, 0.01)
            fields = [gpu.arch, str(gpu.num_cu), str(gpu.num_chiplets), config, state.winner,
                      str(state.max_tflops), args.tuning_space, common.commit_id(), timestamp,
                      f"{duration:.1f}"]  # fmt: skip
            print("\t".join(fields), file=out)
            out.flush()
            if args.debug and debug_path:
                common.append_debug(debug_path, state.entries)
            log.info(f"Tuning successful for '{config}' on GPU {gpu_id}")
    if failed:
        common.write_state(args.output, context, failed)
        log.error("Encountered errors during tuning")
        return 1
    log.info("Tuning completed successfully")
    return 0


def tune_one(args, gpu: common.Gpu, gpu_id: int, config: str, log: common.Log, out):
    """The Result, or the state name ("failed", …) when tuning this config failed. `out` is the
    output file (a test build's faults write into it)."""
    result = measure(args, gpu, gpu_id, config)
    if result.winner == "None":
        log.error(f"[GPU {gpu_id}] No valid perf config found")
        return "failed"
    return result


def measure(args, gpu: common.Gpu, gpu_id: int, config: str) -> Result:
    """One config's candidates compiled and benchmarked (rocmlir-gen | rocmlir-tuning-driver)."""
    fake_costs.one_stage(len(candidates.perf_configs(args.op, args.tuning_space, "E3")), gpu_id)
    return candidates.tune(args.op, config, args.tuning_space, gpu, "E3", args.debug)


def already_tuned(args, gpu: common.Gpu, config: str) -> bool:
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
