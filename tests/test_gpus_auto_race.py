"""Two `worker --gpus auto` started together on one host (issue 43 §4): `auto` takes the GPUs no
worker holds by locking each (worker/gpulock.py) and keeping what it got, handing each lock to the
worker it starts; it never checks a lock and lets it go, which let the second supervisor start
workers on GPUs the first had just taken (they exited 2 on the lock, and it exited 1). The second
takes the GPUs left, or says that every GPU of this host is held (exit 2).

Run on the stand-in build: its fake rocminfo lists FAKE_GPU_COUNT GPUs."""

from __future__ import annotations

import json
import os
import subprocess
from pathlib import Path

import pytest
import sqlalchemy as sa
from support.clitools import cli, mlirtuna_argv, subprocess_env
from support.conformance import BELOW
from support.workers import job_states, make_session

from mlirtuna import machine, standin
from mlirtuna.db.models import Attempt
from mlirtuna.worker import WorkerSettings, gpulock, supervisor
from mlirtuna.worker.supervisor import Slot

GEMMS = [f"-t f32 -out_datatype f32 -transA false -transB false -g 1 -m {m} -n 64 -k 32" for m in
         (16, 32, 48, 64, 80, 96)]  # fmt: skip


def standin_env(db_url: str, locks: Path, gpus: int) -> dict[str, str]:
    env = standin.environment(subprocess_env(db_url))
    env["PATH"] = f"{BELOW / 'bin'}:{env['PATH']}"  # its rocminfo
    env["ROCM_PATH"] = str(BELOW)
    env["FAKE_GPU_COUNT"] = str(gpus)
    env["MLIRTUNA_GPU_LOCK_DIR"] = str(locks)
    return env


def standin_session(db_url: str, tmp_path: Path) -> int:
    configs = tmp_path / "gemms"
    configs.write_text("\n".join(GEMMS) + "\n")
    assert cli(db_url, "import", "--op", "gemm", str(configs), "--tag", "race").code == 0
    new = cli(db_url, "session", "new", *standin.session_flags(standin.BUILD), "--json")
    assert new.code == 0, new.stderr
    sid = json.loads(new.stdout)["id"]
    assert cli(db_url, "jobs", "load", "--session", str(sid), "--tag", "race").code == 0
    return sid


def test_auto_keeps_the_locks_it_found_free(db, tmp_path, monkeypatch):
    """The check is the lock itself: what `free` found free it holds, so a second look at the
    same moment (another supervisor) finds them held; a lock it let go is free again."""
    monkeypatch.setenv("MLIRTUNA_GPU_LOCK_DIR", str(tmp_path / "locks"))
    sid = make_session(db, tmp_path, 1, tuner="sleep")
    settings = WorkerSettings(session_id=sid, machine_name=machine.machine_name())
    said: list[str] = []
    slots, locks = supervisor.free(db, settings, [Slot(0), Slot(1)], said.append)
    try:
        assert slots == [Slot(0), Slot(1)] and sorted(locks) == [0, 1] and said == []
        with pytest.raises(gpulock.GpuHeld, match="every GPU of this host is held"):
            supervisor.free(db, settings, [Slot(0), Slot(1)], said.append)
        assert said == [f"GPU {i} skipped: held by a worker here" for i in (0, 1)]
        locks.pop(1).release()
        assert supervisor.free(db, settings, [Slot(0), Slot(1)], said.append)[0] == [Slot(1)]
    finally:
        supervisor.release(locks)


def test_a_worker_adopts_only_the_lock_it_was_handed(tmp_path, monkeypatch):
    """The variable names a descriptor; the lock file decides: another file's descriptor, or
    another GPU's lock, is not adopted (the worker then locks as usual)."""
    directory = tmp_path / "locks"
    held = gpulock.try_acquire(0, "supervisor pid 1 (session 1) on here", directory)
    assert held is not None
    try:
        env: dict[str, str] = {}
        gpulock.hand_down(held, env)
        monkeypatch.setenv("MLIRTUNA_GPU_LOCK_FD", env["MLIRTUNA_GPU_LOCK_FD"])
        assert gpulock.adopt(1, "worker pid 2 (session 1) on here", directory) is None
        assert "MLIRTUNA_GPU_LOCK_FD" not in os.environ  # read once, never passed to tools
        monkeypatch.setenv("MLIRTUNA_GPU_LOCK_FD", env["MLIRTUNA_GPU_LOCK_FD"])
        adopted = gpulock.adopt(0, "worker pid 2 (session 1) on here", directory)
        assert adopted is not None and adopted.fd == held.fd
        assert (directory / "gpu0.lock").read_text() == "worker pid 2 (session 1) on here\n"
        other = tmp_path / "other"
        other.write_text("")
        with open(other) as f:
            monkeypatch.setenv("MLIRTUNA_GPU_LOCK_FD", str(f.fileno()))
            assert gpulock.adopt(0, "worker pid 3 (session 1) on here", directory) is None
    finally:
        held.release()


@pytest.mark.slow
def test_two_auto_workers_started_together_share_the_gpus(db, db_url, tmp_path):
    sid = standin_session(db_url, tmp_path)
    env = standin_env(db_url, tmp_path / "locks", gpus=2)
    argv = mlirtuna_argv("worker", "--session", str(sid), "--gpus", "auto", "--until-empty",
                         "--mlir-build-dir", str(standin.BUILD))  # fmt: skip
    errs = [tmp_path / f"supervisor{i}.err" for i in range(2)]
    procs = []
    try:
        for err in errs:
            with open(err, "w") as f:
                procs.append(subprocess.Popen(argv, env=env, stdout=subprocess.DEVNULL, stderr=f))
        codes = [p.wait(300) for p in procs]
    finally:
        for p in procs:
            if p.poll() is None:
                p.kill()
                p.wait()
    for code, err in zip(codes, errs, strict=True):
        text = err.read_text()
        assert code in (0, 2), text  # never 1: its workers refused on a GPU it had found free
        if code == 2:
            assert "every GPU of this host is held" in text.strip().splitlines()[-1], text
    assert 0 in codes
    assert job_states(db, sid) == {"completed": len(GEMMS)}
    with db.session() as s:
        held = s.execute(sa.select(Attempt.gpu, Attempt.pid).distinct()).all()
    keys = [gpu for gpu, _pid in held]  # one worker process per GPU key, two GPUs at most
    assert len(keys) == len(set(keys)) <= 2


def test_auto_with_every_gpu_held_says_so_in_one_line(db, db_url, tmp_path):
    sid = standin_session(db_url, tmp_path)
    env = standin_env(db_url, tmp_path / "locks", gpus=2)
    held = [gpulock.acquire(i, f"worker pid {i} (session 1) on here", tmp_path / "locks")
            for i in (0, 1)]  # fmt: skip
    try:
        run = subprocess.run(
            mlirtuna_argv("worker", "--session", str(sid), "--gpus", "auto", "--until-empty",
                          "--mlir-build-dir", str(standin.BUILD)),
            env=env, capture_output=True, text=True, timeout=120, check=False,
        )  # fmt: skip
    finally:
        for lock in held:
            if lock is not None:
                lock.release()
    assert run.returncode == 2, run.stderr
    lines = run.stderr.strip().splitlines()
    assert lines[-1] == "error: every GPU of this host is held by a worker: one worker per GPU"
    assert lines[:-1] == [f"GPU {i} skipped: held by a worker here" for i in (0, 1)]
    assert job_states(db, sid) == {"new": len(GEMMS)}
