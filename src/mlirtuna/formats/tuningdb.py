"""Tuning-database (.tsv) files as rocMLIR writes and reads them. Pure Python, no database.

Four layouts exist in the wild (see docs/reference: rocmlir-interfaces §1d, §2a, §5):

- ``legacy``: ``# arch\\tconfig\\tperfconfig``, 3 fields (E1 wrote
  ``# arch\\ttestVector\\tperfConfig``).
- ``v2``: ``# arch\\tnumCUs\\ttestVector\\tperfConfig\\tTFlops (space)`` (tuningRunner E2 with
  ``--tflops``) or the 4-column form ``...\\tperfConfig (space)`` without it.
- ``tuna``: MITuna's export, ``# arch\\tnumCUs\\ttestVector\\tperfConfig (tuna)``; "tuna" there is a
  label, not a tuning space.
- ``v3``: tuningRunner E3's ten columns (``V3_COLUMNS``); E4 (rocmlirTriton) writes the same.
- ``e2.5``: rocMLIR late 2025: a ``# commit: HASH`` line, then an E2-style header with the space
  in parentheses (``perfConfig (quick)\tTFlops``), later with ``numChiplets`` after numCUs; failed
  configs are written as lines starting ``### `` (kept as TuningError, with their text). A file
  appended by several runs holds several commit/header sections; each section's commit and space
  apply to its rows and errors.

rocMLIR prints one header per invocation and appends, so one file may hold several headers of
different kinds. The reader maps columns by the header's names (as E3's own reader does) and is
stricter than perfRunner: a row whose field count or values do not fit is an InputError at
FILE:LINE, where perfRunner would print a warning and silently drop it.
"""

from __future__ import annotations

import dataclasses
import datetime as dt
import math
import os
import re
from collections.abc import Iterable
from dataclasses import dataclass, field
from typing import Any, TextIO

from mlirtuna.errors import InputError
from mlirtuna.textinput import ascii_float, ascii_int, is_ascii_int, quote, read_lines

V3_COLUMNS = (
    "arch",
    "numCUs",
    "numChiplets",
    "testVector",
    "perfConfig",
    "TFlops",
    "tuningSpace",
    "commitId",
    "timestamp",
    "durationSec",
)
TIMESTAMP_FORMAT = "%Y-%m-%dT%H:%M:%SZ"

# Column names as they appear in headers, mapped to one internal name. Legacy files say
# "config"/"perfconfig"; everything later says "testVector"/"perfConfig".
_ALIASES = {
    "arch": "arch",
    "numcus": "numCUs",
    "numchiplets": "numChiplets",
    "testvector": "testVector",
    "config": "testVector",
    "perfconfig": "perfConfig",
    "tflops": "TFlops",
    "tuningspace": "tuningSpace",
    "commitid": "commitId",
    "timestamp": "timestamp",
    "durationsec": "durationSec",
}
_SPACE_RE = re.compile(r"\(\s*(\w+)\s*\)")
_COMMIT_RE = re.compile(r"^#\s*commit:\s*(\S+)\s*$")
_TIMESTAMP_RE = re.compile(r"[0-9]{4}-[0-9]{2}-[0-9]{2}T[0-9]{2}:[0-9]{2}:[0-9]{2}Z\Z")
ERROR_MARK = "### "
# Positional layouts for rows that come before any header (perfRunner's parse_tuning_db_line).
_POSITIONAL = {
    "legacy": ("arch", "testVector", "perfConfig"),
    "v2": ("arch", "numCUs", "testVector", "perfConfig", "TFlops"),
    "v3": V3_COLUMNS,
}


@dataclass(frozen=True)
class TuningRow:
    """One winner line of a tuning DB. Fields the file's layout lacks are None."""

    arch: str
    num_cu: int | None
    num_chiplets: int | None
    test_vector: str
    perf_config: str
    tflops: float | None
    tuning_space: str | None
    commit_id: str | None
    timestamp: str | None
    duration_s: float | None
    lineno: int

    @property
    def has_perf_config(self) -> bool:
        """False for the "None" rows E2 writes when no candidate was valid."""
        return self.perf_config not in ("", "None")

    @property
    def has_valid_tflops(self) -> bool:
        """False for E2's ``-inf`` (no valid candidate) and for NaN; True when TFlops is absent."""
        return self.tflops is None or (math.isfinite(self.tflops) and self.tflops > 0)


@dataclass(frozen=True)
class TuningHeader:
    """One header line: its layout, column names (normalised) and the space in parentheses."""

    kind: str  # legacy | v2 | tuna | v3
    columns: tuple[str, ...]
    tuning_space: str | None  # from "(space)"; None for v3 and for MITuna's "(tuna)"
    lineno: int


@dataclass(frozen=True)
class TuningError:
    """An E2.5 ``### `` line: a config that failed, with the section it was written in."""

    text: str  # the line without its "### " mark
    tuning_space: str | None
    commit_id: str | None
    lineno: int


