"""E4's GPU runs: each config measured (one-stage: compiled then benchmarked; or from a bundle,
e4_bundles), its row written and flushed at once, `.debug` appended, `.state` at the end."""

from __future__ import annotations

import datetime
import sys
import time
from collections.abc import Callable

import fake_costs

from standin_runner import candidates, common, problems
from standin_runner.candidates import Result

GPU_TIMEOUT_EXIT_CODE = 3  # the driver's status when a GPU run timed out (state gpu_timed_out)
# A config's measurement: its Result, a failed state, or None (a bundle fault: the next run
# retries it, nothing in .state, exit 1).
Measure = Callable[[str], "Result | str | None"]


def one_stage(args, gpu: common.Gpu, gpu_id: int) -> Measure:
    """Measure one config the one-stage way: compile every candidate, then benchmark them."""

    def measure(config: str) -> Result | str:
        fake_costs.one_stage(len(candidates.perf_configs(args.op, args.tuning_space, "E4")), gpu_id)
        return candidates.tune(args.op, config, args.tuning_space, gpu, "E4", args.debug)

    return measure


def measure_one(measure: Measure, config: str, gpu_id: int, log: common.Log):
    """One config measured on GPU `gpu_id` (a test build's faults fail it here)."""
    return measure(config)


def tune_all(args, gpu: common.Gpu, gpu_id: int, configs: list[str], measure: Measure,
             log: common.Log) -> int:  # fmt: skip
    """Both E4 modes that use a GPU: each config measured, its row written and flushed at once,
    `.debug` appended, `.state` at the end."""
    context = f"{gpu.chip}/{gpu.num_cu}/{gpu.num_chiplets}/{args.tuning_space}"
    failed: dict[str, str] = {}
    bundle_faults = 0
    header_written = False
    debug_path = None if args.output == "-" else f"{args.output}.debug"
    with common.open_output(args.output) as out:
        for config in configs:
            key = problems.e4_key(args.op, config)
            if args.op == "gemm":
                parse_or_crash(args, context, failed, key)
            start = time.time()
            stamp = datetime.datetime.now(datetime.UTC).strftime("%Y-%m-%dT%H:%M:%SZ")
            result = measure_one(measure, config, gpu_id, log)
            if result is None:  # a bundle fault: the next run retries it
                bundle_faults += 1
                continue
            if isinstance(result, str):
                failed[key] = result
                continue
            if args.two_stage_topk and not args.benchmark_artifacts:
                # rocmlirTriton benchmarks a bundle in one precise pass: no top k there
                candidates.two_stage(result, config, args.two_stage_topk)
            if result.winner == "None":
                log.error(f"[GPU {gpu_id}] No valid perf config found")
                failed[key] = "failed"
                continue
            if not header_written:
                print(common.V3_HEADER, file=out)
                header_written = True
            fields = [gpu.arch, str(gpu.num_cu), str(gpu.num_chiplets), key, result.winner]
            fields += [str(result.max_tflops), args.tuning_space, common.commit_id(), stamp]
            fields.append(f"{max(time.time() - start, 0.01):.1f}")
            print("\t".join(fields), file=out)
            out.flush()
            if args.debug and debug_path:
                common.append_debug(debug_path, result.entries)
    if failed:
        common.write_state(args.output, context, failed)
        log.error("Encountered errors during tuning")
        return 1
    return 1 if bundle_faults else 0


def parse_or_crash(args, context: str, failed: dict, key: str) -> None:
    """tune_config's from_command_line raises ValueError for a line canonicalize_configs kept
    verbatim: it escapes the worker thread and ends the run (traceback, exit 1); the config it
    was on is left `interrupted` in `.state` (finalize_interrupted), rows already written stay."""
    try:
        problems.e4_gemm_canonical(key)
    except ValueError as e:
        failed[key] = "interrupted"
        common.write_state(args.output, context, failed)
        print("Traceback (most recent call last):", file=sys.stderr)
        print('  File "tuningRunner.py", line 1310, in tune_config', file=sys.stderr)
        print(f"ValueError: {e}", file=sys.stderr)
        sys.exit(1)
