"""`mlirtuna jobs …`, `status` and `wait`: the queue as people see it."""

from __future__ import annotations

import time

import typer
from rich.table import Table

from mlirtuna import jobs, reuse
from mlirtuna.cli import common
from mlirtuna.cli.problemscmd import data_type_opt, direction_opt, layout_opt, no_expand_opt
from mlirtuna.errors import MlirtunaError

app = typer.Typer(no_args_is_help=True, help="Load, list, show, requeue and cancel jobs.")


@app.command()
def load(
    ctx: typer.Context,
    session: int = typer.Option(..., "--session", help="Session id."),
    op: str = typer.Option(None, "--op", help="Only problems of this op."),
    tag: str = typer.Option(None, "--tag", help="The problems imported with this tag."),
    file: str = typer.Option(None, "--file", help="The problems of this config list (needs --op)."),
    all_: bool = typer.Option(False, "--all", help="Every problem in the database."),
    data_type: str = data_type_opt(),
    direction: str = direction_opt(),
    layout: str = layout_opt(),
    no_expand: bool = no_expand_opt(),
    skip_tuned: bool = typer.Option(
        False,
        "--skip-tuned",
        help="Leave out problems an equivalent session already tuned "
        "(same arch_full, CUs, chiplets, tuning space, rocMLIR commit, tuner).",
    ),
    reuse_: bool = typer.Option(
        False,
        "--reuse",
        help="Copy the results left out into this session (marked reused).",
    ),
    changed_since: int = typer.Option(
        None,
        "--changed-since",
        metavar="SESSION",
        help="Only problems SESSION tuned whose winner is stale by --rule (or a --sample).",
    ),
    rule: str = typer.Option("all", "--rule", help="all or family-changed (--changed-since)."),
    sample: int = typer.Option(
        None, "--sample", metavar="N", help="A random N of them, to measure (session diff)."
    ),
    seed: int = typer.Option(0, "--seed", help="Seed of --sample."),
    as_json: bool = typer.Option(False, "--json", help="Print {added, existing, …}."),
) -> None:
    """Make one `new` job per selected problem (idempotent)."""
    options = common.expand_options(data_type, direction, layout, no_expand)
    selection = dict(op=op, tag=tag, file=file, all_problems=all_, options=options)
    if skip_tuned or reuse_ or changed_since is not None or sample is not None:
        _load_less(ctx, session, selection, skip_tuned, reuse_, changed_since, rule, sample, seed,
                   as_json)  # fmt: skip
        return
    report = jobs.load(common.database(ctx), session, **selection)
    if as_json:
        common.print_json(report.as_dict())
    else:
        print(f"{report.added} jobs added, {report.existing} already in session {session}")


def _load_less(ctx, session, selection, skip_tuned, reuse_, changed_since, rule, sample, seed,
               as_json) -> None:  # fmt: skip
    report = reuse.load(
        common.database(ctx), session, skip_tuned=skip_tuned, reuse=reuse_,
        changed_since=changed_since, rule=rule, sample=sample, seed=seed, **selection,
    )  # fmt: skip
    if as_json:
        common.print_json(report.as_dict())
        return
    why = "already tuned" if skip_tuned else "not stale"
    if sample is not None:
        why = "not sampled"
    print(
        f"{report.added} jobs added, {report.existing} already in session {session}, "
        f"{report.skipped} left out ({why}), {report.reused} reused"
        + "".join(f"; {n} from session {sid}" for sid, n in sorted(report.sources.items()))
    )


@app.command("list")
def list_(
    ctx: typer.Context,
    session: int = typer.Option(..., "--session", help="Session id."),
    state: str = typer.Option(None, "--state", help="new, running, completed, error, cancelled."),
    limit: int = typer.Option(None, "--limit", help="At most this many."),
    as_json: bool = typer.Option(False, "--json", help="Print JSON."),
) -> None:
    """List a session's jobs, with each error's first line."""
    rows = jobs.list_jobs(common.database(ctx), session, state, limit)
    if as_json:
        common.print_json([r.as_dict() for r in rows])
        return
    table = Table("job", "state", "retries", "where", "problem", "message")
    for r in rows:
        where = f"{r.machine_name}:{'cpu' if r.gpu_id < 0 else r.gpu_id}" if r.machine_name else ""
        message = r.first_line if r.state != "completed" else ""
        table.add_row(str(r.id), r.state, str(r.retries), where, f"{r.op} {r.test_vector}", message)
    common.out.print(table)


