"""examples/Jenkinsfile, run (issues 35, 44): its shell steps, parsed out of the file itself, and
the steps that move the build between nodes (stash, unstash), run in the pipeline's order with
each stage an agent of its own (workspace and host name), the parallel branches at once
(tests/support/jenkins.py), on every backend, each stage logged in as the role the file gives it.

- The default path: rocMLIR checked out (a stand-in source tree: a git checkout of its own whose
  CMakeLists.txt builds mlirtuna's stand-in, tests/support/standin_rocmlir), built once by
  cmake and ninja, stashed, unstashed on two GPU nodes; one node's worker killed mid-job: the
  build is UNSTABLE, the other node tunes its job after one lease, export and compare run, and
  every node tuned with the build of the session's commit (a build of another is refused).
- The dry run: a job fails on purpose: the wait step reports it (UNSTABLE) and export and
  compare still run; a second run compares with the first's tuning DB, as Copy Artifact hands
  it over.
- Hostile parameters run nothing and write no secret; a workspace and a config list with a
  space and a quote work."""

from __future__ import annotations

import itertools
import os
import re
import shutil
import signal
import subprocess
import sys
import threading
import time
import uuid
from pathlib import Path

import pytest
import sqlalchemy as sa
from support import jenkins
from support.clitools import SRC
from support.standin import with_overlay

from mlirtuna import standin
from mlirtuna.db import roles
from mlirtuna.db.models import Attempt, Job, TuningSession
from mlirtuna.defaults import (
    DEFAULT_BACKOFF_S,
    DEFAULT_MAX_RETRIES,
    ENV_GPU_LOCK_DIR,
    ENV_RETRY_BACKOFF,
)

FAILING = "-m 512"  # the stand-in's config list holds one GEMM with it: its job fails
# The failing job is retried as the file runs it, but the first retry waits this long, not the
# default 10 s (then 20 s): as the farm's own environment would set it, not the file.
BACKOFF_S = 0.2
LEASE_S = "2"  # a lost node's job back to the others after 2 s, not the file's 120
DEFAULT_CONFIG_LIST = "mlir/utils/performance/configs/tier1-gemm-configs"  # the file's default
SOURCE_FIXTURE = Path(__file__).parent / "support" / "standin_rocmlir" / "CMakeLists.txt"
GPU_NODES = ("GPU node 1", "GPU node 2")
SECRET = "s3cret-jenkins-credential"  # what withCredentials puts in MLIRTUNA_DB_PASSWORD


def test_the_pipeline_is_parsed_in_the_order_jenkins_runs_it():
    text = jenkins.JENKINSFILE.read_text()
    scripts, phases = jenkins.steps(text), jenkins.phases(text)
    assert list(scripts) == ["STEP_CHECKOUT", "STEP_BUILD", "STEP_SESSION", "STEP_WORKER",
                             "STEP_WAIT", "STEP_EXPORT", "STEP_COMPARE"]  # fmt: skip
    first, tune = phases
    (build_actions,) = first.branches.values()
    assert [(a.kind, a.arg) for a in build_actions] == [
        ("sh", "STEP_CHECKOUT"), ("sh", "STEP_BUILD"), ("stash", "rocmlir-build"),
        ("sh", "STEP_SESSION"),
    ]  # fmt: skip
    assert [a.keep_stdout_in for a in build_actions if a.keep_stdout_in] == [
        "ROCMLIR_COMMIT", "SESSION"]  # fmt: skip
    assert list(tune.branches) == [*GPU_NODES, "Export and compare"]
    for node in GPU_NODES:  # the build unstashed, never built again; the whole branch caught
        actions = tune.branches[node]
        assert [(a.kind, a.arg) for a in actions] == [
            ("sh", "STEP_CHECKOUT"), ("deleteDir", "rocmlir-build"),
            ("unstash", "rocmlir-build"), ("sh", "STEP_WORKER"),
        ]  # fmt: skip
        assert all(a.caught for a in actions)
    export = tune.branches["Export and compare"]
    assert [a.arg for a in export if a.caught] == ["STEP_WAIT"]
    assert [a.arg for a in export] == ["STEP_WAIT", "STEP_EXPORT", "STEP_COMPARE"]
    header = text.split("pipeline {")[0]
    for plugin in ("Copy Artifact", "Lockable Resources", "Credentials Binding", "Timestamper",
                   "Pipeline (workflow-aggregator"):  # fmt: skip
        assert plugin in header
    assert "§5" not in text and "docs/ci.md §6" in text  # the roles' section
    assert 'lock(resource: "gpus-${env.NODE_NAME}")' in text
    for role in ("ADMIN_DB", "WORKER_DB", "READER_DB"):
        assert f'export MLIRTUNA_DB="${role}"' in text


