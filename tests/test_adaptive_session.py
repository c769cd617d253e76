"""Searched sessions in the farm (issue 45 §1, "Done when"): `--search NAME --budget N` on the
CPU tuner end to end, on every backend; a worker SIGKILLed mid-search comes back and measures
only what it had not measured; the options refused in one line; a searched session is never
equivalent to a whole-space one; the farm's history a search starts from."""

from __future__ import annotations

import signal
import subprocess
from dataclasses import replace

import numpy as np
import pytest
import sqlalchemy as sa
from fastapi.testclient import TestClient
from plugins.searchable import FirstRoundFails
from support.clitools import cli, mlirtuna_argv, run_cli, subprocess_env
from support.dbroles import as_role, fixture_server_db, refused, role_prefix  # noqa: F401 (the server_db fixture)
from support.perfrunner_reader import read_tuning_db
from support.workers import wait_for

from mlirtuna import catalog, problems, search, sessions, tuners
from mlirtuna.db import Database, roles
from mlirtuna.db.models import Candidate, Job, Result, SearchStep
from mlirtuna.db.models import Problem as ProblemRow
from mlirtuna.history import reuse
from mlirtuna.queue import Lease, jobs
from mlirtuna.tuners.base import TuneContext
from mlirtuna.tuners.cpu import CpuTuner
from mlirtuna.tuners.sleep import SleepTuner
from mlirtuna.web.app import create_app, open_read_only
from mlirtuna.worker import Worker, WorkerSettings
from mlirtuna.worker import search as searched

#: Every strategy that chooses (exhaustive measures the space in order: nothing to search).
CHOOSING = [name for name in search.names() if name != "exhaustive"]
GEMMS = (
    "-t f32 -out_datatype f32 -transA false -transB false -g 1 -m 64 -n 64 -k 64\n"
    "-t f32 -out_datatype f32 -transA false -transB false -g 1 -m 32 -n 48 -k 64\n"
)
BUDGET = 8


def candidates_of(db: Database, session_id: int) -> dict[int, list[Candidate]]:
    """{job id: its candidates}."""
    with db.session() as s:
        rows = s.scalars(sa.select(Candidate).where(Candidate.session_id == session_id)).all()
        s.expunge_all()
    out: dict[int, list[Candidate]] = {}
    for row in rows:
        out.setdefault(row.job_id, []).append(row)
    return out


def assert_searched(db: Database, session_id: int, budget: int) -> None:
    """Each job: no perf config twice, at most `budget`, every one with its round, and the
    winner the fastest valid one measured."""
    by_job = candidates_of(db, session_id)
    assert by_job
    with db.session() as s:
        winners = {
            r.job_id: r for r in s.scalars(sa.select(Result).where(Result.session_id == session_id))
        }
    for job_id, cands in by_job.items():
        configs = [c.perf_config for c in cands]
        assert len(configs) == len(set(configs)) <= budget, configs
        assert all(c.search_round is not None and c.search_round >= 0 for c in cands)
        valid = [c for c in cands if c.error is None and c.kernel_time is not None]
        best = min(valid, key=lambda c: c.kernel_time)
        assert winners[job_id].perf_config == best.perf_config


@pytest.mark.parametrize("strategy", CHOOSING)
def test_a_searched_run_measures_the_budget_in_rounds_and_exports(db, db_url, tmp_path, strategy):
    configs = tmp_path / "gemm-configs"
    configs.write_text(GEMMS)
    out = tmp_path / "tuning.tsv"
    done = run_cli(
        db_url, "run", "--op", "gemm", "--tuning-space", "exhaustive", "--search", strategy,
        "--budget", str(BUDGET), "-o", str(out), "--json", str(configs), timeout=600,
    )  # fmt: skip
    assert done.code == 0, done.stderr
    summary = done.json()
    assert summary["counts"]["completed"] == 2 and summary["exported"] == 2
    sid = summary["session"]
    assert_searched(db, sid, BUDGET)
    # The session says how its candidates were chosen: show, --json.
    shown = cli(db_url, "session", "show", str(sid), "--json").json()
    assert (shown["search"], shown["search_budget"]) == (strategy, BUDGET)
    text = cli(db_url, "session", "show", str(sid)).stdout.splitlines()
    assert any(line.split() == ["search", strategy] for line in text)
    # It exports like any session: `mlirtuna export` writes the winners perfRunner reads.
    again = tmp_path / "again.tsv"
    exported = cli(db_url, "export", "--session", str(sid), "-o", str(again))
    assert exported.code == 0, exported.stderr
    tsv = read_tuning_db(str(again), version="2219")
    for w in summary["winners"]:
        assert w["perf_config"] in tsv.values()
    with db.session() as s:
        steps = s.scalar(sa.select(sa.func.count()).select_from(SearchStep)) or 0
        pid = s.scalar(sa.select(Result.problem_id).where(Result.session_id == sid).limit(1))
    assert steps == sum(len(c) for c in candidates_of(db, sid).values())
    dashboard_shows_the_search(db_url, sid, pid, strategy)


