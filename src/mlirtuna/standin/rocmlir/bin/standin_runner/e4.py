"""E4 (rocmlirTriton's tuningRunner 520c8752 with perfRunner eb003bed, the set the conformance
tier runs): E3's ten columns and .state, plus its own flags (time budgets, GPU run timeout,
two-stage top k, cross compilation), named perf configs, every config canonicalized as its
perfRunner prints it (gemm: `-transO false|true` after -transB, no -supportsSplitK); `-c`
lines without -transO expanded to both values, as get_gemm_configurations does; with --debug,
`MeasurementsMs` (every run's time in ms, the driver's --show-all-measurements) and `Status`
(Measured, N/A, Discarded: outside the top k); driver exit status 3 (the GPU run timed out)
recorded as state gpu_timed_out. Its split of compiling and benchmarking: e4_bundles; the
proposed streaming extension: e4_stream."""

from __future__ import annotations

import argparse
import os

from standin_runner import common, e3, e4_bundles, e4_stream, e4_tuning, problems

E4_SPACES = ["quick", "full", "exhaustive"]
E4_RETRY_STATES = ("failed", "timed_out", "gpu_timed_out", "crashed")
# --benchmark-stream, the proposed extension (e4_stream), is offered only by a build that says
# so (FAKE_TUNINGRUNNER_STREAM=1): without it the tool is rocmlirTriton's as stored.
STREAM = os.environ.get("FAKE_TUNINGRUNNER_STREAM") == "1"


def parser(available_gpus: list[int]) -> argparse.ArgumentParser:
    p = e3.parser(
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
    if STREAM:
        artifacts.add_argument(
            "--benchmark-stream", action="store_true", default=False,
            help="benchmark bundles named by JSON requests on stdin, one at a time",
        )  # fmt: skip
    add("--allow-commit-mismatch", action="store_true", default=False, help="other commits' ok")
    add("--gpu-run-timeout", type=int, default=None, metavar="S", help="per GPU run")
    add("--perf-config-timeout", type=int, default=None, metavar="S", help="per candidate")
    add("--rep", type=int, default=100, metavar="MS", help="benchmark time budget")
    add("--warmup", type=int, default=25, metavar="MS", help="warm-up time budget")
    add("--two-stage", action="store_true", default=False, help="re-measure the best")
    add("--two-stage-topk", type=int, default=0, metavar="K", help="how many to re-measure")
    add("--verify-winning-config", action="store_true", default=False, help="verify the winner")
    add("--verify-all-perfconfigs", action="store_true", default=False, help="verify all")
    add("--flush-last-level-cache", action="store_true", default=False, help="flush the LLC")
    return p


def main(argv: list[str]) -> int:
    p = parser(common.available_gpus())
    args = p.parse_args(argv)
    log = common.Log(args.quiet)
    if getattr(args, "benchmark_stream", False):
        return e4_stream.serve(args, log)
    if not (args.config or args.configs_file or args.test_dir):
        p.error("one of the arguments -c/--configs-file --config --test-dir is required")
    if args.op is None:
        p.error("the following arguments are required: --op/--operation")
    if args.op not in problems.TUNED_OPS:
        log.error(problems.refusal())
        return 1
    targets = (args.target_arch, args.target_num_cu, args.target_num_chiplets)
    if any(v is not None for v in targets) and not (args.compile_only or args.benchmark_artifacts):
        return common.usage_error(
            "--target-arch, --target-num-cu and --target-num-chiplets are only allowed with "
            "--compile-only or --benchmark-artifacts"
        )
    configs = [args.config] if args.config else common.read_configs_file(args.configs_file)
    if args.op == "gemm" and not args.config:
        configs = problems.e4_expand_gemm(configs)  # perfRunner.get_gemm_configurations
    configs = [problems.e4_key(args.op, c) for c in configs]  # canonicalize_configs
    if args.compile_only:
        return e4_bundles.compile_only(args, configs, log)
    gpu = common.Gpu()
    gpu_id = args.gpus[0]
    if not args.benchmark_artifacts:
        measure = e4_tuning.one_stage(args, gpu, gpu_id)
    else:
        measure = e4_bundles.bundle_benchmark(args, gpu, gpu_id, log)
        if measure is None:
            return 1
    log.info(f"Using 1 GPU(s)\nGPU {gpu_id}: rep {args.rep} ms, warmup {args.warmup} ms")
    return e4_tuning.tune_all(args, gpu, gpu_id, configs, measure, log)
