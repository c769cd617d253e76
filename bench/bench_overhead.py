"""Orchestration overhead per job, mlirtuna vs Optuna's RDB storage; queue throughput.

1. Per job, on the same database server in the same run, in alternating rounds:
   - mlirtuna: the real worker loop (`Worker.run`, in-process) with the no-op tuner `sleep:0`:
     claim (with the problem), the lease held by the worker's heartbeat thread, tune, fenced
     record of one candidate and `completed`; the reclaim_expired sweep runs every 5 s (and when
     nothing is claimable), so it is timed on its own;
   - Optuna: `study.ask()`, `trial.suggest_float("x", 0, 1)`, `study.tell(trial, 0.5)` with
     RDBStorage and RandomSampler.
   Each side has a scratch database of its own on the same server (both keep an
   `alembic_version` table); for SQLite, a file of its own each, both with the same durability:
   WAL and `PRAGMA synchronous=NORMAL` (mlirtuna's own: a commit does not fsync; Optuna's
   default is a rollback journal with synchronous=FULL), or both FULL with `--sqlite-sync full`.
   Beside each ratio: the fsync probe, the median ms of one durable one-row commit (INSERT one
   row, COMMIT) on that backend at that durability; and both sides' client CPU per job.
2. Where mlirtuna's time goes: each queue call timed on its own.
3. Jobs per second with 1, 4 and 16 worker processes (no-op tuner), measured between the first
   claim and the last completion by the database clock (process start-up excluded).

    python bench/bench_overhead.py [--backends sqlite,postgresql,mysql] [--smoke] [--out FILE]
"""

from __future__ import annotations

import contextlib
import cProfile
import io
import logging
import pstats
import time
from collections.abc import Callable
from dataclasses import dataclass

import common
import sqlalchemy as sa
from sqlalchemy import event

from mlirtuna import queue
from mlirtuna.db import PING_IDLE_S, Database, resolve_url
from mlirtuna.queue import Claimant, Lease
from mlirtuna.tuners.base import TuneContext
from mlirtuna.tuners.sleep import SleepTuner
from mlirtuna.worker import Heartbeat, Worker, WorkerSettings

try:  # the `bench` extra: pip install '.[bench]'
    import optuna
    from optuna.samplers import RandomSampler
    from optuna.storages import RDBStorage
except ImportError:
    optuna = None


@dataclass(frozen=True)
class Sizes:
    rounds: int  # measured rounds per contender (one warm-up round more is discarded)
    per_round: int  # jobs (trials) per round
    calls: int  # jobs for the per-call breakdown
    throughput_jobs: int
    workers: tuple[int, ...]


REAL = Sizes(rounds=15, per_round=40, calls=200, throughput_jobs=1000, workers=(1, 4, 16))
RATE_HEADERS = (
    "backend", "workers", "jobs", "window s", "jobs/s (DB window)", "jobs/s (wall)",
    "worker CPU ms/job", "machine CPU busy",
)  # fmt: skip
OVERHEAD_HEADERS = (
    "backend", "fsync probe ms", "mlirtuna ms/job", "Optuna ms/trial", "Optuna / mlirtuna",
    "mlirtuna CPU ms/job", "Optuna CPU ms/trial", "Optuna / mlirtuna CPU",
)  # fmt: skip
PROBE_COMMITS = 200
PARTS = (
    "reclaim_expired", "claim + problem", "heartbeat hold", "record", "record + claim next",
    "GPU worker: claim + problem + look", "GPU worker: record + claim next",
)  # fmt: skip
#: A GPU worker's claim also checks that no other worker holds a live attempt on its GPU, and
#: after a fresh claim (not one chained to a record) the worker looks again (issue 34): the GPU
#: columns time both beside the CPU worker's claims.
GPU_WHO = Claimant("bench", 0, gpu="GPU-bench-0")
COUNTS = (
    "claim statements", "claim round trips", "record statements", "record round trips",
    "record + claim next statements", "record + claim next round trips",
)  # fmt: skip
SMOKE = Sizes(rounds=2, per_round=3, calls=3, throughput_jobs=6, workers=(2,))


Timed = tuple[float, float]  # (wall, client CPU) seconds per job


