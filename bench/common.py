"""What the bench scripts share: options, scratch databases, sessions full of jobs, worker
processes started behind a barrier, the job window measured by the database clock, Markdown.

Server URLs: MLIRTUNA_BENCH_POSTGRES / MLIRTUNA_BENCH_MYSQL, else MLIRTUNA_TEST_POSTGRES /
MLIRTUNA_TEST_MYSQL (what CI sets), else the loopback servers of the development machine. Every
run works in scratch databases of its own (`bench_<pid>_<random>`) and drops them at the end.

Run as a script (`python bench/common.py worker …`) this module is one worker process of
`run_workers`: it imports, connects and builds its Worker, says "ready", and starts claiming only
when the parent writes a byte to its stdin, so that process start-up stays out of the measurement.
"""

from __future__ import annotations

import argparse
import contextlib
import datetime as dt
import importlib
import json
import os
import platform
import sqlite3
import statistics
import subprocess
import sys
import tempfile
import time
import uuid
from collections.abc import Iterator, Sequence
from dataclasses import dataclass
from pathlib import Path

import sqlalchemy as sa

from mlirtuna import catalog, machine, sessions
from mlirtuna.db import Database, resolve_url
from mlirtuna.db.models import COMPLETED, Job
from mlirtuna.problems import parse
from mlirtuna.queue import jobs
from mlirtuna.sessions import SessionSpec

BACKENDS = ("sqlite", "postgresql", "mysql")
SERVER_ENV = {
    "postgresql": ("MLIRTUNA_BENCH_POSTGRES", "MLIRTUNA_TEST_POSTGRES"),
    "mysql": ("MLIRTUNA_BENCH_MYSQL", "MLIRTUNA_TEST_MYSQL"),
}
LOOPBACK = {
    "postgresql": "postgresql://postgres@127.0.0.1:5432/test",
    "mysql": "mysql://root@127.0.0.1:3306/test",
}
LABEL = {"sqlite": "SQLite", "postgresql": "PostgreSQL", "mysql": "MariaDB/MySQL"}


# -- options and output ------------------------------------------------------------------------
def parser(description: str) -> argparse.ArgumentParser:
    p = argparse.ArgumentParser(description=description)
    p.add_argument(
        "--backends",
        default=",".join(BACKENDS),
        help="comma-separated subset of sqlite,postgresql,mysql (default: all three)",
    )
    p.add_argument("--smoke", action="store_true", help="tiny sizes: checks the script runs")
    p.add_argument("--out", type=Path, help="also write the Markdown to this file")
    return p


def backends(text: str) -> list[str]:
    chosen = [b.strip() for b in text.split(",") if b.strip()]
    unknown = [b for b in chosen if b not in BACKENDS]
    if unknown or not chosen:
        raise SystemExit(f"--backends: expected a subset of {','.join(BACKENDS)}, got {text!r}")
    return chosen


def machine_line() -> str:
    """CPU model and cores, memory, OS, Python, date: the context every table needs."""
    mem = os.sysconf("SC_PAGE_SIZE") * os.sysconf("SC_PHYS_PAGES") / 2**30
    today = dt.datetime.now(dt.UTC).strftime("%Y-%m-%d %H:%M UTC")
    return (
        f"Machine: {machine.cpu_description()}, {mem:.0f} GiB RAM, "
        f"{platform.system()} {platform.release()}, Python {platform.python_version()}; {today}."
    )


def server_versions(chosen: Sequence[str]) -> str:
    parts = [f"SQLite {sqlite3.sqlite_version}"]
    for backend in chosen:
        if backend == "sqlite":
            continue
        engine = sa.create_engine(resolve_url(server_url(backend)), poolclass=sa.NullPool)
        with engine.connect() as conn:
            version = conn.exec_driver_sql("SELECT version()").scalar()
        engine.dispose()
        text = str(version).split(" on ")[0].split(" (")[0]  # PostgreSQL 15.2 (Debian…) on …
        parts.append(text if backend == "postgresql" else f"MySQL server {text}")
    return "Servers on loopback: " + ", ".join(parts) + "."


