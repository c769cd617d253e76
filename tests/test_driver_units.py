"""The driver's real units in the fakes (issue 42 §2): the GPU-less rocmlir-tuning-driver under
src/mlirtuna/standin/rocmlir/below and the whole-tool stand-in print what
rocmlir-tuning-driver.cpp (benchmarkKernels) prints: statistics in ms (the legacy mode's
`{total_cpu_time, iterations}` for a sub-ms kernel, else `{min, median, max, stddev, cv}`), the
time column in ns; and mlirtuna reads each back with a median that is the candidate's time."""

from __future__ import annotations

import json
import os
import subprocess
import sys

import pytest
from support.rocmlir import STAND_IN
from support.standin import with_overlay

from mlirtuna import standin
from mlirtuna.tuners.rocmlir.debugfile import parse_stats

BELOW = standin.BUILD / "below"
MODULE = "// fake-rocmlir-gen: -operation gemm -t f16 -out_datatype f16 -g 1 -m 256 -n 512 -k 128\n"
LEGACY = ["--num-iterations=10", "--warmup-iterations=1"]  # 3fc5be9e's tuningRunner, by default


def fake(tool: str, *args: str, stdin: str = "", overlay: bool = True, **knobs: str):
    """One of the fakes below/bin run with `knobs` set (FAKE_*), the tests' overlay on its
    PYTHONPATH unless `overlay` is False (the package's fakes alone)."""
    env = {k: v for k, v in os.environ.items() if not k.startswith("FAKE_")}
    env["PYTHONPATH"] = str(BELOW / "python")
    env = (with_overlay(env) if overlay else env) | knobs
    argv = [sys.executable, str(BELOW / "bin" / tool), *args]
    return subprocess.run(argv, input=stdin, capture_output=True, text=True, env=env, check=False)


def driver(*flags: str, slow: bool = False) -> list[list[str]]:
    """The fake driver's lines for MODULE, split at tabs, as E3's tuningRunner calls it."""
    knobs = {"FAKE_ROCMLIR_SLOW": "gemm"} if slow else {}
    argv = ["--tuning-space=full", "--use-median", "--show-stats=True", *flags]
    out = fake("rocmlir-tuning-driver", *argv, stdin=MODULE, **knobs)
    assert out.returncode == 0, out.stderr
    return [line.split("\t") for line in out.stdout.splitlines()]


def measured(lines: list[list[str]]) -> list[tuple[dict, float]]:
    """(stats JSON, time ns) of each measured candidate."""
    return [(json.loads(f[1]), float(f[2])) for f in lines if len(f) == 3]


def test_the_fake_driver_times_sub_ms_kernels_with_one_timer_in_legacy_mode() -> None:
    got = measured(driver(*LEGACY))
    assert got
    for stats, ns in got:
        assert set(stats) == {"total_cpu_time", "iterations"}
        assert stats["iterations"] == max(10, -(-1e6 // ns))  # max(N, ceil(1 ms / time))
        assert stats["total_cpu_time"] / stats["iterations"] * 1e6 == pytest.approx(ns, rel=1e-6)
        spread = parse_stats(repr(stats))  # as tuningRunner stores it
        assert spread is not None and spread.median == pytest.approx(ns, rel=1e-6)


@pytest.mark.parametrize("flags,slow", [(LEGACY, True), (["--triton-benchmark-mode"], False)])
def test_the_fake_driver_prints_full_stats_in_ms(flags: list[str], slow: bool) -> None:
    # Kernels of 1 ms and more in the legacy mode, or any kernel in Triton's do_bench mode.
    got = measured(driver(*flags, slow=slow))
    assert got
    for stats, ns in got:
        assert set(stats) == {"min", "median", "max", "stddev", "cv"}
        assert stats["median"] * 1e6 == pytest.approx(ns, rel=1e-6)  # --use-median, in ms
        assert stats["min"] <= stats["median"] <= stats["max"]
        assert stats["cv"] == pytest.approx(stats["stddev"] / stats["median"] * 100, rel=0.05)
        spread = parse_stats(repr(stats))
        assert spread is not None and spread.median == pytest.approx(ns, rel=1e-6)
        assert spread.min is not None and 0.97 * ns < spread.min <= ns


def test_the_fake_drivers_time_column_is_printed_as_llvm_prints_a_double() -> None:
    for fields in driver(*LEGACY):
        assert fields[-1] == "N/A" or fields[-1] == f"{float(fields[-1]):e}"


@pytest.mark.parametrize("ns", [5_000.0, 999_000.0, 1_000_000.0, 7_300_000.0])
def test_the_stand_ins_stats_read_back_as_its_time(ns: float) -> None:
    stats = STAND_IN.driver_stats("-m 1", "v2:1", ns)
    one_timer = {"total_cpu_time", "iterations"}
    assert set(stats) == (one_timer if ns < 1e6 else {"min", "median", "max", "stddev", "cv"})
    spread = parse_stats(repr(stats))
    assert spread is not None and spread.median == pytest.approx(ns, rel=1e-6)
    if spread.min is not None:
        assert 0.97 * ns < spread.min <= ns


@pytest.mark.parametrize(
    "knob,tool,args,overlaid",
    [
        ("FAKE_ROCMLIR_GEN_FAIL", "rocmlir-gen", MODULE.split(": ")[1].split(), 1),
        ("FAKE_ROCMLIR_FAIL_COMPILE", "rocmlir-tuning-driver", ["-"], 1),
        ("FAKE_ROCMLIR_CRASH", "rocmlir-tuning-driver", ["-"], -6),  # SIGABRT
        ("FAKE_ROCMLIR_HANG", "rocmlir-tuning-driver", ["--gpu-run-timeout=1", "-"], 3),
    ],
)
def test_the_fakes_take_faults_only_from_the_overlay(knob, tool, args, overlaid) -> None:
    # The package's fakes name no such knob (test_try_rocmlir); the tests' overlay reads them.
    alone = fake(tool, *args, stdin=MODULE, overlay=False, **{knob: "-m 256"})
    assert alone.returncode == 0 and alone.stdout, alone.stderr  # the knob means nothing
    assert fake(tool, *args, stdin=MODULE, **{knob: "-m 256"}).returncode == overlaid
    assert fake(tool, *args, stdin=MODULE, **{knob: "-m 1024"}).returncode == 0  # not this one


def test_the_overlays_all_na_and_slow_kernels() -> None:
    def times(overlay: bool = True, **knobs: str) -> list[list[str]]:
        run = fake("rocmlir-tuning-driver", "-", stdin=MODULE, overlay=overlay, **knobs)
        assert run.returncode == 0, run.stderr
        return [line.split("\t") for line in run.stdout.splitlines()]

    plain = times(overlay=False, FAKE_ROCMLIR_ALL_NA="gemm", FAKE_ROCMLIR_SLOW="gemm")
    assert plain == times() and any(ns != "N/A" for _, ns in plain)
    assert times(FAKE_ROCMLIR_ALL_NA="gemm") == [[pc, "N/A"] for pc, _ in plain]
    slowed = times(FAKE_ROCMLIR_SLOW="gemm")  # 100 times as long: ms instead of µs
    assert [pc for pc, _ in slowed] == [pc for pc, _ in plain]
    for (_, ns), (_, slow_ns) in zip(plain, slowed, strict=True):
        assert slow_ns == ns == "N/A" or float(slow_ns) == pytest.approx(100 * float(ns))
