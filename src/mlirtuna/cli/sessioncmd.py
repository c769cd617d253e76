"""`mlirtuna session …`: open, list, show, note, retire and delete tuning sessions."""

from __future__ import annotations

import sys

import typer

import mlirtuna.cli.common as common
import mlirtuna.cli.options as options
from mlirtuna.defaults import (
    DEFAULT_BUNDLE_CAP_BYTES,
    DEFAULT_TOPK,
    DEFAULT_TUNER,
)
from mlirtuna.errors import UserError

app = typer.Typer(
    no_args_is_help=True,
    suggest_commands=False,
    help="Tuning sessions: what the results depend on.",
)


@app.command()
def new(
    ctx: typer.Context,
    tuner: str = typer.Option(
        DEFAULT_TUNER,
        "--tuner",
        help="A registered tuner (rocmlir, cpu, sleep:SECONDS, installed plugins: "
        "docs/adding-a-tuner.md) or module.path:factory. Its workers run this tuner.",
    ),
    tuning_space: str = options.tuning_space_opt(),
    arch: str = options.arch_opt(),
    arch_full: str = typer.Option(
        None, "--arch-full", help="With feature flags, e.g. gfx942:sramecc+:xnack- [detected]."
    ),
    num_cu: int = options.num_cu_opt(),
    num_chiplets: int = options.num_chiplets_opt(),
    rocm_v: str = typer.Option(None, "--rocm-v", help="ROCm version [/opt/rocm/.info/version]."),
    mlir_v: str = options.mlir_v_opt(),
    reason: str = options.reason_opt(),
    ticket: str = typer.Option("", "--ticket", help="Ticket or issue id."),
    docker: str = typer.Option(None, "--docker", help="Docker image [from the environment]."),
    mlir_build_dir: str = options.mlir_build_dir_opt(),
    rep: int = typer.Option(None, "--rep", help="E4: benchmark time budget per candidate, ms."),
    warmup: int = typer.Option(None, "--warmup", help="E4: warm-up time budget, ms."),
    gpu_run_timeout: int = typer.Option(
        None, "--gpu-run-timeout", help="E4: seconds a GPU run may take."
    ),
    lfbo_effort: str = typer.Option(None, "--lfbo-effort", help="E4: quick or full (lfbo space)."),
    key_form: str = typer.Option(
        None,
        "--key-format",
        help="plain, split-k or e4: export's default [the build's perfRunner].",
    ),
    topk: int = typer.Option(
        DEFAULT_TOPK,
        "--topk",
        help="Fastest candidates measured again, interleaved, to pick the winner (1: off).",
    ),
    split: str = typer.Option(
        None,
        "--split",
        help="compile,benchmark: two jobs per problem, compiled by `worker --role compile` on "
        "any host with the build, benchmarked on the GPUs (rocmlir, E4 builds).",
    ),
    artifact_store: str = typer.Option(
        None,
        "--artifact-store",
        metavar="PATH",
        help="With --split: keep bundles in this directory (every host sees it) instead of "
        "the database.",
    ),
    keep_artifacts: bool = typer.Option(
        False, "--keep-artifacts", help="With --split: keep bundles after their benchmark."
    ),
    name: str = options.name_opt(),
    bundle_cap_mib: int = typer.Option(
        None,
        "--bundle-cap-mib",
        help="With --split: the most one bundle may unpack to, in MiB (a bigger one is refused "
        f"before anything is written) [default: {DEFAULT_BUNDLE_CAP_BYTES >> 20}].",
    ),
    search: str = options.search_opt(),
    budget: int = options.budget_opt(),
    as_json: bool = typer.Option(False, "--json", help="Print the new session as JSON."),
) -> None:
    """Open a session, detecting what the flags leave out (never guessing)."""
    from mlirtuna import sessions

    spec = sessions.SessionSpec(
        tuner=tuner,
        tuning_space=tuning_space,
        arch=arch,
        arch_full=arch_full,
        num_cu=num_cu,
        num_chiplets=num_chiplets,
        rocm_v=rocm_v,
        mlir_v=mlir_v,
        reason=reason,
        ticket=ticket,
        docker=docker,
        mlir_build_dir=mlir_build_dir,
        rep_ms=rep,
        warmup_ms=warmup,
        gpu_run_timeout_s=gpu_run_timeout,
        lfbo_effort=lfbo_effort,
        key_form=key_form,
        topk=topk,
        split=split,
        artifact_store=artifact_store,
        keep_artifacts=keep_artifacts,
        name=name,
        bundle_cap_mib=bundle_cap_mib,
        search=search,
        search_budget=budget,
    )
    created = sessions.create(common.database(ctx, create=True), spec)
    if as_json:
        common.print_json(created.as_dict())
    else:
        print(created.id)
        common.err(
            f"session {created.id}: {created.arch_full}, {created.num_cu} CUs, "
            f"{created.num_chiplets} chiplet(s), {created.tuning_space}, {created.tuner}"
            + (f", split {created.split}" if created.split else "")
            + (
                f", search {created.search}, budget {created.search_budget}"
                if created.search
                else ""
            )
        )
        if created.capabilities:
            common.err(f"tuningRunner.py: {created.capabilities}")


