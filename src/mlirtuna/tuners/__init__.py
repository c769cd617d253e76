"""Tuners: rocmlir (tuningRunner.py), cpu (the built-in NumPy reference), sleep (for tests).

`make(spec)` turns a --tuner value into a tuner: a name, `sleep:SECONDS`, or `module.path:attr`
for a tuner of your own (a callable returning an object with `name` and `tune()`).
"""

from __future__ import annotations

import importlib

from mlirtuna.errors import UserError
from mlirtuna.tuners.base import Candidate, TuneContext, TuneOutcome, Tuner

NAMES = ("rocmlir", "cpu", "sleep")
# Tuners whose perf configs are told apart by their prefix (see tuner_family_of).
FAMILIES = ("rocmlir", "cpu", "sleep")

__all__ = [
    "FAMILIES",
    "NAMES",
    "Candidate",
    "TuneContext",
    "TuneOutcome",
    "Tuner",
    "make",
    "tuner_family_of",
]


def tuner_family_of(perf_config: str) -> str:
    """Which tuner wrote a perf config: `cpu:…` (cpu:v1, cpu:attn:v1), `sleep:…`, else
    rocmlir (v2:…, v3:…, attn:v1:… and the bare comma lists of older rocMLIR). Not
    keys.perf_config_family, which tells a perf config's format apart (v2, attn:v1, …)."""
    prefix = perf_config.partition(":")[0]
    return prefix if prefix in ("cpu", "sleep") else "rocmlir"


def make(spec: str, *, mlir_build_dir: str | None = None) -> Tuner:
    name, _, arg = spec.partition(":")
    if name == "cpu":
        from mlirtuna.tuners.cpu import CpuTuner

        return CpuTuner()
    if name == "rocmlir":
        from mlirtuna.tuners.rocmlir import RocmlirTuner

        return RocmlirTuner(mlir_build_dir)
    if name == "sleep":
        from mlirtuna.tuners.sleep import SleepTuner

        try:
            return SleepTuner(float(arg or 0))
        except ValueError:
            raise UserError(f"bad tuner {spec!r}: expected sleep:SECONDS") from None
    if "." in name and arg:
        return _plugin(name, arg)
    raise UserError(f"unknown tuner {spec!r} (known: {', '.join(NAMES)}, or module.path:factory)")


def _plugin(module: str, attr: str) -> Tuner:
    try:
        factory = getattr(importlib.import_module(module), attr)
    except (ImportError, AttributeError) as exc:
        raise UserError(f"cannot load tuner {module}:{attr}: {exc}") from None
    return factory()
