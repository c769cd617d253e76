"""`worker --gpus N` looks after its workers (issue 44 §2): one killed by SIGKILL is started
again (its GPU does not sit idle), in one line naming the GPU, how it died and which restart
this is; one that keeps dying is given up after the bound and named in the summary, and the
command exits non-zero."""

from __future__ import annotations

import os
import subprocess

import sqlalchemy as sa
from support.clitools import cli, mlirtuna_argv, subprocess_env
from support.workers import TESTS, job_states, make_session

from mlirtuna.db.models import Attempt
from mlirtuna.worker import supervisor


def plugin_env(db_url: str, **extra: str) -> dict[str, str]:
    env = subprocess_env(db_url, **extra)
    env["PYTHONPATH"] = TESTS + os.pathsep + env["PYTHONPATH"]
    return env


def test_a_worker_killed_by_sigkill_is_started_again_and_the_session_drains(db, db_url, tmp_path):
    """GPU 1's worker is SIGKILLed in the middle of a job: the supervisor says so and starts it
    again; the new worker takes the dead one's job back (it holds the GPU's lock) and the
    session drains; the command exits 0, its summary naming the restart."""
    sid = make_session(db, tmp_path, 6, tuner="plugins.crashing:KilledOnce")
    argv = mlirtuna_argv(
        "worker", "--session", str(sid), "--gpus", "0,1", "--until-empty", "--lease", "60",
        "--gpu-lock-dir", str(tmp_path / "locks"),
    )  # fmt: skip
    env = plugin_env(db_url, KILL_ON_GPU="1", KILL_MARK=str(tmp_path / "killed"), SLEEP_S="0.3")
    run = subprocess.run(argv, env=env, capture_output=True, text=True, timeout=300, check=False)
    assert run.returncode == 0, run.stderr
    said = [line for line in run.stderr.splitlines() if "killed by SIGKILL" in line]
    assert len(said) == 1, run.stderr
    assert said[0].startswith("GPU 1 worker (pid ")
    assert said[0].endswith(
        "killed by SIGKILL: starting it again in 1 s (restart 1 of at most 3 within 10 min)"
    )
    assert "workers: GPU 1 worker started again 1 time" in run.stderr.splitlines()[-1]
    assert job_states(db, sid) == {"completed": 6}
    dead = int(said[0].split("(pid ")[1].split(")")[0])
    with db.session() as s:
        died = set(s.scalars(sa.select(Attempt.outcome).where(Attempt.pid == dead)))
        gpu1 = set(s.scalars(sa.select(Attempt.pid).where(Attempt.gpu_id == 1)))
    assert "completed" not in died  # the job it died holding went to another attempt
    # the worker started again on GPU 1 ran to its end (its closing line) on the same GPU
    assert run.stderr.count("worker GPU 1: ") == 1 and dead in gpu1


def test_a_worker_that_keeps_dying_is_given_up_after_the_bound(db, db_url, tmp_path, monkeypatch):
    """GPU 1's worker dies as it starts, every time: started again at most RESTARTS.most times,
    each said, then given up; GPU 0's worker drains the session, and the command exits 1 with a
    summary naming the lost worker and how it died."""
    monkeypatch.setattr(supervisor, "RESTARTS", supervisor.Restarts(most=2, backoff_s=0.05))
    for name, value in plugin_env(db_url, KILL_ON_GPU="1", SLEEP_S="0").items():
        monkeypatch.setenv(name, value)
    sid = make_session(db, tmp_path, 4, tuner="plugins.crashing:Dying")
    run = cli(db_url, "worker", "--session", str(sid), "--gpus", "0,1", "--until-empty",
              "--gpu-lock-dir", str(tmp_path / "locks"))  # fmt: skip
    assert run.code == 1, run.stderr
    lines = run.stderr.splitlines()
    deaths = [line for line in lines if line.startswith("GPU 1 worker (pid ")]
    assert len(deaths) == 3, run.stderr
    assert deaths[0].endswith("starting it again in 0.05 s (restart 1 of at most 2 within 10 min)")
    assert deaths[1].endswith("starting it again in 0.1 s (restart 2 of at most 2 within 10 min)")
    assert deaths[2].endswith(
        "killed by SIGKILL: not started again (3 deaths within 10 min; at most 2 restarts): its "
        "slot stays idle, and its jobs go to other workers as their leases end"
    )
    assert lines[-1] == (
        "workers: GPU 1 worker started again 2 times; "
        "GPU 1 worker lost (killed by SIGKILL, 3 times within 10 min)"
    )
    assert job_states(db, sid) == {"completed": 4}


def test_a_refused_or_finished_worker_is_not_started_again():
    """Exit 0 (done) and exit 2 (refused: it would be refused again) end a slot; a crash or a
    signal starts it again; after the operator's signal nothing is started again."""
    said: list[str] = []

    def child(code: int) -> supervisor.Child:
        proc = subprocess.Popen(["sh", "-c", f"exit {code}"])
        proc.wait()
        return supervisor.Child(f"w{code}", proc, again=lambda: subprocess.Popen(["true"]))

    done, refused, crashed = child(0), child(2), child(1)
    for c in (done, refused, crashed):
        supervisor.watch(c, False, supervisor.Restarts(backoff_s=0), said.append)
    assert (done.due, refused.due) == (None, None) and crashed.due is not None
    assert refused.failed == "exited 2" and not done.failed
    assert said == [f"w1 (pid {crashed.proc.pid}) exited 1: starting it again in 0 s "
                    "(restart 1 of at most 3 within 10 min)"]  # fmt: skip
    stopping = child(1)
    supervisor.watch(stopping, True, supervisor.RESTARTS, said.append)
    assert stopping.due is None and stopping.failed == "exited 1" and len(said) == 1
