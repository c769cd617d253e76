"""A fusion module for the tool: the tuning key rocMLIR gives it, and the file it is tuned from.

The tuning key comes from the rocMLIR build through perfRunner's pipeline (`rocmlir-gen -fut NAME
-arch CHIP --clone-harness FILE | rocmlir-opt -migraphx-to-tosa | rocmlir-driver -host-pipeline
highlevel -kernel-pipeline highlevel -targets CHIP | rocmlir-gen --emit-tuning-key -`; the
rocmlir-opt stage only when the module's RUN line lowers MIGraphX that way). Fusion modules
travel in the database: for a job, the module is written into the job's temporary directory under
its file name (module_path) and named on the tool's command line.
"""

from __future__ import annotations

import subprocess
from pathlib import Path

from mlirtuna.errors import UserError
from mlirtuna.problems import Problem
from mlirtuna.problems.fusion import FusionProblem

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


def module_path(out: Path, problem: FusionProblem) -> Path:
    """Where a fusion module is written for the tool: a directory of its own (E2's --test_dir
    tunes every *.mlir of it). The name ends in .mlir whatever the file was called."""
    name = Path(problem.file_name).name
    return out.parent / "module" / (name if name.endswith(".mlir") else f"{name}.mlir")


def write_module(out: Path, problem: Problem) -> None:
    """A fusion problem's module, written where the tool's command line will name it."""
    if isinstance(problem, FusionProblem):
        module = module_path(out, problem)
        module.parent.mkdir()
        module.write_text(problem.module_text, encoding="utf-8")
