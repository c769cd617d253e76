"""What one database server can carry: its CPU per job, and the largest farm it can feed.

The servers run on this machine, so their CPU time is read from /proc: PostgreSQL serves each
connection with a process of its own (pg_stat_activity names the ones of our scratch database),
MariaDB with a thread of mariadbd (information_schema.PROCESSLIST gives its TID). Per backend:

1. jobs: W worker processes (the real worker loop, no-op tuner, started behind a barrier) drain
   N jobs; server CPU = the CPU time of the backends serving them (exact), plus the server's
   background work over the same window (PostgreSQL: WAL writer, checkpointer, background
   writer, autovacuum; MariaDB: every thread that serves no connection; shared with whoever
   else uses the server, so counted whole: an upper bound);
2. the calls a long job adds: a heartbeat (every lease/3 = 40 s by default) and the sweep of
   expired leases (at most every 5 s per busy worker), each timed on one connection.

From these: server CPU per job at a job length L = jobs + (L / 40 s) heartbeats + a sweep per
job (one per 5 jobs at L = 1 s), and the largest farm = cores / (CPU per job) x L GPUs.

    python bench/bench_server_capacity.py [--backends postgresql,mysql] [--smoke] [--out FILE]

Run as `bench_server_capacity.py worker URL SESSION` it is one worker process: it connects,
says "ready", runs on "go", prints its stats, and exits on a last line from stdin, so that its
server backend is still there to be measured when the run ends.
"""

from __future__ import annotations

import contextlib
import json
import logging
import os
import subprocess
import sys
import threading
from collections.abc import Iterator
from dataclasses import dataclass
from pathlib import Path

import common
import sqlalchemy as sa

from mlirtuna import queue
from mlirtuna.db import Database, resolve_url
from mlirtuna.defaults import DEFAULT_LEASE_S
from mlirtuna.queue import Claimant
from mlirtuna.worker import SWEEP_S, Worker, WorkerSettings

SERVERS = ("postgresql", "mysql")
JOB_LENGTHS = ((1.0, "1 s"), (30.0, "30 s"), (300.0, "5 min"))
CORES_ASSUMED = (2, 16)  # this machine's, and a dedicated database host's


@dataclass(frozen=True)
class Sizes:
    jobs: int
    workers: int
    calls: int  # heartbeats and sweeps timed on their own


REAL = Sizes(jobs=3000, workers=4, calls=1000)
SMOKE = Sizes(jobs=20, workers=2, calls=10)
TICK = os.sysconf("SC_CLK_TCK")
SERVING = "SELECT tid FROM information_schema.processlist"
MEASURED_HEADERS = (
    "server", "jobs", "backends CPU ms/job", "background CPU ms/job", "heartbeat CPU ms",
    "sweep CPU ms", "measured jobs/s",
)  # fmt: skip
FARM_HEADERS = (
    "server", "job length L", "server CPU ms/job", "jobs/s per core",
    *(f"max GPUs, {c} cores" for c in CORES_ASSUMED), "GPUs at measured jobs/s",
)  # fmt: skip


# -- server CPU from /proc ---------------------------------------------------------------------
def cpu_s(task: str) -> float:
    """CPU seconds of one process or thread (a /proc/… folder) so far, 0 when it is gone:
    schedstat's nanoseconds where the kernel has them, else stat's clock ticks."""
    try:
        return int(Path(task, "schedstat").read_text().split()[0]) / 1e9
    except (OSError, ValueError, IndexError):
        pass
    try:
        text = Path(task, "stat").read_text()
    except OSError:
        return 0.0
    fields = text.rsplit(")", 1)[1].split()
    return (int(fields[11]) + int(fields[12])) / TICK


