"""The rocmlir tuner as the registry knows it (tuners/registry.py): one worker per GPU, a build's
tuningRunner.py, E4's session settings, two-stage sessions where the build has them."""

from __future__ import annotations

from mlirtuna.tuners.registry import TunerKind
from mlirtuna.tuners.rocmlir.artifacts import check_bundle, index_commits, merge_artifacts
from mlirtuna.tuners.rocmlir.checks import build_limit, check_build, check_split_build
from mlirtuna.tuners.rocmlir.eras import E4_SETTINGS
from mlirtuna.tuners.rocmlir.tuner import RocmlirTuner

KIND = TunerKind(
    name="rocmlir",
    make=lambda _arg, build_dir: RocmlirTuner(build_dir),
    gpu=True,
    perf_prefix="",  # v2:…, v3:…, attn:v1:… and older rocMLIR's bare lists
    uses_build=True,
    check_build=check_build,
    check_split_build=check_split_build,
    merge_artifacts=merge_artifacts,
    artifact_commits=index_commits,
    check_artifacts=check_bundle,
    settings=E4_SETTINGS,
    build_limit=build_limit,
)