@dataclass
class TuningFile:
    """A parsed tuning DB: every row in file order, every header seen, the layouts present
    (rows before any header count by their positional layout) and E2.5's error lines."""

    path: str
    rows: list[TuningRow] = field(default_factory=list)
    headers: list[TuningHeader] = field(default_factory=list)
    kinds: set[str] = field(default_factory=set)
    errors: list[TuningError] = field(default_factory=list)


# --------------------------------------------------------------------------------------------
# Reading
# --------------------------------------------------------------------------------------------


def read_tuning_db(path: str | os.PathLike[str]) -> TuningFile:
    """Parse a tuning DB file; raises InputError at FILE:LINE for a malformed row or header."""
    path = os.fspath(path)
    return parse_tuning_db(read_lines(path), path)


def parse_tuning_db(lines: Iterable[str], path: str = "<tuning db>") -> TuningFile:
    """Parse tuning-DB text given as lines (a file object works); see read_tuning_db."""
    result = TuningFile(path)
    header: TuningHeader | None = None
    commit: str | None = None  # E2.5's "# commit: HASH" of the current section
    for lineno, raw in enumerate(lines, start=1):
        line = raw.rstrip("\r\n")
        if not line.strip():
            continue
        try:
            if line.startswith(ERROR_MARK):
                space = header.tuning_space if header else None
                text = line[len(ERROR_MARK) :].strip()
                result.errors.append(TuningError(text, space, commit, lineno))
            elif (commit_line := _COMMIT_RE.match(line)) is not None:
                commit = commit_line.group(1)
                header = None  # a new run's section: its header follows
            elif line.startswith("#"):
                new_header = _parse_header(line, lineno, commit)
                if new_header is not None:
                    header = new_header
                    result.headers.append(header)
                    result.kinds.add(header.kind)
            elif header is not None:
                row = _parse_with_header(line.split("\t"), header, lineno)
                if row.commit_id is None and commit:
                    row = dataclasses.replace(row, commit_id=commit)
                result.rows.append(row)
            else:
                kind, row = _parse_headerless(line.split("\t"), lineno)
                result.kinds.add(kind)
                result.rows.append(row)
        except InputError as e:
            raise e.at(path, lineno) from None
    return result


def _parse_header(line: str, lineno: int, commit: str | None = None) -> TuningHeader | None:
    """A `# arch\\t...` header, or None for any other comment (perfRunner skips those).
    A header under a `# commit:` line is E2.5's (its columns otherwise look like E2's or E3's)."""
    text = line[1:].strip()
    cells = text.split("\t")
    if len(cells) < 3 or cells[0].strip().lower() != "arch":
        return None
    names = tuple(_column_name(c) for c in cells)
    match = _SPACE_RE.search(text)
    space = match.group(1) if match else None
    kind = _header_kind(names, space)
    if commit is not None and "commitId" not in names:
        kind = "e2.5"
    if space == "tuna":
        space = None  # MITuna's label, not a tuning space
    return TuningHeader(kind, names, space, lineno)


def _column_name(cell: str) -> str:
    word = cell.strip().split(" ")[0] if cell.strip() else ""
    name = _ALIASES.get(word.lower())
    if name is None:
        raise InputError(f"unknown column {cell.strip()!r} in tuning DB header")
    return name


def _header_kind(names: tuple[str, ...], space: str | None) -> str:
    if len(set(names)) != len(names):
        raise InputError("duplicate column in tuning DB header")
    for needed in ("arch", "testVector", "perfConfig"):
        if needed not in names:
            raise InputError(f"tuning DB header has no {needed} column")
    if "numChiplets" in names:
        return "v3"
    if "numCUs" in names:
        return "tuna" if space == "tuna" else "v2"
    return "legacy"


def _parse_with_header(fields: list[str], header: TuningHeader, lineno: int) -> TuningRow:
    if len(fields) != len(header.columns):
        raise InputError(
            f"{len(fields)} tab-separated fields, the {header.kind} header on line "
            f"{header.lineno} has {len(header.columns)}"
        )
    values = dict(zip(header.columns, (f.strip() for f in fields), strict=True))
    return _make_row(values, header.tuning_space, lineno)


def _parse_headerless(fields: list[str], lineno: int) -> tuple[str, TuningRow]:
    """Rows before any header, told apart as perfRunner does (3 legacy; v3 if field 3 is a
    number; else v2)."""
    fields = [f.strip() for f in fields]
    n = len(fields)
    if n == 3:
        kind = "legacy"
    elif n >= 5 and fields[2].isdigit():
        kind = "v3"
    elif n >= 4:
        kind = "v2"
    else:
        raise InputError(f"{n} tab-separated fields; a tuning DB row has 3, 4, 5 or 10")
    columns = _POSITIONAL[kind]
    if n > len(columns):
        raise InputError(
            f"{n} tab-separated fields, a headerless {kind} row has at most {len(columns)}"
        )
    return kind, _make_row(dict(zip(columns, fields, strict=False)), None, lineno)


