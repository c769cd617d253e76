"""Bulk speed of the data paths: config import, import-tsv, export and compare of N results.

Run (from the repository root):

    .venv/bin/python bench/bench_bulk.py --size 100000 --backends sqlite,postgresql,mysql

Server backends take their URL from --postgres / --mysql or from MLIRTUNA_TEST_POSTGRES /
MLIRTUNA_TEST_MYSQL (the test suite's variables); each repeat creates a throwaway database there
and drops it afterwards. Prints a Markdown table of the median seconds over --repeat runs.

Each repeat, per backend, on fresh databases:
- import: `catalog.import_files` of an N-line gemm config list (synthetic, valid, distinct);
- import-tsv: `tsvimport.import_tsv` of an N-line v3 tuning DB of the same problems (creates the
  problems, one session, N results);
- export: `export.export` of that session to a v3 file;
- compare: `compare` of the session against the exported file, re-canonicalizing the file's
  test vectors with --op gemm (both sides N results);
- jobs load: `jobs.load` of the N imported problems into a new session (N jobs);
- jobs list: `mlirtuna jobs list`'s query, its default page of 50 (and the total) out of N jobs;
- jobs list --all: all N jobs, rendered as the plain table a pipe gets.
`--profile STEP` runs that step once under cProfile and prints the top functions instead.
"""

from __future__ import annotations

import argparse
import contextlib
import cProfile
import os
import pstats
import statistics
import sys
import tempfile
import time
import uuid
from collections.abc import Callable, Iterator
from pathlib import Path

import sqlalchemy as sa

from mlirtuna import catalog, sessions
from mlirtuna.cli import common, jobscmd
from mlirtuna.db import Database, resolve_url
from mlirtuna.history import compare, export, tsvimport
from mlirtuna.problems import ExpandOptions
from mlirtuna.queue import jobs
from mlirtuna.sessions import SessionSpec

STEPS = ("import", "import-tsv", "export", "compare", "jobs load", "jobs list", "jobs list --all")
ENV = {"postgresql": "MLIRTUNA_TEST_POSTGRES", "mysql": "MLIRTUNA_TEST_MYSQL"}
TYPES = ("f32", "f16", "bf16", "i8")
OUT_TYPE = {"i8": "i32"}
V3_HEADER = (
    "# arch\tnumCUs\tnumChiplets\ttestVector\tperfConfig\tTFlops\ttuningSpace\tcommitId"
    "\ttimestamp\tdurationSec\n"
)


