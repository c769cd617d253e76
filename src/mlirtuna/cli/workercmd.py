"""`mlirtuna worker`: drain a session's jobs on this machine's GPUs."""

from __future__ import annotations

import logging
import os
from typing import TYPE_CHECKING

import typer

import mlirtuna.cli.common as common
import mlirtuna.cli.options as options
from mlirtuna.defaults import (
    DEFAULT_BACKOFF_S,
    DEFAULT_BATCH_WAIT_S,
    DEFAULT_GPU_LOCK_DIR,
    DEFAULT_LEASE_S,
    ENV_GPU_LOCK_DIR,
    ENV_RETRY_BACKOFF,
    ENV_ROCMLIR_BUILD,
)
from mlirtuna.errors import UserError

if TYPE_CHECKING:
    from mlirtuna.worker import WorkerSettings, WorkerStats, gpulock, supervisor

GIB = 1 << 30


def worker(
    ctx: typer.Context,
    session: int = typer.Option(..., "--session", help="Session id."),
    gpus: str = options.gpus_opt(),
    workers: int = options.workers_opt(),
    gpu_identity: str = options.gpu_identity_opt(),
    gpu_id: int = typer.Option(None, "--gpu-id", hidden=True),
    worker_number: int = typer.Option(0, "--worker-number", hidden=True, min=0),
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
    batch: int = options.batch_opt(),
    batch_wait: float = typer.Option(
        DEFAULT_BATCH_WAIT_S,
        "--batch-wait",
        metavar="SECONDS",
        help="A --split session's GPU worker with --batch K: wait up to this long for K ready "
        "bundles while compile jobs are still open (about one tool start-up).",
    ),
    prefetch: bool = typer.Option(
        True,
        "--prefetch/--no-prefetch",
        help="A --split session's GPU worker with --batch K: claim and unpack the next batch "
        "while the current call benchmarks.",
    ),
    stream: bool = typer.Option(
        True,
        "--stream/--no-stream",
        help="A --split session's GPU worker whose tool offers a benchmark stream (a proposed "
        "rocMLIR --benchmark-stream): one long-lived benchmark process fed each bundle.",
    ),
    lease: float = typer.Option(
        DEFAULT_LEASE_S, "--lease", help="Lease seconds; a heartbeat renews it every third of that."
    ),
    job_timeout: float = options.job_timeout_opt(),
    max_retries: int = options.max_retries_opt(),
    retry_backoff: float = typer.Option(
        DEFAULT_BACKOFF_S,
        "--retry-backoff",
        envvar=ENV_RETRY_BACKOFF,
        show_envvar=True,
        help="Seconds before the first retry (doubling).",
    ),
    mlir_build_dir: str = options.mlir_build_dir_opt(),
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
    wait_for_gpu: bool = typer.Option(
        False,
        "--wait-for-gpu",
        help="A GPU another worker holds (one worker per GPU, always): wait for it instead of "
        "exiting 2.",
    ),
    gpu_lock_dir: str = typer.Option(
        None,
        "--gpu-lock-dir",
        envvar=ENV_GPU_LOCK_DIR,
        help="This host's GPU lock files, one per GPU, shared by every user's workers "
        f"(default {DEFAULT_GPU_LOCK_DIR}).",
    ),
    role: str = typer.Option(
        "gpu",
        "--role",
        help="gpu: tune and benchmark jobs, one worker per GPU; compile: a --split session's "
        "compile jobs, --workers processes on this host, no GPU needed.",
    ),
) -> None:
    """Run workers for a session: one process per GPU, each claiming jobs until stopped."""
    from mlirtuna import sessions, tuners
    from mlirtuna.worker import WorkerSettings, check_lease, role_stage, session_tuner, supervisor

    common.check_batch(batch)
    check_lease(lease)
    if batch_wait < 0:
        raise UserError(f"--batch-wait {batch_wait:g}: give 0 or more seconds")
    if not common.state(ctx).debug:
        logging.getLogger("mlirtuna").setLevel(logging.INFO)  # one line per job: a worker's log
    db = common.database(ctx, wait_s=wait_for_db)
    found = sessions.get(db, session)
    tuner = session_tuner(found, tuner)
    if tuners.kind(tuner).uses_build:  # refused once here, not once per GPU worker
        sessions.check_build_for(found, sessions.build_dir_of(mlir_build_dir))
    elif gpu_id is None:  # said by the supervisor, not again by each worker it starts
        _say_unused(ctx, found, gpus if role == "gpu" else "auto", mlir_build_dir)
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
        batch_wait_s=batch_wait,
        prefetch=prefetch,
        stream=stream,
        mlir_build_dir=mlir_build_dir,
        cpu_mem_limit=int(cpu_mem_limit),
        role=role,
        wait_for_gpu=wait_for_gpu,
        gpu_lock_dir=gpu_lock_dir,
    )
    locks: supervisor.Locks = {}
    if gpu_id is not None:  # started by a supervisor, in the slot it named
        slot = supervisor.Slot(gpu_id, number=worker_number, compile=role == "compile")
        slots = supervisor.name_gpus([slot], gpu_identity)
    elif role == "compile":  # compiling needs no GPU: no probe, no pinning
        if gpu_identity is not None:
            raise UserError("--gpu-identity with --role compile: a compile worker uses no GPU")
        slots = supervisor.cpu_slots(workers, compile=True)
    else:
        slots = supervisor.name_gpus(supervisor.plan(gpus, tuner, workers), gpu_identity)
        if len(slots) > 1:  # a GPU it cannot tell: refused before any starts (one: by itself)
            supervisor.identify(settings, slots, found.standin)
        if gpus == "auto" and not wait_for_gpu:  # the GPUs free now, their locks kept
            slots, locks = supervisor.free(db, settings, slots, common.err)
    if len(slots) == 1:
        _run_here(db, settings, slots[0], locks.get(slots[0].gpu_id))
        return
    common.err(f"starting {len(slots)} workers: {', '.join(s.label for s in slots)}")
    url = str(db.url.render_as_string(hide_password=False))
    children = supervisor.start(url, settings, slots, locks=locks)
    ended = supervisor.supervise(children, say=common.err)
    if summary := ended.summary():
        common.err(summary)
    if not ended.ok:
        raise typer.Exit(1)


