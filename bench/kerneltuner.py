"""Kernel Tuner cache files (the public real-GPU tuning data) as mlirtuna candidate matrices.

The one reader of that format in the project: a Kernel Tuner cache is a benchmark input, never a
farm input (no CLI command reads it). A cache (optionally gzip) is JSON with `device_name`,
`tune_params_keys` and `cache`: {comma-joined parameter values: {..., "time": mean ms}}. A
config whose `time` is not a number (Kernel Tuner writes the error's name there, e.g.
"RuntimeFailedConfig") or that has no `time` failed: it is kept, as NaN, never as fast.

Also the `.debug` rows that rocMLIR's quickTuningGen.py reads, for running it on the same data.
"""

from __future__ import annotations

import gzip
import json
import math
from dataclasses import dataclass, field
from pathlib import Path

import numpy as np

from mlirtuna.history import quick


class CacheError(ValueError):
    """A cache file that cannot be read: the message names the file."""


@dataclass
class Cache:
    path: Path
    device: str
    times: dict[str, float]  # config key -> mean ms; NaN = failed
    #: config key -> its recorded repeats in ms (the cache's `times`), where the file has them
    repeats: dict[str, list[float]] = field(default_factory=dict)

    @property
    def failed(self) -> int:
        return sum(1 for t in self.times.values() if math.isnan(t))


def read_cache(path: Path) -> Cache:
    """One Kernel Tuner cache file; CacheError (naming the file) when it is not one."""
    opener = gzip.open if path.name.endswith(".gz") else open
    try:
        with opener(path, "rt", encoding="utf-8") as f:
            text = f.read()
    except (OSError, EOFError, UnicodeDecodeError) as e:
        raise CacheError(f"{path}: cannot read: {e}") from e
    if not text.strip():
        raise CacheError(f"{path}: empty file")
    try:
        data = json.loads(text)
    except json.JSONDecodeError as e:
        raise CacheError(f"{path}:{e.lineno}: not JSON: {e.msg}") from e
    if not isinstance(data, dict) or not isinstance(data.get("cache"), dict):
        raise CacheError(f"{path}: not a Kernel Tuner cache (no `cache` object)")
    if not data["cache"]:
        raise CacheError(f"{path}: no configs in `cache`")
    times = {str(key): _time(entry) for key, entry in data["cache"].items()}
    repeats = {str(key): _repeats(entry) for key, entry in data["cache"].items()}
    device = str(data.get("device_name") or path.name)
    return Cache(path, device, times, {k: r for k, r in repeats.items() if r})


def _repeats(entry: object) -> list[float]:
    """A config's recorded repeat times (positive numbers only)."""
    got = entry.get("times") if isinstance(entry, dict) else None
    if not isinstance(got, list):
        return []
    return [
        float(t)
        for t in got
        if isinstance(t, (int, float)) and not isinstance(t, bool) and math.isfinite(t) and t > 0
    ]


def _time(entry: object) -> float:
    t = entry.get("time") if isinstance(entry, dict) else None
    if isinstance(t, bool) or not isinstance(t, (int, float)):
        return math.nan  # an error name, null or missing: failed
    return float(t) if math.isfinite(t) and t > 0 else math.nan


def read_tree(root: Path) -> dict[str, dict[str, Cache]]:
    """{KERNEL: {GPU: cache}} from every KERNEL/GPU.json[.gz] under root."""
    out: dict[str, dict[str, Cache]] = {}
    for path in sorted(root.glob("*/*.json*")):
        gpu = path.name.split(".json")[0]
        out.setdefault(path.parent.name, {})[gpu] = read_cache(path)
    if not out:
        raise CacheError(f"{root}: no KERNEL/GPU.json.gz files")
    return out


def matrix(caches: dict[str, Cache], configs: list[str] | None = None) -> quick.Matrix:
    """One row (and unit) per GPU; a config a GPU's file lacks counts as failed there."""
    gpus = sorted(caches)
    if configs is None:
        configs = sorted(set().union(*(caches[g].times for g in gpus)))
    times = np.array([[caches[g].times.get(c, np.nan) for c in configs] for g in gpus])
    return quick.Matrix(gpus, configs, times.reshape(len(gpus), len(configs)))


# rocMLIR's .debug conv columns (perfRunner table_entry(), as `export --format debug` writes).
DEBUG_COLUMNS = [
    *("Chip", "numCU", "Direction", "DataType", "FilterLayout", "InputLayout", "OutputLayout"),
    *("N", "C", "H", "W", "K", "Y", "X", "DilationH", "DilationW", "StrideH", "StrideW"),
    *("PaddingH", "PaddingW", "PerfConfig", "TFlops"),
]


def write_debug(path: Path, caches: dict[str, Cache]) -> None:
    """The GPUs as problems of one `.debug` file: one arch (Chip `kt`, so quickTuningGen solves
    one cover over them), each GPU a conv problem of its own (N = its index), TFlops = 1 / ms
    (only ratios matter), NaN for a failed config, as tuningRunner writes it."""
    lines = ["\t".join(DEBUG_COLUMNS)]
    for n, gpu in enumerate(sorted(caches), start=1):
        head = f"kt\t0\tfwd\tf32\tkcyx\tnchw\tnkhw\t{n}\t1\t64\t64\t1\t3\t3\t1\t1\t1\t1\t0\t0"
        for key, t in caches[gpu].times.items():
            tflops = "NaN" if math.isnan(t) else repr(1.0 / t)
            lines.append(f"{head}\t{key}\t{tflops}")
    path.write_text("\n".join(lines) + "\n", encoding="utf-8")