def mlirtuna_round(worker: Worker, n: int) -> Timed:
    """Seconds per job for `n` jobs of the real worker loop: wall, and this process's CPU (the
    heartbeat thread included)."""
    worker.settings.max_jobs = worker.stats.completed + n
    t0, c0 = time.perf_counter(), time.process_time()
    worker.run()
    elapsed, cpu = time.perf_counter() - t0, time.process_time() - c0
    if worker.stats.completed != worker.settings.max_jobs:
        raise RuntimeError(f"worker did {worker.stats}, expected {worker.settings.max_jobs} jobs")
    return elapsed / n, cpu / n


def optuna_round(study: optuna.Study, n: int) -> Timed:  # type: ignore[name-defined]
    """Seconds per trial for `n` ask + suggest + tell: wall, and this process's CPU."""
    t0, c0 = time.perf_counter(), time.process_time()
    for _ in range(n):
        trial = study.ask()
        trial.suggest_float("x", 0.0, 1.0)
        study.tell(trial, 0.5)
    return (time.perf_counter() - t0) / n, (time.process_time() - c0) / n


def per_job(
    db: Database, optuna_url: str | None, sizes: Sizes, profile: bool, sqlite_sync: str
) -> tuple[Timed, Timed | None]:
    """(mlirtuna, optuna) median (wall, CPU) milliseconds per job, rounds alternating who goes
    first."""
    sid = common.make_session(db, sizes.per_round * (sizes.rounds + 1))
    worker = common.worker_class()(db, WorkerSettings(session_id=sid, tuner="sleep:0"))
    prof = cProfile.Profile() if profile else None
    ours: list[Timed] = []
    theirs: list[Timed] = []
    contenders: list[tuple[list[Timed], Callable[[], Timed]]] = [
        (ours, lambda: _maybe_profiled(prof, mlirtuna_round, worker, sizes.per_round))
    ]
    if optuna_url is not None:
        storage = RDBStorage(optuna_url)
        if db.is_sqlite:
            sqlite_durability(storage.engine, sqlite_sync)
        study = optuna.create_study(storage=storage, sampler=RandomSampler())
        contenders.append((theirs, lambda: optuna_round(study, sizes.per_round)))
    for r in range(sizes.rounds + 1):
        for into, run in contenders if r % 2 else contenders[::-1]:
            wall, cpu = run()
            if r:  # round 0 warms both up (first connections, statement caches)
                into.append((wall * 1e3, cpu * 1e3))
    if prof is not None:
        _print_profile(db.backend, prof)
    return _medians(ours), _medians(theirs) if theirs else None


def _medians(rounds: list[Timed]) -> Timed:
    return common.median([w for w, _ in rounds]), common.median([c for _, c in rounds])


def sqlite_durability(engine: sa.Engine, sync: str) -> None:
    """Every new connection of this engine commits with the durability both contenders share:
    WAL and `PRAGMA synchronous=` NORMAL (mlirtuna's own: no fsync per commit) or FULL. The
    connections already pooled are closed, so that none keeps the old setting."""

    def pragmas(dbapi_conn, _record) -> None:
        cur = dbapi_conn.cursor()
        cur.execute("PRAGMA journal_mode=WAL")
        cur.execute(f"PRAGMA synchronous={sync.upper()}")
        cur.close()

    event.listen(engine, "connect", pragmas)
    engine.dispose()


def fsync_probe(url: str, commits: int, sqlite_sync: str) -> float:
    """Median ms of one durable one-row commit (INSERT one row, COMMIT), on a table of its own
    in this database, at the durability the contenders run with: what the disk (and the
    server's commit settings) charge each commit."""
    engine = sa.create_engine(resolve_url(url), poolclass=sa.NullPool)
    if engine.dialect.name == "sqlite":
        sqlite_durability(engine, sqlite_sync)
    times = []
    try:
        with engine.connect() as conn:
            conn.exec_driver_sql("CREATE TABLE fsync_probe (id INTEGER PRIMARY KEY)")
            conn.commit()
            for i in range(commits):
                t0 = time.perf_counter()
                conn.exec_driver_sql(f"INSERT INTO fsync_probe (id) VALUES ({i})")
                conn.commit()
                times.append((time.perf_counter() - t0) * 1e3)
            conn.exec_driver_sql("DROP TABLE fsync_probe")
            conn.commit()
    finally:
        engine.dispose()
    return common.median(times)