def test_no_step_evals_or_sources_what_a_parameter_wrote():
    """Parameters reach the steps as environment variables only: no step evals, and the only
    file a step sources is the one `mlirtuna try-rocmlir --setup-only` wrote (quoted by it)."""
    for name, script in jenkins.steps(jenkins.JENKINSFILE.read_text()).items():
        assert not re.search(r"\beval\b", script), name
        for line in script.splitlines():
            if re.match(r"\s*(\.|source)\s", line):
                assert line.strip() == '. "$WORKSPACE/standin.env"', (name, line)
        # Every expansion of a parameter is quoted (inside "…"), never bare shell text.
        for param in ("CONFIG_LIST", "ROCMLIR_REF", "ROCMLIR_BUILD", "ARCH", "ROCMLIR_URL"):
            for line in script.splitlines():
                for m in re.finditer(r"\$\{?" + param + r"\b", line):
                    assert line[: m.start()].count('"') % 2 == 1, (name, line)


# -- the environment of a run --------------------------------------------------------------------


def role_urls(db, db_url: str) -> tuple[dict[str, str], str | None]:
    """ADMIN_DB, WORKER_DB, READER_DB: the roles of `db roles` on a server, the file on SQLite."""
    if db.is_sqlite:
        return {k: db_url for k in ("ADMIN_DB", "WORKER_DB", "READER_DB")}, None
    prefix = f"j{uuid.uuid4().hex[:10]}"
    roles.apply_roles(db, prefix)
    urls = {
        f"{role.upper()}_DB": db.url.set(
            username=f"{prefix}_{role}", password=None
        ).render_as_string(hide_password=False)
        for role in ("admin", "worker", "reader")
    }
    return urls, prefix


def farm_env(tmp_path: Path, urls: dict[str, str], **params: str) -> dict[str, str]:
    """The pipeline's environment block, its parameters, and what a node has: `mlirtuna` on
    PATH (as a plain install puts it) and ROCm's rocminfo (the stand-in's: one gfx942)."""
    bin_dir = tmp_path / "bin"
    bin_dir.mkdir(exist_ok=True)
    (bin_dir / "mlirtuna").write_text(f'#!/bin/sh\nexec "{sys.executable}" -m mlirtuna "$@"\n')
    (bin_dir / "mlirtuna").chmod(0o755)
    rocm = standin.BUILD / "below" / "bin"
    env = {k: v for k, v in os.environ.items() if not k.startswith(("FAKE_", "MLIRTUNA_"))}
    env = standin.environment(env)
    env |= urls | {
        "PATH": f"{bin_dir}{os.pathsep}{rocm}{os.pathsep}{env['PATH']}",
        "PYTHONPATH": with_overlay({"PYTHONPATH": SRC})["PYTHONPATH"],  # faults: the overlay's
        "ARCH": "gfx942", "ROCMLIR_BUILD": "", "ROCMLIR_REF": "develop",
        "CONFIG_LIST": DEFAULT_CONFIG_LIST, "DRY_RUN": "false", "BUILD_TAG": "jenkins-weekly-1",
        "WORKER_LEASE_S": LEASE_S, "WAIT_TIMEOUT_S": "300", "FAKE_GPU_COUNT": "1",
        "FAKE_TUNINGRUNNER_FAULT": "fail", "FAKE_TUNINGRUNNER_FAULT_CONFIG": FAILING,
        ENV_RETRY_BACKOFF: str(BACKOFF_S),
    }  # fmt: skip
    return env | params


