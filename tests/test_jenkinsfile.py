"""examples/Jenkinsfile, run (issue 35): its shell steps, parsed out of the file itself, run in
the pipeline's order against the stand-in build (its DRY_RUN), on every backend, with each stage
logged in as the role the file gives it. A job fails on purpose: the wait step reports it (the
build is UNSTABLE) and export and compare still run. A second run compares with the first's
tuning DB, as Copy Artifact hands it over."""

from __future__ import annotations

import itertools
import os
import re
import shutil
import subprocess
import sys
import uuid
from dataclasses import dataclass
from pathlib import Path

import pytest
import sqlalchemy as sa
from support.clitools import SRC

from mlirtuna import standin
from mlirtuna.db import roles
from mlirtuna.db.models import Attempt, Job, TuningSession
from mlirtuna.defaults import (
    DEFAULT_BACKOFF_S,
    DEFAULT_MAX_RETRIES,
    ENV_GPU_LOCK_DIR,
    ENV_RETRY_BACKOFF,
)

JENKINSFILE = Path(__file__).resolve().parent.parent / "examples" / "Jenkinsfile"
FAILING = "-m 512"  # the stand-in's config list holds one GEMM with it: its job fails
# The failing job is retried as the file runs it, but the first retry waits this long, not the
# default 10 s (then 20 s): as the farm's own environment would set it, not the file.
BACKOFF_S = 0.2


@dataclass(frozen=True)
class Use:
    stage: str  # the innermost stage: one agent, one workspace
    step: str  # STEP_NAME
    keep_stdout_in: str | None  # env.NAME = sh(returnStdout: true, …)
    may_fail: bool  # inside catchError


def parse(text: str) -> tuple[dict[str, str], list[Use]]:
    """The STEP_* scripts, and each use of one in the pipeline, in order."""
    steps = dict(re.findall(r"^def (STEP_\w+) = '''\n(.*?)'''$", text, re.M | re.S))
    body = text[text.index("\npipeline {") :]
    uses = []
    for stage, inside in re.findall(r"stage\('([^']+)'\)(.*?)(?=stage\('|\Z)", body, re.S):
        for match in re.finditer(r"(env\.(\w+) = )?sh\([^)]*?script: (STEP_\w+)\)|"
                                 r"sh label: '[^']*', script: (STEP_\w+)", inside):  # fmt: skip
            step = match.group(3) or match.group(4)
            before = inside[: match.start()]
            caught = before.rfind("catchError(") > before.rfind("}")
            uses.append(Use(stage, step, match.group(2), caught))
    return steps, uses


def test_the_steps_are_used_in_the_order_they_are_written():
    steps, uses = parse(JENKINSFILE.read_text())
    assert list(steps) == ["STEP_BUILD", "STEP_SESSION", "STEP_WORKER", "STEP_WAIT",
                           "STEP_EXPORT", "STEP_COMPARE"]  # fmt: skip
    assert list(dict.fromkeys(u.step for u in uses)) == list(steps)
    assert [u.step for u in uses if u.may_fail] == ["STEP_WAIT"]
    assert [u.keep_stdout_in for u in uses if u.keep_stdout_in] == ["SESSION"]
    # Every stage that touches the build makes (or links) it on its own node first.
    for stage in {u.stage for u in uses if u.step in ("STEP_SESSION", "STEP_WORKER")}:
        assert next(u.step for u in uses if u.stage == stage) == "STEP_BUILD"
    text = JENKINSFILE.read_text()
    for plugin in ("Copy Artifact", "Lockable Resources", "Credentials Binding", "Git"):
        assert plugin in text.split("pipeline {")[0]
    assert 'lock(resource: "gpus-${env.NODE_NAME}")' in text
    for role in ("ADMIN_DB", "WORKER_DB", "READER_DB"):
        assert f'export MLIRTUNA_DB="${role}"' in text


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


