"""A worker that learns it lost a job's lease stops that job's tool (issue 23 item 16): paused
(SIGSTOP) past its lease, the job taken over, then resumed (SIGCONT), it kills the tool's
process group and its setsid child at its next heartbeat instead of running it to the end."""

from __future__ import annotations

import signal
import subprocess
import sys
import time

import pytest
import sqlalchemy as sa
from support.clitools import mlirtuna_argv, subprocess_env
from support.rocmlir import (
    pid_alive,
    rocmlir_session,
)
from support.workers import running_job, wait_for, wait_past_lease

from mlirtuna import queue
from mlirtuna.db.models import Attempt, Job
from mlirtuna.queue import Claimant

# The backend changes nothing here (the queue, records and SQL of their own are tested on every
# backend in their own files): SQLite only, to keep the suite quick.
pytestmark = pytest.mark.backends("sqlite")


def gone(*pids: int, within: float = 10.0) -> bool:
    deadline = time.monotonic() + within
    while any(pid_alive(p) for p in pids) and time.monotonic() < deadline:
        time.sleep(0.05)
    return not any(pid_alive(p) for p in pids)


def test_a_worker_that_lost_its_lease_stops_the_tool(db, db_url, tmp_path, build):
    pids = tmp_path / "tool.pid", tmp_path / "child.pid"
    sid = rocmlir_session(db, tmp_path, "gemm")
    env = subprocess_env(
        db_url, MLIRTUNA_ROCMLIR_PYTHON=sys.executable, FAKE_TUNINGRUNNER_FAULT="hang",
        FAKE_TUNINGRUNNER_IGNORE_SIGTERM="1", FAKE_TUNINGRUNNER_SETSID_CHILD="1",
        FAKE_TUNINGRUNNER_TOOL_PIDFILE=str(pids[0]), FAKE_TUNINGRUNNER_CHILD_PIDFILE=str(pids[1]),
    )  # fmt: skip
    argv = mlirtuna_argv(
        "worker", "--session", str(sid), "--tuner", "rocmlir", "--gpus", "0",
        "--mlir-build-dir", str(build), "--max-jobs", "1", "--lease", "1.5",
        "--job-timeout", "600", "--max-retries", "5",
    )  # fmt: skip
    errlog = tmp_path / "worker.err"
    with open(errlog, "w") as err:
        a = subprocess.Popen(argv, env=env, stdout=subprocess.DEVNULL, stderr=err)
    try:
        wait_for(lambda: all(p.exists() and p.read_text().strip() for p in pids), timeout=60)
        tool, child = (int(p.read_text()) for p in pids)
        a.send_signal(signal.SIGSTOP)
        wait_past_lease(db, running_job(db, sid))  # A's heartbeat cannot renew it
        assert queue.reclaim_expired(db, max_retries=5, session_id=sid) == 1
        b = queue.claim(db, sid, Claimant("other-host", 0, 1), lease_s=600)
        assert b is not None  # another worker has the job now
        a.send_signal(signal.SIGCONT)
        # Not the 600 s job timeout: 60 s is a hang guard, "lease lost" below says why it ended.
        assert a.wait(timeout=60) == 0, errlog.read_text()
        assert gone(tool, child)
    finally:
        if a.poll() is None:
            a.kill()
            a.wait()
    stderr = errlog.read_text()
    assert "lease lost" in stderr and "stopped the tool" in stderr
    with db.session() as s:
        job = s.scalars(sa.select(Job).where(Job.session_id == sid)).one()
        outcomes = s.scalars(sa.select(Attempt.outcome).order_by(Attempt.id)).all()
    assert job.state == "running" and job.lease_token == b.token  # A recorded nothing
    assert outcomes[0] == "expired" and len(outcomes) == 2
