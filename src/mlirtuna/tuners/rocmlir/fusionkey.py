"""A fusion module's tuning key as rocMLIR computes it: perfRunner's pipeline, run on a build.

`rocmlir-gen -fut NAME -arch CHIP --clone-harness FILE | rocmlir-opt -migraphx-to-tosa |
rocmlir-driver -host-pipeline highlevel -kernel-pipeline highlevel -targets CHIP |
rocmlir-gen --emit-tuning-key -`; the rocmlir-opt stage only when the module's RUN line lowers
MIGraphX that way (catalog.read_problem calls it when `import --op fusion` names a build).
"""

from __future__ import annotations

import subprocess
from pathlib import Path

from mlirtuna.errors import UserError

KEY_TIMEOUT_S = 120


def key_pipeline(path: Path, text: str, build_dir: str, arch: str) -> list[list[str]]:
    """perfRunner's fusion key pipeline for one module (reference rocmlir-newest §6)."""
    from mlirtuna.problems.migraphx import read_module

    module = read_module(text, str(path))
    fut = module.function_under_test()
    bin_dir = Path(build_dir) / "bin"
    stages = [
        [str(bin_dir / "rocmlir-gen"), "-fut", fut, "-arch", arch, "--clone-harness", str(path)]
    ]
    if any("-migraphx-to-tosa" in run for run in module.run_lines):
        stages.append([str(bin_dir / "rocmlir-opt"), "-migraphx-to-tosa"])
    stages.append(
        [str(bin_dir / "rocmlir-driver"), "-host-pipeline", "highlevel", "-kernel-pipeline",
         "highlevel", "-targets", arch]
    )  # fmt: skip
    stages.append([str(bin_dir / "rocmlir-gen"), "--emit-tuning-key", "-"])
    return stages


def emit_tuning_key(path: Path, text: str, build_dir: str, arch: str) -> str:
    """rocmlir-gen's `--emit-tuning-key` output for the module; UserError when a stage fails."""
    stages = key_pipeline(path, text, build_dir, arch)
    data: bytes | None = None
    for stage in stages:
        try:
            done = subprocess.run(
                stage, input=data, capture_output=True, timeout=KEY_TIMEOUT_S, check=False
            )
        except FileNotFoundError:
            raise UserError(f"{stage[0]}: not found (is {build_dir} a rocMLIR build?)") from None
        except subprocess.TimeoutExpired:
            raise UserError(f"{path}: {Path(stage[0]).name} ran past {KEY_TIMEOUT_S} s") from None
        if done.returncode != 0:
            tail = done.stderr.decode(errors="replace").strip().splitlines()[-1:] or [""]
            raise UserError(f"{path}: {Path(stage[0]).name} exited {done.returncode}: {tail[0]}")
        data = done.stdout
    return (data or b"").decode(errors="replace")