def dashboard_shows_the_search(db_url: str, sid: int, pid: int, strategy: str) -> None:
    """The session page says the search and budget; the candidates table has each one's round,
    and its one winner mark is the winner's (the fastest of every round)."""
    ro = open_read_only(db_url)
    try:
        client = TestClient(create_app(ro), base_url="http://127.0.0.1")
        page = client.get(f"/sessions/{sid}").text
        assert f'id="session-search">{strategy}<' in page
        assert f'id="session-budget">{BUDGET}<' in page
        table = client.get(f"/api/problems/{pid}/table?session={sid}&sort=search_round").json()
        assert table["rows"] and all(r["search_round"] is not None for r in table["rows"])
        assert sum(r["winner"] for r in table["rows"]) == 1
        assert table["rule"].startswith(f"searched ({strategy})")
        csv = client.get(f"/api/problems/{pid}/candidates.csv?session={sid}").text
        assert csv.splitlines()[0].endswith(",round")
    finally:
        ro.dispose()


@pytest.mark.backends("sqlite", "postgresql", "mysql", fast=("sqlite",))
@pytest.mark.parametrize("strategy", CHOOSING)
def test_a_worker_killed_mid_search_loses_nothing_and_measures_nothing_twice(
    db, db_url, tmp_path, strategy
):
    """The sleep tuner makes each round slow (1 s); the worker is SIGKILLed once a round's
    measurements are stored, and the next worker (after the lease) replays them: the job's
    candidates are those steps plus only configs not measured before, within the budget."""
    budget = 25
    configs = tmp_path / "gemm"
    configs.write_text(GEMMS.splitlines()[0] + "\n")
    assert cli(db_url, "import", "--op", "gemm", "--tag", "k", str(configs)).code == 0
    made = cli(db_url, "session", "new", "--tuner", "sleep:1", "--search", strategy,
               "--budget", str(budget), "--json")  # fmt: skip
    assert made.code == 0, made.stderr
    sid = made.json()["id"]
    assert cli(db_url, "jobs", "load", "--session", str(sid), "--tag", "k").code == 0
    argv = mlirtuna_argv("worker", "--session", str(sid), "--lease", "3", "--until-empty")
    env = subprocess_env(db_url)
    first = subprocess.Popen(argv, env=env, stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL)
    try:
        wait_for(lambda: steps_of(db) != [], timeout=120)
        first.send_signal(signal.SIGKILL)
        first.wait(timeout=30)
    finally:
        if first.poll() is None:
            first.kill()
    kept = steps_of(db)
    assert 0 < len(kept) < budget
    second = subprocess.run(argv, env=env, capture_output=True, text=True, timeout=300)
    assert second.returncode == 0, second.stderr
    with db.session() as s:
        job = s.scalars(sa.select(Job).where(Job.session_id == sid)).one()
        assert job.state == "completed"
    cands = candidates_of(db, sid)[job.id]
    configs_measured = [c.perf_config for c in cands]
    assert len(configs_measured) == len(set(configs_measured)) <= budget
    # The dead attempt's measurements are the job's, with their rounds: not measured again.
    first_rounds = {pc: r for pc, r, _ in kept}
    for c in cands:
        if c.perf_config in first_rounds:
            assert c.search_round == first_rounds[c.perf_config]
    assert set(first_rounds) <= set(configs_measured)
    all_steps = steps_of(db)
    assert len(all_steps) == len({pc for pc, _, _ in all_steps}) == len(cands)
    assert len({token for _, _, token in all_steps}) == 2  # two attempts measured
    assert_searched(db, sid, budget)


