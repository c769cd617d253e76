"""The problems and timings behind the fake rocmlir-gen / rocmlir-tuning-driver.

- A problem module (what `rocmlir-gen -operation …` prints) is one comment line
  `// fake-rocmlir-gen: <op> <problem flags>`; the problem is that text, --perf_config and
  the passed --arch/--num_cu/--num_chiplets excluded.
- A MIGraphX fusion module's problem is rocmlir-gen's tuning key (`--emit-tuning-key`) in the
  form perfRunner@3fc5be9e parses (conv: no `-m conv -t 1`; gemm: no -transO, no
  -supportsSplitK), from the stand-in's MIGraphX reader (../../bin/fake_fusion.py).
- Candidates: a per-space count of perf configs; each one's time is derived from a sha256 of
  problem + perf config, so every run prints the same numbers. About one in eight is N/A.

Seams: module_for (rocmlir-gen's module), time_ns (one candidate's time), compile_statuses
(--compile-only) and measure (the driver's timing run). A test build's overlay (module
`below_overlay`, tests/support/standin_faults, on PYTHONPATH) wraps them with its faults and slow
kernels when it is on the path (../../bin/overlay_hook.py: the stand-in tuningRunner.py's hook);
the package's build has none.
"""

from __future__ import annotations

import hashlib
import math
import os
import re
import struct
import sys

HERE = os.path.dirname(os.path.abspath(__file__))
sys.path.insert(0, os.path.join(HERE, "..", "..", "bin"))
import fake_fusion  # noqa: E402
import overlay_hook  # noqa: E402

MARK = "// fake-rocmlir-gen: "
SPACE_SIZE = {"quick": 4, "greedy": 6, "full": 8, "exhaustive": 16}
SPREAD = 0.02  # how far a run strays from the candidate's time (relative), at most
_DROP = ("--arch", "--num_cu", "--num_chiplets", "--kernel-repeats", "-arch")


def problem_of_argv(argv: list[str]) -> str:
    """rocmlir-gen's command line without what does not name the problem."""
    out: list[str] = []
    skip = False
    for tok in argv:
        if skip:
            skip = False
        elif tok in _DROP:
            skip = True
        elif not tok.startswith(("--perf_config", "--num_cu=", "--num_chiplets=")):
            out.append(tok)
    return " ".join(out)


def module_for(argv: list[str]) -> str:
    return MARK + problem_of_argv(argv) + "\n"


def migraphx_key_problem(text: str) -> str:
    problem = fake_fusion.problem_string(text, new_layout=False)
    return problem.replace(" -transO false", "")


def problem_of_module(text: str) -> str:
    for line in text.splitlines():
        if line.startswith(MARK):
            return line[len(MARK) :].strip()
    return migraphx_key_problem(text)


def _h(*parts: str) -> int:
    return int.from_bytes(hashlib.sha256("|".join(parts).encode()).digest()[:8], "big")