def _say_unused(ctx: typer.Context, session, gpus: str, build_dir: str | None) -> None:
    """A session whose tuner uses no GPU and no build (cpu): a --gpus list or a build dir is
    said in one line each, not ignored silently. A warning, not a refusal: the sleep tuner's
    workers are pinned to GPUs on purpose (tests and benchmarks stand in for GPU workers with
    them), and MLIRTUNA_ROCMLIR_BUILD may be set on a host for its GPU sessions."""
    from click.core import ParameterSource

    if gpus != "auto":
        common.err(
            f"warning: session {session.id}'s tuner {session.tuner} uses no GPU: --gpus {gpus} "
            "pins one worker to each of those GPUs anyway, each holding its GPU's lock on this "
            "host (a GPU worker there waits for it); --workers N runs N CPU workers instead"
        )
    if build_dir:
        source = ctx.get_parameter_source("mlir_build_dir")
        given = f"{ENV_ROCMLIR_BUILD}={build_dir}" if source == ParameterSource.ENVIRONMENT else (
            f"--mlir-build-dir {build_dir}")  # fmt: skip
        common.err(
            f"warning: session {session.id}'s tuner {session.tuner} runs no rocMLIR build: "
            f"{given} is not used"
        )


def _run_here(
    db, settings: WorkerSettings, slot: supervisor.Slot, taken: gpulock.GpuLock | None = None
) -> None:
    """One worker in this process on `slot`; `taken`: its GPU's lock, held already (auto)."""
    from mlirtuna.queue import GpuHolder
    from mlirtuna.tuners import process
    from mlirtuna.worker import Worker, gpulock

    settings.gpu_id, settings.gpu_identity = slot.gpu_id, slot.identity
    if slot.gpu_id >= 0 and "ROCR_VISIBLE_DEVICES" not in os.environ:
        os.environ["ROCR_VISIBLE_DEVICES"] = str(slot.gpu_id)
    w = Worker(db, settings)
    w.install_signal_handlers()
    lock = None
    if slot.gpu_id >= 0 and settings.role == "gpu":  # one worker per GPU on this host
        who = str(GpuHolder(settings.machine_name, os.getpid(), settings.session_id))
        directory = gpulock.lock_dir(settings.gpu_lock_dir)
        if taken is not None:
            taken.name_holder(who)
        # held already: by this process (`auto`), or handed down by the supervisor that started it
        lock = taken or gpulock.adopt(slot.gpu_id, who, directory)
        if lock is None:
            lock = gpulock.acquire(
                slot.gpu_id, who, directory, settings.wait_for_gpu, w.stop_requested
            )
        if lock is None:  # told to stop while it waited
            return
        w.gpu_lock = lock
        # Every tool holds the lock too: a GPU whose worker died stays locked while its tool runs.
        process.share_with_tools(lock.fd)
    try:
        stats = w.run()
    finally:
        if lock is not None:
            process.share_with_tools()
            lock.release()
    common.err(f"{slot.worker_name}: {summary(stats)}")


def summary(stats: WorkerStats) -> str:
    """What a worker did, as its last line says it."""
    line = (
        f"{stats.completed} completed, {stats.failed} failed, {stats.lost} lost leases, "
        f"{stats.released} given back"
    )
    if stats.claimed_with_record:  # how, not what: said only where it happened
        line += (
            f"; {stats.claimed_with_record} of its jobs claimed in the same commit that "
            "recorded the job before (no round trip of their own)"
        )
    return line


def register(app: typer.Typer) -> None:
    app.command()(worker)
