"""The toy plugin's own tests, as a tuner's author writes them: mlirtuna's tuner contract
subclassed (docs/adding-a-tuner.md, "Testing it"). Run from the plugin's directory with the
plugin installed: `python -m pytest tests` (mlirtuna's tests/test_tuner_contract.py does)."""

from __future__ import annotations

import pytest
import toytuner

from mlirtuna.testing import TunerContract, parse_problem


class TestToyTuner(TunerContract):
    @pytest.fixture
    def tuner_spec(self) -> str:
        return "toy"

    @pytest.fixture
    def problem(self):
        return parse_problem("gemm", "-t f32 -transA false -transB false -g 1 -m 64 -n 64 -k 64")


def test_its_fields_name_the_tools_number():
    assert toytuner.KIND.perf_fields is not None
    assert toytuner.KIND.perf_fields("toy:v1:3") == {"n": 3}