def _maybe_profiled(prof: cProfile.Profile | None, fn, *args) -> float:
    if prof is None:
        return fn(*args)
    prof.enable()
    try:
        return fn(*args)
    finally:
        prof.disable()


def _print_profile(backend: str, prof: cProfile.Profile) -> None:
    text = io.StringIO()
    pstats.Stats(prof, stream=text).sort_stats("cumulative").print_stats(30)
    common.status(f"--- cProfile of mlirtuna's worker loop on {backend} ---\n{text.getvalue()}")


class DriverClock:
    """Counts the statements sent to the database and the time spent inside the driver, and
    the other round trips: the pool's ping of a connection that sat idle, and each COMMIT
    (none for a PostgreSQL statement run in autocommit)."""

    def __init__(self, db: Database) -> None:
        self.statements, self.seconds, self._t0 = 0, 0.0, 0.0
        self.checkouts, self.commits = 0, 0
        event.listen(db.engine, "before_cursor_execute", self._before)
        event.listen(db.engine, "after_cursor_execute", self._after)
        event.listen(db.engine, "commit", self._commit)
        event.listen(db.engine.pool, "checkout", self._checkout)

    def _before(self, *_args: object) -> None:
        self._t0 = time.perf_counter()

    def _after(self, *_args: object) -> None:
        self.statements += 1
        self.seconds += time.perf_counter() - self._t0

    def _commit(self, conn) -> None:
        if conn.get_execution_options().get("isolation_level") != "AUTOCOMMIT":
            self.commits += 1

    def _checkout(self, _dbapi_conn, record, _proxy) -> None:
        # The pool pings a connection that sat idle longer than PING_IDLE_S (db/engine.py).
        idle = time.monotonic() - record.info.get("checked_in", time.monotonic())
        self.checkouts += idle > PING_IDLE_S

    def take(self) -> tuple[int, int]:
        """(statements, round trips) since the last take; SQLite has no round trips."""
        trips = self.statements + self.checkouts + self.commits
        counts = (self.statements, trips)
        self.statements, self.checkouts, self.commits = 0, 0, 0
        return counts


def breakdown(db: Database, n: int) -> dict[str, float]:
    """Median milliseconds of each call the worker makes per job, timed one by one; per claim
    and per record the statements and round trips sent; per job the milliseconds spent inside
    the driver executing statements."""
    parts: dict[str, list[float]] = {k: [] for k in PARTS}
    sid = common.make_session(db, 2 * n + 3)
    clock = DriverClock(db)
    who, tuner = Claimant("bench", -1), SleepTuner(0.0)
    ctx = TuneContext("cpu", "cpu", 1, 1, "full", gpu_id=-1)
    beat = Heartbeat(db, 120.0, 40.0)
    counts = {"claim": [0, 0], "record": [0, 0], "record + claim next": [0, 0]}
    driver_s = 0.0
    for i in range(n + 1):
        t0 = time.perf_counter()
        queue.reclaim_expired(db, max_retries=3, session_id=sid)
        t1 = time.perf_counter()
        clock.take()
        clock.seconds = 0.0
        lease = queue.claim(db, sid, who, 120.0)
        if lease is None or lease.problem is None:
            raise RuntimeError("no job to claim")
        claimed = clock.take()
        t2 = time.perf_counter()
        with beat.hold(lease):
            outcome = tuner.tune(lease.problem, ctx)
        t3 = time.perf_counter()
        clock.take()
        _record(db, lease, outcome)
        recorded = clock.take()
        t4 = time.perf_counter()
        if i == 0:  # the first job warms up
            continue
        driver_s += clock.seconds
        for key, taken in (("claim", claimed), ("record", recorded)):
            counts[key] = [a + b for a, b in zip(counts[key], taken, strict=True)]
        for key, a, b in zip(PARTS[:4], (t0, t1, t2, t3), (t1, t2, t3, t4), strict=True):
            parts[key].append((b - a) * 1e3)
    # The worker's own path, one job at a time: each record claims the next job in its commit.
    parts["record + claim next"], counts["record + claim next"] = _chained(db, sid, who, n, clock)
    gpu_sid = common.make_session(db, 2 * n + 3)
    for i in range(n + 1):
        t0 = time.perf_counter()
        lease = queue.claim(db, gpu_sid, GPU_WHO, 120.0)
        if queue.gpu_holder(db, GPU_WHO) is not None:  # the worker's look after a fresh claim
            raise RuntimeError("another holder of the bench's GPU")
        elapsed = time.perf_counter() - t0
        if lease is None or lease.problem is None:
            raise RuntimeError("no job to claim")
        _record(db, lease, tuner.tune(lease.problem, ctx))
        if i:
            parts["GPU worker: claim + problem + look"].append(elapsed * 1e3)
    parts["GPU worker: record + claim next"], _ = _chained(db, gpu_sid, GPU_WHO, n, clock)
    out = {k: common.median(v) for k, v in parts.items()}
    for key in ("claim", "record", "record + claim next"):
        out[f"{key} statements"] = counts[key][0] / n
        out[f"{key} round trips"] = counts[key][1] / n if not db.is_sqlite else float("nan")
    out["in driver"] = driver_s / n * 1e3
    return out


