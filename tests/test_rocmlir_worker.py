"""The rocmlir tuner through a real worker, on every backend: what tuningRunner reports is what
gets recorded, and every fault ends as the right job state and message."""

from __future__ import annotations

import sys

import pytest
import sqlalchemy as sa
from support.clitools import run_cli
from support.rocmlir import (
    LINES,
    expected,
    pid_alive,
    rocmlir_session,
    work,
    worker_args,
)

from mlirtuna.db.models import Candidate, Job, Result
from mlirtuna.problems import parse
from mlirtuna.queue import jobs

# The backend changes nothing here (the queue, records and SQL of their own are tested on every
# backend in their own files): SQLite only, to keep the suite quick.
pytestmark = pytest.mark.backends("sqlite")


@pytest.mark.parametrize("era", ["E2", "E3"])
@pytest.mark.parametrize("op", ["gemm", "conv", "attention"])
def test_records_exactly_what_the_tool_reports(db, tmp_path, build, monkeypatch, era, op):
    monkeypatch.setenv("FAKE_TUNINGRUNNER_ERA", era)
    sid = rocmlir_session(db, tmp_path, op)
    assert work(db, sid, build).stats.completed == 1
    problem = parse(op, LINES[op])
    times = expected(op, problem.canonical(), "quick", era)
    best = max((pc for pc, ns in times.items() if ns is not None), key=lambda pc: -times[pc])
    with db.session() as s:
        job = s.scalars(sa.select(Job).where(Job.session_id == sid)).one()
        assert job.state == "completed" and job.gpu_id == 0 and job.compile_end
        result = s.scalars(sa.select(Result).where(Result.job_id == job.id)).one()
        assert result.perf_config == best
        assert result.kernel_time == pytest.approx(times[best], rel=1e-9)
        assert result.tflops == pytest.approx(problem.flops() / times[best] / 1e3, rel=1e-9)
        cands = {
            c.perf_config: c
            for c in s.scalars(sa.select(Candidate).where(Candidate.job_id == job.id))
        }
    assert set(cands) == set(times)
    for pc, ns in times.items():
        if ns is None:
            assert cands[pc].error and cands[pc].kernel_time is None
        else:
            assert cands[pc].kernel_time == pytest.approx(ns, rel=1e-9) and not cands[pc].error


@pytest.mark.parametrize(
    ("era", "fault", "message"),
    [
        ("E3", "fail", "tuningRunner exited with status 1"),
        ("E2", "none", "no valid perf config"),
        ("E3", "none", "no valid perf config"),
        ("E2", "garbage", "malformed result file"),
        ("E3", "wrong_arch", "refusing to record"),
        ("E2", "empty", "exited 0 but wrote no result"),
        ("E3", "crash_partial", "exited with status 139"),
    ],
)
def test_faults_end_in_error_with_the_reason(db, tmp_path, build, monkeypatch, era, fault, message):
    monkeypatch.setenv("FAKE_TUNINGRUNNER_ERA", era)
    monkeypatch.setenv("FAKE_TUNINGRUNNER_FAULT", fault)
    sid = rocmlir_session(db, tmp_path, "gemm")
    assert work(db, sid, build).stats.failed == 1
    with db.session() as s:
        job = s.scalars(sa.select(Job).where(Job.session_id == sid)).one()
        assert job.state == "error" and message.lower() in job.result.lower()
        assert s.scalar(sa.select(sa.func.count()).select_from(Result)) == 0
        assert s.scalar(sa.select(sa.func.count()).select_from(Candidate)) == 0
    if fault == "fail":
        assert "ERROR" in job.result  # the tail of the tool's stderr is kept


def test_hang_is_killed_at_the_job_timeout_and_retried(db, tmp_path, build, monkeypatch):
    monkeypatch.setenv("FAKE_TUNINGRUNNER_FAULT", "hang")
    pidfile = tmp_path / "child.pid"
    monkeypatch.setenv("FAKE_TUNINGRUNNER_CHILD_PIDFILE", str(pidfile))
    sid = rocmlir_session(db, tmp_path, "gemm")
    work(db, sid, build, job_timeout_s=2.0, max_retries=2)
    with db.session() as s:
        job = s.scalars(sa.select(Job).where(Job.session_id == sid)).one()
    assert (
        job.state == "error"
        and job.retries == 2
        and "ran past the job timeout of 2 s" in job.result
    )
    assert not pid_alive(int(pidfile.read_text()))  # the tool's child died with its group


def test_cli_worker_with_rocmlir_tuner(db, db_url, tmp_path, build):
    sid = rocmlir_session(db, tmp_path, "gemm")
    run = run_cli(
        db_url,
        *worker_args(sid, "--mlir-build-dir", str(build), "--until-empty"),
        MLIRTUNA_ROCMLIR_PYTHON=sys.executable,
    )
    assert run.code == 0, run.stderr
    assert jobs.counts(db, sid)[sid]["completed"] == 1


def test_cli_rocmlir_without_build_dir_names_flag_and_env(db, db_url, tmp_path, monkeypatch):
    monkeypatch.delenv("MLIRTUNA_ROCMLIR_BUILD", raising=False)
    sid = rocmlir_session(db, tmp_path, "gemm")
    run = run_cli(db_url, *worker_args(sid, "--until-empty"))
    assert run.code == 2
    line = run.stderr.strip()
    assert "--mlir-build-dir" in line and "MLIRTUNA_ROCMLIR_BUILD" in line and "\n" not in line
