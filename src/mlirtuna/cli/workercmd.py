"""`mlirtuna worker`: drain a session's jobs on this machine's GPUs."""

from __future__ import annotations

import os

import typer

from mlirtuna import manager
from mlirtuna.cli import common
from mlirtuna.worker import (
    DEFAULT_BACKOFF_S,
    DEFAULT_LEASE_S,
    DEFAULT_MAX_RETRIES,
    Worker,
    WorkerSettings,
)

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
    tuner: str = typer.Option("cpu", "--tuner", help="rocmlir, cpu, or sleep:SECONDS (tests)."),
    until_empty: bool = typer.Option(
        False, "--until-empty", help="Exit once no job is new or running."
    ),
    max_jobs: int = typer.Option(None, "--max-jobs", help="Exit after this many jobs."),
    lease: float = typer.Option(
        DEFAULT_LEASE_S, "--lease", help="Lease seconds; a heartbeat renews it every third of that."
    ),
    job_timeout: float = typer.Option(
        None, "--job-timeout", help="Stop a tuner after this many seconds (the job is retried)."
    ),
    max_retries: int = typer.Option(
        DEFAULT_MAX_RETRIES, "--max-retries", help="Failed attempts before a job ends in error."
    ),
    retry_backoff: float = typer.Option(
        DEFAULT_BACKOFF_S, "--retry-backoff", help="Seconds before the first retry (doubling)."
    ),
    mlir_build_dir: str = typer.Option(
        None,
        "--mlir-build-dir",
        envvar="MLIRTUNA_ROCMLIR_BUILD",
        show_envvar=True,
        help="rocMLIR build dir (rocmlir tuner).",
    ),
    cpu_mem_limit: float = typer.Option(
        4 * GIB, "--cpu-mem-limit", help="Bytes a cpu-tuner problem may use."
    ),
) -> None:
    """Run workers for a session: one process per GPU, each claiming jobs until stopped."""
    db = common.database(ctx)
    settings = WorkerSettings(
        session_id=session,
        tuner=tuner,
        lease_s=lease,
        job_timeout_s=job_timeout,
        max_retries=max_retries,
        backoff_s=retry_backoff,
        until_empty=until_empty,
        max_jobs=max_jobs,
        mlir_build_dir=mlir_build_dir,
        cpu_mem_limit=int(cpu_mem_limit),
    )
    slots = [manager.Slot(gpu_id)] if gpu_id is not None else manager.plan(gpus, tuner, workers)
    if len(slots) == 1:
        _run_here(db, settings, slots[0])
        return
    common.err(f"starting {len(slots)} workers: {', '.join(s.label for s in slots)}")
    procs = manager.start(str(db.url.render_as_string(hide_password=False)), settings, slots)
    manager.supervise(procs)
    bad = [p.returncode for p in procs if p.returncode not in (0, None)]
    if bad:
        raise typer.Exit(1)


def _run_here(db, settings: WorkerSettings, slot: manager.Slot) -> None:
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


def register(app: typer.Typer) -> None:
    app.command()(worker)
