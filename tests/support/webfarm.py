"""A small farm for the dashboard tests, made by real tuning: the CPU tuner twice over three
GEMMs, the fake tuningRunner (invalid candidates, another context), and a failing tuningRunner
(jobs in error). Every number the tests expect is read back from the database, never typed in.

Tuned for real once per test run and backend; every later farm of that backend, in any of the
run's processes, is the same rows copied into the test's empty database (ids, times and all): the
tuning took 5-8 s a test.
"""

from __future__ import annotations

import fcntl
import os
import pickle
from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path

import pytest
import sqlalchemy as sa

from mlirtuna import catalog, sessions, standin
from mlirtuna.db import Database
from mlirtuna.db.models import Base, Candidate, Job
from mlirtuna.problems import ExpandOptions
from mlirtuna.queue import jobs
from mlirtuna.sessions import SessionSpec
from mlirtuna.worker import Worker, WorkerSettings
from support import tiers
from support.results import mark_standin
from support.standin import standin_build

# The GPU sessions' commit: the stand-in build's, abbreviated (a worker refuses a build of
# another commit than its session's).
GPU_COMMIT = standin.COMMIT[:7]
GEMMS = (
    "-t f32 -out_datatype f32 -transA false -transB false -g 1 -m 32 -n 64 -k 32\n"
    "-t f16 -out_datatype f16 -transA false -transB true -g 1 -m 64 -n 32 -k 32\n"
    "-t f32 -out_datatype f32 -transA false -transB false -g 2 -m 16 -n 32 -k 64\n"
)
TAG = "web"


@dataclass(frozen=True)
class Farm:
    cpu_a: int  # CPU tuner
    cpu_b: int  # CPU tuner again: compare a with b
    gpu: int  # fake tuningRunner: invalid candidates, another context
    failed: int  # failing tuningRunner: every job in error
    problems: list[int]


Rows = list[tuple[str, list[dict]]]  # (table name, its rows), parents first
_MADE: dict[str, tuple[Farm, Rows]] = {}  # backend -> its farm and rows, in this process


def make(db: Database, tmp_path: Path, shared: Path) -> Farm:
    """The farm in `db`. Into an empty database: the rows of this backend's first farm of the
    run (`shared`, run_folder); otherwise tuned for real."""
    if not _empty(db):
        return _tuned(db, tmp_path)
    return _copied(db, shared, lambda: _tuned(db, tmp_path))


def _copied(db: Database, shared: Path, tune: Callable[[], Farm]) -> Farm:
    """Into the empty `db`: the backend's first farm of the run. `tune` runs in the first
    process that asks; the others wait for its rows on a lock in `shared` and copy them in."""
    if db.backend in _MADE:
        farm, rows = _MADE[db.backend]
        _insert(db, rows)
        return farm
    path = shared / f"webfarm-{db.backend}.pickle"
    with open(path.with_suffix(".lock"), "w") as lock:
        fcntl.flock(lock, fcntl.LOCK_EX)  # one process tunes; the others wait here for its rows
        if path.exists():
            farm, rows = pickle.loads(path.read_bytes())
            _insert(db, rows)
        else:
            with tiers.shared_setup():  # for every later test of the run too: no test's own
                farm = tune()
            rows = _rows(db)
            part = path.with_suffix(".part")  # a process that dies writing leaves no half file
            part.write_bytes(pickle.dumps((farm, rows)))
            part.replace(path)
    _MADE[db.backend] = (farm, rows)
    return farm


def run_folder(tmp_path_factory: pytest.TempPathFactory) -> Path:
    """A folder every process of this test run shares: pytest's base temp, which pytest-xdist's
    workers each have a subfolder of (and pytest removes with old runs)."""
    base = tmp_path_factory.getbasetemp()
    return base.parent if os.environ.get("PYTEST_XDIST_WORKER") else base


def _empty(db: Database) -> bool:
    with db.engine.connect() as conn:
        return not any(
            conn.execute(sa.select(sa.literal(1)).select_from(t).limit(1)).first()
            for t in Base.metadata.sorted_tables
        )


def _rows(db: Database) -> Rows:
    with db.engine.connect() as conn:
        return [
            (t.name, [dict(r._mapping) for r in conn.execute(sa.select(t))])
            for t in Base.metadata.sorted_tables
        ]


def _insert(db: Database, rows: Rows) -> None:
    tables = Base.metadata.tables
    with db.engine.begin() as conn:
        for name, some in rows:
            if some:
                conn.execute(tables[name].insert(), some)
        if db.backend == "postgresql":  # explicit ids do not move a sequence: move it past them
            for name, some in rows:
                if some and "id" in tables[name].c:
                    conn.exec_driver_sql(
                        f"SELECT setval(pg_get_serial_sequence('\"{name}\"', 'id'), "
                        f"{max(r['id'] for r in some)})"
                    )


def _tuned(db: Database, tmp_path: Path) -> Farm:
    path = tmp_path / "gemm-configs"
    path.write_text(GEMMS)
    catalog.import_files(db, "gemm", [str(path)], ExpandOptions(expand=False), tag=TAG)
    cpu_a, cpu_b = (_tune(db, SessionSpec(tuner="cpu", tuning_space="quick")) for _ in "ab")
    gpu_spec = SessionSpec(
        tuner="rocmlir",
        tuning_space="quick",
        arch_full="gfx942:sramecc+:xnack-",
        num_cu=304,
        num_chiplets=8,
        rocm_v="6.4",
        mlir_v=GPU_COMMIT,
        reason="nightly",
        ticket="TKT-1",
    )
    with pytest.MonkeyPatch.context() as env:
        build = standin_build(tmp_path, env)
        gpu = _tune(db, gpu_spec, build)
        env.setenv("FAKE_TUNINGRUNNER_FAULT", "fail")
        failed = _tune(db, gpu_spec, build)
    problems = sorted(w.problem_id for w in jobs.list_jobs(db, cpu_a))
    return Farm(cpu_a, cpu_b, gpu, failed, problems)


def _tune(db: Database, spec: SessionSpec, build: Path | None = None) -> int:
    sid = sessions.create(db, spec).id
    if build is not None:  # the stand-in's GPU session
        mark_standin(db, sid)
    jobs.load(db, sid, tag=TAG)
    settings = WorkerSettings(
        session_id=sid,
        tuner=spec.tuner,
        gpu_id=0 if build else -1,
        until_empty=True,
        mlir_build_dir=str(build) if build else None,
        max_retries=1,
        backoff_s=0,
        job_timeout_s=120,
    )
    Worker(db, settings).run()
    return sid


def add_candidates(db: Database, sid: int, pid: int, n: int) -> None:
    """`n` more candidates of one tuning: every third failed, the others rising and falling."""
    with db.transaction() as s:
        job = s.scalar(sa.select(Job.id).where(Job.session_id == sid, Job.problem_id == pid))
        rows = [
            {"session_id": sid, "problem_id": pid, "job_id": job,
             "perf_config": f"cpu:v1:{i},{i % 7},8", "perf_family": "cpu",
             "kernel_time": None if i % 3 == 0 else 1000.0 + i % 97,
             "tflops": None if i % 3 == 0 else 1.0 + (i % 89) / 10 + i / n,
             "error": "did not compile\nat line 3" if i % 3 == 0 else None,
             "remeasured": False}
            for i in range(n)
        ]  # fmt: skip
        for i in range(0, n, 1000):
            s.execute(sa.insert(Candidate), rows[i : i + 1000])
