"""The `.debug` file tuningRunner writes with `--debug`: one row per candidate it tried.

A pandas TSV of perfRunner's table_entry() columns. Columns are found by name (they differ per
op and era; E2 adds an unnamed index column first, E3 a MeasurementsMs column last). There is
no time column: the time is derived from TFlops by the caller.
"""

from __future__ import annotations

import csv
import dataclasses
import json
import math
from collections.abc import Iterable
from dataclasses import dataclass
from pathlib import Path

from mlirtuna.errors import TunerError

# .debug columns that describe the candidate, not the problem: the rest tell blocks apart.
_CANDIDATE_COLUMNS = ("PerfConfig", "TFlops", "MeasurementsMs", "LDSBankConflict")


@dataclass(frozen=True)
class DebugRow:
    """One candidate line of a `.debug` file: its perf config and the tool's TFlops (None for
    N/A: pandas writes NaN as an empty field)."""

    perf_config: str
    tflops: float | None
    lineno: int
    measurements_ms: tuple[float, ...] | None = None  # E3's MeasurementsMs, when written
    # The problem's columns (every column but the candidate's): one config's rows share them.
    problem: tuple[str, ...] = ()

    def _replace_problem(self, problem: tuple[str, ...]) -> DebugRow:
        return dataclasses.replace(self, problem=problem)


def read_debug_file(path: Path) -> list[DebugRow]:
    """Reads a tuningRunner `.debug` file (see the module docstring)."""
    with open(path, encoding="utf-8", newline="") as f:
        return parse_debug_lines(f, path)


def parse_debug_lines(lines: Iterable[str], path: Path, skipped: int = 0) -> list[DebugRow]:
    """read_debug_file on text given as lines (a batch reads the file as the tool writes it:
    the header, then the lines after the first `skipped` data lines)."""
    reader = csv.reader(lines, delimiter="\t")
    header = next(reader, None)
    if not header:
        return []
    try:
        pc_col, tf_col = header.index("PerfConfig"), header.index("TFlops")
    except ValueError:
        raise TunerError(f"{path}:1: .debug header lacks PerfConfig or TFlops") from None
    ms_col = header.index("MeasurementsMs") if "MeasurementsMs" in header else None
    problem_cols = [i for i, name in enumerate(header) if name not in _CANDIDATE_COLUMNS]
    return [
        _debug_row(
            path, reader.line_num + skipped, fields, len(header), pc_col, tf_col, ms_col
        )._replace_problem(tuple(fields[i] for i in problem_cols))
        for fields in reader
        if fields and fields != header
    ]


def _debug_row(
    path: Path,
    lineno: int,
    fields: list[str],
    width: int,
    pc_col: int,
    tf_col: int,
    ms_col: int | None = None,
) -> DebugRow:
    if len(fields) != width:
        raise TunerError(f"{path}:{lineno}: {len(fields)} fields, the .debug header has {width}")
    text = fields[tf_col].strip()
    try:
        tflops = float(text) if text else None
    except ValueError:
        raise TunerError(f"{path}:{lineno}: TFlops {text!r} is not a number") from None
    if not fields[pc_col]:
        raise TunerError(f"{path}:{lineno}: empty PerfConfig")
    ms = _measurements(fields[ms_col]) if ms_col is not None else None
    return DebugRow(fields[pc_col], tflops, lineno, ms)


def _measurements(text: str) -> tuple[float, ...] | None:
    """A MeasurementsMs cell (pandas writes the list's repr); None when empty or unreadable:
    the statistics are extra, a candidate without them is still a candidate."""
    try:
        values = json.loads(text) if text.strip() else None
    except ValueError:
        return None
    if not isinstance(values, list) or not values:
        return None
    try:
        ms = tuple(float(v) for v in values)
    except (TypeError, ValueError):
        return None
    return ms if all(math.isfinite(v) and v > 0 for v in ms) else None