def _chained(
    db: Database, sid: int, who: Claimant, n: int, clock: DriverClock
) -> tuple[list[float], list[int]]:
    """n jobs as the worker runs them (after one to warm up): each record claims the next job
    in its commit. The ms of each record + claim, and the statements and round trips sent."""
    times, counts = [], [0, 0]
    tuner, ctx = SleepTuner(0.0), TuneContext("cpu", "cpu", 1, 1, "full", gpu_id=who.gpu_id)
    beat = Heartbeat(db, 120.0, 40.0)
    lease = queue.claim(db, sid, who, 120.0)
    for i in range(n + 1):
        if lease is None or lease.problem is None:
            raise RuntimeError("no job to claim")
        with beat.hold(lease):
            outcome = tuner.tune(lease.problem, ctx)
        clock.take()
        t0 = time.perf_counter()
        recorded, lease = queue.record_and_claim(
            db, lease, outcome, queue.NextClaim(sid, who, 120.0)
        )
        elapsed = time.perf_counter() - t0
        taken = clock.take()
        if not recorded:
            raise RuntimeError("lease lost in a single-worker benchmark")
        if i:
            times.append(elapsed * 1e3)
            counts = [a + b for a, b in zip(counts, taken, strict=True)]
    if lease is not None:  # the job claimed last goes back for the next user of the session
        queue.release(db, lease)
    return times, counts


def _record(db: Database, lease: Lease, outcome) -> None:
    if not queue.record(db, lease, outcome):
        raise RuntimeError(f"job {lease.job_id}: lease lost in a single-worker benchmark")


def throughput(db: Database, url: str, sizes: Sizes) -> list[tuple[int, common.WorkerRun]]:
    runs = []
    for w in sizes.workers:
        sid = common.make_session(db, sizes.throughput_jobs)
        runs.append((w, common.run_workers(url, sid, w, "sleep:0")))
    return runs


def main() -> None:
    p = common.parser(__doc__.split("\n\n")[0])
    p.add_argument("--profile", action="store_true", help="cProfile mlirtuna's rounds (stderr)")
    p.add_argument(
        "--sqlite-sync",
        choices=("normal", "full"),
        default="normal",
        help="SQLite durability of both contenders (WAL; synchronous NORMAL: mlirtuna's own)",
    )
    args = p.parse_args()
    chosen = common.backends(args.backends)
    sizes = SMOKE if args.smoke else REAL
    logging.getLogger("mlirtuna").setLevel(logging.ERROR)
    if optuna is None:
        common.status("Optuna is not installed (pip install '.[bench]'): mlirtuna's side only")
    else:
        optuna.logging.set_verbosity(optuna.logging.WARNING)

    overhead, parts, rates = [], [], []
    for backend in chosen:
        label = common.LABEL[backend]
        with contextlib.ExitStack() as stack:
            url = stack.enter_context(common.scratch_db(backend))
            o_url = None
            if optuna is not None:
                o_url = stack.enter_context(common.scratch_db(backend, migrate=False))
            db = Database(url)
            stack.callback(db.dispose)
            if db.is_sqlite:
                sqlite_durability(db.engine, args.sqlite_sync)
            commits = 5 if args.smoke else PROBE_COMMITS
            probe = fsync_probe(url, commits, args.sqlite_sync)
            common.status(f"{backend}: per-job overhead, {sizes.rounds} x {sizes.per_round} jobs")
            ours, theirs = per_job(db, o_url, sizes, args.profile, args.sqlite_sync)
            overhead.append(overhead_row(label, probe, ours, theirs))
            common.status(f"{backend}: per-call breakdown")
            calls = breakdown(db, sizes.calls)
            per_call = [calls[k] for k in PARTS]
            counted = [_count(calls[k]) for k in COUNTS]
            parts.append([label, *per_call, *counted, calls["in driver"]])
            common.status(f"{backend}: throughput with {sizes.workers} worker processes")
            for w, run in throughput(db, url, sizes):
                rates.append(rate_row(label, w, run))
    common.emit(report(chosen, sizes, overhead, parts, rates, args.sqlite_sync), args.out)


