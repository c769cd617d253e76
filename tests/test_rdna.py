"""The GPU as rocMLIR's tools see it (issue 22): on a WGP-mode chip (RDNA, wave32) HIP, and so
tuningRunner and perfRunner, count half the CUs rocminfo prints (gfx1100: 48, rocminfo 96).
Sessions detect the tool's count; the record check also accepts the doubled (legacy) count,
as the tool's own matches_current_num_cu does. On every backend, against the stand-in."""

from __future__ import annotations

import os
import stat

import pytest
import sqlalchemy as sa
from conftest import DATA
from support.rocmlir import GEMM, mark_standin
from support.standin import standin_build

from mlirtuna import catalog, machine, sessions
from mlirtuna.db.models import Job, Result
from mlirtuna.problems import ExpandOptions
from mlirtuna.queue import jobs
from mlirtuna.sessions import SessionSpec
from mlirtuna.worker import Worker, WorkerSettings


@pytest.fixture
def rdna_rocm(tmp_path, monkeypatch):
    """A ROCm install with one gfx1100 (rocminfo prints 96 CUs)."""
    root = tmp_path / "rocm"
    (root / "bin").mkdir(parents=True)
    tool = root / "bin" / "rocminfo"
    tool.write_text(f"#!/bin/sh\ncat {DATA / 'rocm' / 'rocminfo-gfx1100.txt'}\n")
    tool.chmod(tool.stat().st_mode | stat.S_IEXEC)
    monkeypatch.setattr(machine, "ROCM_PATH", root)
    monkeypatch.setattr(machine, "num_chiplets", lambda arch: 1)
    monkeypatch.setenv("PATH", f"{root / 'bin'}{os.pathsep}{os.environ['PATH']}")
    return root


def test_rocminfo_on_rdna_gives_hips_count():
    (gpu,) = machine.parse_rocminfo((DATA / "rocm" / "rocminfo-gfx1100.txt").read_text())
    assert (gpu.arch, gpu.num_cu, gpu.rocminfo_cu) == ("gfx1100", 48, 96)
    (mi300x, _) = machine.parse_rocminfo((DATA / "rocm" / "rocminfo.txt").read_text())
    assert (mi300x.num_cu, mi300x.rocminfo_cu) == (304, 304)  # CDNA: no WGPs


@pytest.mark.parametrize(
    ("arch", "recorded", "current", "same"),
    [
        ("gfx1100", 48, 48, True),
        ("gfx1100", 96, 48, True),  # the tool's legacy count
        ("gfx1201", 32, 64, True),  # a session that stored rocminfo's count
        ("gfx1030", 40, 48, False),
        ("gfx942", 304, 152, False),  # no WGP mode: 2x is another GPU
        ("gfx942", 304, 304, True),
    ],
)
def test_same_num_cu(arch, recorded, current, same):
    assert machine.same_num_cu(arch, recorded, current) is same


def test_session_new_on_rdna_needs_no_num_cu(db, rdna_rocm):
    s = sessions.create(db, SessionSpec(tuner="rocmlir"))
    assert (s.arch, s.arch_full, s.num_cu, s.num_chiplets) == ("gfx1100", "gfx1100", 48, 1)


def rdna_session(db, tmp_path, num_cu: int | None, tag: str) -> int:
    path = tmp_path / f"{tag}-configs"
    path.write_text(GEMM + "\n")
    catalog.import_files(db, "gemm", [str(path)], ExpandOptions(expand=False), tag=tag)
    spec = SessionSpec(tuner="rocmlir", num_cu=num_cu, tuning_space="quick", mlir_v="abc")
    sess = sessions.create(db, spec)
    jobs.load(db, sess.id, tag=tag)
    return mark_standin(db, sess.id)


def run_worker(db, sid, build) -> None:
    settings = WorkerSettings(
        session_id=sid, tuner="rocmlir", gpu_id=0, until_empty=True, mlir_build_dir=str(build),
        max_retries=1, backoff_s=0, job_timeout_s=60,
    )  # fmt: skip
    Worker(db, settings).run()


def job_of(db, sid) -> tuple[str, str | None, int]:
    with db.session() as s:
        job = s.scalars(sa.select(Job).where(Job.session_id == sid)).one()
        results = s.scalar(sa.select(sa.func.count()).select_from(Result).where(
            Result.session_id == sid))  # fmt: skip
        return job.state, job.result, results


def test_rdna_jobs_are_recorded(db, tmp_path, monkeypatch, rdna_rocm):
    build = standin_build(tmp_path, monkeypatch)
    monkeypatch.setattr(machine, "ROCM_PATH", rdna_rocm)  # standin_build leaves it; be explicit
    monkeypatch.setenv("FAKE_GPU_ARCH", "gfx1100")  # the tool: HIP's 48 CUs, 1 chiplet
    monkeypatch.setenv("FAKE_GPU_NUM_CU", "48")
    monkeypatch.setenv("FAKE_GPU_NUM_CHIPLETS", "1")
    detected = rdna_session(db, tmp_path, None, "detected")
    run_worker(db, detected, build)
    assert job_of(db, detected)[::2] == ("completed", 1)
    # A session opened with rocminfo's count (before this change, or by --num-cu 96).
    legacy = rdna_session(db, tmp_path, 96, "legacy")
    run_worker(db, legacy, build)
    assert job_of(db, legacy)[::2] == ("completed", 1)
    # Another count is another GPU: refused as before.
    other = rdna_session(db, tmp_path, 60, "other")
    run_worker(db, other, build)
    state, text, results = job_of(db, other)
    assert state == "error" and results == 0
    assert "tool reports gfx1100/48 CUs/1 chiplets, session is gfx1100/60 CUs" in text