def run_pipeline(tmp: Path, env: dict[str, str]) -> dict[str, tuple[int, str, str]]:
    """Every shell step in order, each stage in a workspace of its own; {step@stage: result}."""
    steps, uses = parse(JENKINSFILE.read_text())
    env = dict(env)
    out = {}
    for use in uses:
        workspace = tmp / re.sub(r"\W+", "-", use.stage)
        workspace.mkdir(parents=True, exist_ok=True)
        done = subprocess.run(
            ["bash", "-c", steps[use.step]], cwd=workspace, env=env | {"WORKSPACE": str(workspace)},
            capture_output=True, text=True, timeout=600,
        )  # fmt: skip
        out[f"{use.step}@{use.stage}"] = (done.returncode, done.stdout, done.stderr)
        assert done.returncode == 0 or use.may_fail, (use, done.stdout, done.stderr)
        if use.keep_stdout_in:
            env[use.keep_stdout_in] = done.stdout.strip()
    return out


@pytest.mark.slow
def test_the_pipeline_runs_against_the_stand_in(db, db_url, tmp_path):
    urls, prefix = role_urls(db, db_url)
    bin_dir = tmp_path / "bin"  # `mlirtuna` on PATH, as a plain install puts it
    bin_dir.mkdir()
    (bin_dir / "mlirtuna").write_text(f'#!/bin/sh\nexec "{sys.executable}" -m mlirtuna "$@"\n')
    (bin_dir / "mlirtuna").chmod(0o755)
    env = {k: v for k, v in os.environ.items() if not k.startswith(("FAKE_", "MLIRTUNA_"))}
    env |= urls | {
        "PATH": f"{bin_dir}{os.pathsep}{env['PATH']}", "PYTHONPATH": SRC,
        "ARCH": "gfx942", "ROCMLIR_BUILD": "", "CONFIG_LIST": "unused-in-a-dry-run",
        "DRY_RUN": "true", "BUILD_TAG": "jenkins-weekly-1",
        "FAKE_TUNINGRUNNER_FAULT": "fail", "FAKE_TUNINGRUNNER_FAULT_CONFIG": FAILING,
        ENV_RETRY_BACKOFF: str(BACKOFF_S),
        # This run's GPU node is a host of its own: the runs on the other backends, at the same
        # time in other test processes, hold their "GPU 0" too.
        ENV_GPU_LOCK_DIR: str(tmp_path / "gpu-locks"),
    }  # fmt: skip
    # Jenkins checks the pipeline's repository out into the workspace: the build lies in a git
    # tree of its own commit, which is not the build's (the stand-in states its own).
    git = ["git", "-C", str(tmp_path), "-c", "user.email=t@example.com", "-c", "user.name=t"]
    (tmp_path / "Jenkinsfile").write_text(JENKINSFILE.read_text())
    for step in (["init", "-q"], ["add", "Jenkinsfile"], ["commit", "-qm", "the pipeline"]):
        subprocess.run([*git, *step], check=True)
    try:
        first = run_pipeline(tmp_path / "week1", env)
        with db.session() as s:
            assert s.scalars(sa.select(TuningSession.mlir_v)).one() == standin.COMMIT
        code, listed, _ = first["STEP_WAIT@Export and compare"]
        assert code == 1 and FAILING in listed  # reported: the build goes UNSTABLE
        assert_retried_after_the_backoff(db)
        export_ws = tmp_path / "week1" / "Export-and-compare"
        rows = (export_ws / "mlir_tuning_gfx942.tsv").read_text().splitlines()
        tuned = [r for r in rows if r and not r.startswith("#")]
        assert len(tuned) == len(standin.GEMMS) - 1 and not any(FAILING in r for r in tuned)
        assert "nothing to compare" in first["STEP_COMPARE@Export and compare"][1]
        # Week 2: Copy Artifact hands last week's tuning DB over; the gate compares.
        week2 = tmp_path / "week2" / "Export-and-compare" / "last-week"
        week2.mkdir(parents=True)
        shutil.copy(export_ws / "mlir_tuning_gfx942.tsv", week2)
        second = run_pipeline(tmp_path / "week2", env | {"BUILD_TAG": "jenkins-weekly-2"})
        code, printed, err = second["STEP_COMPARE@Export and compare"]
        assert code == 0 and "common problems" in printed, err
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
