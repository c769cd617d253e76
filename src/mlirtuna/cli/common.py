"""What every command shares: the database handle, output helpers, common option parsing."""

from __future__ import annotations

import json
import sys
from dataclasses import dataclass, field
from typing import Any

import click
import typer
from rich.console import Console

from mlirtuna.db import Database, connect, resolve_url
from mlirtuna.errors import UserError
from mlirtuna.problems import ExpandOptions

out = Console(soft_wrap=True, highlight=False)
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


# A worker of a farm may start before its database server is up: by default it waits this long.
FARM_WAIT_FOR_DB_S = 60.0


def database(
    ctx: click.Context, *, check_schema: bool = True, wait_s: float | None = 0.0
) -> Database:
    """The command's database. `wait_s`: how long to wait for a server still away (workers);
    None: the farm default (FARM_WAIT_FOR_DB_S for a server, nothing for SQLite)."""
    st = state(ctx)
    if st._db is None:
        url = resolve_url(st.db_url)
        if wait_s is None:
            wait_s = 0.0 if url.get_backend_name() == "sqlite" else FARM_WAIT_FOR_DB_S
        if check_schema and wait_s > 0:
            st._db = connect(url, wait_s)
        else:
            st._db = Database(url, check_schema=check_schema)
        ctx.find_root().call_on_close(st._db.dispose)  # no connection outlives the command
    return st._db


def err(message: str) -> None:
    """A status line on stderr (plain: errors must stay one line, whatever the width)."""
    print(message, file=sys.stderr, flush=True)


def print_json(data: Any) -> None:
    print(json.dumps(data, indent=None, default=str), flush=True)


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
