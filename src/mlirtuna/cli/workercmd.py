"""`mlirtuna worker`: drain a session's jobs on this machine's GPUs."""

from __future__ import annotations

import logging
import os
from typing import TYPE_CHECKING

import typer

from mlirtuna.cli import common
from mlirtuna.cli.problemscmd import data_type_opt, direction_opt, layout_opt, no_expand_opt
from mlirtuna.defaults import (
    DEFAULT_BACKOFF_S,
    DEFAULT_LEASE_S,
    DEFAULT_MAX_RETRIES,
    DEFAULT_TUNING_SPACE,
)

if TYPE_CHECKING:
    from mlirtuna import flow
    from mlirtuna.worker import WorkerSettings, supervisor

GIB = 1 << 30


def worker(
    ctx: typer.Context,
    session: int = typer.Option(..., "--session", help="Session id."),
    gpus: str = typer.Option(
        "auto",
        "--gpus",
        help="auto (every GPU rocminfo lists; one CPU "
        "worker where there is none) or 0,1,…: one worker process each.",
    ),
    workers: int = typer.Option(1, "--workers", help="Worker processes per GPU (or CPU workers)."),
    gpu_id: int = typer.Option(None, "--gpu-id", hidden=True),
    tuner: str = typer.Option(
        None,
        "--tuner",
        help="The session's tuner (the default); another one is refused. sleep:SECONDS may "
        "set a sleep session's seconds.",
    ),
    until_empty: bool = typer.Option(
        False, "--until-empty", help="Exit once no job is new or running."
    ),
    max_jobs: int = typer.Option(None, "--max-jobs", help="Exit after this many jobs."),
    batch: int = common.batch_opt(),
    lease: float = typer.Option(
        DEFAULT_LEASE_S, "--lease", help="Lease seconds; a heartbeat renews it every third of that."
    ),
    job_timeout: float = typer.Option(
        None,
        "--job-timeout",
        help="Stop a tuner after this many seconds (the job is retried) "
        "[default: by tuning space: quick 1 h, full/greedy 4 h, exhaustive 24 h].",
    ),
    max_retries: int = typer.Option(
        DEFAULT_MAX_RETRIES, "--max-retries", help="Failed attempts before a job ends in error."
    ),
    retry_backoff: float = typer.Option(
        DEFAULT_BACKOFF_S, "--retry-backoff", help="Seconds before the first retry (doubling)."
    ),
    mlir_build_dir: str = common.mlir_build_dir_opt(),
    cpu_mem_limit: float = typer.Option(
        4 * GIB, "--cpu-mem-limit", help="Bytes a cpu-tuner problem may use."
    ),
    wait_for_db: float = typer.Option(
        None,
        "--wait-for-db",
        metavar="SECONDS",
        help="Wait this long for a database server that is not up yet "
        "[default: 60 for a server, 0 for SQLite]; a wrong host or login stops at once.",
    ),
    role: str = typer.Option(
        "gpu",
        "--role",
        help="gpu: tune and benchmark jobs, one worker per GPU; compile: a --split session's "
        "compile jobs, --workers processes on this host, no GPU needed.",
    ),
) -> None:
    """Run workers for a session: one process per GPU, each claiming jobs until stopped."""
    from mlirtuna import sessions
    from mlirtuna.worker import WorkerSettings, role_stage, session_tuner, supervisor

    common.check_batch(batch)
    if not common.state(ctx).debug:
        logging.getLogger("mlirtuna").setLevel(logging.INFO)  # one line per job: a worker's log
    db = common.database(ctx, wait_s=wait_for_db)
    found = sessions.get(db, session)
    tuner = session_tuner(found, tuner)
    role_stage(found, role)  # a bad role, or compile for a one-stage session: refused here
    settings = WorkerSettings(
        session_id=session,
        tuner=tuner,
        lease_s=lease,
        job_timeout_s=job_timeout,
        max_retries=max_retries,
        backoff_s=retry_backoff,
        until_empty=until_empty,
        max_jobs=max_jobs,
        batch=batch,
        mlir_build_dir=mlir_build_dir,
        cpu_mem_limit=int(cpu_mem_limit),
        role=role,
    )
    if gpu_id is not None:
        slots = [supervisor.Slot(gpu_id)]
    elif role == "compile":  # compiling needs no GPU: no probe, no pinning
        slots = [supervisor.Slot(-1) for _ in range(max(workers, 1))]
    else:
        slots = supervisor.plan(gpus, tuner, workers)
    if len(slots) == 1:
        _run_here(db, settings, slots[0])
        return
    common.err(f"starting {len(slots)} workers: {', '.join(s.label for s in slots)}")
    procs = supervisor.start(str(db.url.render_as_string(hide_password=False)), settings, slots)
    supervisor.supervise(procs)
    bad = [p.returncode for p in procs if p.returncode not in (0, None)]
    if bad:
        raise typer.Exit(1)


