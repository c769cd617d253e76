"""The `mlirtuna` command: parses arguments, calls the API, prints. No logic lives here.

Data goes to stdout, status to stderr. A user error is one line on stderr and exit 2; a runtime
failure one line and exit 1; `--debug` shows tracebacks.
"""

from __future__ import annotations

import logging
import sys
import traceback

import click
import typer
from typer.core import TyperGroup

from mlirtuna.cli import common
from mlirtuna.defaults import ENV_DB
from mlirtuna.errors import MlirtunaError, UserError

# `mlirtuna --help` lists the commands by what a person comes to do, each panel in the order of
# the work (the flow of docs/architecture.md). One table: a command missing here is listed
# under "Other" (tests/test_cli_help.py fails on it).
HELP_PANELS: dict[str, tuple[str, ...]] = {
    "Tune on this machine": ("run", "try-rocmlir"),
    "Farm": ("import", "session", "jobs", "worker", "status", "wait"),
    "Results": ("results", "export", "import-tsv", "compare", "quick-list"),
    "Admin": ("db", "serve"),
}
OTHER_PANEL = "Other"


class _Group(TyperGroup):
    """Turns mlirtuna's errors into one line and an exit status, for every subcommand; lists
    the commands by panel (HELP_PANELS)."""

    def list_commands(self, ctx: click.Context) -> list[str]:
        """The commands in panel order, then any other (tab completion offers them so too)."""
        return sorted(super().list_commands(ctx), key=_help_rank)

    def format_commands(self, ctx: click.Context, formatter: click.HelpFormatter) -> None:
        shown = [
            (name, cmd)
            for name in self.list_commands(ctx)
            if (cmd := self.get_command(ctx, name)) is not None and not cmd.hidden
        ]
        if not shown:
            return
        width = max(len(name) for name, _ in shown)
        limit = formatter.width - 6 - width
        for panel in (*HELP_PANELS, OTHER_PANEL):
            # Names padded to the widest of all: every panel's help starts in one column.
            rows = [
                (n.ljust(width), c.get_short_help_str(limit))
                for n, c in shown
                if help_panel(n) == panel
            ]
            if rows:
                with formatter.section(panel):
                    formatter.write_dl(rows)

    def invoke(self, ctx: click.Context):
        try:
            return super().invoke(ctx)
        except click.NoSuchOption as exc:
            # Click lists every close option sorted by name (`--sesion`: "--json, --session");
            # keep the closest one only.
            possibilities = exc.possibilities or []
            if len(possibilities) > 1:
                import difflib

                best = difflib.get_close_matches(exc.option_name, possibilities, 1, 0.0)
                # Click declares it final; it is read only when the error is printed.
                exc.possibilities = best  # type: ignore[misc]
            raise
        except UserError as exc:
            _fail(ctx, exc, exc.exit_code)
        except MlirtunaError as exc:
            _fail(ctx, exc, 1)
        except KeyboardInterrupt:
            common.err("interrupted")
            sys.exit(130)
        except Exception as exc:
            # Only a command that loaded SQLAlchemy can raise its errors: `--help` (Click's Exit
            # passes through here too) must not pay for importing it (start-up, issue 10).
            sa_exc = sys.modules.get("sqlalchemy.exc")
            if sa_exc is None or not isinstance(exc, sa_exc.DBAPIError):
                raise
            # A database error no command expects (a missing table, a read-only or full disk,
            # a file that is not a database): one line naming the database, exit 2.
            from mlirtuna.db import error_line, resolve_url

            st = common.state(ctx)
            _fail(ctx, error_line(resolve_url(st.db_url), exc), 2)


def help_panel(command: str) -> str:
    """The `--help` panel a top-level command is listed under."""
    return next((p for p, names in HELP_PANELS.items() if command in names), OTHER_PANEL)


def _help_rank(command: str) -> tuple[int, int]:
    panels = list(HELP_PANELS)
    panel = help_panel(command)
    if panel == OTHER_PANEL:
        return len(panels), 0
    return panels.index(panel), HELP_PANELS[panel].index(command)


def _fail(ctx: click.Context, exc: Exception, code: int) -> None:
    if common.state(ctx).debug:  # the traceback too; the exit status stays the error's
        traceback.print_exception(exc, file=sys.stderr)
    common.err(f"error: {exc}")
    sys.exit(code)


app = typer.Typer(
    cls=_Group,
    no_args_is_help=True,
    suggest_commands=False,  # Click suggests already: Typer's would print it twice
    rich_markup_mode=None,  # plain help: `[default: …]` and bracketed paths stay as written
    pretty_exceptions_enable=False,
    help="mlirtuna: a tuning farm for rocMLIR kernels (problems, sessions, a job queue, results).",
)


def _print_version(value: bool) -> None:
    if value:
        from mlirtuna import __version__

        print(f"mlirtuna {__version__}")
        raise typer.Exit()


@app.callback()
def _global(
    ctx: typer.Context,
    db: str = typer.Option(
        None,
        "--db",
        envvar=ENV_DB,
        show_envvar=True,
        help="Database URL: sqlite:///FILE, postgresql://USER@HOST/DB or mysql://USER@HOST/DB "
        "[default: sqlite:///mlirtuna.db]. A password is best given in the env "
        "(MLIRTUNA_DB or MLIRTUNA_DB_PASSWORD), not here.",
    ),
    debug: bool = typer.Option(False, "--debug", help="Show tracebacks and debug logs."),
    verbose: bool = typer.Option(
        False, "--verbose", "-v", help="Say which database is used; info logs."
    ),
    _version: bool = typer.Option(
        False, "--version", callback=_print_version, is_eager=True, help="Print the version, exit."
    ),
) -> None:
    ctx.obj = common.State(db_url=db, debug=debug)
    if debug or verbose:
        common.err(f"database: {common.describe_db(db)}")  # the first line, before anything
    logging.basicConfig(
        level=logging.DEBUG if debug else logging.WARNING,
        format="%(asctime)s %(levelname)s %(name)s: %(message)s",
        stream=sys.stderr,
    )
    if verbose and not debug:
        logging.getLogger("mlirtuna").setLevel(logging.INFO)


def _register() -> None:
    from mlirtuna.cli import (
        dbcmd,
        jobscmd,
        problemscmd,
        quickcmd,
        runcmd,
        sessioncmd,
        trycmd,
        workercmd,
    )

    for module in (problemscmd, jobscmd, workercmd, runcmd, quickcmd, trycmd):
        module.register(app)
    app.add_typer(dbcmd.app, name="db")
    app.add_typer(sessioncmd.app, name="session")
    try:
        from mlirtuna.cli import resultscmd
    except ImportError:  # pragma: no cover
        return
    resultscmd.register(app)
    from mlirtuna.cli import servecmd

    servecmd.register(app)


_register()


def main(argv: list[str] | None = None) -> None:
    app(args=argv, prog_name="mlirtuna")
