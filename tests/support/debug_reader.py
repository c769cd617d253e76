"""A reader of rocMLIR's `.debug` tuning files, written for tests from
shared/reference/rocmlir-newest.md §7 (what quickTuningGen.py and analysis/tuning_eval expect:
pandas TSV of perfRunner's table_entry() rows, `PerfConfig` and `TFlops` columns, NaN or empty
TFlops for an inapplicable candidate). It shares no code with mlirtuna.debugexport on purpose.

It reads like `pandas.read_csv(path, sep="\\t")`: the first line names the columns, every later
line has one value per column, "" / "NaN" / "nan" are missing values.
"""

from __future__ import annotations

import math

MISSING = {"", "NaN", "nan", "NA", "N/A"}


def read_debug(path: str) -> list[dict[str, str | float | None]]:
    """Rows as dicts; TFlops as a float (NaN when missing); other cells as written (None when
    missing)."""
    with open(path, encoding="utf-8") as f:
        lines = f.read().split("\n")
    if lines and lines[-1] == "":
        lines.pop()
    header = lines[0].split("\t")
    assert "PerfConfig" in header and "TFlops" in header, header
    rows = []
    for number, line in enumerate(lines[1:], start=2):
        cells = line.split("\t")
        assert len(cells) == len(header), f"line {number}: {len(cells)} cells for {len(header)}"
        row: dict[str, str | float | None] = {}
        for name, cell in zip(header, cells, strict=True):
            if name == "TFlops":
                row[name] = math.nan if cell in MISSING else float(cell)
            else:
                row[name] = None if cell in MISSING else cell
        rows.append(row)
    return rows


def best_per_problem(rows: list[dict], problem_columns: list[str]) -> dict[tuple, float]:
    """What quickTuningGen does first: per problem, the best TFlops over its perf configs."""
    best: dict[tuple, float] = {}
    for row in rows:
        tflops = row["TFlops"]
        if math.isnan(tflops):
            continue
        key = tuple(row[c] for c in problem_columns)
        best[key] = max(best.get(key, 0.0), tflops)
    return best