def node_env(tmp_path: Path) -> jenkins.Agents:
    """Each node's own GPU lock directory (each is a host of its own; the runs on the other
    backends, at the same time in other test processes, hold their "GPU 0" too)."""
    return jenkins.Agents(env=lambda stage: {ENV_GPU_LOCK_DIR: str(tmp_path / "locks" / stage)})


def git(repo: Path, *args: str) -> str:
    return subprocess.run(
        ["git", "-C", str(repo), "-c", "user.email=t@example.com", "-c", "user.name=t", *args],
        check=True, capture_output=True, text=True,
    ).stdout.strip()  # fmt: skip


def pipeline_checkout(root: Path) -> None:
    """Jenkins checks the pipeline's repository out into each workspace: the build lies in a
    git tree of its own commit, which is not rocMLIR's."""
    root.mkdir(parents=True)
    (root / "Jenkinsfile").write_text(jenkins.JENKINSFILE.read_text())
    git(root, "init", "-q")
    git(root, "add", "Jenkinsfile")
    git(root, "commit", "-qm", "the pipeline")


def rocmlir_source(tmp_path: Path) -> tuple[Path, str]:
    """The stand-in rocMLIR repository (ROCMLIR_URL): a CMakeLists.txt that builds the stand-in
    and the default config list; its commit."""
    src = tmp_path / "rocMLIR upstream"
    (src / DEFAULT_CONFIG_LIST).parent.mkdir(parents=True)
    shutil.copy(SOURCE_FIXTURE, src / "CMakeLists.txt")
    (src / DEFAULT_CONFIG_LIST).write_text("".join(g + "\n" for g in standin.GEMMS))
    git(src, "init", "-q", "-b", "develop")
    git(src, "add", ".")
    git(src, "commit", "-qm", "rocMLIR")
    return src, git(src, "rev-parse", "HEAD")


def files_holding(root: Path, needles: list[str]) -> list[Path]:
    found = []
    for path in root.rglob("*"):
        if path.is_file() and not path.is_symlink():
            data = path.read_bytes()
            if any(n.encode() in data for n in needles if n):
                found.append(path)
    return found


# -- the default path: build once, two nodes, one lost ------------------------------------------


@pytest.mark.slow
def test_the_default_path_builds_once_and_survives_a_lost_node(db, db_url, tmp_path):
    if not shutil.which("cmake") or not shutil.which("ninja"):
        pytest.skip("cmake and ninja build the stand-in rocMLIR source (.ci/run installs them)")
    urls, prefix = role_urls(db, db_url)
    upstream, commit = rocmlir_source(tmp_path)
    # A workspace path with a space and a quote in it, as a Jenkins job name can give.
    root = tmp_path / "jobs" / 'weekly "it\'s" tuning'
    pipeline_checkout(root)
    env = farm_env(tmp_path, urls, ROCMLIR_URL=str(upstream))
    killed: list[int] = []
    agents = lost_node_agents(tmp_path, db, killed)
    try:
        ran = jenkins.run(root, env, agents)
        steps = ran.steps
        assert killed, _said(ran)
        assert ran.result == "UNSTABLE", _said(ran)
        assert ran.failed_stages == {"GPU node 1", "Export and compare"}, _said(ran)
        # Built once: the Tune branches ran no cmake, they unstashed the one build.
        assert [k for k in steps if k.startswith("STEP_BUILD")] == [
            "STEP_BUILD@Build, session and jobs"]  # fmt: skip
        for node in GPU_NODES:
            built = root / jenkins.slug(node) / "rocmlir-build"
            assert (built / "CMakeCache.txt").is_file() and (
                built / "bin" / "tuningRunner.py"
            ).exists()
            assert git(root / jenkins.slug(node) / "rocMLIR", "rev-parse", "HEAD") == commit
        with db.session() as s:
            session = s.scalars(sa.select(TuningSession)).one()
            assert (session.mlir_v, session.standin) == (commit, True)
            attempts = s.execute(sa.select(Attempt.machine_name, Attempt.outcome)).all()
            states = dict(s.execute(sa.select(Job.id, Job.state)).all())
        # Both nodes tuned jobs to the end (node 1 before it was lost, with the same build).
        assert {m for m, outcome in attempts if outcome == "completed"} == {
            "gpu-node-1",
            "gpu-node-2",
        }
        assert sorted(states.values()) == ["completed"] * (len(standin.GEMMS) - 1) + ["error"]
        code, listed = steps["STEP_WAIT@Export and compare"].returncode, steps[
            "STEP_WAIT@Export and compare"].stdout  # fmt: skip
        assert code == 1 and FAILING in listed
        export_ws = root / "Export-and-compare"
        rows = [r for r in (export_ws / "mlir_tuning_gfx942.tsv").read_text().splitlines()
                if r and not r.startswith("#")]  # fmt: skip
        assert len(rows) == len(standin.GEMMS) - 1
        assert all(commit in r for r in rows), rows  # the tools of the session's commit
        assert "nothing to compare" in steps["STEP_COMPARE@Export and compare"].stdout
        assert_a_build_of_another_commit_is_refused(root, upstream, env, session.id)
    finally:
        if prefix:
            roles.drop_roles(db, prefix)


