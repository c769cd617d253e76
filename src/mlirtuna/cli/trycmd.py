"""`mlirtuna try-rocmlir`: the rocMLIR flow without a GPU, on the stand-in build the package
ships (mlirtuna.standin)."""

from __future__ import annotations

import shlex
from pathlib import Path
from typing import TYPE_CHECKING

import typer

if TYPE_CHECKING:
    from mlirtuna.db import Database

import mlirtuna.cli.common as common

DEFAULT_DIR = "mlirtuna-standin"


def try_rocmlir(
    ctx: typer.Context,
    directory: str = typer.Argument(
        DEFAULT_DIR,
        metavar="[DIR]",
        help="Where the stand-in build goes: a new or empty directory, or one an earlier "
        "try-rocmlir made (replaced); anything else is refused.",
    ),
    setup_only: bool = typer.Option(
        False,
        "--setup-only",
        help="Only install the build; print the variables it needs as `export` lines "
        '(eval "$(mlirtuna try-rocmlir --setup-only DIR)").',
    ),
) -> None:
    """Try the rocMLIR flow without a GPU: install the stand-in rocMLIR build (a GPU-less
    tuningRunner.py speaking the real tool's command line and formats; made-up numbers) in DIR,
    then run a one-stage session (`run --tuner rocmlir`) and a two-stage one (compile worker,
    benchmark worker), printing each command first. They go to a database of the build's own
    (DIR/mlirtuna-standin.db), never MLIRTUNA_DB's: into another only when `--db` is given on
    the command line. Their sessions are marked stand-in, never exported by `export --arch`."""
    from mlirtuna import standin

    build = standin.install(directory).resolve()
    if setup_only:
        env = standin.environment({})
        # What `session new` would detect on a GPU machine with a real build, given instead.
        env["MLIRTUNA_STANDIN_SESSION_FLAGS"] = shlex.join(standin.session_flags(build)[4:])
        for name in sorted(env):
            print(f"export {name}={shlex.quote(env[name])}")
        common.err(f"stand-in rocMLIR build in {build}: give --mlir-build-dir {build}")
        return
    common.err(f"stand-in rocMLIR build in {build} (era {standin.ERA}, {standin.ARCH_FULL})")
    db = _trial_db(ctx, build)
    done = standin.trial(db.url.render_as_string(hide_password=False), build, common.err)
    print(done.results, end="")
    common.err(
        f"tried: session {done.one_stage} (one stage) and session {done.two_stage} "
        f"(compile, then benchmark); see them with "
        f"`mlirtuna --db {shlex.quote(db.display_url)} serve`"
    )


def _trial_db(ctx: typer.Context, build: Path) -> Database:
    """The build's own database, unless `--db` was given on the command line: MLIRTUNA_DB (a
    farm's, maybe) is never written by a trial that was not told so."""
    from mlirtuna import standin

    given = common.db_given(ctx)
    if not given:
        common.state(ctx).db_url = f"sqlite:///{build / standin.TRIAL_DB}"
    db = common.database(ctx, create=True)
    if given:
        common.err(
            f"writing the stand-in's sessions into {db.display_url} (--db): they are marked "
            "stand-in, never exported by `export --arch`"
        )
    return db


def register(app: typer.Typer) -> None:
    app.command("try-rocmlir")(try_rocmlir)