def table(headers: Sequence[str], rows: Sequence[Sequence[object]]) -> str:
    def cell(value: object) -> str:
        return f"{value:.3g}" if isinstance(value, float) else str(value)

    lines = ["| " + " | ".join(headers) + " |", "|" + "|".join("---" for _ in headers) + "|"]
    lines += ["| " + " | ".join(cell(v) for v in row) + " |" for row in rows]
    return "\n".join(lines)


def emit(text: str, out: Path | None) -> None:
    print(text, flush=True)
    if out is not None:
        out.parent.mkdir(parents=True, exist_ok=True)
        out.write_text(text + "\n")


def median(values: Sequence[float]) -> float:
    return statistics.median(values)


def status(message: str) -> None:
    print(message, file=sys.stderr, flush=True)


# -- scratch databases -------------------------------------------------------------------------
def server_url(backend: str) -> str:
    for var in SERVER_ENV[backend]:
        if os.environ.get(var):
            return os.environ[var]
    return LOOPBACK[backend]


@contextlib.contextmanager
def scratch_db(backend: str, *, migrate: bool = True) -> Iterator[str]:
    """The URL of a new, empty database (with mlirtuna's schema when `migrate`), dropped after."""
    if backend == "sqlite":
        with tempfile.TemporaryDirectory(prefix="mlirtuna-bench-") as tmp:
            url = f"sqlite:///{Path(tmp) / 'bench.db'}"
            if migrate:
                Database(url).dispose()  # a new SQLite file gets the schema on first use
            yield url
        return
    base = resolve_url(server_url(backend))
    name = f"bench_{os.getpid()}_{uuid.uuid4().hex[:8]}"
    admin = sa.create_engine(base, isolation_level="AUTOCOMMIT", poolclass=sa.NullPool)
    quote = '"' if backend == "postgresql" else "`"
    charset = "" if backend == "postgresql" else " CHARACTER SET utf8mb4"
    with admin.connect() as conn:
        conn.exec_driver_sql(f"CREATE DATABASE {quote}{name}{quote}{charset}")
    url = base.set(database=name)
    try:
        if migrate:
            db = Database(url, check_schema=False)
            db.upgrade()
            db.dispose()
        yield url.render_as_string(hide_password=False)
    finally:
        force = " WITH (FORCE)" if backend == "postgresql" else ""
        with admin.connect() as conn:
            conn.exec_driver_sql(f"DROP DATABASE IF EXISTS {quote}{name}{quote}{force}")
        admin.dispose()


def max_connections(url: str) -> int | None:
    """The server's connection limit (None for SQLite)."""
    if url.startswith("sqlite"):
        return None
    engine = sa.create_engine(resolve_url(url), poolclass=sa.NullPool)
    with engine.connect() as conn:
        query = "SELECT @@max_connections" if "mysql" in url else "SHOW max_connections"
        value = conn.exec_driver_sql(query).scalar()
    engine.dispose()
    return int(value)


# -- sessions and jobs -------------------------------------------------------------------------
def make_session(db: Database, n_jobs: int) -> int:
    """A sleep-tuner session with `n_jobs` new jobs, one per small gemm problem."""
    tag = f"bench-{uuid.uuid4().hex[:8]}"
    line = "-t f32 -out_datatype f32 -transA false -transB false -g 1 -m {} -n 8 -k 8"
    problems = [parse("gemm", line.format(i + 1)) for i in range(n_jobs)]
    with db.session(immediate=True) as s:
        ids, _ = catalog.ensure_problems(s, "gemm", problems)
        catalog.tag_problems(s, tag, dict.fromkeys(ids.values(), 0))
    sess = sessions.create(db, SessionSpec(tuner="sleep", reason="bench"))
    jobs.load(db, sess.id, tag=tag)
    return sess.id


@dataclass(frozen=True)
class Window:
    """A session's jobs as the database clock saw them: first claim to last completion."""

    completed: int
    seconds: float


def job_window(db: Database, session_id: int) -> Window:
    with db.session() as s:
        n, first, last = s.execute(
            sa.select(
                sa.func.count(), sa.func.min(Job.claimed_at), sa.func.max(Job.finished_at)
            ).where(Job.session_id == session_id, Job.state == COMPLETED)
        ).one()
    if not n:
        return Window(0, float("nan"))
    return Window(n, (_as_dt(last) - _as_dt(first)).total_seconds())


