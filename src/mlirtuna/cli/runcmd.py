"""`mlirtuna run`: the whole chain on this machine (flow.py does it; this parses and prints)."""

from __future__ import annotations

from typing import TYPE_CHECKING

import typer

import mlirtuna.cli.common as common
import mlirtuna.cli.options as options
from mlirtuna.problems import OPS

if TYPE_CHECKING:
    from mlirtuna import flow


def run(
    ctx: typer.Context,
    files: list[str] = typer.Argument(
        None,
        metavar="FILE...",
        help="rocMLIR config lists; fusion: .mlir modules or dirs (none with --session: resume).",
    ),
    op: str = typer.Option(
        None,
        "--op",
        help=f"{', '.join(OPS)}, or auto (per file: a directory or .mlir is fusion, a config "
        "list is told by its flags).",
    ),
    tuner: str = typer.Option(
        "auto",
        "--tuner",
        help="auto (rocmlir when a build dir is given, else cpu), or any tuner `session new` "
        "takes.",
    ),
    tuning_space: str = options.tuning_space_opt(),
    gpus: str = options.gpus_opt(),
    gpu_identity: str = options.gpu_identity_opt(),
    workers: int = options.workers_opt(),
    batch: int = options.batch_opt(),
    output: str = typer.Option(
        None,
        "-o",
        "--output",
        help="The tuning DB to write [default: mlir_tuning_<arch>.tsv; fusion: "
        "tuning_fusion_<arch>.tsv].",
    ),
    session: int = typer.Option(
        None, "--session", help="Resume this session: without FILEs, exactly its run."
    ),
    mlir_build_dir: str = options.mlir_build_dir_opt(),
    data_type: str = options.data_type_opt(),
    direction: str = options.direction_opt(),
    layout: str = options.layout_opt(),
    no_expand: bool = options.no_expand_opt(),
    arch: str = options.arch_opt(),
    num_cu: int = options.num_cu_opt(),
    num_chiplets: int = options.num_chiplets_opt(),
    mlir_v: str = options.mlir_v_opt(),
    reason: str = options.reason_opt(),
    name: str = options.name_opt(),
    search: str = options.search_opt(),
    budget: int = options.budget_opt(),
    job_timeout: float = options.job_timeout_opt(),
    max_retries: int = options.max_retries_opt(),
    skip_tuned: bool = typer.Option(
        False, "--skip-tuned", help="Leave out problems an equivalent session already tuned."
    ),
    reuse_: bool = typer.Option(
        False,
        "--reuse",
        help="Copy those results in, so the export is complete (implies --skip-tuned).",
    ),
    quiet: bool = typer.Option(False, "--quiet", "-q", help="No progress display."),
    as_json: bool = typer.Option(False, "--json", help="Print one JSON summary at the end."),
    as_csv: bool = typer.Option(False, "--csv", help="Print the winners as CSV at the end."),
) -> None:
    """Import, open a session, load jobs, tune them here, export the tuning DB, show winners."""
    import mlirtuna.cli.progress as progress
    from mlirtuna import flow, sessions
    from mlirtuna.worker import WorkerSettings

    common.output_format(as_json, as_csv)  # both at once: refused before any work
    common.check_batch(batch)
    if gpu_identity is not None:  # a name that cannot be one: refused before any work
        from mlirtuna import machine

        for name in gpu_identity.split(","):
            machine.canonical_gpu_name(name)

    db = common.database(ctx, create=True)
    flags = {
        k: v
        for k, v in (
            ("arch", arch),
            ("num_cu", num_cu),
            ("num_chiplets", num_chiplets),
            ("mlir_v", mlir_v),
            ("name", name or None),
            ("search", search),
            ("search_budget", budget),
        )
        if v is not None
    }
    plan = flow.RunPlan(
        op=op,
        files=files or [],
        options=common.expand_options(data_type, direction, layout, no_expand),
        tuner=tuner,
        tuning_space=tuning_space,
        gpus=gpus,
        gpu_identity=gpu_identity,
        workers=workers,
        output=output,
        session_id=session,
        mlir_build_dir=mlir_build_dir,
        reason=reason,
        session_flags=flags,
        skip_tuned=skip_tuned,
        reuse=reuse_,
        settings=WorkerSettings(
            session_id=0, job_timeout_s=job_timeout, max_retries=max_retries, batch=batch
        ),
    )
    prepared = flow.prepare(db, plan)
    sid = prepared.session.id
    if not as_json:
        common.err(
            f"session {sid}: {prepared.tuner_why}; {prepared.imported.problems} problems, "
            f"{prepared.loaded.added} new jobs ({prepared.loaded.existing} already there)"
            + _left_out(prepared.loaded)
        )
    if standin_left_out := getattr(prepared.loaded, "standin_left_out", None):
        common.err(sessions.left_out_line(standin_left_out, "a real session never reuses them"))
    common.warn_cannot_run(prepared.skipped)
    live = not (quiet or as_json) and common.err_console.is_terminal
    with progress.LiveView(db, sid, common.err_console, enabled=live) as view:
        interrupted = flow.run_workers(db, plan, prepared, view.tick, quiet=live or as_json)
    summary = flow.finish(db, plan, prepared, interrupted)
    if as_json:
        common.print_json(summary.as_dict())
        for note in summary.notes:  # in the JSON too; status lines go to stderr in every format
            common.err(f"note: {note}")
    else:
        _report(db, summary, plan, as_csv)
    if interrupted:
        # A session run opened remembers what it was asked; one opened otherwise needs the lists.
        lists = "" if prepared.session.run_spec else f" --op {op} {' '.join(files or [])}"
        common.err(f"interrupted: resume with `mlirtuna run --session {sid}{lists}`")
        raise typer.Exit(130)
    if summary.counts["error"]:
        raise typer.Exit(1)


def _left_out(loaded) -> str:
    skipped = getattr(loaded, "skipped", None)
    if skipped is None:
        return ""
    return f", {skipped} already tuned ({loaded.reused} reused)"


def _report(db, summary: flow.RunSummary, plan: flow.RunPlan, as_csv: bool = False) -> None:
    from mlirtuna.cli.resultscmd import print_winners_csv, winners_table

    if as_csv:
        print_winners_csv(summary.winners)
    else:
        common.print_table(winners_table(summary.winners))
    c = summary.counts
    common.err(
        f"session {summary.session_id}: {c['completed']} completed, {c['error']} errors"
        + (
            f" (see `mlirtuna jobs list --session {summary.session_id} --state error`)"
            if c["error"]
            else ""
        )
    )
    for note in summary.notes:
        common.err(f"note: {note}")
    if summary.output:
        common.err(
            f"tuning DB: {summary.output} ({summary.exported_rows} rows: "
            f"{summary.exported_what}); database: {db.display_url}"
        )


def register(app: typer.Typer) -> None:
    app.command()(run)
