"""The `.debug` file tuningRunner writes with `--debug`: one row per candidate it tried.

The format is formats/debug.py's (each op's columns declared in its OpSpec; `export --format
debug` writes it): a pandas TSV of perfRunner's table_entry() columns, read by its header names,
never by position (the columns differ per op and era). A column this reader does not know is
ignored. The header is written once; a file whose header changes mid-file (the tool refuses to
append another op's schema) is an error. What this module adds is the measurements' meaning:

- `Stats`: what rocmlir-tuning-driver `--show-stats` printed for the candidate, which
  tuningRunner json.loads and pandas writes as the dict's repr (JSON accepted too); empty for
  N/A candidates. Its times are in **milliseconds** (rocmlir-tuning-driver.cpp,
  benchmarkKernels: every run is a hipEventElapsedTime or a CPU timer in ms; only the time
  column is converted, msToNs). Two shapes:
  - `{'min': …, 'median': …, 'max': …, 'stddev': …, 'cv': …}` (cv in percent), where each run
    was timed: read into a stats.Spread in ns: its median and min, the IQR taken as
    1.349 * stddev (a normal distribution's), the sample count only where the dict gives one
    (`count`/`n`/`samples`; the driver gives none, so the noise stays unknown). A min above
    the median is a malformed file (TunerError, FILE:LINE).
  - `{'total_cpu_time': …, 'iterations': N}`: the driver's default (legacy) mode, which
    3fc5be9e's tuningRunner uses (`--num-iterations`, no `--triton-benchmark-mode`), times a
    kernel whose warm-up run took under 1 ms with one CPU timer over all N iterations. Read as
    a median estimate total / N (in ns) with no min and no spread (None, not 0).
- `MeasurementsMs` (rocmlirTriton's E4 with `--debug`, instead of Stats): what
  rocmlir-tuning-driver `--show-all-measurements` prints, a JSON list of every measured run's
  hipEventElapsedTime in milliseconds, in the order they ran (rocmlir-tuning-driver.cpp,
  benchmarkKernels), which tuningRunner stores as the list pandas writes (its repr).
  Summarized in ns with stats.summarize; empty for N/A and Discarded candidates. Its fastest run
  can never be slower than the row's time (the driver's median, `--use-median`): outcome.py
  checks that, a violation is a malformed file.
- Every time read from Stats or MeasurementsMs must be one a kernel run can take
  (stats.MIN_KERNEL_NS to stats.MAX_KERNEL_NS, 1 ns to a day; a stddev at most a day): a cell
  with one outside is the tool's fault, not a measurement. Its row keeps its TFlops (the
  candidate stays) but drops its statistics, and says why (`DebugRow.dropped`, FILE:LINE), which
  the outcome's notes carry (the worker logs them).
- `Status` (E4): `Measured`, `N/A` or `Discarded` (outside the top k of `--two-stage-topk`);
  a candidate without TFlops keeps it as its reason.

There is no time column: the time is derived from TFlops by the caller. Rows name no test vector:
a batch tells its configs' blocks apart by the problem columns (`problem`, `matches`).
"""

from __future__ import annotations

import ast
import csv
import json
import math
from collections.abc import Iterable, Mapping
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from mlirtuna import problems, stats
from mlirtuna.errors import InputError, TunerError
from mlirtuna.formats import debug
from mlirtuna.problems import Problem
from mlirtuna.problems.fusion import FusionProblem
from mlirtuna.tuners.process import output_lines

MAX_SAMPLES = 2**31 - 1  # candidate.samples is an INTEGER: a larger count would fail the record

NS_PER_MS = 1e6  # the driver's msToNs: its stats are in ms, the time column in ns

# A normal distribution's IQR in standard deviations: Stats gives stddev, a Spread holds an IQR.
IQR_PER_STDDEV = 1.349

# Per op: the .debug columns that show a problem's field as written (the op's OpSpec.debug),
# used to tell a batch's blocks apart. Layout columns are spelled as rocmlir-gen spells them and
# are left out: the sizes and types already tell configs of one batch apart.
FIELD_COLUMNS: dict[str, dict[str, str]] = {
    s.name: s.debug.fields() for s in problems.SPECS if s.debug is not None
}
# The columns that describe the problem and the GPU (one config's rows share them); every other
# named column is the candidate's (PerfConfig, TFlops, Stats, Status, LDSBankConflict, …) or
# unknown, and ignored.
PROBLEM_COLUMNS = debug.problem_column_names([s.debug for s in problems.SPECS if s.debug])