def steps_of(db: Database) -> list[tuple[str, int, str]]:
    with db.session() as s:
        rows = s.execute(
            sa.select(SearchStep.perf_config, SearchStep.search_round, SearchStep.lease_token)
        ).all()
    return [tuple(r) for r in rows]  # type: ignore[misc]


@pytest.mark.backends("sqlite")
def test_search_options_are_refused_in_one_line(db_url, tmp_path):
    def refused(*args: str, says: str) -> None:
        run = cli(db_url, "session", "new", "--tuner", "cpu", *args)
        assert run.code == 2, run.stderr
        lines = run.stderr.strip().splitlines()
        assert len(lines) == 1 and says in lines[0], run.stderr

    refused("--search", "random", says="--budget N")
    refused("--budget", "5", says="--search")
    refused("--search", "no-such", "--budget", "5", says=", ".join(search.names()))
    refused("--search", "random", "--budget", "0", says="1 or more")
    refused("--tuner", "plugins.claimlog:Failing", "--search", "random", "--budget", "5",
            says="cannot measure chosen candidates")  # fmt: skip
    configs = tmp_path / "gemm"
    configs.write_text(GEMMS)
    run = cli(db_url, "run", "--op", "gemm", "--search", "random", str(configs))
    assert run.code == 2 and "--budget N" in run.stderr
    # Nothing half-written: no session was opened by any of them.
    assert cli(db_url, "session", "list", "--json").json() == []


@pytest.mark.backends("sqlite")
def test_a_searched_session_is_not_equivalent_to_a_whole_space_one(db):
    def opened(**kw) -> sessions.Session:
        return sessions.create(db, sessions.SessionSpec(tuner="cpu", tuning_space="full", **kw))

    whole, searched_a = opened(), opened(search="random", search_budget=10)
    searched_b, other_budget = (
        opened(search="random", search_budget=10),
        opened(search="random", search_budget=20),
    )
    assert not reuse.equivalent(whole, searched_a)
    assert reuse.equivalent(searched_a, searched_b)
    assert not reuse.equivalent(searched_a, other_budget)


