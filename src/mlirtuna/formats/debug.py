"""rocMLIR's `.debug` file: tuningRunner's DebugFileWriter, one TSV row per candidate tried.

The one place that knows the format; the reader (tuners/rocmlir/debugfile.py, the tool's files)
and the exporter (history/debugexport.py, `export --format debug`) both use it. Each op's columns
are declared once, in its OpSpec (problems/<op>.py), as a `Layout` of this module.

A row is perfRunner's `table_entry()` as pandas writes it (`to_csv(sep="\\t", index=False)`):
the op's leading problem columns, the GPU's (`Chip numCU`, and `numChiplets` from E3 on), the
rest of the problem's, then `PerfConfig [LDSBankConflict] TFlops` and what `--debug` adds: E3's
`Stats`, E4's `MeasurementsMs Status`; `--debug-quick-tune-data` adds nothing. E2 writes an
unnamed index column first. Real headers, E3 (rocMLIR 3fc5be9e, tests/data/rocmlir-real/):

    gemm  DataType OutDataType Chip numCU numChiplets TransA TransB G M K N ScaledGemm
          ScaleADtype ScaleBDtype TransScaleA TransScaleB PerfConfig LDSBankConflict TFlops Stats
    conv  Direction DataType Chip numCU numChiplets FilterLayout InputLayout OutputLayout
          N C H W K Y X DilationH DilationW StrideH StrideW PaddingH PaddingW PerfConfig …

E4 (rocmlirTriton 046da074) puts `TransO` after gemm's `TransB`. A file is read by its header
names, never by position; a column the reader does not know is ignored.

Cells: booleans `True`/`False`, an invalid candidate's TFlops empty (pandas' NaN; the exporter
writes `NaN`, which pandas reads the same), a float as its repr (exact).
"""

from __future__ import annotations

import math
from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass
from typing import Any

ERAS = ("E2", "E3", "E4")
FROM_E3, E4_ONLY = ("E3", "E4"), ("E4",)
GPU_COLUMNS = ("Chip", "numCU", "numChiplets")
PERF_CONFIG, LDS_BANK_CONFLICT, TFLOPS = "PerfConfig", "LDSBankConflict", "TFlops"
STATS, MEASUREMENTS, STATUS = "Stats", "MeasurementsMs", "Status"
# What `--debug` appends per era: E3 the driver's --show-stats dict, E4 every run and a status.
DEBUG_COLUMNS = {"E2": (), "E3": (STATS,), "E4": (MEASUREMENTS, STATUS)}
NAN = "NaN"
MISSING = frozenset(("", NAN, "nan"))  # what pandas reads as NaN in a TFlops cell


class DebugFormatError(ValueError):
    """A line that is not a `.debug` row (the caller adds FILE:LINE and whose fault it is)."""


@dataclass(frozen=True)
class Column:
    """One problem column of table_entry()."""

    name: str  # as table_entry() names it
    field: str | None = None  # the problem's attribute it shows; None: one mlirtuna does not model
    default: str = ""  # the cell written for a column without a field (ScaledGemm: False)
    eras: tuple[str, ...] = ERAS  # the eras whose table_entry() has it
    # How the field's value is spelled where it is not str(value) (conv layouts as rocmlir-gen
    # spells them); such a column is written, never compared back to the field.
    spell: Callable[[Any], str] | None = None

    def cell(self, problem: Any) -> str:
        if self.field is None:
            return self.default
        value = getattr(problem, self.field)
        if self.spell is not None:
            return self.spell(value)
        return "" if value is None else str(value)  # bool -> True/False, as pandas writes it


@dataclass(frozen=True)
class Layout:
    """One op's table_entry() columns: those before the GPU's, those after, and whether the
    row carries LDSBankConflict (conv and gemm)."""

    lead: tuple[Column, ...]
    rest: tuple[Column, ...]
    lds_bank_conflict: bool = False

    def header(self, era: str, debug: bool = False) -> tuple[str, ...]:
        """The header the tool writes in `era`; `debug`: with `--debug`'s statistics columns
        (without: the `--debug-quick-tune-data` file). E2's unnamed index column left out."""
        _check_era(era)
        gpu = GPU_COLUMNS if era != "E2" else GPU_COLUMNS[:2]
        lead = tuple(c.name for c in self.lead if era in c.eras)
        rest = tuple(c.name for c in self.rest if era in c.eras)
        lds = (LDS_BANK_CONFLICT,) if self.lds_bank_conflict else ()
        tail = DEBUG_COLUMNS[era] if debug else ()
        return (*lead, *gpu, *rest, PERF_CONFIG, *lds, TFLOPS, *tail)

    def fields(self) -> dict[str, str]:
        """Column name -> the problem's attribute, for every column that shows a field as
        written (any era): what tells one problem's rows from another's."""
        return {c.name: c.field for c in (*self.lead, *self.rest) if c.field and c.spell is None}

    def names(self) -> frozenset[str]:
        return frozenset(c.name for c in (*self.lead, *self.rest))


@dataclass(frozen=True)
class Gpu:
    """The GPU columns of a row."""

    chip: str
    num_cu: int
    num_chiplets: int = 1