class ImplausibleTime(ValueError):
    """A Stats or MeasurementsMs time no kernel run can take (stats.kernel_time_fault)."""


@dataclass(frozen=True)
class DebugRow:
    """One candidate line of a `.debug` file: its perf config and the tool's TFlops (None for
    N/A: pandas writes NaN as an empty field)."""

    perf_config: str
    tflops: float | None
    lineno: int
    spread: stats.Spread | None = None  # from Stats (E3) or MeasurementsMs (E4)
    status: str | None = None  # E4's Status column, when written
    # The problem's columns as (name, value) pairs: one config's rows share them.
    problem: tuple[tuple[str, str], ...] = ()
    source: str = ""  # the file it was read from, for FILE:LINE errors
    dropped: str = ""  # why its statistics were dropped (a time no kernel run can take)

    @property
    def where(self) -> str:
        return f"{self.source}:{self.lineno}"


def read_debug_file(path: Path) -> list[DebugRow]:
    """Reads a tuningRunner `.debug` file (see the module docstring)."""
    return parse_debug_lines(output_lines(path), path)  # each line capped, no link followed


def parse_debug_lines(lines: Iterable[str], path: Path, skipped: int = 0) -> list[DebugRow]:
    """read_debug_file on text given as lines (a batch reads the file as the tool writes it:
    the header, then the lines after the first `skipped` data lines)."""
    reader = csv.reader(lines, delimiter="\t")
    names = next(reader, None)
    if not names:
        return []
    try:
        header = debug.Header.read(names)
    except debug.DebugFormatError as exc:
        raise TunerError(f"{path}:1: {exc}") from None
    problem_cols = [name for name in header.named if name in PROBLEM_COLUMNS]
    rows = []
    for fields in reader:
        if not fields or fields == names:
            continue
        where = f"{path}:{reader.line_num + skipped}"
        if header.is_header(fields):
            raise TunerError(
                f"{where}: the .debug header changed mid-file (another op's or era's "
                "columns appended to this file)"
            )
        try:
            row = debug.parse_row(header, fields)
        except debug.DebugFormatError as exc:
            raise TunerError(f"{where}: {exc}") from None
        spread, dropped = _statistics(row.cells, where)
        status = row.cells.get(debug.STATUS, "").strip() or None
        rows.append(
            DebugRow(
                row.perf_config,
                row.tflops,
                reader.line_num + skipped,
                spread,
                status,
                problem=tuple((name, row.cells[name]) for name in problem_cols),
                source=str(path),
                dropped=dropped,
            )
        )
    return rows


def _statistics(cells: Mapping[str, str], where: str) -> tuple[stats.Spread | None, str]:
    """The row's Spread (Stats or MeasurementsMs), and why it was dropped ("" if it was not)."""
    try:
        if debug.STATS in cells:
            return parse_stats(cells[debug.STATS], where), ""
        if debug.MEASUREMENTS in cells:
            return _measurements(cells[debug.MEASUREMENTS]), ""
    except ImplausibleTime as exc:
        return None, f"{where}: {exc}: its statistics are dropped (a tool's fault)"
    return None, ""


def parse_stats(text: str, where: str = "Stats") -> stats.Spread | None:
    """A Stats cell (module docstring) as a Spread in ns; None when empty or unreadable: the
    statistics are extra, a candidate without them is still a candidate. A min above the
    median is no measurement at all: TunerError naming `where` (FILE:LINE). A time no kernel
    run can take (module docstring): ImplausibleTime."""
    if not text.strip():
        return None
    try:
        value = json.loads(text)
    except ValueError:
        try:
            value = ast.literal_eval(text)
        except (ValueError, SyntaxError, MemoryError, RecursionError):
            return None
    if not isinstance(value, dict):
        return None
    if "total_cpu_time" in value:
        return _one_timer(value)
    return _runs_stats(value, where)


