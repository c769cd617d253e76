"""A big farm for the dashboard's speed goal: problems, sessions, jobs, winners and candidates.

Run (from the repository root):

    python bench/gen_dashboard_data.py --db sqlite:///big.db
    python bench/gen_dashboard_data.py --db postgresql://postgres@127.0.0.1:5432/big

Defaults: 100,000 gemm problems (with their gemm_config rows and tags), 1,000 sessions over four
GPU contexts and a year of rocMLIR commits, one job per (session, problem) tuned, a winner per
completed job and 5,000,000 candidate rows in all (about one in ten invalid, with a reason; v4
perf configs, the fields the candidate table, parallel coordinates and importance view read; the
first three of each tuning re-measured; median, min, IQR and sample count on the valid ones).
Session i tunes a window of --per-session problems starting at (i - 1) * problems /
sessions (mod problems), so each problem is tuned in about ten sessions (its trend) and neighbouring
sessions share most problems (compare). 1 % of jobs end in error (five distinct first lines);
the newest two sessions are still running: some jobs new, a few running with fresh or stale
heartbeats. The database must be empty or freshly migrated; rows go in with the driver's bulk
path (PostgreSQL COPY, SQLite/MariaDB executemany), not through the ORM.
"""

from __future__ import annotations

import argparse
import datetime as dt
import random
import sys
import time
from collections.abc import Iterable, Iterator, Sequence
from dataclasses import dataclass
from pathlib import Path

sys.path.insert(0, str(Path(__file__).parent))

from bench_bulk import gemm_vector

from mlirtuna.db import Database

ARCHS = (
    ("gfx942", "gfx942:sramecc+:xnack-", 304, 8),
    ("gfx942", "gfx942:sramecc+:xnack-", 80, 2),
    ("gfx90a", "gfx90a:sramecc+:xnack-", 104, 1),
    ("gfx950", "gfx950:sramecc+:xnack-", 256, 8),
)
ERRORS = (
    "tuningRunner exited with status 1: ERROR: rocmlir-tuning-driver failed",
    "job timed out after 1800 s",
    "tuningRunner output has no result line for this config",
    "lease expired 3 times (worker lost)",
    "ERROR: MLIR pass pipeline failed: rock-gridwise-gemm-to-blockwise",
)
INVALID = ("N/A: does not fit in LDS", "N/A: verification failed", "N/A: compile error")
T0 = dt.datetime(2026, 1, 5, 8, 0, 0)
CHUNK = 50_000


@dataclass(frozen=True)
class Size:
    problems: int = 100_000
    sessions: int = 1_000
    per_session: int = 1_000
    candidates: int = 5_000_000


SMOKE = Size(problems=400, sessions=12, per_session=50, candidates=3_000)


class Loader:
    """Bulk rows into one table through the raw driver connection, in chunks."""

    def __init__(self, db: Database) -> None:
        self.db = db
        self.raw = db.engine.raw_connection()
        self.conn = self.raw.driver_connection
        if db.is_sqlite:
            self.conn.execute("PRAGMA synchronous=OFF")

    def load(self, table: str, columns: Sequence[str], rows: Iterable[tuple]) -> int:
        n = 0
        for chunk in _chunks(rows, CHUNK):
            n += len(chunk)
            if self.db.backend == "postgresql":
                cur = self.conn.cursor()
                with cur.copy(f"COPY {table} ({', '.join(columns)}) FROM STDIN") as copy:
                    for row in chunk:
                        copy.write_row(row)
                cur.close()
            else:
                mark = "?" if self.db.is_sqlite else "%s"
                sql = (
                    f"INSERT INTO {table} ({', '.join(columns)}) "
                    f"VALUES ({', '.join(mark for _ in columns)})"
                )
                if self.db.is_sqlite:
                    self.conn.execute("BEGIN")
                    self.conn.executemany(sql, [_sqlite_row(r) for r in chunk])
                else:
                    cur = self.conn.cursor()
                    cur.executemany(sql, chunk)
                    cur.close()
            self.conn.commit()
        return n

    def close(self) -> None:
        self.raw.close()


