"""The session decides the tuner; results of another tuner's family are refused; sessions can be
retired and deleted; what a tuner can never run fails at once (issue 10, points 1 and 4)."""

from __future__ import annotations

from pathlib import Path

import pytest
import sqlalchemy as sa
from support.clitools import cli, run_cli
from support.results import mark_standin

from mlirtuna import catalog, queue, sessions
from mlirtuna.db import Database
from mlirtuna.db.models import Attempt, Candidate, Job, Result, TuningSession
from mlirtuna.errors import UserError
from mlirtuna.history import export
from mlirtuna.problems import ExpandOptions
from mlirtuna.queue import jobs
from mlirtuna.sessions import SessionSpec
from mlirtuna.tuners import tuner_of
from mlirtuna.tuners.base import Candidate as Cand
from mlirtuna.tuners.base import TuneOutcome
from mlirtuna.worker import Worker, WorkerSettings

# The backend changes nothing here (the queue, records and SQL of their own are tested on every
# backend in their own files): SQLite only, to keep the suite quick.
pytestmark = pytest.mark.backends("sqlite")

GEMM = "-t f16 -out_datatype f16 -transA false -transB false -g 1 -m 1024 -n 512 -k 768"
SMALL = "-t f32 -out_datatype f32 -transA false -transB false -g 1 -m {m} -n 8 -k 8"
ROCMLIR = {"arch_full": "gfx942:sramecc+:xnack-", "num_cu": 304, "num_chiplets": 8}


def open_session(db: Database, tmp_path: Path, tuner: str, lines: list[str], **spec) -> int:
    path = tmp_path / f"configs-{tuner.replace(':', '-')}-{len(sessions.list_all(db))}"
    path.write_text("\n".join(lines) + "\n")
    catalog.import_files(db, "gemm", [str(path)], ExpandOptions(expand=False), tag=path.name)
    sid = sessions.create(db, SessionSpec(tuner=tuner, tuning_space="quick", **spec)).id
    jobs.load(db, sid, tag=path.name)
    return sid


def rows(db: Database, model, sid: int) -> int:
    column = Attempt.job_id.in_(sa.select(Job.id).where(Job.session_id == sid))
    where = column if model is Attempt else model.session_id == sid
    with db.session() as s:
        return s.scalar(sa.select(sa.func.count()).select_from(model).where(where))


# --- 1. the session decides the tuner -----------------------------------------------------------


def test_worker_without_tuner_runs_the_sessions_tuner(db, db_url, tmp_path, build):
    sid = mark_standin(db, open_session(db, tmp_path, "rocmlir", [GEMM], **ROCMLIR))
    run = run_cli(
        db_url, "worker", "--session", str(sid), "--gpus", "0", "--mlir-build-dir", str(build),
        "--until-empty",
    )  # fmt: skip
    assert run.code == 0, run.stderr
    assert "worker GPU 0: 1 completed" in run.stderr
    with db.session() as s:
        winner = s.scalar(sa.select(Result.perf_config).where(Result.session_id == sid))
    assert tuner_of(winner) == "rocmlir" and not winner.startswith("cpu:")


@pytest.mark.parametrize("asked", ["cpu", "sleep:0.1", "plugins.claimlog:Logging"])
def test_worker_with_another_tuner_is_refused(db, db_url, tmp_path, asked):
    sid = open_session(db, tmp_path, "rocmlir", [GEMM], **ROCMLIR)
    run = cli(db_url, "worker", "--session", str(sid), "--tuner", asked, "--until-empty")
    assert run.code == 2, run.stderr
    line = run.stderr.strip()
    assert "\n" not in line and f"--tuner {asked}" in line and "rocmlir" in line
    assert jobs.counts(db, sid)[sid]["new"] == 1  # nothing claimed


def test_sleep_and_plugin_tuners_need_a_session_of_their_own(db, db_url, tmp_path):
    cpu = open_session(db, tmp_path, "cpu", [SMALL.format(m=1)])
    with pytest.raises(UserError, match=r"sleep:0.2.*session .* tuner cpu"):
        Worker(db, WorkerSettings(session_id=cpu, tuner="sleep:0.2"))
    sid = cli(db_url, "session", "new", "--tuner", "sleep:0.01", "--json").json()["id"]
    assert sessions.get(db, sid).tuner == "sleep:0.01"
    assert Worker(db, WorkerSettings(session_id=sid)).settings.tuner == "sleep:0.01"
    # A sleep session's workers may set the seconds; the tuner stays the session's.
    assert Worker(db, WorkerSettings(session_id=sid, tuner="sleep:0")).tuner.seconds == 0
    bad = cli(db_url, "session", "new", "--tuner", "no.such.module:factory")
    assert bad.code == 2 and "cannot load tuner" in bad.stderr


class _Fixed:
    """A tuner that reports one fixed perf config: what a wrong tuner would record."""

    name = "fixed"

    def __init__(self, perf_config: str) -> None:
        self.perf_config = perf_config

    def tune(self, problem, ctx):
        winner = Cand(self.perf_config, 1000.0, problem.flops() / 1e6)
        return TuneOutcome(candidates=[winner], winner=winner)


