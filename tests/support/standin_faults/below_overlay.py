"""The tests' overlay on the package's fakes below the tool (src/mlirtuna/standin/rocmlir/below,
see ../README.md): imported by below/python/fake_kernels.py when on its path, through the hook
the stand-in tuningRunner.py uses for standin_overlay (bin/overlay_hook.py). It wraps the seams
fake_kernels names; it never changes a format the fakes print.

Each knob holds '|'-separated substrings of problems (what `rocmlir-gen -operation …` was
given) and hits the problems holding one of them:
  FAKE_ROCMLIR_GEN_FAIL      rocmlir-gen refuses the problem: exit 1;
  FAKE_ROCMLIR_FAIL_COMPILE  a perf config (the middle one) fails to compile: message on stderr,
                             driver exit 1 (timing a module or --compile-only; a bundle that
                             was compiled times as it is);
  FAKE_ROCMLIR_CRASH         the driver aborts (SIGABRT) at the middle perf config;
  FAKE_ROCMLIR_HANG          a GPU run hangs: driver exit 3 after --gpu-run-timeout, or forever;
  FAKE_ROCMLIR_ALL_NA        every candidate is N/A (exit 0, like a problem no config fits);
  FAKE_ROCMLIR_SLOW          the kernels take 2 to 18 ms instead of 20 to 180 µs (the driver's
                             legacy mode then times each run instead of all with one timer).
"""

from __future__ import annotations

import functools
import os
import signal
import sys
import time
from types import ModuleType


def matches(knob: str, problem: str) -> bool:
    """Whether the knob names the problem: one of its '|'-separated substrings is in it."""
    return any(sub in problem for sub in os.environ.get(knob, "").split("|") if sub)


def install(fk: ModuleType) -> None:
    """Called by fake_kernels (`fk`) once it is defined: the knobs wrapped around its seams."""
    fk.module_for = _gen_fail(fk.module_for, fk.problem_of_argv)
    fk.time_ns = _slow(fk.time_ns)
    fk.compile_statuses = _compile_fails(fk.compile_statuses)
    fk.measure = _measure_faults(fk.measure)


def _gen_fail(module_for, problem_of_argv):
    @functools.wraps(module_for)
    def wrapper(argv: list[str]) -> str:
        problem = problem_of_argv(argv)
        if matches("FAKE_ROCMLIR_GEN_FAIL", problem):
            sys.exit(f"rocmlir-gen: error: invalid problem: {problem}")
        return module_for(argv)

    return wrapper


def _slow(time_ns):
    @functools.wraps(time_ns)
    def wrapper(problem: str, perf_config: str, index: int) -> float | None:
        ns = time_ns(problem, perf_config, index)
        return ns * 100 if ns is not None and matches("FAKE_ROCMLIR_SLOW", problem) else ns

    return wrapper


def _fail_compile(configs: list[str]) -> None:
    print(f"error: failed to compile perf config {configs[len(configs) // 2]}", file=sys.stderr)
    sys.exit(1)


def _compile_fails(compile_statuses):
    @functools.wraps(compile_statuses)
    def wrapper(problem: str, configs: list[str]) -> list[dict[str, str]]:
        if matches("FAKE_ROCMLIR_FAIL_COMPILE", problem):
            _fail_compile(configs)
        return compile_statuses(problem, configs)

    return wrapper


def _gpu_run_timeout() -> int:
    """The driver's --gpu-run-timeout=N (0: none), read off its own command line."""
    given = [a.partition("=")[2] for a in sys.argv[1:] if a.startswith("--gpu-run-timeout=")]
    return int(given[-1] or 0) if given else 0


def _measure_faults(measure):
    @functools.wraps(measure)
    def wrapper(problem: str, configs: list[str], compiled: set[str] | None) -> list:
        if matches("FAKE_ROCMLIR_HANG", problem):
            limit = _gpu_run_timeout()
            time.sleep(limit if limit > 0 else 3600)
            print(f"GPU run exceeded --gpu-run-timeout={limit}s; exiting", file=sys.stderr)
            sys.exit(3)
        # Both hit the middle perf config, so a driver with none to time runs on.
        if configs and compiled is None and matches("FAKE_ROCMLIR_FAIL_COMPILE", problem):
            _fail_compile(configs)  # compiled as it is timed
        if configs and matches("FAKE_ROCMLIR_CRASH", problem):
            sys.stdout.flush()
            os.kill(os.getpid(), signal.SIGABRT)
        if matches("FAKE_ROCMLIR_ALL_NA", problem):
            return [None] * len(configs)
        return measure(problem, configs, compiled)

    return wrapper
