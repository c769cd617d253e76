"""Tuners: rocmlir (tuningRunner.py), cpu (the built-in NumPy reference), sleep (for tests), and
plugins.

What each tuner is (GPU or CPU workers, spaces, perf-config family, how its tools are stopped,
its session checks) is its `TunerKind` in the registry (registry.py). `make(spec)` turns a
--tuner value into a tuner: a name, `NAME:ARG` (`sleep:SECONDS`), or `module.path:attr` for a
tuner of your own; plugins also register by entry point (docs/adding-a-tuner.md).
"""

from __future__ import annotations

from mlirtuna.tuners.base import Candidate, TuneContext, TuneOutcome, Tuner
from mlirtuna.tuners.registry import (
    AUTO,
    BuildLimit,
    SessionBuild,
    TunerKind,
    build_limit,
    cannot_run,
    kind,
    make,
    names,
    tuner_of,
)

__all__ = [
    "AUTO",
    "BuildLimit",
    "Candidate",
    "SessionBuild",
    "TuneContext",
    "TuneOutcome",
    "Tuner",
    "TunerKind",
    "build_limit",
    "cannot_run",
    "kind",
    "make",
    "names",
    "tuner_of",
]
