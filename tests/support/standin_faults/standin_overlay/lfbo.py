"""The other stored rocmlirTriton tuningRunner (docs/formats.md: index id 57922483061, no commit),
played over the package's E4 when FAKE_TUNINGRUNNER_E4=lfbo: era archaeology the tests need
(mlirtuna still reads that line's builds) and try-rocmlir never runs. Against the package's E4
(rocmlirTriton 520c8752) it has

- the lfbo space (30 candidates; refused with --compile-only) and its --lfbo-effort quick|full;
- E3's --verify-timeout;
- keys ending `-supportsSplitK true|false` (false for attention), the suffix skipped when a gemm
  line is parsed;
- a driver that gives up on some candidates over their time budget (Discarded without a top k);
- with --debug, the driver's lines in its log ("[GPU N] <perf>\\t<ns|N/A|Discarded>").

Each is wrapped around a seam of bin/standin_runner/ (the --help lists its flags where the
other line's does, so a session detects the same capabilities)."""

from __future__ import annotations

import argparse
import functools
from typing import Any

from standin_runner import candidates, common, e4, e4_bundles, e4_tuning, problems

SPLIT_K = "-supportsSplitK"


def install() -> None:
    e4.E4_SPACES = [*e4.E4_SPACES, "lfbo"]
    candidates.SPACE_SIZES = {**candidates.SPACE_SIZES, "lfbo": 30}
    candidates.e4_discarded = discarded
    e4.parser = _with_lfbo_flags(e4.parser)
    e4_bundles.compile_only = _no_lfbo_bundles(e4_bundles.compile_only)
    e4_tuning.tune_all = _driver_lines_logged(e4_tuning.tune_all)
    problems.e4_gemm_canonical = _split_k_skipped(problems.e4_gemm_canonical)
    problems.e4_key = _split_k_appended(problems.e4_key)


def discarded(config: str, perf_config: str) -> bool:
    """Its driver gives up on about one candidate in ten (over its time budget)."""
    return candidates.unit("discarded", config, perf_config) < 0.1


def _add_after(p: argparse.ArgumentParser, after: str, *names: str, **kwargs: Any) -> None:
    """A flag added right after `after`, so that --help and the usage line list it where this
    line's tool does (argparse has no public way to place one)."""
    action = p.add_argument(*names, **kwargs)
    for actions in (p._actions, p._optionals._group_actions):
        actions.remove(action)
        at = next(i for i, a in enumerate(actions) if after in a.option_strings)
        actions.insert(at + 1, action)


def _with_lfbo_flags(parser):
    @functools.wraps(parser)
    def wrapper(available_gpus: list[int]) -> argparse.ArgumentParser:
        p = parser(available_gpus)
        _add_after(p, "--timeout", "--verify-timeout", type=int, default=None, metavar="S",
                   help="per verification")  # fmt: skip
        _add_after(p, "--warmup", "--lfbo-effort", choices=["quick", "full"], default="quick",
                   help="lfbo effort")  # fmt: skip
        return p

    return wrapper


def _no_lfbo_bundles(compile_only):
    @functools.wraps(compile_only)
    def wrapper(args, configs: list[str], log: common.Log) -> int:
        if args.tuning_space == "lfbo":  # its own search: nothing to compile ahead
            return common.usage_error("--tuning-space lfbo is not allowed with --compile-only")
        return compile_only(args, configs, log)

    return wrapper


def _driver_lines_logged(tune_all):
    @functools.wraps(tune_all)
    def wrapper(args, gpu, gpu_id: int, configs: list[str], measure, log: common.Log) -> int:
        if not args.debug:
            return tune_all(args, gpu, gpu_id, configs, measure, log)

        def logged(config: str):
            result = measure(config)
            for line in getattr(result, "driver_lines", []):  # a failed state has none
                log.info(f"[GPU {gpu_id}] {line}")
            return result

        return tune_all(args, gpu, gpu_id, configs, logged, log)

    return wrapper


def _split_k_skipped(canonical):
    @functools.wraps(canonical)
    def wrapper(config: str) -> str:
        """The line without its -supportsSplitK pair (a flag without a value is left for the
        parser to refuse)."""
        tokens, kept, i = config.split(), [], 0
        while i < len(tokens):
            if tokens[i] != SPLIT_K or i + 1 >= len(tokens):
                kept += tokens[i : i + 2]
            i += 2
        return canonical(" ".join(kept))

    return wrapper


def _split_k_appended(e4_key):
    @functools.wraps(e4_key)
    def wrapper(op: str, config: str) -> str:
        key = e4_key(op, config)
        if SPLIT_K in key.split():
            return key
        return f"{key} {SPLIT_K} {'false' if op == 'attention' else 'true'}"

    return wrapper