def _runs_stats(value: Mapping[str, Any], where: str) -> stats.Spread | None:
    """The full shape: min/median/max/stddev of the runs, in ms."""
    median, low = _ms_to_ns(value.get("median")), _ms_to_ns(value.get("min"))
    stddev = _ms_to_ns(value.get("stddev"))
    if median is None or median <= 0:
        return None
    _plausible("Stats median", median, value["median"])
    if low is not None and low > 0:
        _plausible("Stats min", low, value["min"])
    if stddev is not None and stddev > stats.MAX_KERNEL_NS:  # 0 and a fraction of 1 ns are fine
        _plausible("Stats stddev", stddev, value["stddev"])
    if low is not None and low > median:
        raise TunerError(
            f"{where}: Stats min {low / NS_PER_MS:g} ms exceeds its median "
            f"{median / NS_PER_MS:g} ms (a malformed .debug file)"
        )
    count = next((value[k] for k in ("count", "n", "samples") if k in value), None)
    return stats.Spread(
        median=median,
        min=low if low is not None and low > 0 else median,
        iqr=IQR_PER_STDDEV * stddev if stddev is not None and stddev >= 0 else None,
        samples=_count(count),
    )


def _one_timer(value: Mapping[str, Any]) -> stats.Spread | None:
    """The legacy shape: one CPU timer over all iterations (ms): their mean, nothing more."""
    total, iterations = _ms_to_ns(value.get("total_cpu_time")), _count(value.get("iterations"))
    if total is None or total <= 0 or iterations is None:
        return None
    mean = total / iterations
    _plausible("Stats total_cpu_time / iterations", mean, value["total_cpu_time"] / iterations)
    return stats.Spread(median=mean, min=None, iqr=None, samples=None)


def _plausible(what: str, ns: float, ms: float | None = None) -> None:
    """ImplausibleTime unless `ns` is a time one kernel run can take; `ms`: the cell's value
    as written, where the conversion overflowed (1e303 ms is inf ns)."""
    fault = stats.kernel_time_fault(ns)
    if fault:
        raise ImplausibleTime(f"{what} {ns / NS_PER_MS if ms is None else ms:g} ms is {fault}")


def _count(value: Any) -> int | None:
    ok = isinstance(value, int) and not isinstance(value, bool) and 0 < value <= MAX_SAMPLES
    return value if ok else None


def _ms_to_ns(value: Any) -> float | None:
    """ms as ns; inf where it overflows (1e303 ms), for _plausible to refuse."""
    ms = _number(value)
    return None if ms is None else ms * NS_PER_MS


def _number(value: Any) -> float | None:
    if isinstance(value, bool) or not isinstance(value, int | float):
        return None
    return float(value) if math.isfinite(value) else None


def _measurements(text: str) -> stats.Spread | None:
    """A MeasurementsMs cell (the list's repr, in ms) summarized in ns; None when empty or
    unreadable; ImplausibleTime when a run is a time no kernel run can take."""
    try:
        values = json.loads(text) if text.strip() else None
    except ValueError:
        return None
    if not isinstance(values, list) or not values:
        return None
    try:
        ms = [float(v) for v in values]
    except (TypeError, ValueError):
        return None
    if not all(math.isfinite(v) and v > 0 for v in ms):
        return None
    for value in (min(ms), max(ms)):  # 1e303 ms overflows to inf ns: checked as converted
        _plausible("MeasurementsMs run", value * NS_PER_MS, value)
    return stats.summarize([m * NS_PER_MS for m in ms])


def matches(problem: Problem, columns: tuple[tuple[str, str], ...]) -> bool | None:
    """Whether a block's problem columns name `problem` (a fusion problem: the conv/gemm of its
    tuning key); None when no column can tell (an op or layout this reader has no names for)."""
    problem = _tuned(problem)
    fields = FIELD_COLUMNS.get(problem.op, {})
    compared = False
    for name, cell in columns:
        attr = fields.get(name)
        if attr is None or not hasattr(problem, attr):
            continue
        compared = True
        if not _same(getattr(problem, attr), cell):
            return False
    return True if compared else None


def _tuned(problem: Problem) -> Any:
    """The problem the tool tunes: a fusion module's conv/gemm key, else the problem."""
    if isinstance(problem, FusionProblem):
        try:
            return problem.key_problem()
        except InputError:
            return problem
    return problem


def _same(value: Any, cell: str) -> bool:
    text = cell.strip()
    if isinstance(value, bool):
        return text.lower() in ("true", "1") if value else text.lower() in ("false", "0", "")
    if isinstance(value, int):
        try:
            return int(float(text)) == value
        except ValueError:
            return False
    if value is None:
        return text in ("", "False", "false")
    return str(value).lower() == text.lower()