def lost_node_agents(tmp_path: Path, db, killed: list[int]) -> jenkins.Agents:
    """Node 1 tunes slowly and is lost (SIGKILL to its whole process group, as a dying agent
    takes its processes) once it has tuned a job and holds the next; node 2's agent comes
    online after that."""
    holds = threading.Event()
    node1 = Attempt.machine_name == "gpu-node-1"

    def holding_a_job(proc) -> None:
        while proc.poll() is None:
            with db.session() as s:
                held = s.scalar(sa.select(Attempt.id).where(node1, Attempt.outcome.is_(None)))
                tuned = s.scalar(sa.select(Attempt.id).where(node1, Attempt.outcome == "completed"))
            if held is not None and tuned is not None:
                os.killpg(proc.pid, signal.SIGKILL)
                killed.append(proc.pid)
                break
            time.sleep(0.05)
        holds.set()

    def started(stage: str, step: str, proc) -> None:
        if stage == "GPU node 1" and step == "STEP_WORKER":
            threading.Thread(target=holding_a_job, args=(proc,), daemon=True).start()

    def before(stage: str) -> None:
        if stage == "GPU node 2":
            holds.wait(timeout=300)

    def env(stage: str) -> dict[str, str]:
        slow = {"FAKE_TUNINGRUNNER_DELAY": "2"} if stage == "GPU node 1" else {}
        return {ENV_GPU_LOCK_DIR: str(tmp_path / "locks" / stage)} | slow

    return jenkins.Agents(env=env, started=started, before=before)


def assert_a_build_of_another_commit_is_refused(root, upstream, env, session_id) -> None:
    """A node whose build is of another rocMLIR commit than the session's: its worker stops
    before claiming, one line, exit 2."""
    node = root / "GPU-node-3"
    node.mkdir()
    (upstream / "NEWS").write_text("a later commit\n")
    git(upstream, "add", "NEWS")
    git(upstream, "commit", "-qm", "later")
    git(node, "clone", "-q", str(upstream), "rocMLIR")
    subprocess.run(["cmake", "-G", "Ninja", "-S", node / "rocMLIR", "-B", node / "rocmlir-build"],
                   check=True, capture_output=True, env=env)  # fmt: skip
    script = jenkins.steps(jenkins.JENKINSFILE.read_text())["STEP_WORKER"]
    done = subprocess.run(
        ["bash", "-c", script], cwd=node, capture_output=True, text=True,
        env=env | {"WORKSPACE": str(node), "SESSION": str(session_id),
                   ENV_GPU_LOCK_DIR: str(node / "locks")},
    )  # fmt: skip
    assert done.returncode == 2 and "was built from rocMLIR" in done.stderr, done.stderr


