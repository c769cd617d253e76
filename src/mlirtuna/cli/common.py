"""What every command shares: the database handle, output helpers, parsing of shared options
(the option declarations themselves are in options.py).

Start-up: the command modules import this one and nothing heavy; the database layer
(SQLAlchemy, Alembic), Rich and the API modules are imported inside the functions that use them,
so that `mlirtuna --help` loads none of them (docs/benchmarks.md, "Start-up").
"""

from __future__ import annotations

import json
import sys
from collections.abc import Iterable
from dataclasses import dataclass, field
from typing import TYPE_CHECKING, Any

import click

from mlirtuna.errors import MlirtunaError, UserError
from mlirtuna.formats.csvcells import write_csv
from mlirtuna.textinput import printable

if TYPE_CHECKING:
    from rich.console import Console

    from mlirtuna.db import Database
    from mlirtuna.problems import ExpandOptions


def __getattr__(name: str) -> Any:
    """`err_console`, the Rich console on stderr, made on first use (PEP 562)."""
    if name == "err_console":
        from rich.console import Console

        console: Console = Console(stderr=True, soft_wrap=True, highlight=False)
        globals()["err_console"] = console
        return console
    raise AttributeError(f"module {__name__!r} has no attribute {name!r}")


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


# A worker of a farm may start before its database server is up: by default it waits this long.
FARM_WAIT_FOR_DB_S = 60.0


def db_given(ctx: click.Context) -> bool:
    """Whether `--db` was given on the command line (not taken from MLIRTUNA_DB)."""
    source = ctx.find_root().get_parameter_source("db")
    return source is click.core.ParameterSource.COMMANDLINE


def database(
    ctx: click.Context,
    *,
    check_schema: bool = True,
    create: bool = False,
    wait_s: float | None = 0.0,
) -> Database:
    """The command's database; only commands that write (`create=True`) may make a SQLite file.
    `wait_s`: how long to wait for a server still away (workers); None: the farm default
    (FARM_WAIT_FOR_DB_S for a server, nothing for SQLite)."""
    from mlirtuna.db import Database, connect, resolve_url

    st = state(ctx)
    if st._db is None:
        url = resolve_url(st.db_url)
        if wait_s is None:
            wait_s = 0.0 if url.get_backend_name() == "sqlite" else FARM_WAIT_FOR_DB_S
        if check_schema and wait_s > 0:
            st._db = connect(url, wait_s)
        else:
            st._db = Database(url, check_schema=check_schema, create=create)
        ctx.find_root().call_on_close(st._db.dispose)  # no connection outlives the command
    return st._db


def describe_db(db_url: str | None) -> str:
    """The database a command will use, password masked (even for a URL that does not parse)."""
    from mlirtuna.db import mask, mask_text, resolve_url

    try:
        return mask(resolve_url(db_url))
    except MlirtunaError:
        return mask_text(db_url or "")


def err(message: str) -> None:
    """A status line on stderr (plain: errors must stay one line, whatever the width); control
    characters (from a file name, a value) are printed escaped."""
    print(printable(message), file=sys.stderr, flush=True)


def print_json(data: Any) -> None:
    print(json.dumps(data, indent=None, default=str), flush=True)


# Past this many rows a table is printed as plain aligned text even on a terminal (Rich takes
# minutes over 100,000 rows).
RICH_TABLE_MAX_ROWS = 1000


class TextTable:
    """Rows of text under named columns, printed by `print_table` (Rich only on a terminal);
    every cell escaped (textinput.printable)."""

    def __init__(self, *columns: str, title: str = "") -> None:
        self.columns = columns
        self.title = "\n".join(printable(line) for line in title.splitlines())
        self.rows: list[tuple[str, ...]] = []

    def add_row(self, *cells: object) -> None:
        """Cells as text with control, bidi and line-separator characters escaped: a session
        named `ESC[2J` or holding U+202E is shown, never acted on by the terminal."""
        self.rows.append(tuple(printable(str(cell)) for cell in cells))