def _run_here(db, settings: WorkerSettings, slot: supervisor.Slot) -> None:
    from mlirtuna.worker import Worker

    settings.gpu_id = slot.gpu_id
    if slot.gpu_id >= 0 and "ROCR_VISIBLE_DEVICES" not in os.environ:
        os.environ["ROCR_VISIBLE_DEVICES"] = str(slot.gpu_id)
    w = Worker(db, settings)
    w.install_signal_handlers()
    stats = w.run()
    common.err(
        f"worker {slot.label}: {stats.completed} completed, {stats.failed} failed, "
        f"{stats.lost} lost leases, {stats.released} given back"
    )


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
        help="conv, gemm, attention, gemm_gemm, conv_gemm, fusion, or auto (per file: a "
        "directory or .mlir is fusion, a config list is told by its flags).",
    ),
    tuner: str = typer.Option(
        "auto",
        "--tuner",
        help="auto (rocmlir when a build dir is given, else cpu), rocmlir or cpu.",
    ),
    tuning_space: str = typer.Option(
        DEFAULT_TUNING_SPACE,
        "--tuning-space",
        help="quick, full, greedy, exhaustive or list:NAME (a stored quick list).",
    ),
    gpus: str = typer.Option("auto", "--gpus", help="auto or 0,1,…"),
    workers: int = typer.Option(1, "--workers", help="Worker processes per GPU (or CPU workers)."),
    batch: int = common.batch_opt(),
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
    mlir_build_dir: str = common.mlir_build_dir_opt(),
    data_type: str = data_type_opt(),
    direction: str = direction_opt(),
    layout: str = layout_opt(),
    no_expand: bool = no_expand_opt(),
    arch: str = typer.Option(None, "--arch", help="For a new rocmlir session [detected]."),
    num_cu: int = typer.Option(None, "--num-cu", help="For a new rocmlir session [detected]."),
    num_chiplets: int = typer.Option(None, "--num-chiplets", help="[detected]."),
    reason: str = typer.Option("", "--reason", help="Why this tuning is run."),
    job_timeout: float = typer.Option(None, "--job-timeout", help="Seconds per job."),
    max_retries: int = typer.Option(
        DEFAULT_MAX_RETRIES, "--max-retries", help="Failed attempts before a job ends in error."
    ),
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
    from mlirtuna import flow
    from mlirtuna.cli import progress
    from mlirtuna.worker import WorkerSettings

    common.output_format(as_json, as_csv)  # both at once: refused before any work
    common.check_batch(batch)

    db = common.database(ctx, create=True)
    flags = {
        k: v
        for k, v in (("arch", arch), ("num_cu", num_cu), ("num_chiplets", num_chiplets))
        if v is not None
    }
    plan = flow.RunPlan(
        op=op,
        files=files or [],
        options=common.expand_options(data_type, direction, layout, no_expand),
        tuner=tuner,
        tuning_space=tuning_space,
        gpus=gpus,
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
    for why, vectors in prepared.skipped.items():
        common.err(f"warning: skipping {len(vectors)} problem(s): {why} (e.g. {vectors[0]})")
    live = not (quiet or as_json) and common.err_console.is_terminal
    with progress.LiveView(db, sid, common.err_console, enabled=live) as view:
        interrupted = flow.run_workers(db, plan, prepared, view.tick, quiet=live or as_json)
    summary = flow.finish(db, plan, prepared, interrupted)
    if as_json:
        common.print_json(summary.as_dict())
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
    app.command()(worker)
    app.command()(run)
