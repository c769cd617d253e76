"""`mlirtuna try-rocmlir` (issue 35): the rocMLIR flow tried without a GPU, on the stand-in
build shipped in the package (never read from tests/): a one-stage and a two-stage session."""

from __future__ import annotations

import os
import subprocess

import pytest
import sqlalchemy as sa
from support.clitools import cli, run_cli

from mlirtuna import standin
from mlirtuna.db.models import Job, Result, TuningSession
from mlirtuna.errors import UserError


def test_the_build_ships_in_the_package(tmp_path):
    assert (
        "tests" not in standin.BUILD.parts and (standin.BUILD / "bin" / "tuningRunner.py").is_file()
    )
    build = standin.install(tmp_path / "build")
    runner = build / "bin" / "tuningRunner.py"
    assert os.access(runner, os.X_OK) and os.access(build / "below" / "bin" / "rocminfo", os.X_OK)
    assert len((build / "configs" / "gemm.txt").read_text().splitlines()) == len(standin.GEMMS)
    help_text = subprocess.run(
        [standin.environment()["MLIRTUNA_ROCMLIR_PYTHON"], str(runner), "--help"],
        env=standin.environment(), capture_output=True, text=True, check=True,
    ).stdout  # fmt: skip
    assert "--compile-only" in help_text  # E4: the two-stage capability
    # Not a stand-in there: refused, nothing removed.
    mine = tmp_path / "mine"
    mine.mkdir()
    (mine / "keep").write_text("x")
    with pytest.raises(UserError):
        standin.install(mine)
    assert (mine / "keep").read_text() == "x"


def test_setup_only_prints_what_a_pipeline_exports(tmp_path):
    run = cli("sqlite:///unused.db", "try-rocmlir", "--setup-only", str(tmp_path / "b"))
    assert run.code == 0, run.stderr
    assert "export MLIRTUNA_TOOL_ENV='FAKE_*'" in run.stdout.splitlines()
    assert "export FAKE_TUNINGRUNNER_ERA=E4" in run.stdout.splitlines()
    assert f"--mlir-build-dir {tmp_path / 'b'}" in run.stderr


@pytest.mark.slow
def test_one_and_two_stage_sessions_without_a_gpu(db, db_url, tmp_path):
    # As a person runs it: a process of its own, no FAKE_* or tool allowlist set beforehand.
    env = {k: "" for k in os.environ if k.startswith("FAKE_") or k == "MLIRTUNA_TOOL_ENV"}
    # Into this database only because --db names it on the command line (issue 42 §3).
    run = run_cli(db_url, "--db", db_url, "try-rocmlir", str(tmp_path / "standin"), timeout=600,
                  **env)  # fmt: skip
    assert run.code == 0, run.stderr
    assert "writing the stand-in's sessions into " in run.stderr
    with db.session() as s:
        made = s.execute(
            sa.select(TuningSession.id, TuningSession.tuner, TuningSession.split)
        ).all()
        assert set(s.scalars(sa.select(TuningSession.standin))) == {True}
        states = dict(s.execute(sa.select(Job.state, sa.func.count()).group_by(Job.state)).all())
        winners = s.scalar(sa.select(sa.func.count()).select_from(Result))
    assert [(t, sp or "") for _, t, sp in made] == [
        ("rocmlir", ""),
        ("rocmlir", "compile,benchmark"),
    ]
    n = len(standin.GEMMS)
    assert states == {"completed": 3 * n} and winners == 2 * n  # run's n + compile n + benchmark n
    assert f"tried: session {made[0][0]} (one stage) and session {made[1][0]}" in run.stderr
    assert "$ mlirtuna worker --role compile" in run.stderr
    assert run.stdout.count(f"{n} winners in session") == 0  # counts go to stderr
    assert sum("gemm " in line for line in run.stdout.splitlines()) >= 2 * n