def problem_cells(layout: Layout, era: str, problem: Any, gpu: Gpu) -> tuple[str, ...]:
    """The cells before PerfConfig (a problem has many candidates: callers cache these)."""
    _check_era(era)
    chips = (gpu.chip, str(gpu.num_cu), str(gpu.num_chiplets))
    lead = tuple(c.cell(problem) for c in layout.lead if era in c.eras)
    rest = tuple(c.cell(problem) for c in layout.rest if era in c.eras)
    return (*lead, *chips[: 3 if era != "E2" else 2], *rest)


def candidate_cells(layout: Layout, perf_config: str, tflops: float | None) -> tuple[str, ...]:
    """The cells from PerfConfig on (LDSBankConflict: NaN, as the tool writes it)."""
    lds = (NAN,) if layout.lds_bank_conflict else ()
    return (perf_config, *lds, tflops_cell(tflops))


def tflops_cell(value: float | None) -> str:
    """An invalid candidate (None, NaN, not positive) is NaN; else the double's repr (exact)."""
    if value is None or not math.isfinite(value) or value <= 0:
        return NAN
    return repr(float(value))


@dataclass(frozen=True)
class Header:
    """A file's header, read: where PerfConfig and TFlops are, and every named column."""

    names: tuple[str, ...]
    perf_config: int
    tflops: int
    named: Mapping[str, int]

    @classmethod
    def read(cls, names: Sequence[str]) -> Header:
        try:
            pc, tf = names.index(PERF_CONFIG), names.index(TFLOPS)
        except ValueError:
            raise DebugFormatError(".debug header lacks PerfConfig or TFlops") from None
        named = {name: i for i, name in enumerate(names) if name}
        return cls(tuple(names), pc, tf, named)

    def is_header(self, fields: Sequence[str]) -> bool:
        """Whether a line is a header: this one again, or another (a change mid-file)."""
        return PERF_CONFIG in fields and TFLOPS in fields


@dataclass(frozen=True)
class Row:
    """One candidate line, parsed: its perf config, TFlops (None for an invalid candidate) and
    its cells by name (the problem's and GPU's among them)."""

    perf_config: str
    tflops: float | None
    cells: Mapping[str, str]


def parse_row(header: Header, fields: Sequence[str]) -> Row:
    """One data line split into fields; DebugFormatError for one that is no row."""
    width = len(header.names)
    if len(fields) != width:
        raise DebugFormatError(f"{len(fields)} fields, the .debug header has {width}")
    text = fields[header.tflops].strip()
    try:
        tflops = None if text in MISSING else float(text)
    except ValueError:
        raise DebugFormatError(f"TFlops {text!r} is not a number") from None
    if not fields[header.perf_config]:
        raise DebugFormatError("empty PerfConfig")
    cells = {name: fields[i] for name, i in header.named.items()}
    return Row(fields[header.perf_config], tflops, cells)


def problem_column_names(layouts: Sequence[Layout]) -> frozenset[str]:
    """Every column that describes the problem or the GPU, over `layouts` (one config's rows
    share them); every other named column is the candidate's or unknown."""
    return frozenset(GPU_COLUMNS).union(*(layout.names() for layout in layouts))


def _check_era(era: str) -> None:
    if era not in ERAS:
        raise ValueError(f"unknown .debug era {era!r} (known: {', '.join(ERAS)})")


# -- shared column declarations (several ops' table_entry() spell these alike) ------------------


def gen_layout(table: Mapping[str, str]) -> Callable[[Any], str]:
    """A conv layout as table_entry() prints it: perfRunner's *_LAYOUT_MAP letter by letter
    (rocMLIR 3fc5be9e, perfRunner.py; a real `-f NCHW` row says `kcyx`), lower case."""
    return lambda layout: "".join(table.get(ch, ch) for ch in str(layout)).lower()


_SPATIAL = {"G": "g", "0": "0", "1": "1"}
FILTER_LAYOUT = Column(
    "FilterLayout",
    "fil_layout",
    spell=gen_layout({"N": "k", "C": "c", "H": "y", "W": "x", **_SPATIAL}),
)
INPUT_LAYOUT = Column(
    "InputLayout",
    "in_layout",
    spell=gen_layout({"N": "n", "C": "c", "H": "h", "W": "w", **_SPATIAL}),
)
OUTPUT_LAYOUT = Column(
    "OutputLayout",
    "out_layout",
    spell=gen_layout({"N": "n", "C": "k", "H": "h", "W": "w", **_SPATIAL}),
)
CONV_SIZES = (
    Column("N", "batchsize"),
    Column("C", "in_channels"),
    Column("H", "in_h"),
    Column("W", "in_w"),
    Column("K", "out_channels"),
    Column("Y", "fil_h"),
    Column("X", "fil_w"),
)
CONV_WINDOW = (
    Column("DilationH", "dilation_h"),
    Column("DilationW", "dilation_w"),
    Column("StrideH", "conv_stride_h"),
    Column("StrideW", "conv_stride_w"),
    Column("PaddingH", "pad_h"),
    Column("PaddingW", "pad_w"),
)
