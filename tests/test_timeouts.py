"""Timeouts that kill (issue 23): a tool that ignores SIGTERM, with a child that left its process
group and session (setsid) and ignores SIGTERM too, is gone after a timeout; and the SIGKILL is
sent even when the wait for the tool is cut short by the worker's own alarm."""

from __future__ import annotations

import signal
import sys
import time

import pytest
import sqlalchemy as sa
from support.clitools import run_cli
from support.rocmlir import (
    GEMM,
    context,
    pid_alive,
    rocmlir_session,
    tuner,
)

from mlirtuna.db.models import Job
from mlirtuna.errors import TunerTimeout
from mlirtuna.problems import parse
from mlirtuna.tuners import process

# The backend changes nothing here (the queue, records and SQL of their own are tested on every
# backend in their own files): SQLite only, to keep the suite quick.
pytestmark = pytest.mark.backends("sqlite")

STUBBORN = """
import os, signal, subprocess, sys, time
signal.signal(signal.SIGTERM, signal.SIG_IGN)
child = subprocess.Popen([sys.executable, "-c", "import signal, time\\n"
    "signal.signal(signal.SIGTERM, signal.SIG_IGN)\\nwhile True: time.sleep(60)"],
    start_new_session=True)
print(child.pid, flush=True)
while True: time.sleep(60)
"""


def gone(*pids: int, within: float = 30.0) -> bool:  # a hang guard: SIGKILLed, they go at once
    deadline = time.monotonic() + within
    while any(pid_alive(p) for p in pids) and time.monotonic() < deadline:
        time.sleep(0.05)
    return not any(pid_alive(p) for p in pids)


def test_an_interrupted_stop_still_kills_the_tool_and_its_setsid_child(tmp_path):
    proc, out, err = process.start([sys.executable, "-c", STUBBORN], tmp_path, {"PATH": "/usr/bin"})
    deadline = time.monotonic() + 60  # a hang guard: it prints its child's pid as it starts
    while not out.data.strip() and time.monotonic() < deadline:
        time.sleep(0.02)
    child = int(out.data.split()[0])

    class Alarm(Exception):
        pass

    class StillWaiting(Exception):  # the hang guard: stop went on waiting out its grace
        pass

    def fire(_signum, _frame):
        signal.signal(signal.SIGALRM, hang)
        signal.setitimer(signal.ITIMER_REAL, 60)
        raise Alarm

    def hang(_signum, _frame):
        raise StillWaiting

    old = signal.signal(signal.SIGALRM, fire)
    signal.setitimer(signal.ITIMER_REAL, 0.3)  # inside stop's SIGTERM grace of an hour
    try:
        with pytest.raises(Alarm):  # not StillWaiting: the interrupted stop killed at once
            process.stop(proc, (out, err), kill_grace_s=3600)
    finally:
        signal.setitimer(signal.ITIMER_REAL, 0)
        signal.signal(signal.SIGALRM, old)
    assert proc.returncode == -signal.SIGKILL
    assert gone(child)


def test_a_tool_timeout_kills_a_child_that_left_the_group(build, monkeypatch, tmp_path):
    pids = tmp_path / "tool.pid", tmp_path / "child.pid"
    monkeypatch.setenv("FAKE_TUNINGRUNNER_FAULT", "hang")
    monkeypatch.setenv("FAKE_TUNINGRUNNER_IGNORE_SIGTERM", "1")
    monkeypatch.setenv("FAKE_TUNINGRUNNER_SETSID_CHILD", "1")
    monkeypatch.setenv("FAKE_TUNINGRUNNER_TOOL_PIDFILE", str(pids[0]))
    monkeypatch.setenv("FAKE_TUNINGRUNNER_CHILD_PIDFILE", str(pids[1]))
    t = tuner(build, "E3", monkeypatch, kill_grace_s=0.5)
    with pytest.raises(TunerTimeout):
        t.tune(parse("gemm", GEMM), context(tuning_space="quick", timeout_s=1.5))
    assert gone(*(int(p.read_text()) for p in pids))


@pytest.mark.slow  # waits out a timeout
def test_the_worker_kills_a_stubborn_tool_under_a_short_job_timeout(db, db_url, tmp_path, build):
    pids = tmp_path / "tool.pid", tmp_path / "child.pid"
    sid = rocmlir_session(db, tmp_path, "gemm")
    run = run_cli(  # its timeout is a hang guard: a tool left alive holds the worker forever
        db_url, "worker", "--session", str(sid), "--tuner", "rocmlir", "--gpus", "0",
        "--mlir-build-dir", str(build), "--until-empty", "--job-timeout", "1",
        "--max-retries", "1", MLIRTUNA_ROCMLIR_PYTHON=sys.executable,
        FAKE_TUNINGRUNNER_FAULT="hang", FAKE_TUNINGRUNNER_IGNORE_SIGTERM="1",
        FAKE_TUNINGRUNNER_SETSID_CHILD="1", FAKE_TUNINGRUNNER_TOOL_PIDFILE=str(pids[0]),
        FAKE_TUNINGRUNNER_CHILD_PIDFILE=str(pids[1]), timeout=120,
    )  # fmt: skip
    assert run.code == 0, run.stderr
    with db.session() as s:
        job = s.scalars(sa.select(Job).where(Job.session_id == sid)).one()
    assert job.state == "error" and "ran past the job timeout of 1 s" in job.result
    assert gone(*(int(p.read_text()) for p in pids))