@pytest.mark.parametrize(
    ("tuner", "perf_config"),
    [("rocmlir", "cpu:v1:64,64,8"), ("cpu", "v2:256,256,8,128,128,8,1,1,2,1,1")],
)
def test_record_refuses_another_tuners_perf_configs(db, tmp_path, tuner, perf_config):
    spec = ROCMLIR if tuner == "rocmlir" else {}
    sid = open_session(db, tmp_path, tuner, [SMALL.format(m=1)], **spec)
    settings = WorkerSettings(session_id=sid, until_empty=True, max_retries=3, backoff_s=0)
    stats = Worker(db, settings, tuner=_Fixed(perf_config)).run()
    assert stats.completed == 0 and stats.failed == 1
    with db.session() as s:
        job = s.scalar(sa.select(Job).where(Job.session_id == sid))
        assert job.state == "error" and job.retries == 1  # deterministic: not retried
        assert perf_config in job.result and f"tuner {tuner}" in job.result
    assert rows(db, Result, sid) == rows(db, Candidate, sid) == 0


# --- 4. what a tuner can never run fails at once ------------------------------------------------


def test_unsupported_problem_ends_in_error_without_retries(db, tmp_path):
    """A problem the worker finds it cannot run: over its own --cpu-mem-limit, which `jobs load`
    cannot know (what no worker can run, fp8, is not loaded at all: test_operator_told)."""
    sid = open_session(db, tmp_path, "cpu", [SMALL.format(m=8)])
    settings = WorkerSettings(session_id=sid, until_empty=True, max_retries=3, backoff_s=30,
                              cpu_mem_limit=1)  # fmt: skip
    Worker(db, settings).run()  # a retry would wait 30 s before the worker could finish
    with db.session() as s:
        job = s.scalar(sa.select(Job).where(Job.session_id == sid))
        assert job.state == "error" and job.retries == 1
        assert "over --cpu-mem-limit" in job.result and "not retried" in job.result
    assert rows(db, Attempt, sid) == 1


def test_transient_failure_is_still_retried(db, tmp_path):
    lease_sid = open_session(db, tmp_path, "cpu", [SMALL.format(m=1)])
    lease = queue.claim(db, lease_sid, queue.Claimant("t", -1), 60)
    assert queue.fail(db, lease, "timeout", max_retries=3, backoff_s=0) == "new"


# --- 1. retire and delete -----------------------------------------------------------------------


def _tuned(db: Database, tmp_path: Path, n: int = 2) -> int:
    sid = open_session(db, tmp_path, "sleep", [SMALL.format(m=m) for m in range(1, n + 1)])
    Worker(db, WorkerSettings(session_id=sid, until_empty=True)).run()
    return sid


def test_retired_session_is_never_chosen_by_export(db, db_url, tmp_path):
    old, new = _tuned(db, tmp_path), _tuned(db, tmp_path)
    arch = sessions.get(db, new).arch
    assert export.render(db, export.ExportQuery(arch=arch)).sessions == [new]
    done = cli(db_url, "session", "retire", str(new), "--json")
    assert done.code == 0 and done.json()["retired_at"]
    assert export.render(db, export.ExportQuery(arch=arch)).sessions == [old]
    assert export.render(db, export.ExportQuery(sessions=(new,))).rows == 2  # history stays
    cli(db_url, "session", "retire", str(old))
    with pytest.raises(UserError, match="no session matches"):
        export.render(db, export.ExportQuery(arch=arch))


def test_delete_removes_everything_of_one_session(db, db_url, tmp_path):
    keep, gone = _tuned(db, tmp_path), _tuned(db, tmp_path, 3)
    before = {m: rows(db, m, keep) for m in (Job, Attempt, Result, Candidate)}
    done = cli(db_url, "session", "delete", str(gone), "--yes", "--json")
    assert done.code == 0, done.stderr
    assert done.json() == {
        "session": gone, "jobs": 3, "attempts": 3, "results": 3, "candidates": 3,
    }  # fmt: skip
    assert all(rows(db, m, gone) == 0 for m in (Job, Attempt, Result, Candidate))
    assert {m: rows(db, m, keep) for m in before} == before
    with db.session() as s:
        assert s.get(TuningSession, gone) is None


def test_delete_refuses_a_running_session_unless_forced(db, tmp_path):
    sid = open_session(db, tmp_path, "sleep", [SMALL.format(m=1)])
    lease = queue.claim(db, sid, queue.Claimant("t", -1), 60)
    with pytest.raises(UserError, match=r"running job.*--force"):
        jobs.delete_session(db, sid)
    assert jobs.counts(db, sid)[sid]["running"] == 1  # nothing deleted
    assert jobs.delete_session(db, sid, force=True).jobs == 1
    # The worker that held the job finds its lease gone and writes nothing.
    winner = Cand("sleep:v1:1", 1.0, 1.0)
    assert not queue.record(db, lease, TuneOutcome([winner], winner))


def test_delete_asks_for_yes_without_a_terminal(db, db_url, tmp_path):
    sid = open_session(db, tmp_path, "sleep", [SMALL.format(m=1)])
    run = cli(db_url, "session", "delete", str(sid))
    assert run.code == 2 and "--yes" in run.stderr and "\n" not in run.stderr.strip()
    assert sessions.get(db, sid).id == sid
