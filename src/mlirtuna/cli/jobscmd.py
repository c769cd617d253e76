"""`mlirtuna jobs …`, `status` and `wait`: the queue as people see it."""

from __future__ import annotations

import time
from typing import TYPE_CHECKING

import typer

import mlirtuna.cli.common as common
import mlirtuna.cli.options as options
from mlirtuna.errors import UserError

if TYPE_CHECKING:
    from mlirtuna.queue import jobs

app = typer.Typer(
    no_args_is_help=True, suggest_commands=False, help="Load, list, show, requeue and cancel jobs."
)


@app.command()
def load(
    ctx: typer.Context,
    session: int = typer.Option(..., "--session", help="Session id."),
    op: str = typer.Option(None, "--op", help="Only problems of this op."),
    tag: str = typer.Option(None, "--tag", help="The problems imported with this tag."),
    file: str = typer.Option(None, "--file", help="The problems of this config list (needs --op)."),
    all_: bool = typer.Option(False, "--all", help="Every problem in the database."),
    data_type: str = options.data_type_opt(),
    direction: str = options.direction_opt(),
    layout: str = options.layout_opt(),
    no_expand: bool = options.no_expand_opt(),
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
    from mlirtuna.queue import jobs

    options = common.expand_options(data_type, direction, layout, no_expand)
    selection = dict(op=op, tag=tag, file=file, all_problems=all_, options=options)
    if skip_tuned or reuse_ or changed_since is not None or sample is not None:
        _load_less(ctx, session, selection, skip_tuned, reuse_, changed_since, rule, sample, seed,
                   as_json)  # fmt: skip
        return
    report = jobs.load(common.database(ctx), session, **selection)
    common.warn_cannot_run(report.cannot_run)
    if as_json:
        common.print_json(report.as_dict())
    else:
        print(f"{report.added} jobs added, {report.existing} already in session {session}")


def _load_less(ctx, session, selection, skip_tuned, reuse_, changed_since, rule, sample, seed,
               as_json) -> None:  # fmt: skip
    from mlirtuna import sessions
    from mlirtuna.history import reuse

    report = reuse.load(
        common.database(ctx), session, skip_tuned=skip_tuned, reuse=reuse_,
        changed_since=changed_since, rule=rule, sample=sample, seed=seed, **selection,
    )  # fmt: skip
    common.warn_cannot_run(report.cannot_run)
    if report.standin_left_out:
        common.err(
            sessions.left_out_line(
                report.standin_left_out, "a real session neither skips nor reuses what they tuned"
            )
        )
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


DEFAULT_LIST_LIMIT = 50
JOB_COLUMNS = ("job", "stage", "state", "retries", "where", "op", "test vector", "message")


@app.command("list")
def list_(
    ctx: typer.Context,
    session: int = typer.Option(..., "--session", help="Session id."),
    state: str = typer.Option(
        None, "--state", help="new, waiting, running, completed, error, cancelled."
    ),
    limit: int = typer.Option(DEFAULT_LIST_LIMIT, "--limit", help="At most this many, by id."),
    all_: bool = typer.Option(False, "--all", help="Every job (no --limit)."),
    as_json: bool = typer.Option(False, "--json", help="Print JSON."),
    as_csv: bool = options.csv_opt(),
) -> None:
    """List a session's jobs, with each error's first line (the first 50 unless --all)."""
    from mlirtuna.queue import jobs

    fmt = common.output_format(as_json, as_csv)
    got = jobs.page(common.database(ctx), session, state, None if all_ else limit)
    if fmt == "json":
        common.print_json([r.as_dict() for r in got.jobs])
    elif fmt == "csv":
        common.print_csv(JOB_COLUMNS, map(job_row, got.jobs))
    else:
        table = common.TextTable(*JOB_COLUMNS)
        for r in got.jobs:
            table.add_row(*job_row(r))
        common.print_table(table)
    if got.total > len(got.jobs):
        common.err(f"the first {len(got.jobs)} of {got.total} jobs (--limit N or --all for more)")


def job_row(r: jobs.JobInfo) -> tuple[str, ...]:
    where = f"{r.machine_name}:{'cpu' if r.gpu_id < 0 else r.gpu_id}" if r.machine_name else ""
    message = r.first_line if r.state != "completed" else ""
    return (str(r.id), r.stage, r.state, str(r.retries), where, r.op, r.test_vector, message)


@app.command()
def show(
    ctx: typer.Context,
    job_id: int = typer.Argument(..., metavar="ID"),
    as_json: bool = typer.Option(False, "--json", help="Print JSON."),
) -> None:
    """Show one job: output or error text, timings, machine, GPU, attempts."""
    from mlirtuna.queue import jobs

    info = jobs.show(common.database(ctx), job_id)
    if as_json:
        common.print_json(info.as_dict())
        return
    d = info.as_dict()
    for key in (
        "id",
        "session_id",
        "stage",
        "op",
        "test_vector",
        "state",
        "retries",
        "priority",
        "machine_name",
        "worker",
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
            f"{a['machine_name']} {a['worker']} pid {a['pid']}"
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
    as_json: bool = typer.Option(False, "--json", help="Print {requeued}."),
) -> None:
    """Put jobs back to new, with their retries reset."""
    from mlirtuna.queue import jobs

    n = jobs.requeue(common.database(ctx), session, state, job)
    if as_json:
        common.print_json({"requeued": n})
    else:
        print(f"{n} jobs requeued")


@app.command()
def cancel(
    ctx: typer.Context,
    session: int = typer.Option(..., "--session", help="Session id."),
    job: int = typer.Option(None, "--job", help="Only this job."),
    all_: bool = typer.Option(False, "--all", help="Every job of the session not yet done."),
    as_json: bool = typer.Option(False, "--json", help="Print {cancelled}."),
) -> None:
    """Cancel one job (--job) or every job of the session not yet done (--all).

    A running job's worker then records nothing.
    """
    if (job is None) == (not all_):
        raise UserError("jobs cancel needs --job ID, or --all for every job of the session")
    from mlirtuna.queue import jobs

    n = jobs.cancel(common.database(ctx), session, job)
    if as_json:
        common.print_json({"cancelled": n})
    else:
        print(f"{n} jobs cancelled")


def status(
    ctx: typer.Context,
    session: int = typer.Option(None, "--session", help="Only this session."),
    watch: bool = typer.Option(
        False,
        "--watch",
        help="Refresh every 2 s until no job is new, waiting or running (exit 0; 1 when some "
        "job ended in error, as `mlirtuna wait`), or Ctrl-C.",
    ),
    as_json: bool = typer.Option(False, "--json", help="Print JSON."),
    as_csv: bool = options.csv_opt(),
) -> None:
    """Job counts by state, per session (a two-stage session also per stage), with jobs/min
    and ETA while jobs are open (measured as the dashboard does: the last ten minutes)."""
    from mlirtuna.queue import jobs
    from mlirtuna.web import farm

    fmt = common.output_format(as_json, as_csv)
    db = common.database(ctx)
    while True:
        counts = jobs.counts(db, session)
        rates = farm.rates(db, counts)
        split = {sid: jobs.stage_counts(db, sid) for sid in counts}
        split = {sid: by for sid, by in split.items() if set(by) - {"tune"}}
        if fmt == "json":
            common.print_json({"sessions": [
                _status_json(sid, c, split.get(sid), rates[sid]) for sid, c in counts.items()
            ]})  # fmt: skip
        else:
            _print_status(counts, split, rates, fmt)
        if not watch:
            return
        if not any(c[s] for c in counts.values() for s in jobs.OPEN_STATES):
            _end_watch(counts)
        time.sleep(2)


def _print_status(counts: dict, split: dict, rates: dict, fmt: str) -> None:
    """The status table (or its CSV: jobs/min and ETA seconds as numbers, empty when none)."""
    from mlirtuna.queue import jobs

    states = jobs.JOB_STATES
    rows: list[tuple[object, ...]] = []
    for sid, c in counts.items():
        per_minute, eta = rates[sid]
        shown = (per_minute, eta) if fmt == "csv" else (_rate_text(per_minute), common.clock(eta))
        rows.append((sid, *(c[s] for s in states), sum(c.values()), *shown))
        for stage, sc in split.get(sid, {}).items():  # indented under their session
            rows.append((f"  {stage}", *(sc[s] for s in states), sum(sc.values()), "", ""))
    if fmt == "csv":
        common.print_csv(("session", *states, "total", "per_minute", "eta_s"), rows)
        return
    table = common.TextTable("session", *states, "total", "jobs/min", "ETA")
    for row in rows:
        table.add_row(*map(str, row))
    common.print_table(table)


def _rate_text(per_minute: float | None) -> str:
    return "-" if per_minute is None else f"{per_minute:.1f}"


def _end_watch(counts: dict[int, dict[str, int]]) -> None:
    """Nothing new, waiting or running: the watch ends, with `mlirtuna wait`'s exit status."""
    errors = {sid: c["error"] for sid, c in counts.items() if c["error"]}
    if not errors:
        common.err("status --watch: no job new, waiting or running: done")
        raise typer.Exit(0)
    listed = ", ".join(f"session {sid}: {n}" for sid, n in errors.items())
    common.err(
        f"status --watch: no job new, waiting or running; jobs in error ({listed}): see "
        "`mlirtuna jobs list --session N --state error`"
    )
    raise typer.Exit(1)


def _status_json(sid: int, counts: dict, stages: dict | None, rate: tuple) -> dict:
    out = {"id": sid, "counts": counts, "per_minute": rate[0], "eta_s": rate[1]}
    if stages:
        out["stages"] = stages
    return out


def wait(
    ctx: typer.Context,
    session: int = typer.Option(..., "--session", help="Session id."),
    timeout: float = typer.Option(
        None, "--timeout", help="Give up after this many seconds (exit 3)."
    ),
    poll: float = typer.Option(2.0, "--poll", help="Seconds between checks."),
    as_json: bool = typer.Option(
        False, "--json", help="Print {timed_out, exit_code, counts, errors}."
    ),
) -> None:
    """Block until the session has no new, waiting or running job.

    Exit 0: every job completed (or was cancelled); 1: some job ended in error; 3: timed out.
    """
    from mlirtuna.queue import jobs

    outcome = jobs.wait(common.database(ctx), session, timeout, poll)
    if as_json:
        common.print_json(outcome.as_dict())
    else:
        common.err(", ".join(f"{n} {s}" for s, n in outcome.counts.items() if n) or "no jobs")
        if outcome.timed_out:
            left = sum(outcome.counts[s] for s in ("new", "waiting", "running"))
            common.err(f"timed out: session {session} still has {left} jobs after {timeout:g} s")
        for job in outcome.errors:
            common.err(f"job {job.id} error: {job.first_line}")
    if outcome.exit_code:
        raise typer.Exit(outcome.exit_code)


def register(root: typer.Typer) -> None:
    root.add_typer(app, name="jobs")
    root.command()(status)
    root.command()(wait)
