"""mlirtuna.testing's TunerContract over every registered tuner (issue 46): the built-ins here,
rocmlir on the stand-in build; the toy plugin by its own test suite (tests/plugin_dist), run as
its author runs it, in a pytest of its own with only the plugin installed beside mlirtuna."""

from __future__ import annotations

import os
import subprocess
import sys
from pathlib import Path

import pytest
from support.rocmlir import GEMM
from support.standin import standin_build

from mlirtuna.problems import Problem
from mlirtuna.testing import TunerContract, parse_problem
from mlirtuna.tuners import registry

SMALL_GEMM = "-t f32 -transA false -transB false -g 1 -m 64 -n 64 -k 64"
PLUGIN_DIST = Path(__file__).resolve().parent / "plugin_dist"


class BuiltIn(TunerContract):
    """The contract of a built-in tuner, named by SPEC (not collected: no Test prefix)."""

    SPEC = ""

    @pytest.fixture
    def tuner_spec(self) -> str:
        return self.SPEC


class TestRocmlir(BuiltIn):
    """The rocmlir tuner driving the stand-in build's tuningRunner.py (E3, the default: it
    batches; E4 below: it splits too)."""

    SPEC = "rocmlir"

    @pytest.fixture
    def mlir_build_dir(self, tmp_path, monkeypatch) -> str:
        return str(standin_build(tmp_path, monkeypatch))

    @pytest.fixture
    def problem(self) -> Problem:
        return parse_problem("gemm", GEMM)


class TestRocmlirE4(TestRocmlir):
    """The same on an E4 build: its two-stage mode (compile, then benchmark) too."""

    @pytest.fixture
    def mlir_build_dir(self, tmp_path, monkeypatch) -> str:
        return str(standin_build(tmp_path, monkeypatch, era="E4"))


class TestCpu(BuiltIn):
    SPEC = "cpu"

    @pytest.fixture
    def problem(self) -> Problem:
        return parse_problem("gemm", SMALL_GEMM)

    @pytest.fixture
    def unsupported_problem(self) -> Problem:
        return parse_problem("gemm", SMALL_GEMM.replace("f32", "fp8"))


class TestSleep(BuiltIn):
    SPEC = "sleep:0.1"  # long enough to be stopped part-way

    @pytest.fixture
    def problem(self) -> Problem:
        return parse_problem("gemm", SMALL_GEMM)


def test_every_built_in_tuner_keeps_the_contract_here():
    """A tuner added to registry.BUILT_IN without a TunerContract subclass here fails this."""
    classes = [TestRocmlir, TestRocmlirE4, TestCpu, TestSleep]
    assert {c for c in globals().values() if isinstance(c, type) and issubclass(c, BuiltIn)} == {
        BuiltIn,
        *classes,
    }
    assert {registry.split_spec(c.SPEC)[0] for c in classes} == set(registry.BUILT_IN)


def test_the_plugins_own_suite_subclasses_the_contract_and_passes():
    """The issue's "done when": the toy plugin's tests (plugin_dist/tests) subclass the contract
    and pass, run by pytest in the plugin's own directory (its own rootdir, none of mlirtuna's
    conftest), the plugin installed by its dist-info on PYTHONPATH."""
    env = dict(os.environ, PYTHONPATH=str(PLUGIN_DIST), MLIRTUNA_TOOL_ENV="TOYTOOL_*")
    ran = subprocess.run(
        [sys.executable, "-m", "pytest", "-q", "-p", "no:cacheprovider", "-p", "no:xdist",
         "tests"],
        cwd=PLUGIN_DIST, env=env, capture_output=True, text=True, timeout=600, check=False,
    )  # fmt: skip
    assert ran.returncode == 0, ran.stdout + ran.stderr
    summary = ran.stdout.strip().splitlines()[-1]
    assert " passed" in summary and "failed" not in summary, ran.stdout