class Server:
    """The server's processes (PostgreSQL) or threads (MariaDB): ours and the background."""

    def __init__(self, backend: str, admin_url: str, dbname: str) -> None:
        self.backend, self.dbname = backend, dbname
        self.admin = sa.create_engine(resolve_url(admin_url), poolclass=sa.NullPool)
        self.mariadbd = _mariadbd_pid() if backend == "mysql" else None
        self.serving: set[int] = set()  # MariaDB threads seen serving a connection

    def ours(self) -> dict[str, float]:
        """{/proc folder: CPU s} of the backends serving the scratch database now."""
        if self.backend == "postgresql":
            q = "SELECT pid FROM pg_stat_activity WHERE datname = %(db)s"
            return {f"/proc/{p}": cpu_s(f"/proc/{p}") for p in self._ids(q)}
        q = "SELECT tid FROM information_schema.processlist WHERE db = %(db)s"
        return {self._task(t): cpu_s(self._task(t)) for t in self._ids(q)}

    def background(self) -> dict[str, float]:
        """{/proc folder: CPU s} of the server's processes or threads that may work for no
        connection in particular (MariaDB: those in `serving` are left out by `spent`)."""
        if self.backend == "postgresql":
            q = "SELECT pid FROM pg_stat_activity WHERE backend_type <> 'client backend'"
            return {f"/proc/{p}": cpu_s(f"/proc/{p}") for p in self._ids(q)}
        self.serving.update(self._ids(SERVING))
        tasks = Path(f"/proc/{self.mariadbd}/task")
        return {str(t): cpu_s(str(t)) for t in tasks.iterdir()}

    def spent(self, before: dict[str, float], after: dict[str, float]) -> float:
        """Background CPU between two readings, without any thread that served a connection
        meanwhile (known only at the end)."""
        serving = {self._task(t) for t in self.serving}
        return sum(v - before.get(k, 0.0) for k, v in after.items() if k not in serving)

    @contextlib.contextmanager
    def watch(self) -> Iterator[None]:
        """MariaDB: note every thread that serves a connection meanwhile (anyone's: the other
        users of the server come and go), so that `background` leaves them out."""
        if self.backend != "mysql":
            yield
            return
        stop = threading.Event()

        def poll() -> None:
            while not stop.wait(0.05):
                self.serving.update(self._ids(SERVING))

        thread = threading.Thread(target=poll, daemon=True)
        thread.start()
        try:
            yield
        finally:
            stop.set()
            thread.join()

    def _task(self, tid: int) -> str:
        return f"/proc/{self.mariadbd}/task/{tid}"

    def _ids(self, query: str) -> list[int]:
        with self.admin.connect() as conn:
            return [r[0] for r in conn.exec_driver_sql(query, {"db": self.dbname}) if r[0]]

    def dispose(self) -> None:
        self.admin.dispose()


def _mariadbd_pid() -> int:
    for proc in Path("/proc").iterdir():
        if proc.name.isdigit():
            with contextlib.suppress(OSError):
                if (proc / "comm").read_text().strip() in ("mariadbd", "mysqld"):
                    return int(proc.name)
    raise SystemExit("no mariadbd/mysqld process on this machine: the server must run here")


def delta(before: dict[str, float], after: dict[str, float]) -> float:
    """CPU spent between two readings; a backend first seen after started at 0."""
    return sum(v - before.get(k, 0.0) for k, v in after.items())


# -- 1. jobs driven by worker processes --------------------------------------------------------
@dataclass(frozen=True)
class JobRun:
    jobs: int
    ours_s: float  # CPU of the backends serving the workers
    background_s: float
    window_s: float  # first claim .. last completion, by the database clock


def drive_jobs(url: str, db: Database, server: Server, sizes: Sizes) -> JobRun:
    sid = common.make_session(db, sizes.jobs)
    argv = [sys.executable, str(Path(__file__).resolve()), "worker", url, str(sid)]
    procs = [
        subprocess.Popen(argv, stdin=subprocess.PIPE, stdout=subprocess.PIPE, text=True)
        for _ in range(sizes.workers)
    ]
    try:
        for p in procs:
            if _line(p) != "ready":
                raise RuntimeError("bench worker did not start")
        with server.watch():
            before, bg0 = server.ours(), server.background()
            for p in procs:
                _say(p, "go")
            done = sum(json.loads(_line(p))["completed"] for p in procs)
            after, bg1 = server.ours(), server.background()  # the workers are still connected
        for p in procs:
            _say(p, "exit")
            p.wait(timeout=60)
    finally:
        for p in procs:
            if p.poll() is None:
                p.kill()
                p.wait()
    window = common.job_window(db, sid)
    if done != sizes.jobs or window.completed != sizes.jobs:
        raise RuntimeError(f"workers completed {done} of {sizes.jobs} jobs")
    return JobRun(done, delta(before, after), server.spent(bg0, bg1), window.seconds)


def _line(p: subprocess.Popen) -> str:
    return (p.stdout.readline() if p.stdout else "").strip()


def _say(p: subprocess.Popen, word: str) -> None:
    if p.stdin:
        p.stdin.write(word + "\n")
        p.stdin.flush()


def _worker_main(url: str, session_id: int) -> None:
    logging.getLogger("mlirtuna").setLevel(logging.ERROR)
    db = Database(url)
    settings = WorkerSettings(session_id=session_id, tuner="sleep:0", until_empty=True)
    worker = Worker(db, settings)
    print("ready", flush=True)
    sys.stdin.readline()
    stats = worker.run()
    print(json.dumps({"completed": stats.completed}), flush=True)
    sys.stdin.readline()  # keep the connection (and its server backend) until measured
    db.dispose()


