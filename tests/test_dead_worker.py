"""A SIGKILLed GPU worker (issue 42 §1): its tool, and everything the tool started, dies with
it; the GPU's lock on this host stays held until the last of them is gone (the tool's guard
holds it, tuners/guard.py); and the next worker on the host takes the dead worker's jobs back at
once, instead of waiting out their lease, because holding that lock proves them gone. A live
worker's jobs are never taken back."""

from __future__ import annotations

import os
import signal
import subprocess
import sys
import threading
from pathlib import Path

import pytest
import sqlalchemy as sa
from support.clitools import mlirtuna_argv, run_cli, subprocess_env
from support.rocmlir import (
    pid_alive,
    rocmlir_session,
)
from support.workers import make_session, wait_for

from mlirtuna import machine, queue
from mlirtuna.db.models import Attempt, Job
from mlirtuna.queue import Claimant
from mlirtuna.tuners import process
from mlirtuna.worker import gpulock

HANG = {  # the stand-in's tool hangs with a child that left its session and ignores SIGTERM
    "FAKE_TUNINGRUNNER_FAULT": "hang",
    "FAKE_TUNINGRUNNER_IGNORE_SIGTERM": "1",
    "FAKE_TUNINGRUNNER_SETSID_CHILD": "1",
}


def start_hanging_worker(db_url: str, sid: int, build: Path, tmp_path: Path):
    """A GPU worker (GPU 0, a 600 s lease) whose tool hangs; (the worker, the tool's pid, the
    pid of the tool's setsid child) once the tool runs."""
    pids = tmp_path / "tool.pid", tmp_path / "child.pid"
    env = subprocess_env(
        db_url, MLIRTUNA_ROCMLIR_PYTHON=sys.executable, FAKE_TUNINGRUNNER_TOOL_PIDFILE=str(pids[0]),
        FAKE_TUNINGRUNNER_CHILD_PIDFILE=str(pids[1]), **HANG,
    )  # fmt: skip
    argv = mlirtuna_argv(
        "worker", "--session", str(sid), "--tuner", "rocmlir", "--gpus", "0",
        "--mlir-build-dir", str(build), "--lease", "600", "--job-timeout", "600",
        "--max-retries", "5",
    )  # fmt: skip
    worker = subprocess.Popen(argv, env=env, stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL)
    wait_for(lambda: all(p.exists() and p.read_text().strip() for p in pids), timeout=60)
    tool, child = (int(p.read_text()) for p in pids)
    return worker, tool, child


def kill_leftovers(*pids: int) -> None:
    for pid in pids:
        if pid_alive(pid):
            os.kill(pid, signal.SIGKILL)


@pytest.mark.backends("sqlite")  # the queue's side runs on every backend: take_back below
def test_a_sigkilled_workers_tool_dies_with_it_and_holds_the_gpu_until_then(
    db, db_url, tmp_path, build
):
    """SIGKILL of the worker alone: the tool and its setsid child are gone, and this host's lock
    on GPU 0 is free only once they are (a worker started then cannot benchmark beside them)."""
    sid = rocmlir_session(db, tmp_path, "gemm")
    worker, tool, child = start_hanging_worker(db_url, sid, build, tmp_path)
    try:
        worker.kill()  # the worker's pid only: its tool is in a session of its own
        worker.wait()
        locks = gpulock.lock_dir()
        got: list[gpulock.GpuLock] = []

        def take() -> bool:
            try:
                got.append(gpulock.acquire(0, "the next worker", locks))  # type: ignore[arg-type]
            except gpulock.GpuHeld:
                return False
            return True

        wait_for(take, timeout=30)
        alive = [pid for pid in (tool, child) if pid_alive(pid)]
        got[0].release()
        assert alive == []  # the lock came free only once both were gone
    finally:
        kill_leftovers(tool, child)