def _said(ran: jenkins.Ran) -> str:
    return "\n".join(
        f"{k}: rc {v.returncode}\n{v.stdout[-800:]}{v.stderr[-1500:]}" for k, v in ran.steps.items()
    )


# -- hostile parameters ----------------------------------------------------------------------------

HOSTILE = (
    "x; env > LEAK #",
    # a command substitution, backticks, both quotes, a newline and spaces, in one value
    '$(touch PWNED) `touch PWNED` it\'s "q"; touch PWNED\n touch PWNED #',
)


@pytest.mark.slow
@pytest.mark.backends("postgresql")  # a server's passwords to leak; the shell is the same on all
@pytest.mark.parametrize("hostile", HOSTILE)
def test_hostile_parameters_run_nothing_and_write_no_secret(db, db_url, tmp_path, hostile):
    """Each parameter a step reads, set to shell text: the first stage (checkout, build,
    session) and the export run it as a value, never as a command: no LEAK or PWNED file
    anywhere, no database URL or password in any file of the workspaces."""
    urls, prefix = role_urls(db, db_url)
    upstream, _ = rocmlir_source(tmp_path)
    try:
        for param in ("CONFIG_LIST", "ROCMLIR_REF", "ROCMLIR_BUILD", "ARCH", "BUILD_TAG"):
            root = tmp_path / "ws" / param
            pipeline_checkout(root)
            env = farm_env(tmp_path, urls, ROCMLIR_URL=str(upstream), SESSION="1",
                           MLIRTUNA_DB_PASSWORD=SECRET, **{param: hostile})  # fmt: skip
            for step in ("STEP_CHECKOUT", "STEP_BUILD", "STEP_SESSION", "STEP_EXPORT"):
                script = jenkins.steps(jenkins.JENKINSFILE.read_text())[step]
                subprocess.run(["bash", "-c", script], cwd=root, capture_output=True,
                               env=env | {"WORKSPACE": str(root)}, timeout=300)  # fmt: skip
            assert not [p for p in tmp_path.rglob("*") if p.name in ("LEAK", "PWNED")], param
            secrets = [SECRET, *urls.values()]
            assert not files_holding(root, secrets), (param, files_holding(root, secrets))
    finally:
        if prefix:
            roles.drop_roles(db, prefix)


@pytest.mark.slow
@pytest.mark.backends("sqlite")  # the paths and the config list: no SQL of their own
def test_a_prebuilt_build_with_the_default_config_list_and_quoted_paths(db, db_url, tmp_path):
    """ROCMLIR_BUILD (a build on every node) with the default CONFIG_LIST: the list is read in
    the checkout the build's CMakeCache.txt names; a CONFIG_LIST given as an absolute path with
    a space and a quote works as well."""
    if not shutil.which("cmake"):
        pytest.skip("cmake builds the stand-in rocMLIR source (.ci/run installs it)")
    urls, prefix = role_urls(db, db_url)
    upstream, commit = rocmlir_source(tmp_path)
    build = tmp_path / "it's a build"
    subprocess.run(["cmake", "-G", "Ninja", "-S", upstream, "-B", build], check=True,
                   capture_output=True, env=farm_env(tmp_path, urls))  # fmt: skip
    quoted_list = tmp_path / 'the "weekly" list\'s.txt'
    # One GEMM more: the pipeline's tag then holds the three of the default list and this one.
    quoted_list.write_text(standin.GEMMS[0].replace("-k 128", "-k 64") + "\n")
    try:
        runs = (("a", DEFAULT_CONFIG_LIST, len(standin.GEMMS)),
                ("b", str(quoted_list), len(standin.GEMMS) + 1))  # fmt: skip
        for tag, config_list, problems in runs:
            root = tmp_path / f"ws {tag}'s"
            pipeline_checkout(root)
            env = farm_env(tmp_path, urls, ROCMLIR_BUILD=str(build), CONFIG_LIST=config_list,
                           BUILD_TAG=f"weekly-{tag}")  # fmt: skip
            scripts = jenkins.steps(jenkins.JENKINSFILE.read_text())
            for step in ("STEP_CHECKOUT", "STEP_BUILD", "STEP_SESSION"):
                done = subprocess.run(
                    ["bash", "-c", scripts[step]], cwd=root, text=True, capture_output=True,
                    env=env | {"WORKSPACE": str(root)},
                )  # fmt: skip
                assert done.returncode == 0, (step, done.stderr)
            with db.session() as s:
                made = s.scalar(
                    sa.select(TuningSession).where(TuningSession.id == int(done.stdout))
                )
                assert made is not None and made.mlir_v == commit
                assert s.scalar(sa.select(sa.func.count(Job.id)).where(
                    Job.session_id == made.id)) == problems  # fmt: skip
    finally:
        if prefix:
            roles.drop_roles(db, prefix)