def perf_configs(problem: str, space: str) -> list[str]:
    count = SPACE_SIZE.get(space, 8)
    fused = re.search(r"-operation (attention|gemm_gemm|conv_gemm)\b", problem)
    out = []
    for i in range(count):
        m, n, k = 16 << (i % 4), 16 << ((i // 4) % 4), 4 << (i // 16)
        out.append(f"attn:v2:{m},{n},{k},16,16,8,1,1" if fused else f"v2:{m},{n},{k},16,16,8,1,1,1")
    return out


def time_ns(problem: str, perf_config: str, index: int) -> float | None:
    """The candidate's median time in ns; None (N/A) for about one in eight, never the first."""
    h = _h(problem, perf_config)
    if index > 0 and h % 8 == 0:
        return None
    base = 20_000 + _h(problem) % 80_000
    return float(base + (h >> 8) % base)


def compile_statuses(problem: str, configs: list[str]) -> list[dict[str, str]]:
    """--compile-only: each perf config's entry in the bundle's manifest, "success" or (about
    one in eight, as time_ns) "not_applicable"."""
    return [
        {"perfConfig": pc, "status": "not_applicable" if time_ns(problem, pc, i) is None
         else "success"}
        for i, pc in enumerate(configs)
    ]  # fmt: skip


def measure(problem: str, configs: list[str], compiled: set[str] | None) -> list[float | None]:
    """The driver's timing run: each perf config's time in ns, None (N/A) for one not
    applicable or, timing a bundle, one that did not compile (`compiled`: None when the
    module is compiled as it is timed)."""
    return [
        None if compiled is not None and pc not in compiled else time_ns(problem, pc, i)
        for i, pc in enumerate(configs)
    ]


def _f32(x: float) -> float:
    """The value as a C++ float holds it: the driver keeps its statistics in floats."""
    return float(struct.unpack("f", struct.pack("f", x))[0])


def stats(problem: str, perf_config: str, ns: float, one_timer_iterations: int | None) -> str:
    """What rocmlir-tuning-driver --show-stats prints before the time, in ms (its unit; only the
    time column is ns), numbers as llvm::raw_ostream prints a double (%e):
    - `one_timer_iterations` N (the legacy mode's small kernel, one CPU timer over N runs):
      `{"total_cpu_time":<ms of all N>,"iterations":N}`;
    - else the runs' `{"min","median","max","stddev","cv"}` (floats; cv in percent; the
      population stddev), the runs of measurements_ms, whose median is the candidate's time."""
    ms = ns * 1e-6
    if one_timer_iterations is not None:
        n = one_timer_iterations
        return f'{{"total_cpu_time":{ms * n:e},"iterations":{n}}}'
    runs = sorted(measurements_ms(problem, perf_config, ns))
    mid = len(runs) // 2
    median = runs[mid] if len(runs) % 2 else (runs[mid - 1] + runs[mid]) / 2
    mean = sum(runs) / len(runs)
    stddev = math.sqrt(sum((r - mean) ** 2 for r in runs) / len(runs))
    cv = stddev / mean * 100 if mean > 0 else 0.0
    numbers = {"min": runs[0], "median": median, "max": runs[-1], "stddev": stddev, "cv": cv}
    return "{" + ",".join(f'"{k}":{_f32(v):e}' for k, v in numbers.items()) + "}"


def one_timer_iterations(ns: float, num_iterations: int, warmup_iterations: int) -> int | None:
    """The legacy mode's choice (rocmlir-tuning-driver.cpp, benchmarkKernels): a kernel whose
    warm-up run took under 1 ms is timed by one CPU timer over max(N, ceil(1 ms / its time))
    iterations; None when each run is timed (no warm-up, or 1 ms and more)."""
    ms = ns * 1e-6
    if warmup_iterations <= 0 or ms >= 1.0:
        return None
    return max(num_iterations, math.ceil(1.0 / ms))


def measurements_ms(problem: str, perf_config: str, ns: float) -> list[float]:
    """rocmlirTriton's --show-all-measurements: every run's time in ms, in the order run; eleven
    runs whose median is the candidate's time (its --use-median time): five faster, five slower
    by up to SPREAD."""
    ms = ns * 1e-6

    def u(tag: str) -> float:
        return (_h(tag, problem, perf_config) % 1000 + 1) / 1001

    runs = [ms, *(ms * (1 - SPREAD * u(f"lo{i}")) for i in range(5))]
    runs += [ms * (1 + SPREAD * u(f"hi{i}")) for i in range(5)]
    order = sorted(range(len(runs)), key=lambda i: _h("order", str(i), problem, perf_config))
    return [runs[i] for i in order]


# The tools call the seams through this module (fk.measure, …), and its own functions call them
# as globals of it: what the overlay installs in their place is what runs.
_OVERLAY = overlay_hook.load("below_overlay")
if _OVERLAY is not None:
    _OVERLAY.install(sys.modules[__name__])
