"""Queue fixtures the tests share: a claimant, sleep sessions of small gemm jobs, an outcome to
record."""

from __future__ import annotations

import pytest

from mlirtuna import catalog, sessions
from mlirtuna.queue import Claimant, jobs
from mlirtuna.sessions import SessionSpec
from mlirtuna.tuners.base import Candidate as Cand
from mlirtuna.tuners.base import TuneOutcome

ME = Claimant("test-host", 0, 1)


def gemm_file(tmp_path, n: int, name: str = "gemm") -> str:
    path = tmp_path / name
    path.write_text(
        "".join(
            f"-t f32 -out_datatype f32 -transA false -transB false -g 1 "
            f"-m {16 * (i + 1)} -n 16 -k 16\n"
            for i in range(n)
        )
    )
    return str(path)


@pytest.fixture(name="session_with_jobs")
def fixture_session_with_jobs(db, tmp_path):
    """A sleep session with 5 gemm jobs loaded from a tag."""
    catalog.import_files(db, "gemm", [gemm_file(tmp_path, 5)], tag="small")
    sess = sessions.create(db, SessionSpec(tuner="sleep"))
    jobs.load(db, sess.id, tag="small")
    return sess.id


def outcome(n: int = 3) -> TuneOutcome:
    cands = [Cand(f"pc{i}", 1000.0 * (i + 1), 10.0 / (i + 1)) for i in range(n)]
    cands.append(Cand("bad", error="wrong result"))
    return TuneOutcome(candidates=cands, winner=cands[0], output="tool output")


def two_job_session(db, tmp_path) -> int:
    """A sleep session with two new gemm jobs."""
    path = tmp_path / "g"
    path.write_text(
        "-t f32 -out_datatype f32 -transA false -transB false -g 1 -m 8 -n 8 -k 8\n"
        "-t f32 -out_datatype f32 -transA false -transB false -g 1 -m 9 -n 8 -k 8\n"
    )
    catalog.import_files(db, "gemm", [str(path)], tag="x")
    sid = sessions.create(db, SessionSpec(tuner="sleep")).id
    jobs.load(db, sid, tag="x")
    return sid
