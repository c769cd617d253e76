"""Scaling efficiency: W worker processes, a tuner that sleeps T = 0.2 s per job.

efficiency = (jobs x T / W) / time, with jobs = 10 x W so that each worker does about ten jobs.
Time is measured twice: by the database clock from the first claim to the last completion
(min(claimed_at) .. max(finished_at); the headline number), and by the wall clock from the start
signal to the last worker's exit. Workers are real processes (the real `Worker` loop with
`--until-empty`) that import, connect and say ready before a common start signal, so Python
start-up (about 0.5 s of CPU per process) stays outside both windows.

    python bench/bench_scaling.py [--backends sqlite,postgresql,mysql] [--smoke] [--out FILE]
"""

from __future__ import annotations

import logging

import common
import sqlalchemy as sa

from mlirtuna.db import Database, resolve_url
from mlirtuna.db.models import Attempt, Job

SLEEP_S = 0.2
JOBS_PER_WORKER = 10
REAL_WORKERS = (1, 8, 32, 64)
SMOKE_WORKERS = (2,)
SMOKE_SLEEP_S = 0.02
HEADERS = (
    "backend", "workers", "jobs", "DB window s", "efficiency (DB)", "range", "wall s",
    "efficiency (wall)", "jobs per worker", "worker CPU ms/job", "machine CPU busy",
)  # fmt: skip
SPARE_CONNECTIONS = 5  # for this script and whoever else uses the server


def jobs_per_worker(db: Database, session_id: int) -> tuple[int, int]:
    """(fewest, most) jobs one worker process completed."""
    with db.session() as s:
        counts = s.scalars(
            sa.select(sa.func.count())
            .select_from(Attempt)
            .join(Job, Job.id == Attempt.job_id)
            .where(Job.session_id == session_id, Attempt.outcome == "completed")
            .group_by(Attempt.pid)
        ).all()
    return (min(counts), max(counts)) if counts else (0, 0)


def free_connections(url: str) -> int | None:
    """Connections the server still accepts (None: no limit, SQLite)."""
    limit = common.max_connections(url)
    if limit is None:
        return None
    engine = sa.create_engine(resolve_url(url), poolclass=sa.NullPool)
    with engine.connect() as conn:
        used = conn.exec_driver_sql(
            "SELECT COUNT(*) FROM information_schema.processlist"
            if "mysql" in url
            else "SELECT COUNT(*) FROM pg_stat_activity WHERE backend_type = 'client backend'"
        ).scalar()
    engine.dispose()
    return limit - int(used)


def run_backend(
    backend: str, workers: tuple[int, ...], sleep_s: float, repeat: int
) -> list[list[object]]:
    rows: list[list[object]] = []
    label = common.LABEL[backend]
    with common.scratch_db(backend) as url:
        db = Database(url)
        for w in workers:
            free = free_connections(url)
            if free is not None and w + SPARE_CONNECTIONS > free:
                rows.append([label, w, f"skipped: {free} connections free", *["-"] * 8])
                continue
            runs = [one_run(db, url, backend, w, sleep_s) for _ in range(repeat)]
            runs.sort(key=lambda r: r[0])  # by DB-window efficiency
            eff, run, fewest, most = runs[len(runs) // 2]
            ideal = JOBS_PER_WORKER * sleep_s
            rows.append(
                [
                    label,
                    w,
                    run.window.completed,
                    f"{run.window.seconds:.2f}",
                    f"{eff:.1f} %",
                    f"{runs[0][0]:.0f}-{runs[-1][0]:.0f} %",
                    f"{run.wall_s:.2f}",
                    f"{100 * ideal / run.wall_s:.1f} %",
                    f"{fewest}-{most}",
                    f"{run.cpu_ms_per_job:.1f}",
                    f"{run.busy_pct:.0f} %",
                ]
            )
        db.dispose()
    return rows


def one_run(
    db: Database, url: str, backend: str, w: int, sleep_s: float
) -> tuple[float, common.WorkerRun, int, int]:
    """(DB-window efficiency in %, the run, fewest and most jobs done by one worker)."""
    n = JOBS_PER_WORKER * w
    sid = common.make_session(db, n)
    common.status(f"{backend}: {w} workers, {n} jobs of {sleep_s} s")
    run = common.run_workers(url, sid, w, f"sleep:{sleep_s}")
    if run.window.completed != n:
        raise RuntimeError(f"{run.window.completed} of {n} jobs completed")
    efficiency = 100 * (n * sleep_s / w) / run.window.seconds
    return (efficiency, run, *jobs_per_worker(db, sid))


def main() -> None:
    p = common.parser(__doc__.split("\n\n")[0])
    p.add_argument(
        "--workers",
        help=f"comma-separated worker counts (default {','.join(map(str, REAL_WORKERS))})",
    )
    p.add_argument("--repeat", type=int, help="runs per size; the median is shown (default 3)")
    args = p.parse_args()
    chosen = common.backends(args.backends)
    workers = SMOKE_WORKERS if args.smoke else REAL_WORKERS
    if args.workers:
        workers = tuple(int(w) for w in args.workers.split(","))
    sleep_s = SMOKE_SLEEP_S if args.smoke else SLEEP_S
    logging.getLogger("mlirtuna").setLevel(logging.ERROR)
    repeat = args.repeat or (1 if args.smoke else 3)
    rows = [row for b in chosen for row in run_backend(b, workers, sleep_s, repeat)]
    text = "\n\n".join(
        [
            "### Scaling efficiency",
            common.machine_line() + " " + common.server_versions(chosen),
            f"Tuner `sleep:{sleep_s:g}`, {JOBS_PER_WORKER} jobs per worker, worker processes "
            "started behind a barrier (start-up excluded). Efficiency = (jobs x T / W) / time; "
            "DB window = first claim to last completion by the database clock, wall = start "
            "signal to the last worker's exit (includes each worker's final `--until-empty` "
            f"poll and interpreter exit). Each size ran {repeat} times: the run with the median "
            "DB-window efficiency is shown, `range` spans all runs. Worker CPU = the worker "
            "processes' own CPU time per job; machine CPU busy = all cores, the database server "
            "and other users included.",
            common.table(HEADERS, rows),
        ]
    )
    common.emit(text, args.out)


if __name__ == "__main__":
    main()