@app.command()
def show(
    ctx: typer.Context,
    job_id: int = typer.Argument(..., metavar="ID"),
    as_json: bool = typer.Option(False, "--json", help="Print JSON."),
) -> None:
    """Show one job: output or error text, timings, machine, GPU, attempts."""
    info = jobs.show(common.database(ctx), job_id)
    if as_json:
        common.print_json(info.as_dict())
        return
    d = info.as_dict()
    for key in (
        "id",
        "session_id",
        "op",
        "test_vector",
        "state",
        "retries",
        "priority",
        "machine_name",
        "gpu_id",
        "compile_start",
        "compile_end",
        "perf_config",
        "tflops",
        "candidates",
    ):
        print(f"{key:14} {d[key]}")
    print("attempts:")
    for a in info.attempts:
        print(
            f"  {a['claimed_at']} -> {a['ended_at'] or '…'}  {a['outcome']:9} "
            f"{a['machine_name']} gpu {a['gpu_id']} pid {a['pid']}"
            + (f"  {a['message'].splitlines()[0]}" if a["message"] else "")
        )
    print("result:")
    print(info.result or "")


@app.command()
def requeue(
    ctx: typer.Context,
    session: int = typer.Option(..., "--session", help="Session id."),
    state: str = typer.Option(
        "error", "--state", help="error, running (a dead worker's) or cancelled."
    ),
    job: int = typer.Option(None, "--job", help="Only this job."),
) -> None:
    """Put jobs back to new, with their retries reset."""
    n = jobs.requeue(common.database(ctx), session, state, job)
    print(f"{n} jobs requeued")


@app.command()
def cancel(
    ctx: typer.Context,
    session: int = typer.Option(..., "--session", help="Session id."),
    job: int = typer.Option(None, "--job", help="Only this job."),
) -> None:
    """Cancel jobs not yet completed (a running one records nothing)."""
    n = jobs.cancel(common.database(ctx), session, job)
    print(f"{n} jobs cancelled")


def status(
    ctx: typer.Context,
    session: int = typer.Option(None, "--session", help="Only this session."),
    watch: bool = typer.Option(False, "--watch", help="Refresh every 2 s until Ctrl-C."),
    as_json: bool = typer.Option(False, "--json", help="Print JSON."),
) -> None:
    """Job counts by state, per session."""
    db = common.database(ctx)
    while True:
        counts = jobs.counts(db, session)
        if as_json:
            common.print_json({"sessions": [{"id": sid, "counts": c} for sid, c in counts.items()]})
        else:
            table = Table("session", *jobs.JOB_STATES, "total")
            for sid, c in counts.items():
                table.add_row(str(sid), *(str(c[s]) for s in jobs.JOB_STATES), str(sum(c.values())))
            common.out.print(table)
        if not watch:
            return
        time.sleep(2)


def wait(
    ctx: typer.Context,
    session: int = typer.Option(..., "--session", help="Session id."),
    timeout: float = typer.Option(
        None, "--timeout", help="Give up after this many seconds (exit 1)."
    ),
    poll: float = typer.Option(2.0, "--poll", help="Seconds between checks."),
) -> None:
    """Block until the session has no new or running job; exit 1 if any ended in error."""
    db = common.database(ctx)
    deadline = None if timeout is None else time.monotonic() + timeout
    while not jobs.is_drained(db, session):
        if deadline is not None and time.monotonic() > deadline:
            raise MlirtunaError(f"session {session} still has jobs after {timeout:g} s")
        time.sleep(poll)
    failed = jobs.list_jobs(db, session, "error")
    counts = jobs.counts(db, session)[session]
    common.err(", ".join(f"{n} {s}" for s, n in counts.items() if n))
    if failed:
        for job in failed:
            common.err(f"job {job.id} error: {job.first_line}")
        raise typer.Exit(1)


def register(root: typer.Typer) -> None:
    root.add_typer(app, name="jobs")
    root.command()(status)
    root.command()(wait)
