"""The overlay on the stand-in's bin/rocmlir-gen and bin/rocmlir-tuning-driver (what
perfRunner and mlirtuna's chosen configs call), each switched on by the environment:

  FAKE_ROCMLIR_TOOLS_LOG=path: append {"tool", "argv", "env"} as one JSON line per call (env:
    the visible devices);
  FAKE_ROCMLIR_DRIVER_NO_BENCHMARK_CONFIG=1: a driver that predates --benchmark-config (not in
    its --help, refused as an unknown argument);
  FAKE_ROCMLIR_KEY_LAYOUT=old: rocmlir-gen's --emit-tuning-key (and the stand-in tuningRunner's
    fusion keys) as builds before numChiplets print it: `arch\\tnumCU\\tPROBLEM`, no
    -supportsSplitK."""

from __future__ import annotations

import functools
import json
import os
import sys
from types import ModuleType

import fake_fusion


def install(tool: str, argv: list[str], module: ModuleType) -> None:
    """Before `tool` (its own `module`) runs `argv`: the call logged, the older builds played."""
    log_call(tool, argv)
    old_key_layout()
    if (
        tool == "rocmlir-tuning-driver"
        and os.environ.get("FAKE_ROCMLIR_DRIVER_NO_BENCHMARK_CONFIG") == "1"
    ):
        module.options = _without_benchmark_config(module.options)
        refuse_benchmark_config(argv)


def log_call(tool: str, argv: list[str]) -> None:
    path = os.environ.get("FAKE_ROCMLIR_TOOLS_LOG")
    if path:
        env = {k: v for k, v in os.environ.items() if k.endswith("_VISIBLE_DEVICES")}
        with open(path, "a") as f:
            f.write(json.dumps({"tool": tool, "argv": argv, "env": env}) + "\n")


def old_key_layout() -> None:
    if os.environ.get("FAKE_ROCMLIR_KEY_LAYOUT", "new") == "old":
        emit = fake_fusion.emit_tuning_key
        fake_fusion.emit_tuning_key = functools.partial(emit, new_layout=False)


def _without_benchmark_config(options):
    @functools.wraps(options)
    def wrapper() -> list[tuple[str, str]]:
        return [o for o in options() if not o[0].startswith("--benchmark-config")]

    return wrapper


def refuse_benchmark_config(argv: list[str]) -> None:
    """As the old driver's option parser: --benchmark-config is an unknown argument (its --help
    still answers)."""
    given = [a[2:].partition("=")[2] for a in argv if a[2:].partition("=")[0] == "benchmark-config"]
    if given and "--help" not in argv:
        print(f"rocmlir-tuning-driver: Unknown command line argument '--benchmark-config="
              f"{given[-1]}'.", file=sys.stderr)  # fmt: skip
        sys.exit(1)
