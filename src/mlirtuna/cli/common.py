"""What every command shares: the database handle, output helpers, common option parsing."""

from __future__ import annotations

import csv
import json
import sys
from collections.abc import Iterable
from dataclasses import dataclass, field
from typing import Any

import click
import typer
from rich.console import Console
from rich.table import Table

from mlirtuna.db import Database, mask, mask_text, resolve_url
from mlirtuna.errors import MlirtunaError, UserError
from mlirtuna.problems import ExpandOptions

err_console = Console(stderr=True, soft_wrap=True, highlight=False)


@dataclass
class State:
    db_url: str | None = None
    debug: bool = False
    _db: Database | None = field(default=None, repr=False)


def state(ctx: click.Context) -> State:
    root = ctx.find_root()
    if not isinstance(root.obj, State):
        root.obj = State()
    return root.obj


def database(ctx: click.Context, *, check_schema: bool = True, create: bool = False) -> Database:
    """The command's database; only commands that write (`create=True`) may make a SQLite file."""
    st = state(ctx)
    if st._db is None:
        st._db = Database(resolve_url(st.db_url), check_schema=check_schema, create=create)
        ctx.find_root().call_on_close(st._db.dispose)  # no connection outlives the command
    return st._db


def describe_db(db_url: str | None) -> str:
    """The database a command will use, password masked (even for a URL that does not parse)."""
    try:
        return mask(resolve_url(db_url))
    except MlirtunaError:
        return mask_text(db_url or "")


def err(message: str) -> None:
    """A status line on stderr (plain: errors must stay one line, whatever the width)."""
    print(message, file=sys.stderr, flush=True)


def print_json(data: Any) -> None:
    print(json.dumps(data, indent=None, default=str), flush=True)


# Wide enough for any row: a table sent to a pipe or a file is never wrapped or cut.
_UNBOUNDED_WIDTH = 1 << 20


def print_table(table: Table) -> None:
    """A table on stdout that never cuts a perf config or a test vector: on a terminal a long
    cell folds onto more lines; to a pipe or a file every row stays one whole line."""
    console = Console(highlight=False, markup=False)  # cells are data, never markup
    if console.is_terminal:
        for column in table.columns:
            column.overflow = "fold"
    else:
        console = Console(highlight=False, markup=False, width=_UNBOUNDED_WIDTH)
    console.print(table)


def print_csv(header: Iterable[str], rows: Iterable[Iterable[Any]]) -> None:
    writer = csv.writer(sys.stdout, lineterminator="\n")
    writer.writerow(header)
    writer.writerows(rows)


def output_format(as_json: bool, as_csv: bool) -> str:
    """json, csv or table; both flags at once is an error before any work."""
    if as_json and as_csv:
        raise UserError("choose one of --json and --csv")
    return "json" if as_json else "csv" if as_csv else "table"


def csv_opt():
    return typer.Option(False, "--csv", help="Print CSV (a header line, then one line a row).")


def split_list(value: str | None, flag: str) -> tuple[str, ...] | None:
    if value is None:
        return None
    items = tuple(x.strip() for x in value.split(",") if x.strip())
    if not items:
        raise UserError(f"{flag} needs at least one value")
    return items


def expand_options(
    data_type: str | None, direction: str | None, layout: str | None, no_expand: bool
) -> ExpandOptions:
    return ExpandOptions(
        data_types=split_list(data_type, "--data-type"),
        directions=split_list(direction, "--direction"),
        layouts=split_list(layout, "--layout"),
        expand=not no_expand,
    )


def mlir_build_dir_opt():
    """--mlir-build-dir, shared by every command that may run or describe rocMLIR."""
    return typer.Option(
        None, "--mlir-build-dir", envvar="MLIRTUNA_ROCMLIR_BUILD", show_envvar=True,
        help="rocMLIR build dir (holds bin/tuningRunner.py; its git commit becomes mlir_v).",
    )  # fmt: skip