def gemm_vector(i: int) -> str:
    """The i-th of N distinct canonical gemm test vectors (mixed radix over type, m, n, k)."""
    t = TYPES[i % 4]
    m, n, k = 16 * (i // 4 % 64 + 1), 32 * (i // 256 % 64 + 1), 64 * (i // 16384 + 1)
    trans_b = "true" if i % 3 == 0 else "false"
    return (
        f"-t {t} -out_datatype {OUT_TYPE.get(t, t)} -transA false -transB {trans_b} "
        f"-g 1 -m {m} -n {n} -k {k}"
    )


def write_inputs(folder: Path, size: int) -> tuple[str, str]:
    configs_path, tsv_path = folder / "gemm-configs", folder / "tuning.tsv"
    vectors = [gemm_vector(i) for i in range(size)]
    configs_path.write_text("".join(v + "\n" for v in vectors))
    rows = (
        f"gfx942:sramecc+:xnack-\t304\t8\t{v}\tv4:{i % 97},64,8,32,32,32,8,1,1,2,0,0,1,1\t"
        f"{1 + i % 50 / 10}\tfull\tabc123\t2025-01-01T00:00:00Z\t{i % 60}.0\n"
        for i, v in enumerate(vectors)
    )
    tsv_path.write_text(V3_HEADER + "".join(rows))
    return str(configs_path), str(tsv_path)


@contextlib.contextmanager
def fresh_db(backend: str, urls: dict[str, str], folder: Path) -> Iterator[Database]:
    """A new, migrated database; dropped afterwards on servers."""
    if backend == "sqlite":
        path = folder / f"{uuid.uuid4().hex}.db"
        db = Database(f"sqlite:///{path}")
        try:
            yield db
        finally:
            db.dispose()
        return
    base = resolve_url(urls[backend])
    admin = sa.create_engine(base, isolation_level="AUTOCOMMIT", poolclass=sa.NullPool)
    name = f"mlirtuna_bench_{uuid.uuid4().hex[:8]}"
    quote = '"' if backend == "postgresql" else "`"
    with admin.connect() as conn:
        conn.exec_driver_sql(f"CREATE DATABASE {quote}{name}{quote}")
    db = Database(base.set(database=name), check_schema=False)
    try:
        db.upgrade()
        yield db
    finally:
        db.dispose()
        with admin.connect() as conn:
            conn.exec_driver_sql(f"DROP DATABASE IF EXISTS {quote}{name}{quote}")
        admin.dispose()


def timed(fn: Callable[[], object]) -> float:
    t0 = time.perf_counter()
    fn()
    return time.perf_counter() - t0


def one_round(
    backend: str, urls: dict[str, str], folder: Path, inputs: tuple[str, str], profile: str | None
) -> dict[str, float]:
    configs_path, tsv_path = inputs
    out_path = str(folder / "export.tsv")
    steps: dict[str, Callable[[Database], object]] = {
        "import": lambda db: catalog.import_files(db, "gemm", [configs_path], ExpandOptions()),
        "import-tsv": lambda db: tsvimport.import_tsv(db, "gemm", [tsv_path]),
        "export": lambda db: export.export(db, export.ExportQuery(arch="gfx942"), "v3", out_path),
        "compare": lambda db: compare.compare(
            *compare.load_sides("1", out_path, "gemm", lambda: db)
        ),
    }
    seconds: dict[str, float] = {}
    with fresh_db(backend, urls, folder) as db:
        seconds["import"] = run_step("import", steps, db, profile)
        sid = sessions.create(db, SessionSpec(tuner="sleep")).id
        steps["jobs load"] = lambda db: jobs.load(db, sid, all_problems=True)
        steps["jobs list"] = lambda db: jobs.page(db, sid, None, jobscmd.DEFAULT_LIST_LIMIT)
        steps["jobs list --all"] = lambda db: list_all_jobs(db, sid)
        for step in ("jobs load", "jobs list", "jobs list --all"):
            seconds[step] = run_step(step, steps, db, profile)
    with fresh_db(backend, urls, folder) as db:
        for step in ("import-tsv", "export", "compare"):
            seconds[step] = run_step(step, steps, db, profile)
    return seconds


def list_all_jobs(db: Database, session_id: int) -> str:
    table = common.TextTable(*jobscmd.JOB_COLUMNS)
    for job in jobs.page(db, session_id).jobs:
        table.add_row(*jobscmd.job_row(job))
    return common.plain_table(table)


def run_step(
    step: str, steps: dict[str, Callable[[Database], object]], db: Database, profile: str | None
) -> float:
    if step != profile:
        return timed(lambda: steps[step](db))
    profiler = cProfile.Profile()
    took = timed(lambda: profiler.runcall(steps[step], db))
    pstats.Stats(profiler, stream=sys.stderr).sort_stats("cumulative").print_stats(25)
    return took


def table(size: int, results: dict[str, list[dict[str, float]]]) -> str:
    backends = list(results)
    lines = [
        f"| {size:,} rows, median s | " + " | ".join(backends) + " |",
        "|---|" + "---:|" * len(backends),
    ]
    for step in STEPS:
        cells = [f"{statistics.median(r[step] for r in results[b]):.2f}" for b in backends]
        lines.append(f"| {step} | " + " | ".join(cells) + " |")
    return "\n".join(lines)


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--size", type=int, default=100_000, help="rows per step [100000]")
    ap.add_argument("--backends", default="sqlite", help="comma list: sqlite,postgresql,mysql")
    ap.add_argument("--repeat", type=int, default=3, help="runs per backend; the median is shown")
    ap.add_argument("--postgres", default=os.environ.get(ENV["postgresql"]), help="server URL")
    ap.add_argument("--mysql", default=os.environ.get(ENV["mysql"]), help="server URL")
    ap.add_argument("--profile", choices=STEPS, help="cProfile one step (stderr)")
    args = ap.parse_args(argv)
    urls = {"postgresql": args.postgres, "mysql": args.mysql}
    backends = [b.strip() for b in args.backends.split(",") if b.strip()]
    for b in backends:
        if b != "sqlite" and not urls.get(b):
            ap.error(f"{b}: give --{'postgres' if b == 'postgresql' else b} or set {ENV[b]}")
    results: dict[str, list[dict[str, float]]] = {}
    with tempfile.TemporaryDirectory(prefix="mlirtuna-bench-") as tmp:
        folder = Path(tmp)
        inputs = write_inputs(folder, args.size)
        for backend in backends:
            results[backend] = []
            for i in range(args.repeat):
                took = one_round(backend, urls, folder, inputs, args.profile)
                results[backend].append(took)
                print(
                    f"{backend} run {i + 1}: "
                    + ", ".join(f"{k} {v:.2f}s" for k, v in took.items()),
                    file=sys.stderr,
                    flush=True,
                )
    print(table(args.size, results))
    return 0


if __name__ == "__main__":
    sys.exit(main())