# -- 2. heartbeats and sweeps on one connection ------------------------------------------------
def per_call(db: Database, server: Server, n: int) -> dict[str, float]:
    """Server CPU ms per heartbeat and per sweep (one connection, `n` calls each)."""
    sid = common.make_session(db, 1)
    lease = queue.claim(db, sid, Claimant("bench", -1), DEFAULT_LEASE_S)
    if lease is None:
        raise RuntimeError("no job to claim")
    out = {}
    calls = {
        "heartbeat": lambda: queue.heartbeat(db, lease, DEFAULT_LEASE_S),
        "sweep": lambda: queue.reclaim_expired(db, max_retries=3, session_id=sid),
    }
    for name, call in calls.items():
        call()
        before = server.ours()
        for _ in range(n):
            call()
        out[name] = delta(before, server.ours()) / n * 1e3
    return out


# -- the report --------------------------------------------------------------------------------
def job_cpu_ms(run: JobRun, calls: dict[str, float], length_s: float) -> float:
    """Server CPU ms per job of `length_s` seconds: claim + record (with the server's background
    share), its heartbeats, and its sweep (every SWEEP_S per busy worker, at most one per job)."""
    base = (run.ours_s + run.background_s) / run.jobs * 1e3
    heartbeats = length_s / (DEFAULT_LEASE_S / 3)
    sweeps = min(1.0, length_s / SWEEP_S)
    return base + heartbeats * calls["heartbeat"] + sweeps * calls["sweep"]


def main() -> None:
    p = common.parser(__doc__.split("\n\n")[0])
    p.set_defaults(backends="postgresql,mysql")
    args = p.parse_args()
    chosen = [b for b in common.backends(args.backends) if b in SERVERS]
    if not chosen:
        raise SystemExit("--backends: choose postgresql and/or mysql (SQLite has no server)")
    sizes = SMOKE if args.smoke else REAL
    logging.getLogger("mlirtuna").setLevel(logging.ERROR)
    measured, farms = [], []
    for backend in chosen:
        label = common.LABEL[backend]
        with common.scratch_db(backend) as url:
            db = Database(url)
            server = Server(backend, common.server_url(backend), db.url.database)
            try:
                common.status(f"{backend}: {sizes.jobs} jobs, {sizes.workers} worker processes")
                run = drive_jobs(url, db, server, sizes)
                common.status(f"{backend}: {sizes.calls} heartbeats and sweeps")
                calls = per_call(db, server, sizes.calls)
            finally:
                server.dispose()
                db.dispose()
        measured.append(measured_row(label, run, calls))
        farms += farm_rows(label, run, calls)
    common.emit(report(chosen, sizes, measured, farms), args.out)


def measured_row(label: str, run: JobRun, calls: dict[str, float]) -> list[object]:
    return [
        label,
        run.jobs,
        f"{run.ours_s / run.jobs * 1e3:.2f}",
        f"{run.background_s / run.jobs * 1e3:.2f}",
        f"{calls['heartbeat']:.3f}",
        f"{calls['sweep']:.3f}",
        f"{run.jobs / run.window_s:.0f}",
    ]


def farm_rows(label: str, run: JobRun, calls: dict[str, float]) -> list[list[object]]:
    rows = []
    for length_s, name in JOB_LENGTHS:
        ms = job_cpu_ms(run, calls, length_s)
        per_core = 1e3 / ms  # jobs/s one core of the server sustains
        gpus = [f"{per_core * cores * length_s:,.0f}" for cores in CORES_ASSUMED]
        rows.append([label, name, f"{ms:.2f}", f"{per_core:.0f}", *gpus])
        rows[-1].append(f"{run.jobs / run.window_s * length_s:,.0f}")
    return rows


def report(chosen, sizes: Sizes, measured, farms) -> str:
    cores = " / ".join(str(c) for c in CORES_ASSUMED)
    return "\n\n".join(
        [
            "### What one database server can carry",
            common.machine_line() + " " + common.server_versions(chosen),
            f"{sizes.jobs} jobs drained by {sizes.workers} worker processes (no-op tuner), the "
            "server on this machine. Server CPU from /proc: the backends serving the workers "
            "(exact) and the server's background work in the same window (shared with anyone "
            "else using the server: an upper bound). Heartbeat and sweep: server CPU per call, "
            f"{sizes.calls} calls on one connection. Jobs/s: the run's, by the database clock, "
            "with the workers and the server sharing this machine's cores.",
            common.table(MEASURED_HEADERS, measured),
            "The largest farm: a GPU finishing a job every L seconds needs 1/L claims+records "
            f"per second, a heartbeat every {DEFAULT_LEASE_S / 3:.0f} s and a sweep every "
            f"{SWEEP_S:.0f} s at most. Server CPU per job = claim + record (backends + "
            "background) + L/40 heartbeats + min(1, L/5) sweeps; max GPUs = cores x "
            f"(jobs/s per core) x L, for {cores} server cores (linear in cores: an assumption); "
            "last column: the jobs/s measured here x L.",
            common.table(FARM_HEADERS, farms),
        ]
    )


if __name__ == "__main__" and sys.argv[1:2] == ["worker"]:
    _worker_main(sys.argv[2], int(sys.argv[3]))
elif __name__ == "__main__":
    main()
