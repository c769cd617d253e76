"""The stand-in rocMLIR build for tests: one factory, `standin_build`, for every test that drives
the stand-in tuningRunner.py (the `build` fixture of tests/conftest.py and the test modules' own
`build` fixtures call it), and the stand-in's own functions in-process (STAND_IN) to compute what
it reports.

A test build is a private copy of the package's build (mlirtuna.standin.BUILD) with the tests'
overlay (support/standin_faults: older eras, rocmlirTriton's other E4 line, faults, delays, an
argv log) on the tool's path; the package's build has none of those knobs."""

from __future__ import annotations

import importlib
import json
import os
import shutil
import sys
from pathlib import Path
from types import SimpleNamespace

import pytest

from mlirtuna import standin

BUILD = standin.BUILD  # shipped in the package (mlirtuna try-rocmlir)
BIN = BUILD / "bin"
OVERLAY_PATH = Path(__file__).resolve().parent / "standin_faults"  # holds standin_overlay
OLD_ERAS = ("E2", "E2.5")  # the overlay's eras


def with_overlay(env: dict[str, str]) -> dict[str, str]:
    """`env` with the tests' overlay first on PYTHONPATH (the tool's environment passes
    PYTHON*), so that the stand-in it starts takes FAKE_* faults and the older eras."""
    paths = [p for p in env.get("PYTHONPATH", "").split(os.pathsep) if p]
    if str(OVERLAY_PATH) not in paths:
        paths.insert(0, str(OVERLAY_PATH))
    return {**env, "PYTHONPATH": os.pathsep.join(paths)}


def clean_environment(monkeypatch: pytest.MonkeyPatch) -> None:
    """No FAKE_* or MLIRTUNA_ROCMLIR* setting and no pinned GPU left from elsewhere; this
    Python runs the tool; the overlay on PYTHONPATH."""
    for name in list(os.environ):
        if name.startswith(("FAKE_", "MLIRTUNA_ROCMLIR")) or name.endswith("_VISIBLE_DEVICES"):
            monkeypatch.delenv(name)
    monkeypatch.setenv("MLIRTUNA_ROCMLIR_PYTHON", sys.executable)
    monkeypatch.setenv("PYTHONPATH", with_overlay(dict(os.environ))["PYTHONPATH"])


def standin_build(
    tmp_path: Path,
    monkeypatch: pytest.MonkeyPatch,
    *,
    era: str | None = None,
    log: bool = False,
    **knobs: str,
) -> Path:
    """A private copy of the stand-in build at tmp_path/build (the tool's cwd) in a clean
    environment (clean_environment). `era`: FAKE_TUNINGRUNNER_ERA (else the stand-in's default,
    E3); `log`: each invocation's argv recorded in tmp_path/argv.jsonl (calls); `knobs`: more
    settings, FAKE_TUNINGRUNNER_FAULT="hang" and the like."""
    build = tmp_path / "build"
    shutil.copytree(BUILD, build, ignore=shutil.ignore_patterns("__pycache__"))
    clean_environment(monkeypatch)
    if era:
        monkeypatch.setenv("FAKE_TUNINGRUNNER_ERA", era)
    if log:
        monkeypatch.setenv("FAKE_TUNINGRUNNER_LOG", str(tmp_path / "argv.jsonl"))
    for name, value in knobs.items():
        monkeypatch.setenv(name, value)
    return build


def calls(build: Path) -> list[dict]:
    """The invocations a `log` build recorded, in order."""
    path = build.parent / "argv.jsonl"
    return [json.loads(line) for line in path.read_text().splitlines()] if path.exists() else []


def load_stand_in() -> SimpleNamespace:
    """The stand-in's own functions, to compute what it reports (same generator, no
    subprocess): Gpu, describe and perf_configs (any era, the overlay's included),
    candidate_time_ns, driver_stats."""
    for path in (str(BIN), str(OVERLAY_PATH)):
        if path not in sys.path:
            sys.path.append(path)
    common = importlib.import_module("standin_runner.common")
    problems = importlib.import_module("standin_runner.problems")
    candidates = importlib.import_module("standin_runner.candidates")
    older = importlib.import_module("standin_overlay.e2")

    def describe(op: str, config: str, gpu, era: str = "E3") -> tuple[dict, float]:
        return (older if era in OLD_ERAS else problems).describe(op, config, gpu)

    def perf_configs(op: str, space: str, era: str) -> list[str]:
        if era in OLD_ERAS:
            return older.perf_configs(op, space)
        return candidates.perf_configs(op, space, era)

    return SimpleNamespace(
        Gpu=common.Gpu,
        describe=describe,
        perf_configs=perf_configs,
        candidate_time_ns=candidates.candidate_time_ns,
        driver_stats=candidates.driver_stats,
    )


STAND_IN = load_stand_in()