def _sqlite_row(row: tuple) -> tuple:
    # The text SQLAlchemy itself writes for a DateTime on SQLite, so queries compare alike.
    return tuple(
        v.strftime("%Y-%m-%d %H:%M:%S.%f") if isinstance(v, dt.datetime) else v for v in row
    )


def _chunks(rows: Iterable[tuple], n: int) -> Iterator[list[tuple]]:
    chunk: list[tuple] = []
    for row in rows:
        chunk.append(row)
        if len(chunk) == n:
            yield chunk
            chunk = []
    if chunk:
        yield chunk


def _problems(size: Size) -> Iterator[tuple]:
    for i in range(size.problems):
        yield (i + 1, "gemm", gemm_vector(i), T0)


def _gemm_configs(size: Size) -> Iterator[tuple]:
    for i in range(size.problems):
        f = gemm_vector(i).split()
        v = dict(zip(f[0::2], f[1::2], strict=True))
        yield (
            i + 1, v["-t"], v["-out_datatype"], False, v["-transB"] == "true", False,
            1, int(v["-m"]), int(v["-n"]), int(v["-k"]), 0,
        )  # fmt: skip


def _tags(size: Size) -> Iterator[tuple]:
    for i in range(size.problems):
        yield (i + 1, "tier1" if i % 5 else "tier1-quick", 0)
        if i % 7 == 0:
            yield (i + 1, "bert", 0)


def _sessions(size: Size) -> Iterator[tuple]:
    for s in range(1, size.sessions + 1):
        arch, full, cu, chiplets = ARCHS[s % len(ARCHS)]
        week = s * 52 // max(size.sessions, 1)
        yield (
            s, arch, full, cu, chiplets, f"6.{week // 13}", f"{week * 7919 % 16**7:07x}",
            "nightly" if s % 10 else "release check", f"TKT-{s % 37}", "", "full", "rocmlir",
            f"node{s % 16}", T0 + dt.timedelta(hours=8 * s),
        )  # fmt: skip


