"""A tuner plugin outside the package works end to end (issue 32): tests/plugin_dist holds the
toytuner package and a dist-info whose entry point (group mlirtuna.tuners) registers it; nothing
of mlirtuna names it. `session new --tuner toy`, `worker --gpus auto` (one GPU worker per GPU
rocminfo lists: the kind says GPU), its perf configs checked, and its tool killed when the
worker loses the job's lease."""

from __future__ import annotations

import json
import os
import signal
import subprocess
import time
from pathlib import Path

import httpx
import pytest
import sqlalchemy as sa
from support.clitools import mlirtuna_argv, run_cli, subprocess_env
from support.rocmlir import pid_alive
from support.webserve import serving_command
from support.workers import wait_for

from mlirtuna import catalog, queue, standin
from mlirtuna.db.models import Attempt, Job, Result
from mlirtuna.problems import ExpandOptions
from mlirtuna.queue import Claimant, jobs

# The flow over whole workers: each backend in .ci/run, SQLite in the quick loop (the
# queue, claim and settle SQL it runs is tested on all three there too).
pytestmark = pytest.mark.backends(fast=("sqlite",))

TESTS = Path(__file__).resolve().parent
PLUGIN_PATH = TESTS / "plugin_dist"
FAKE_BIN = standin.BUILD / "below" / "bin"  # rocminfo: one gfx942
GEMM = "-t f32 -transA false -transB false -g 1 -m 64 -n 64 -k 64"


def plugin_env(**extra: str) -> dict[str, str]:
    """What a process needs to find the plugin: its folder on PYTHONPATH (the dist-info is how
    importlib.metadata finds the entry point), the fake rocminfo first on PATH."""
    return {
        "PYTHONPATH": f"{PLUGIN_PATH}{os.pathsep}{os.environ.get('PYTHONPATH', '')}",
        "PATH": f"{FAKE_BIN}{os.pathsep}{os.environ['PATH']}",
        "MLIRTUNA_TOOL_ENV": "TOYTOOL_*",  # the tool's switches reach it (the env is allowlisted)
        **extra,
    }


def toy_session(db, db_url: str, tmp_path: Path, *flags: str) -> int:
    configs = tmp_path / "gemm-configs"
    configs.write_text(GEMM + "\n")
    catalog.import_files(db, "gemm", [str(configs)], ExpandOptions(expand=False), tag="g")
    new = run_cli(db_url, "session", "new", "--tuner", "toy", *flags, "--json", **plugin_env())
    assert new.code == 0, new.stderr
    sid = json.loads(new.stdout)["id"]
    jobs.load(db, sid, tag="g")
    return sid


def test_a_plugin_tuner_runs_end_to_end_on_gpu_workers(db, db_url, tmp_path):
    sid = toy_session(db, db_url, tmp_path)
    shown = json.loads(run_cli(db_url, "session", "show", str(sid), "--json").stdout)
    assert shown["tuner"] == "toy" and shown["arch"] == "gfx942"  # a GPU session: rocminfo's
    argv = ("worker", "--session", str(sid), "--gpus", "auto", "--until-empty")
    if not Path("/sys/class/kfd/kfd/topology/nodes").exists():  # which GPU is it? unknown
        unnamed = run_cli(db_url, *argv, **plugin_env())
        assert unnamed.code == 2 and "--gpu-identity ID" in unnamed.stderr
    worker = run_cli(db_url, *argv, "--gpu-identity", "toy-gpu-0", **plugin_env())
    assert worker.code == 0, worker.stderr
    with db.session() as s:
        job = s.scalars(sa.select(Job).where(Job.session_id == sid)).one()
        result = s.scalars(sa.select(Result).where(Result.session_id == sid)).one()
        gpu = s.scalars(sa.select(Attempt.gpu)).one()
    assert gpu == "toy-gpu-0"  # the operator's name keys the GPU's claims
    assert job.state == "completed" and job.gpu_id == 0  # a GPU worker, not a CPU one (-1)
    assert result.perf_config == "toy:v1:1"
    assert "toy tool on GPU 0" in job.result
    # The dashboard names the plugin's fields (its TunerKind.perf_fields), as rocMLIR's.
    with serving_command(db_url, **plugin_env()) as url:
        got = httpx.get(f"{url}/api/problems/{job.problem_id}/table?session={sid}", timeout=30)
    page = got.raise_for_status().json()
    assert page["columns"] == ["n"]
    assert {r["perf_config"]: r["fields"] for r in page["rows"]} == {
        f"toy:v1:{n}": {"n": n} for n in (1, 2, 3)
    }
    assert {r["family"] for r in page["rows"]} == {"toy:v1"}