def _as_dt(value: dt.datetime | str) -> dt.datetime:
    # SQLite's strftime-written timestamps may come back as text in aggregates.
    return value if isinstance(value, dt.datetime) else dt.datetime.fromisoformat(value)


# -- worker processes behind a barrier ---------------------------------------------------------
ENV_WORKER = "MLIRTUNA_BENCH_WORKER"  # module:Class of a Worker subclass, to measure a patch


def worker_class() -> type:
    """The Worker class under test: mlirtuna's own, or a patched one named in the env."""
    spec = os.environ.get(ENV_WORKER, "mlirtuna.worker:Worker")
    module, _, name = spec.partition(":")
    return getattr(importlib.import_module(module), name)


@dataclass(frozen=True)
class WorkerRun:
    wall_s: float  # from the start signal until the last worker process exited
    window: Window  # first claim .. last completion, by the database clock
    completed: int  # as the workers counted it
    cpu_ms_per_job: float  # the worker processes' own CPU time (user + system) per job
    busy_pct: float  # the whole machine's CPU use during the run (every core = 100 %)


def run_workers(url: str, session_id: int, n: int, tuner: str, timeout_s: float = 600) -> WorkerRun:
    """`n` worker processes with `tuner`, started together once every one has connected."""
    argv = [sys.executable, str(Path(__file__).resolve()), "worker", url, str(session_id), tuner]
    env = dict(os.environ, PYTHONUNBUFFERED="1")
    procs = [
        subprocess.Popen(argv, stdin=subprocess.PIPE, stdout=subprocess.PIPE, text=True, env=env)
        for _ in range(n)
    ]
    try:
        for p in procs:
            line = p.stdout.readline() if p.stdout else ""
            if line.strip() != "ready":
                raise RuntimeError(f"bench worker did not start (said {line!r})")
        busy0, t0 = cpu_busy_s(), time.perf_counter()
        for p in procs:
            if p.stdin:
                p.stdin.write("go\n")
                p.stdin.flush()
        outs = [p.communicate(timeout=timeout_s)[0] for p in procs]
        wall, busy1 = time.perf_counter() - t0, cpu_busy_s()
    finally:
        for p in procs:
            if p.poll() is None:
                p.kill()
                p.wait()
    if any(p.returncode for p in procs):
        raise RuntimeError(f"bench workers failed: exit codes {[p.returncode for p in procs]}")
    reports = [json.loads(o.strip().splitlines()[-1]) for o in outs]
    done = sum(r["completed"] for r in reports)
    cpu = sum(r["cpu_s"] for r in reports)
    busy = 100 * (busy1 - busy0) / (wall * (os.cpu_count() or 1))
    db = Database(url)
    try:
        return WorkerRun(wall, job_window(db, session_id), done, 1e3 * cpu / max(done, 1), busy)
    finally:
        db.dispose()


def cpu_busy_s() -> float:
    """Seconds every CPU of the machine has spent busy since boot (/proc/stat; 0 elsewhere)."""
    try:
        fields = Path("/proc/stat").read_text().split("\n", 1)[0].split()[1:]
    except OSError:
        return 0.0
    ticks = [int(x) for x in fields]
    idle = ticks[3] + (ticks[4] if len(ticks) > 4 else 0)  # idle + iowait
    return (sum(ticks[:8]) - idle) / os.sysconf("SC_CLK_TCK")


def _worker_main(url: str, session_id: int, tuner: str) -> None:
    from mlirtuna.worker import WorkerSettings

    db = Database(url)
    settings = WorkerSettings(session_id=session_id, tuner=tuner, until_empty=True)
    worker = worker_class()(db, settings)
    jobs.is_drained(db, session_id)  # the pool now holds a live connection
    print("ready", flush=True)
    sys.stdin.readline()
    cpu0 = time.process_time()
    stats = worker.run()
    cpu = time.process_time() - cpu0
    db.dispose()
    print(json.dumps({"completed": stats.completed, "cpu_s": cpu}), flush=True)


if __name__ == "__main__" and sys.argv[1:2] == ["worker"]:
    _worker_main(sys.argv[2], int(sys.argv[3]), sys.argv[4])