def _window(size: Size, s: int) -> range:
    stride = max(size.problems // max(size.sessions, 1), 1)
    start = (s - 1) * stride % size.problems
    return range(start, start + min(size.per_session, size.problems))


@dataclass
class Fill:
    jobs: int = 0
    results: int = 0
    candidates: int = 0
    errors: int = 0


def generate(url: str, size: Size, seed: int = 7, log=print) -> Fill:
    db = Database(url, check_schema=False)
    db.upgrade()
    rng = random.Random(seed)
    loader = Loader(db)
    fill = Fill()
    try:
        t = time.perf_counter()
        loader.load("problem", ("id", "op", "test_vector", "created_at"), _problems(size))
        loader.load(
            "gemm_config",
            ("id", "data_type", "out_data_type", "trans_a", "trans_b", "trans_o", "group_size",
             "m", "n", "k", "kernel_repeats"),
            _gemm_configs(size),
        )  # fmt: skip
        loader.load("problem_tag", ("problem_id", "tag", "priority"), _tags(size))
        loader.load(
            "session",
            ("id", "arch", "arch_full", "num_cu", "num_chiplets", "rocm_v", "mlir_v", "reason",
             "ticket", "docker", "tuning_space", "tuner", "host", "created_at"),
            _sessions(size),
        )  # fmt: skip
        log(f"problems, configs, tags, sessions: {time.perf_counter() - t:.1f} s")
        t = time.perf_counter()
        jobs, results, cands, attempts = _tuning(size, rng, fill)
        loader.load("job", JOB_COLUMNS, jobs)
        loader.load("attempt", ATTEMPT_COLUMNS, attempts)
        loader.load("result", RESULT_COLUMNS, results)
        log(f"{fill.jobs} jobs, {fill.results} results: {time.perf_counter() - t:.1f} s")
        t = time.perf_counter()
        loader.load("candidate", CANDIDATE_COLUMNS, _candidates(size, cands, rng, fill))
        log(f"{fill.candidates} candidates: {time.perf_counter() - t:.1f} s")
        t = time.perf_counter()
        _analyze(db)
        log(f"analyze: {time.perf_counter() - t:.1f} s")
    finally:
        loader.close()
        db.dispose()
    return fill


JOB_COLUMNS = (
    "id", "session_id", "problem_id", "reason", "state", "priority", "retries", "result",
    "compile_start", "compile_end", "gpu_id", "machine_name", "lease_token", "lease_expires_at",
    "heartbeat_at", "claimed_at", "finished_at",
)  # fmt: skip
ATTEMPT_COLUMNS = (
    "id", "job_id", "lease_token", "machine_name", "gpu_id", "pid", "claimed_at", "ended_at",
    "outcome", "message",
)  # fmt: skip
RESULT_COLUMNS = (
    "id",
    "session_id",
    "problem_id",
    "job_id",
    "perf_config",
    "kernel_time",
    "tflops",
)
CANDIDATE_COLUMNS = (
    "id", "session_id", "problem_id", "job_id", "perf_config", "kernel_time", "tflops", "error",
    "perf_family", "time_min", "time_iqr", "samples", "remeasured",
)  # fmt: skip
TOPK = 3  # the first candidates of each tuning are its re-measured top k (the winner first)


def _tuning(size: Size, rng: random.Random, fill: Fill):
    """Jobs (and attempts) as lists, winners as a list; candidate seeds for the generator."""
    jobs: list[tuple] = []
    attempts: list[tuple] = []
    results: list[tuple] = []
    cands: list[tuple[int, int, int, float]] = []  # session, problem, job, winner TFlops
    now = dt.datetime.now(dt.UTC).replace(tzinfo=None)
    live = {size.sessions, size.sessions - 1}  # still running
    for s in range(1, size.sessions + 1):
        started = T0 + dt.timedelta(hours=8 * s)
        for n, p in enumerate(_window(size, s)):
            pid = p % size.problems + 1
            fill.jobs += 1
            jid = fill.jobs
            claimed = started + dt.timedelta(seconds=20 * n)
            ended = claimed + dt.timedelta(seconds=rng.uniform(5, 60))
            machine, gpu = f"node{jid % 16}", jid % 8
            if s in live and n >= size.per_session // 2:
                if n < size.per_session // 2 + 4:  # held now: two fresh, two gone quiet
                    beat = now - dt.timedelta(seconds=5 if n % 2 else 90)
                    token = f"live{jid:028d}"
                    jobs.append((jid, s, pid, "", "running", 0, 0, None, now, None, gpu, machine,
                                 token, beat + dt.timedelta(seconds=120), beat,
                                 now - dt.timedelta(seconds=100), None))  # fmt: skip
                    attempts.append(
                        (jid, jid, token, machine, gpu, 1000 + n, now, None, None, None)
                    )
                else:
                    jobs.append(
                        (jid, s, pid, "", "new", 0, 0) + (None,) * 3 + (-1, "") + (None,) * 5
                    )
                continue
            if s in live:  # finished in the last minutes: a rate and an ETA
                ended = now - dt.timedelta(seconds=(size.per_session // 2 - n) * 2)
                claimed = ended - dt.timedelta(seconds=30)
            if rng.random() < 0.01:
                fill.errors += 1
                error = f"{rng.choice(ERRORS)}\n(stderr tail)\nline 2 of the tool's output"
                jobs.append((jid, s, pid, "", "error", 0, 3, error, claimed, ended, gpu, machine,
                             None, None, ended, claimed, ended))  # fmt: skip
                attempts.append((jid, jid, f"err{jid:029d}", machine, gpu, 1000, claimed, ended,
                                 "failed", error.splitlines()[0]))  # fmt: skip
                continue
            best = rng.lognormvariate(3, 1)
            jobs.append((jid, s, pid, "", "completed", 0, 0, "ok", claimed, ended, gpu, machine,
                         None, None, ended, claimed, ended))  # fmt: skip
            fill.results += 1
            results.append((fill.results, s, pid, jid, _perf(pid, 0), 1e6 / best, best))
            cands.append((s, pid, jid, best))
    return jobs, results, cands, attempts


def _perf(pid: int, k: int) -> str:
    """A v4 perf config (14 fields: the candidate table's columns, the parallel coordinates'
    and the importance view's axes); k makes each candidate of a problem its own."""
    return (
        f"v4:{32 << (pid + k) % 3},{64 << k % 3},{4 << (pid * k) % 3},{16 << k % 2},"
        f"{16 << (pid + k) % 2},{16 << k % 2},{4 << (k // 3) % 3},1,{1 + k % 2},{k % 2},"
        f"{1 + (k // 2) % 2},{k},1,1"
    )


def _candidates(
    size: Size, winners: list[tuple], rng: random.Random, fill: Fill
) -> Iterator[tuple]:
    per = size.candidates / max(len(winners), 1)  # the total comes out exactly
    for i, (s, pid, jid, best) in enumerate(winners):
        n = int(per * (i + 1)) - int(per * i)  # spreads the total exactly
        for k in range(n):
            fill.candidates += 1
            perf = _perf(pid, k)
            if k and rng.random() < 0.1:
                yield (fill.candidates, s, pid, jid, perf, None, None, rng.choice(INVALID), "v4",
                       None, None, None, False)  # fmt: skip
                continue
            tflops = best if k == 0 else best * rng.uniform(0.05, 0.99)
            ns = 1e6 / tflops
            spread = ns * rng.uniform(0.005, 0.05)
            yield (fill.candidates, s, pid, jid, perf, ns, tflops, None, "v4", ns - spread,
                   spread, rng.randint(20, 100), k < TOPK)  # fmt: skip


def _analyze(db: Database) -> None:
    """Fresh planner statistics, as a database that grew over months would have."""
    with db.engine.connect() as conn:
        if db.backend == "postgresql":
            for table in ("problem", "session", "job", "attempt", "result", "candidate"):
                # Rows came with their ids: move the sequences past them.
                conn.exec_driver_sql(
                    f"SELECT setval(pg_get_serial_sequence('{table}', 'id'), "
                    f"(SELECT max(id) FROM {table}))"
                )
            conn.commit()
            conn.execution_options(isolation_level="AUTOCOMMIT").exec_driver_sql("ANALYZE")
        elif db.is_sqlite:
            conn.exec_driver_sql("ANALYZE")
        else:
            for table in ("problem", "job", "result", "candidate", "session", "problem_tag"):
                conn.exec_driver_sql(f"ANALYZE TABLE {table}")
        conn.commit()


def main() -> None:
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("--db", required=True, help="an empty (or freshly migrated) database URL")
    p.add_argument("--problems", type=int, default=Size.problems)
    p.add_argument("--sessions", type=int, default=Size.sessions)
    p.add_argument("--per-session", type=int, default=Size.per_session)
    p.add_argument("--candidates", type=int, default=Size.candidates)
    p.add_argument("--smoke", action="store_true", help="tiny sizes")
    args = p.parse_args()
    size = (
        SMOKE
        if args.smoke
        else Size(args.problems, args.sessions, args.per_session, args.candidates)
    )
    t = time.perf_counter()
    fill = generate(args.db, size, log=lambda m: print(m, file=sys.stderr, flush=True))
    print(
        f"{size.problems} problems, {size.sessions} sessions, {fill.jobs} jobs "
        f"({fill.errors} in error), {fill.results} winners, {fill.candidates} candidates "
        f"in {time.perf_counter() - t:.0f} s"
    )


if __name__ == "__main__":
    main()