def _make_row(values: dict[str, str], header_space: str | None, lineno: int) -> TuningRow:
    arch, tv, pc = values["arch"], values["testVector"], values["perfConfig"]
    for name, value in (("arch", arch), ("testVector", tv), ("perfConfig", pc)):
        if not value:
            raise InputError(f"empty {name}")
    if values.get("tuningSpace") == "":  # the column is there, its value is not
        raise InputError("empty tuningSpace")
    return TuningRow(
        arch=arch,
        num_cu=_opt_int(values, "numCUs"),
        num_chiplets=_opt_int(values, "numChiplets"),
        test_vector=tv,
        perf_config=pc,
        tflops=_opt_float(values, "TFlops"),
        tuning_space=values.get("tuningSpace") or header_space,
        commit_id=values.get("commitId") or None,
        timestamp=_opt_timestamp(values),
        duration_s=_opt_float(values, "durationSec"),
        lineno=lineno,
    )


def _opt_int(values: dict[str, str], name: str) -> int | None:
    text = values.get(name)
    if not text:
        return None
    if not is_ascii_int(text) or text[0] == "-":
        raise InputError(f"{name} {quote(text)} is not a non-negative integer")
    return ascii_int(name, text, 0)


def _opt_float(values: dict[str, str], name: str) -> float | None:
    # Optional columns may be empty (E3's own reader treats them so); "-inf" and "nan" parse,
    # so that callers can flag E2's "no valid perf config" rows.
    text = values.get(name)
    if not text:
        return None
    return ascii_float(name, text)


def _opt_timestamp(values: dict[str, str]) -> str | None:
    text = values.get("timestamp")
    if not text:
        return None
    try:
        if not _TIMESTAMP_RE.match(text):  # strptime's %Y also takes fullwidth digits
            raise ValueError(text)
        dt.datetime.strptime(text, TIMESTAMP_FORMAT)
    except ValueError:
        raise InputError(f"timestamp {quote(text)} is not YYYY-MM-DDTHH:MM:SSZ") from None
    return text


# --------------------------------------------------------------------------------------------
# Writing
# --------------------------------------------------------------------------------------------


def format_timestamp(when: dt.datetime) -> str:
    """A timestamp as E3 writes it: UTC, second resolution, trailing Z."""
    if when.tzinfo is not None:
        when = when.astimezone(dt.UTC)
    return when.strftime(TIMESTAMP_FORMAT)


def v3_header() -> str:
    return "# " + "\t".join(V3_COLUMNS)


def v2_header(tuning_space: str, tflops: bool = True) -> str:
    if tflops:
        return f"# arch\tnumCUs\ttestVector\tperfConfig\tTFlops ({tuning_space})"
    return f"# arch\tnumCUs\ttestVector\tperfConfig ({tuning_space})"


def write_v3(rows: Iterable[TuningRow], out: TextIO) -> None:
    """Write one E3 header and the rows, exactly as tuningRunner E3 does.

    Every row needs num_cu, num_chiplets, tflops, tuning_space, timestamp and duration_s;
    a missing commit_id is written as "unknown" (E3 does the same when git fails).
    """
    lines = [v3_header()]
    for row in rows:
        lines.append(_join(_v3_fields(row)))
    out.write("\n".join(lines) + "\n")


def write_v2(
    rows: Iterable[TuningRow], out: TextIO, tuning_space: str, tflops: bool = True
) -> None:
    """Write one E2 header and the rows (5 columns, or 4 with tflops=False).

    ``write_v2(rows, out, "tuna", tflops=False)`` produces MITuna's export layout.
    """
    lines = [v2_header(tuning_space, tflops)]
    for row in rows:
        fields = [row.arch, str(_need(row, "num_cu")), row.test_vector, row.perf_config]
        if tflops:
            fields.append(str(float(_need(row, "tflops"))))
        lines.append(_join(fields))
    out.write("\n".join(lines) + "\n")


def _v3_fields(row: TuningRow) -> list[str]:
    return [
        row.arch,
        str(_need(row, "num_cu")),
        str(_need(row, "num_chiplets")),
        row.test_vector,
        row.perf_config,
        str(float(_need(row, "tflops"))),
        _need(row, "tuning_space"),
        row.commit_id or "unknown",
        _need(row, "timestamp"),
        f"{float(_need(row, 'duration_s')):.1f}",
    ]


def _need(row: TuningRow, name: str) -> Any:
    value = getattr(row, name)
    if value is None:
        raise ValueError(f"tuning DB row for {row.test_vector!r} has no {name}")
    return value


def _join(fields: list[str]) -> str:
    # A tab or newline inside a field would silently shift every later column for perfRunner.
    for value in fields:
        if not value or any(c in value for c in "\t\r\n"):
            raise ValueError(f"tuning DB field {value!r} is empty or holds a tab/newline")
    return "\t".join(fields)
