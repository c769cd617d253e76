#!/usr/bin/env python3
"""A stand-in for rocMLIR's mlir/utils/performance/tuningRunner.py, shipped with mlirtuna for
`mlirtuna try-rocmlir`, the Jenkinsfile's dry run and the tests.

It speaks the real tool's command line and file formats for the era the build is set to,
FAKE_TUNINGRUNNER_ERA: E3 (the default; rocMLIR 3fc5be9e, standin_runner/e3.py) or E4
(rocmlirTriton, standin_runner/e4*.py; what try-rocmlir sets). No GPU, no compiler: each config
gets a deterministic candidate list whose times come from a hash of (config, perf config).

Build settings (environment; ../README.md says who sets each): FAKE_GPU_ARCH
(gfx942:sramecc+:xnack-), FAKE_GPU_NUM_CU (304), FAKE_GPU_NUM_CHIPLETS (8), FAKE_GPU_COUNT (8,
the GPU ids --gpus accepts); FAKE_TUNINGRUNNER_STREAM=1 (E4 offers the proposed
--benchmark-stream); FAKE_TUNINGRUNNER_STARTUP_S, _COMPILE_MS, _BENCH_MS, _GPU_LOG (realistic
time costs for bench/, fake_costs.py). The commit it reports is the one its build's
MLIRTUNA_STANDIN.md states.

A test build adds an overlay (tests/support/standin_faults, on PYTHONPATH as module
`standin_overlay`): older eras (E2, E2.5), rocmlirTriton's other stored line and injected
faults, wrapped around the functions standin_runner's modules name as seams. The package's
build has none and reads no such knob.

--op fusion (E3): `--test-dir/--test_dir DIR` only (`--config FILE.mlir` is refused with the
real tool's usage error, exit 2); each module is keyed as rocmlir-gen --emit-tuning-key would key
it and tuned as that conv/gemm (fake_fusion.py); the keys go to `fusion_config_file` in the
working directory, as the real tool writes them.

Standard library only (the real tool needs numpy/pandas/tqdm; tests must not).
"""

from __future__ import annotations

import os
import sys
from collections.abc import Callable

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
import fake_costs
import overlay_hook
from fake_perfrunner import (  # noqa: F401 (perfRunner's names, as the real tool imports them)
    AttentionConfiguration,
    ConvConfiguration,
    ConvGemmConfiguration,
    GemmConfiguration,
    GemmGemmConfiguration,
)
from standin_runner import e3, e4

ERAS: dict[str, Callable[[list[str]], int]] = {"E3": e3.main, "E4": e4.main}
OVERLAY = "standin_overlay"  # a test build's module (tests/support/standin_faults)


def main(argv: list[str] | None = None) -> int:
    argv = sys.argv[1:] if argv is None else argv
    era = os.environ.get("FAKE_TUNINGRUNNER_ERA", "E3").upper()
    eras = dict(ERAS)
    extra = overlay_hook.load(OVERLAY)
    if extra is not None:
        extra.install(eras, era, argv)  # its eras added, its faults wrapped around the seams
    if "--help" not in argv:
        fake_costs.startup()
    run = eras.get(era)
    if run is None:
        names = sorted(eras)
        print(f"FAKE_TUNINGRUNNER_ERA must be {', '.join(names[:-1])} or {names[-1]}, not "
              f"{era!r}", file=sys.stderr)  # fmt: skip
        return 2
    return run(argv)


if __name__ == "__main__":
    sys.exit(main())