@app.command("list")
def list_(
    ctx: typer.Context,
    as_json: bool = typer.Option(False, "--json", help="Print JSON."),
    as_csv: bool = options.csv_opt(),
) -> None:
    """List sessions."""
    from mlirtuna import sessions

    fmt = common.output_format(as_json, as_csv)
    db = common.database(ctx)
    rows = sessions.list_all(db)
    ops = sessions.ops(db, [r.id for r in rows])
    if fmt == "json":
        common.print_json([{**r.as_dict(), "ops": ops[r.id]} for r in rows])
        return
    if fmt == "csv":
        header = list(sessions.Session.__dataclass_fields__)
        common.print_csv(
            [*header, "ops"],
            ([*(getattr(r, k) for k in header), ",".join(ops[r.id])] for r in rows),
        )
        return
    table = common.TextTable(
        "id", "name", "op", "created", "arch", "CUs", "chiplets", "space", "tuner", "split",
        "mlir_v", "reason",
    )  # fmt: skip
    for r in rows:
        table.add_row(
            str(r.id),
            r.name or "-",
            ",".join(ops[r.id]) or "-",
            r.created_at,
            r.arch_full,
            str(r.num_cu),
            str(r.num_chiplets),
            r.tuning_space,
            f"{r.tuner} (stand-in)" if r.standin else r.tuner,  # made-up numbers: said
            r.split or "-",
            r.mlir_v[:12],
            f"{r.reason} (retired)" if r.retired_at else r.reason,
        )
    common.print_table(table)


@app.command()
def show(
    ctx: typer.Context,
    session_id: int = typer.Argument(..., metavar="ID"),
    as_json: bool = typer.Option(False, "--json", help="Print JSON."),
) -> None:
    """Show one session."""
    from mlirtuna import sessions

    row = sessions.get(common.database(ctx), session_id)
    if as_json:
        common.print_json(row.as_dict())
        return
    shown = row.as_dict()
    width = max(map(len, shown))
    for key, value in shown.items():
        print(f"{key:{width}} {value}")
    if row.standin:
        common.err(f"session {row.id} is a stand-in session ({sessions.STANDIN_WHY})")


@app.command()
def diff(
    ctx: typer.Context,
    a: int = typer.Argument(..., metavar="A", help="The older session."),
    b: int = typer.Argument(
        ..., metavar="B", help="The newer session (or the context to tune in)."
    ),
    as_json: bool = typer.Option(False, "--json", help="Print JSON (with every problem id)."),
) -> None:
    """What differs between two sessions' contexts, and which problems B's context must re-tune."""
    from mlirtuna.history import reuse

    d = reuse.diff(common.database(ctx), a, b)
    if as_json:
        common.print_json(d.as_dict())
        return
    for key, (va, vb) in d.differences.items():
        print(f"{key:14} {va!s:30} -> {vb}")
    if not d.differences:
        print("same context")
    print(f"equivalent: {'yes (results can be reused)' if d.equivalent else 'no'}")
    print(f"problems: {d.only_a} only in {a}, {d.only_b} only in {b}, {d.both} in both")
    print(f"to re-tune in {b}'s context: {len(d.to_retune)} of {a}'s problems")
    if d.both:
        gm = f"{d.tflops_geomean:.4f}" if d.tflops_geomean is not None else "n/a"
        print(
            f"winners changed: {d.winners_changed}/{d.both} ({d.winners_changed / d.both:.0%}), "
            f"TFlops {b}/{a} geomean {gm}"
        )
    for side, fams in d.families.items():
        name = a if side == "a" else b
        print(f"families in {name}: " + (", ".join(f"{f} {n}" for f, n in fams.items()) or "-"))


@app.command()
def retire(
    ctx: typer.Context,
    session_id: int = typer.Argument(..., metavar="ID"),
    as_json: bool = typer.Option(False, "--json", help="Print the session as JSON."),
) -> None:
    """Keep a session for history, but never pick it again (export --arch, run)."""
    from mlirtuna import sessions

    row = sessions.retire(common.database(ctx), session_id)
    if as_json:
        common.print_json(row.as_dict())
    else:
        common.err(f"session {row.id}: retired at {row.retired_at}")


@app.command()
def note(
    ctx: typer.Context,
    session_id: int = typer.Argument(..., metavar="ID"),
    text: str = typer.Argument(..., metavar="TEXT", help="What to note (quote it)."),
    as_json: bool = typer.Option(False, "--json", help="Print the note as JSON."),
) -> None:
    """Add a note to a session (appended with the time; the dashboard's session page shows
    them)."""
    from dataclasses import asdict

    from mlirtuna import sessions

    added = sessions.add_note(common.database(ctx), session_id, text)
    if as_json:
        common.print_json(asdict(added))
    else:
        common.err(f"session {session_id}: noted at {added.created_at}")


@app.command()
def delete(
    ctx: typer.Context,
    session_id: int = typer.Argument(..., metavar="ID"),
    force: bool = typer.Option(False, "--force", help="Even while a job of it is running."),
    yes: bool = typer.Option(False, "--yes", help="Do not ask (needed when stdin is no terminal)."),
    as_json: bool = typer.Option(False, "--json", help="Print what was deleted as JSON."),
) -> None:
    """Delete a session with its jobs, attempts, results and candidates (one transaction)."""
    from mlirtuna import sessions
    from mlirtuna.queue import jobs

    db = common.database(ctx)
    sessions.get(db, session_id)  # a wrong id says so before asking anything
    if not yes:
        if not sys.stdin.isatty():
            raise UserError(f"deleting session {session_id} needs --yes (stdin is no terminal)")
        if not typer.confirm(f"delete session {session_id} and all its jobs and results?"):
            raise typer.Exit(1)
    gone = jobs.delete_session(db, session_id, force=force)
    if as_json:
        common.print_json(gone.as_dict())
    else:
        common.err(
            f"session {gone.session}: deleted with {gone.jobs} jobs, {gone.attempts} attempts, "
            f"{gone.results} results, {gone.candidates} candidates"
        )
