"""Realistic time costs for the stand-in tuningRunner, so benchmarks can see where GPU time goes.

The stand-in computes nothing; by default it costs nothing either. For bench/bench_gpu_time.py
it can be made to take the time the real tool takes, by environment variables (the tool's own
command line stays exactly the real one):

  FAKE_TUNINGRUNNER_STARTUP_S   seconds per invocation before any work: Python, pandas, rocm-smi
                                and HIP start-up (the GPU is idle meanwhile);
  FAKE_TUNINGRUNNER_COMPILE_MS  milliseconds per candidate compiled (rocmlir-gen | rocmlir-driver
                                on one CPU; the GPU is idle meanwhile);
  FAKE_TUNINGRUNNER_BENCH_MS    milliseconds per candidate benchmarked on the GPU;
  FAKE_TUNINGRUNNER_GPU_LOG     a file: every benchmarking stretch is appended as one JSON line
                                {"gpu": ID, "start": T0, "end": T1, "candidates": N} (time.time()),
                                so the GPU's busy share can be measured from outside.

Costs are sleeps, not spin loops: the bench simulates many GPUs and compile hosts on a machine
with two cores, and a sleeping "compiler" must not steal the CPU the queue itself needs.
"""

from __future__ import annotations

import json
import os
import time


def _env(name: str) -> float:
    return float(os.environ.get(name, "0") or 0)


def startup() -> None:
    """The tool's start-up, paid once per invocation."""
    seconds = _env("FAKE_TUNINGRUNNER_STARTUP_S")
    if seconds > 0:
        time.sleep(seconds)


def compile_candidates(count: int) -> None:
    """Compiling `count` candidates (host CPU work, no GPU)."""
    ms = _env("FAKE_TUNINGRUNNER_COMPILE_MS")
    if ms > 0 and count > 0:
        time.sleep(ms * count / 1000.0)


def benchmark_candidates(count: int, gpu_id: int) -> None:
    """Benchmarking `count` candidates on GPU `gpu_id`, logged as one busy stretch."""
    ms = _env("FAKE_TUNINGRUNNER_BENCH_MS")
    if ms <= 0 or count <= 0:
        return
    start = time.time()
    time.sleep(ms * count / 1000.0)
    end = time.time()
    path = os.environ.get("FAKE_TUNINGRUNNER_GPU_LOG")
    if path:
        line = json.dumps({"gpu": gpu_id, "start": start, "end": end, "candidates": count})
        with open(path, "a") as f:  # one short append per stretch: lines do not interleave
            f.write(line + "\n")


def one_stage(count: int, gpu_id: int) -> None:
    """One config tuned the one-stage way: compile every candidate, then benchmark them."""
    compile_candidates(count)
    benchmark_candidates(count, gpu_id)