@pytest.mark.backends("sqlite")
def test_the_next_worker_on_the_host_takes_a_dead_workers_jobs_back_at_once(
    db, db_url, tmp_path, build
):
    """A second worker on GPU 0 of the same host, right after the first was SIGKILLed holding
    a job with a 600 s lease: it takes that job back at once, says so in one line, and tunes
    it; the dead worker's attempt ends expired."""
    sid = rocmlir_session(db, tmp_path, "gemm")
    worker, tool, child = start_hanging_worker(db_url, sid, build, tmp_path)
    try:
        worker.kill()
        worker.wait()
        # Run to the end well within the dead worker's 600 s lease (timeout: a hang guard).
        run = run_cli(
            db_url, "worker", "--session", str(sid), "--tuner", "rocmlir", "--gpus", "0",
            "--mlir-build-dir", str(build), "--lease", "600", "--until-empty",
            "--wait-for-gpu", "--max-retries", "5",
            MLIRTUNA_ROCMLIR_PYTHON=sys.executable, timeout=300,
        )  # fmt: skip
    finally:
        kill_leftovers(tool, child)
    assert run.code == 0, run.stderr
    host = machine.machine_name()
    line = (
        f"GPU 0: worker pid {worker.pid} on {host} is gone (its tool too): its 1 job taken back now"
    )
    assert line in run.stderr
    with db.session() as s:
        job = s.scalars(sa.select(Job).where(Job.session_id == sid)).one()
        attempts = s.execute(
            sa.select(Attempt.pid, Attempt.outcome, Attempt.message).order_by(Attempt.id)
        ).all()
    assert job.state == "completed" and job.retries == 1
    dead, done = attempts
    assert (dead.pid, dead.outcome) == (worker.pid, "expired") and "taken back" in dead.message
    assert done.outcome == "completed"


def test_take_back_ends_only_the_dead_workers_attempts(db, tmp_path):
    """queue.take_back, on every backend: the named worker's running jobs go back (retry
    counted; error at the last retry), another worker's job on the same host is untouched."""
    sid = make_session(db, tmp_path, 3, tuner="sleep")
    dead = Claimant("host", 0, 4242, gpu="host:0")
    live = Claimant("host", 1, 4243, gpu="host:1")
    first = queue.claim(db, sid, dead, lease_s=600)
    second = queue.claim(db, sid, dead, lease_s=600)
    kept = queue.claim(db, sid, live, lease_s=600)
    assert first and second and kept
    with db.session() as s:  # the second job is at its last retry
        s.execute(sa.update(Job).where(Job.id == second.job_id).values(retries=1))
        s.commit()
    assert queue.take_back(db, "host", 4242, dead.worker, max_retries=2) == 2
    assert queue.take_back(db, "host", 4242, dead.worker, max_retries=2) == 0
    with db.session() as s:
        states = dict(s.execute(sa.select(Job.id, Job.state)).all())
        outcomes = dict(s.execute(sa.select(Attempt.lease_token, Attempt.outcome)).all())
    assert states == {first.job_id: "new", second.job_id: "error", kept.job_id: "running"}
    assert outcomes == {first.token: "expired", second.token: "expired", kept.token: None}


def test_a_tool_outlives_the_thread_that_started_it(tmp_path):
    """PR_SET_PDEATHSIG also fires when the *thread* that started the guard ends: the guard
    sees its worker alive and lets the tool run to its end (a stream outlives its thread)."""
    started: list[subprocess.Popen[bytes]] = []
    native: list[int] = []
    end = threading.Event()

    def start() -> None:
        native.append(threading.get_native_id())
        started.append(process.popen(["/bin/sh", "-c", "read x; echo $x"], tmp_path, {}, fed=True))
        end.wait(60)

    thread = threading.Thread(target=start)
    thread.start()
    wait_for(lambda: started and children(started[0].pid))  # its PR_SET_PDEATHSIG is set
    end.set()
    thread.join()
    wait_for(lambda: not Path(f"/proc/self/task/{native[0]}").exists())  # gone in the kernel
    proc = started[0]
    out, _ = proc.communicate(b"still here\n", timeout=30)
    assert (proc.returncode, out) == (0, b"still here\n")


def children(pid: int) -> list[str]:
    return Path(f"/proc/{pid}/task/{pid}/children").read_text().split()
