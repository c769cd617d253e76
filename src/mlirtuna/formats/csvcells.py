"""The CSV every table is downloaded or printed as (`--csv`, the dashboard's .csv answers), with
cells a spreadsheet would evaluate made text (CSV injection, OWASP): a cell that is not a plain
number and starts with `=`, `+`, `-`, `@`, a tab or a carriage return gets a leading `'`, which
Excel, LibreOffice and Google Sheets read as "text" and do not show. A test vector (`-t f32 …`)
is such a cell; -5 and 1e-3 stay numbers. A script reading the CSV back drops that one `'`
(read_cell)."""

from __future__ import annotations

import csv
import re
from collections.abc import Iterable
from typing import Any, TextIO

FORMULA_STARTS = ("=", "+", "-", "@", "\t", "\r")
TEXT_MARK = "'"
# A plain decimal number, as Python or a spreadsheet writes one: left as it is.
_NUMBER = re.compile(r"[+-]?(?:\d+\.?\d*|\.\d+)(?:[eE][+-]?\d+)?")


def csv_cell(value: Any) -> Any:
    """`value` as a CSV cell no spreadsheet evaluates: numbers as they are, text that would
    start a formula with TEXT_MARK before it."""
    if value is None or isinstance(value, bool | int | float):
        return value
    text = str(value)
    if text.startswith(FORMULA_STARTS) and not _NUMBER.fullmatch(text):
        return TEXT_MARK + text
    return text


def read_cell(text: str) -> str:
    """A cell as written before csv_cell marked it."""
    if text.startswith(TEXT_MARK) and text[1:].startswith(FORMULA_STARTS):
        return text[1:]
    return text


def write_csv(out: TextIO, header: Iterable[str], rows: Iterable[Iterable[Any]]) -> None:
    """A header and rows as CSV to `out`, every cell through csv_cell."""
    writer = csv.writer(out, lineterminator="\n")
    writer.writerow([csv_cell(h) for h in header])
    writer.writerows([csv_cell(c) for c in row] for row in rows)