def overhead_row(label: str, probe: float, ours: Timed, theirs: Timed | None) -> list[object]:
    if theirs is None:
        return [label, probe, ours[0], "not installed", "-", ours[1], "not installed", "-"]
    return [
        label, probe, ours[0], theirs[0], f"{theirs[0] / ours[0]:.1f}x",
        ours[1], theirs[1], f"{theirs[1] / ours[1]:.1f}x",
    ]  # fmt: skip


def _count(value: float) -> str:
    return "-" if value != value else f"{value:.3g}"  # NaN: SQLite, no server to go round to


def rate_row(label: str, workers: int, run: common.WorkerRun) -> list[object]:
    return [
        label,
        workers,
        run.window.completed,
        f"{run.window.seconds:.2f}",
        f"{run.window.completed / run.window.seconds:.0f}",
        f"{run.completed / run.wall_s:.0f}",
        f"{run.cpu_ms_per_job:.1f}",
        f"{run.busy_pct:.0f} %",
    ]


def report(chosen, sizes: Sizes, overhead, parts, rates, sqlite_sync: str = "normal") -> str:
    who = f"Optuna {optuna.__version__}" if optuna is not None else "Optuna (not installed)"
    return "\n\n".join(
        [
            "### Orchestration overhead per job: mlirtuna vs Optuna",
            common.machine_line() + " " + common.server_versions(chosen),
            f"Median of {sizes.rounds} rounds of {sizes.per_round} jobs (trials) each, the two "
            "contenders alternating within one run, each in its own scratch database on the same "
            "server. mlirtuna: the worker loop with the no-op tuner (claim with the problem, "
            f"heartbeat, fenced record of one candidate, a sweep every 5 s). {who}: RDBStorage, "
            "RandomSampler, ask + suggest_float + tell. SQLite: both with WAL and "
            f"synchronous={sqlite_sync.upper()}"
            + (" (mlirtuna's own; a commit does not fsync)" if sqlite_sync == "normal" else "")
            + ". fsync probe: median ms of one one-row INSERT + COMMIT on that backend, what "
            "each durable commit costs there. CPU: each contender's client process CPU time "
            "per job (mlirtuna's heartbeat thread included); the servers' CPU is not counted.",
            common.table(OVERHEAD_HEADERS, overhead),
            "Where mlirtuna's time goes: median ms per call, each timed on its own (the worker "
            "sweeps at most every 5 s, so reclaim_expired is not in its per-job cost); then the "
            "statements a claim and a record send, alone and as the worker sends them (the "
            "record of job N and the claim of job N+1 in one commit; SQLite's BEGIN IMMEDIATE "
            "included), and their "
            "round trips to the server (statements + COMMIT + the ping of a connection idle "
            "over 1 s, none here; PostgreSQL's one-statement claim and record run in "
            "autocommit, without BEGIN/COMMIT); then per "
            "job the ms spent inside the database driver executing statements, separate claim and "
            "record (round trips and "
            "server work; COMMIT not included). The rest is Python.",
            common.table(["backend", *PARTS, *COUNTS, "in driver"], parts),
            "Queue throughput, no-op tuner, worker processes started behind a barrier; jobs/s "
            "by the database clock (first claim to last completion) and by the wall clock "
            "(start signal to the last worker's exit, which includes its `--until-empty` check); "
            "worker CPU = the worker processes' own CPU time per job; machine CPU busy = all "
            "cores, everyone (the database server, other users) included:",
            common.table(RATE_HEADERS, rates),
        ]
    )


if __name__ == "__main__":
    main()