def print_table(table: TextTable) -> None:
    """A table on stdout that never cuts a perf config or a test vector: on a terminal a long
    cell folds onto more lines between its tokens; to a pipe or a file each row is one whole line
    of aligned text."""
    if sys.stdout.isatty() and len(table.rows) <= RICH_TABLE_MAX_ROWS:
        from rich.console import Console

        print_rich(table, Console(highlight=False, markup=False))  # cells are data, not markup
    else:
        sys.stdout.write(plain_table(table))
        sys.stdout.flush()


def print_rich(table: TextTable, console: Any) -> None:
    """The table drawn by Rich on `console`, each column at least as wide as its longest token
    (cells wrap at spaces, never inside a perf config or a flag's value); the room left is
    shared out toward each column's longest cell. Where the tokens cannot fit side by side in
    the console's width, the plain table instead: whole lines, which the terminal may wrap, but
    no cell folded mid-token."""
    from rich.table import Table

    cells = [[name, *(r[i] for r in table.rows)] for i, name in enumerate(table.columns)]
    widths = [max((len(tok) for c in column for tok in c.split()), default=1) for column in cells]
    full = [max(max(map(len, column)), 1) for column in cells]
    spare = console.width - (3 * len(cells) + 1) - sum(widths)  # 1 space each side, 1 rule
    if spare < 0:
        console.file.write(plain_table(table))
        console.file.flush()
        return
    while spare > 0 and any(w < f for w, f in zip(widths, full, strict=True)):
        for i, f in enumerate(full):
            if spare and widths[i] < f:
                widths[i] += 1
                spare -= 1
    rich = Table(title=table.title or None, title_justify="left")
    for name, width in zip(table.columns, widths, strict=True):
        rich.add_column(name, width=width, overflow="fold")
    for row in table.rows:
        rich.add_row(*row)
    console.print(rich)


def plain_table(table: TextTable) -> str:
    """Columns padded to their widest cell, two spaces apart; the title first, if any."""
    columns = [[name, *(row[i] for row in table.rows)] for i, name in enumerate(table.columns)]
    widths = [max(map(len, column)) for column in columns]
    lines = table.title.splitlines()
    for row in zip(*columns, strict=True):
        lines.append("  ".join(cell.ljust(w) for cell, w in zip(row, widths, strict=True)).rstrip())
    return "".join(line + "\n" for line in lines)


def print_csv(header: Iterable[str], rows: Iterable[Iterable[Any]]) -> None:
    """A table as CSV on stdout, cells a spreadsheet would evaluate made text (csvcells)."""
    write_csv(sys.stdout, header, rows)


def output_format(as_json: bool, as_csv: bool) -> str:
    """json, csv or table; both flags at once is an error before any work."""
    if as_json and as_csv:
        raise UserError("choose one of --json and --csv")
    return "json" if as_json else "csv" if as_csv else "table"


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
    from mlirtuna.problems import ExpandOptions

    return ExpandOptions(
        data_types=split_list(data_type, "--data-type"),
        directions=split_list(direction, "--direction"),
        layouts=split_list(layout, "--layout"),
        expand=not no_expand,
    )


def check_batch(batch: int) -> None:
    if batch < 1:
        raise UserError(f"--batch {batch}: give 1 or more jobs")


def warn_cannot_run(skipped: dict[str, list[str]]) -> None:
    """One line per reason a tuner can never run some problems (`run`, `jobs load`)."""
    for why, vectors in skipped.items():
        err(f"warning: skipping {len(vectors)} problem(s): {why} (e.g. {vectors[0]})")


def clock(seconds: float | None) -> str:
    """A duration as H:MM:SS (an ETA, a run's length); "-" for none."""
    if seconds is None:
        return "-"
    whole = int(seconds)
    return f"{whole // 3600}:{whole // 60 % 60:02d}:{whole % 60:02d}"