def test_the_registry_knows_the_plugin(db_url):
    unknown = run_cli(db_url, "session", "new", "--tuner", "nosuch", **plugin_env())
    assert unknown.code == 2 and "known: rocmlir, cpu, sleep, toy" in unknown.stderr
    with_arg = run_cli(db_url, "session", "new", "--tuner", "toy:3", **plugin_env())
    assert with_arg.code == 2 and "toy takes no argument" in with_arg.stderr
    space = run_cli(
        db_url, "session", "new", "--tuner", "toy", "--tuning-space", "exhaustive", **plugin_env()
    )
    assert space.code == 2 and "the toy tuner has no tuning space 'exhaustive'" in space.stderr
    e4 = run_cli(db_url, "session", "new", "--tuner", "toy", "--rep", "5", **plugin_env())
    assert e4.code == 2 and "--rep: not a setting of the toy tuner" in e4.stderr
    without = run_cli(db_url, "session", "new", "--tuner", "toy")  # not installed: unknown
    assert without.code == 2 and "unknown tuner 'toy'" in without.stderr


@pytest.mark.slow  # a worker paused past its lease
def test_a_worker_that_lost_its_lease_kills_the_plugins_tool(db, db_url, tmp_path):
    sid = toy_session(db, db_url, tmp_path)
    pidfile = tmp_path / "tool.pid"
    env = subprocess_env(db_url, **plugin_env(TOYTOOL_HANG="1", TOYTOOL_PIDFILE=str(pidfile)))
    argv = mlirtuna_argv(
        "worker", "--session", str(sid), "--gpus", "auto", "--max-jobs", "1", "--lease", "1.5",
        "--job-timeout", "600", "--max-retries", "5", "--gpu-identity", "toy-gpu-0",
    )  # fmt: skip
    errlog = tmp_path / "worker.err"
    with open(errlog, "w") as err:
        a = subprocess.Popen(argv, env=env, stdout=subprocess.DEVNULL, stderr=err)
    try:
        wait_for(lambda: pidfile.exists() and pidfile.read_text().strip(), timeout=60)
        tool = int(pidfile.read_text())
        a.send_signal(signal.SIGSTOP)
        wait_for(lambda: queue.reclaim_expired(db, max_retries=5, session_id=sid) == 1, 30)
        b = queue.claim(db, sid, Claimant("other-host", 0, 1), lease_s=600)
        assert b is not None  # another worker has the job now
        a.send_signal(signal.SIGCONT)
        assert a.wait(timeout=60) == 0, errlog.read_text()
        deadline = time.monotonic() + 10
        while pid_alive(tool) and time.monotonic() < deadline:
            time.sleep(0.05)
        assert not pid_alive(tool)  # deaf to SIGTERM: killed, not waited for (600 s)
    finally:
        if a.poll() is None:
            a.kill()
            a.wait()
    assert "stopped the tool" in errlog.read_text()
    with db.session() as s:
        job = s.scalars(sa.select(Job).where(Job.session_id == sid)).one()
        outcomes = s.scalars(sa.select(Attempt.outcome).order_by(Attempt.id)).all()
    assert job.state == "running" and job.lease_token == b.token  # A recorded nothing
    assert outcomes[0] == "expired"