@pytest.mark.backends("sqlite")
def test_the_search_starts_from_the_farms_history_of_the_op(db, db_url, tmp_path):
    """A whole-space session's candidates of other problems of the op become the history of a
    searched job, carried to its problem's configs (the cpu tuner clips block sizes)."""
    configs = tmp_path / "gemm"
    configs.write_text(GEMMS)
    whole = run_cli(db_url, "run", "--op", "gemm", "--tuning-space", "full", "--json",
                    "-o", str(tmp_path / "w.tsv"), str(configs), timeout=600)  # fmt: skip
    assert whole.code == 0, whole.stderr
    target = sessions.create(
        db,
        sessions.SessionSpec(tuner="cpu", tuning_space="full", search="random", search_budget=5),
    )
    with db.session() as s:
        pid = s.scalar(sa.select(ProblemRow.id).order_by(ProblemRow.id))
        problem = catalog.load_problem(s, pid)
    tuner = tuners.make("cpu")
    ctx = TuneContext("cpu", "cpu", 1, 1, "full")
    keys = tuner.search_space(problem, ctx)  # type: ignore[attr-defined]
    job = searched.SearchedJob(db, target, tuner, Lease(0, "t", target.id, pid, 0), lambda fn: fn())
    history = searched.farm_history(job, problem, keys)
    # Both problems of the whole session: its own (same keys) and the other one (carried).
    assert len(history.units) == 2
    assert history.times.shape == (2, len(keys))
    assert all(np.isfinite(row).sum() >= len(keys) // 2 for row in history.times)
    assert np.isfinite(history.times).any()
    # A session never learns from itself.
    self_job = searched.SearchedJob(db, sessions.get(db, whole.json()["session"]), tuner,
                                    job.lease, lambda fn: fn())  # fmt: skip
    assert searched.farm_history(self_job, problem, keys).units == ()


def test_sleep_tuner_round_measures_exactly_the_configs_given():
    problem = problems.parse("gemm", GEMMS.splitlines()[0])
    tuner = tuners.make("sleep:0")
    ctx = TuneContext("cpu", "cpu", 1, 1, "full", perf_configs=("sleep:v1:3",))
    assert [c.perf_config for c in tuner.tune(problem, ctx).candidates] == ["sleep:v1:3"]


@pytest.mark.backends("postgresql", "mysql")
def test_the_worker_role_runs_a_searched_session(server_db, tmp_path):
    """The least-privilege worker role writes a searched job's steps and candidates (INSERT
    search_step), and nothing more: it cannot change or delete a step once written."""
    path = tmp_path / "gemm"
    path.write_text(GEMMS)
    catalog.import_files(server_db, "gemm", [str(path)], tag="r")
    spec = sessions.SessionSpec(tuner="sleep", search="random", search_budget=12)
    sid = sessions.create(server_db, spec).id
    jobs.load(server_db, sid, tag="r")
    with role_prefix(server_db) as name:
        roles.apply_roles(server_db, name)
        worker_db = as_role(server_db, f"{name}_worker")
        try:
            settings = WorkerSettings(session_id=sid, tuner="sleep", until_empty=True)
            assert Worker(worker_db, settings, tuner=SleepTuner(0)).run().completed == 2
            assert refused(worker_db, "UPDATE search_step SET kernel_time = 1", commit=False)
            assert refused(worker_db, "DELETE FROM search_step", commit=False)
        finally:
            worker_db.dispose()
    assert len(steps_of(server_db)) == 24
    assert_searched(server_db, sid, 12)


@pytest.mark.backends("sqlite")
def test_run_into_a_session_refuses_another_search(db, db_url, tmp_path):
    sid = sessions.create(
        db, sessions.SessionSpec(tuner="cpu", search="random", search_budget=5)
    ).id
    configs = tmp_path / "gemm"
    configs.write_text(GEMMS)
    for flags in (["--search", "exhaustive"], ["--budget", "6"]):
        run = cli(db_url, "run", "--session", str(sid), "--op", "gemm", *flags, str(configs))
        assert run.code == 2, run.stderr
        assert f"session {sid} was opened with search random (budget 5)" in run.stderr
    with db.session() as s:
        assert s.scalar(sa.select(sa.func.count()).select_from(Job)) == 0


def test_the_cpu_tuner_lists_its_space_and_measures_exactly_a_round():
    problem = problems.parse("gemm", GEMMS.splitlines()[0])
    tuner = CpuTuner(repeats=1)
    ctx = TuneContext("cpu", "cpu", 1, 1, "full")
    keys = tuner.search_space(problem, ctx)
    assert len(keys) == len(set(keys)) > 10
    assert tuner.search_space(problem, replace(ctx, tuning_space="greedy")) == keys  # its grid
    chosen = tuple(keys[3:6])
    out = tuner.tune(problem, replace(ctx, perf_configs=chosen))
    assert [c.perf_config for c in out.candidates] == list(chosen)


@pytest.mark.backends("sqlite")
def test_a_round_the_tool_failed_is_invalid_here_and_not_kept_for_the_next_attempt(db, tmp_path):
    """The first round's tool call fails: its configs are this attempt's invalid candidates
    (round 0, the tool's error), the search goes on to the budget, and search_step keeps only
    what was measured (a new attempt may try the failed round's configs again)."""
    path = tmp_path / "gemm"
    path.write_text(GEMMS.splitlines()[0] + "\n")
    catalog.import_files(db, "gemm", [str(path)], tag="f")
    spec = sessions.SessionSpec(tuner="sleep", search="random", search_budget=30)
    sid = sessions.create(db, spec).id
    jobs.load(db, sid, tag="f")
    settings = WorkerSettings(session_id=sid, tuner="sleep", until_empty=True)
    assert Worker(db, settings, tuner=FirstRoundFails()).run().completed == 1
    cands = next(iter(candidates_of(db, sid).values()))
    failed = [c for c in cands if c.error is not None]
    assert failed and all(c.search_round == 0 for c in failed)
    assert all(c.error.startswith("round failed: tuningRunner exited 1") for c in failed)
    assert len(cands) == 30
    kept = {pc for pc, _, _ in steps_of(db)}
    assert kept == {c.perf_config for c in cands if c.error is None}
    assert_searched(db, sid, 30)
