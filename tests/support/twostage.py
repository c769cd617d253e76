"""Two-stage sessions for tests: an E4 stand-in session split in compile and benchmark."""

from __future__ import annotations

import collections

import sqlalchemy as sa

from mlirtuna import catalog, sessions
from mlirtuna.db.models import Candidate, Job, Result
from mlirtuna.problems import ExpandOptions
from mlirtuna.queue import jobs
from mlirtuna.sessions import SessionSpec
from support.rocmlir import ARCH_FULL

COMMIT = "0123456789abcdef0123456789abcdef01234567"  # the stand-in's default commitId
SPLIT = "compile,benchmark"


def gemm(m: int) -> str:
    return f"-t f32 -out_datatype f32 -transA false -transB false -g 1 -m {m} -n 64 -k 128"


def problems(db, tmp_path, n: int) -> None:
    path = tmp_path / "gemm-configs"
    path.write_text("".join(gemm(64 * (i + 1)) + "\n" for i in range(n)))
    catalog.import_files(db, "gemm", [str(path)], ExpandOptions(expand=False), tag="g")


def session(db, build, split: str | None = SPLIT, **spec) -> int:
    sess = sessions.create(
        db,
        SessionSpec(
            tuner="rocmlir",
            arch_full=ARCH_FULL,
            num_cu=304,
            num_chiplets=8,
            tuning_space="quick",
            rocm_v="6.4",
            mlir_v=COMMIT,
            mlir_build_dir=str(build),
            split=split,
            **spec,
        ),
    )
    jobs.load(db, sess.id, tag="g")
    return sess.id


def states(db, sid) -> dict[tuple[str, str], int]:
    with db.session() as s:
        rows = s.execute(sa.select(Job.stage, Job.state).where(Job.session_id == sid)).all()
    return dict(collections.Counter((r.stage, r.state) for r in rows))


def count(db, model, *where) -> int:
    with db.session() as s:
        return s.scalar(sa.select(sa.func.count()).select_from(model).where(*where)) or 0


def recorded(db, sid) -> dict[int, tuple]:
    """{problem: (winner, tflops, sorted candidates)}: what a session recorded, comparable
    between sessions."""
    with db.session() as s:
        winners = {
            r.problem_id: (r.perf_config, round(r.tflops, 9))
            for r in s.execute(sa.select(Result).where(Result.session_id == sid)).scalars()
        }
        cands = collections.defaultdict(list)
        for c in s.execute(sa.select(Candidate).where(Candidate.session_id == sid)).scalars():
            cands[c.problem_id].append((c.perf_config, c.tflops and round(c.tflops, 9), c.error))
    return {pid: (*w, sorted(cands[pid], key=str)) for pid, w in winners.items()}
