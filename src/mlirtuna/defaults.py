"""Defaults that `--help` shows, apart from the modules that use them: the CLI reads them without
importing the database layer, so `mlirtuna --help` starts fast (docs/benchmarks.md, start-up)."""

from __future__ import annotations

DEFAULT_TUNING_SPACE = "full"  # tuningRunner E3's default
DEFAULT_LEASE_S = 120.0
DEFAULT_MAX_RETRIES = 3
DEFAULT_BACKOFF_S = 10.0
DEFAULT_QUICK_THRESHOLD = 0.93  # quickTuningGen.py's --th and tuning_eval's coverage threshold