# -- the dry run --------------------------------------------------------------------------------


@pytest.mark.slow
def test_the_dry_run_runs_against_the_stand_in(db, db_url, tmp_path):
    urls, prefix = role_urls(db, db_url)
    env = farm_env(tmp_path, urls, DRY_RUN="true", CONFIG_LIST="unused-in-a-dry-run")
    pipeline_checkout(tmp_path / "week1")
    try:
        first = jenkins.run(tmp_path / "week1", env, node_env(tmp_path))
        assert first.result == "UNSTABLE", _said(first)
        with db.session() as s:
            assert s.scalars(sa.select(TuningSession.mlir_v)).one() == standin.COMMIT
        wait = first.steps["STEP_WAIT@Export and compare"]
        assert wait.returncode == 1 and FAILING in wait.stdout  # reported: the build UNSTABLE
        assert_retried_after_the_backoff(db)
        export_ws = tmp_path / "week1" / "Export-and-compare"
        rows = (export_ws / "mlir_tuning_gfx942.tsv").read_text().splitlines()
        tuned = [r for r in rows if r and not r.startswith("#")]
        assert len(tuned) == len(standin.GEMMS) - 1 and not any(FAILING in r for r in tuned)
        assert "nothing to compare" in first.steps["STEP_COMPARE@Export and compare"].stdout
        # Week 2: Copy Artifact hands last week's tuning DB over; the gate compares.
        week2 = tmp_path / "week2" / "Export-and-compare" / "last-week"
        week2.mkdir(parents=True)
        shutil.copy(export_ws / "mlir_tuning_gfx942.tsv", week2)
        second = jenkins.run(tmp_path / "week2", env | {"BUILD_TAG": "jenkins-weekly-2"},
                             node_env(tmp_path / "week2"))  # fmt: skip
        compare = second.steps["STEP_COMPARE@Export and compare"]
        assert compare.returncode == 0 and "common problems" in compare.stdout, compare.stderr
    finally:
        if prefix:
            roles.drop_roles(db, prefix)


def assert_retried_after_the_backoff(db) -> None:
    """The failing job (the one in error) ran every attempt --max-retries allows, each retry
    after the backoff the environment set (doubling), not the default."""
    with db.session() as s:
        (job,) = s.scalars(sa.select(Job).where(Job.state == "error"))
        attempts = s.execute(
            sa.select(Attempt.outcome, Attempt.claimed_at)
            .where(Attempt.job_id == job.id)
            .order_by(Attempt.id)
        ).all()
    assert job.retries == DEFAULT_MAX_RETRIES
    assert [a.outcome for a in attempts] == ["failed"] * DEFAULT_MAX_RETRIES
    gaps = [(b.claimed_at - a.claimed_at).total_seconds() for a, b in itertools.pairwise(attempts)]
    assert gaps[0] >= 0.8 * BACKOFF_S and gaps[1] >= 0.8 * 2 * BACKOFF_S, gaps
    assert max(gaps) < DEFAULT_BACKOFF_S, gaps
