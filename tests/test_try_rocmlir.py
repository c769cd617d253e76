"""`mlirtuna try-rocmlir` (issue 35): the rocMLIR flow tried without a GPU, on the stand-in
build shipped in the package (never read from tests/): a one-stage and a two-stage session."""

from __future__ import annotations

import os
import re
import subprocess
import sys

import pytest
import sqlalchemy as sa
from support.clitools import cli, run_cli
from support.standin import with_overlay

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


# The knobs only the tests' overlay (tests/support/standin_faults) reads: never the package's.
TEST_ONLY_KNOBS = re.compile(
    r"FAULT|DELAY|SETSID|PIDFILE|IGNORE_SIGTERM|STDERR_BYTES"  # the tuningRunner's
    r"|FAKE_TUNINGRUNNER_(LOG\b|COMMIT|TWO_STAGE|STREAM_FOREIGN)|FAKE_E25_"  # its logs, old builds
    r"|FAKE_TUNINGRUNNER_E4|\blfbo\b"  # rocmlirTriton's other stored line (standin_overlay/lfbo.py)
    r"|FAKE_ROCMLIR_(GEN_FAIL|FAIL_COMPILE|CRASH|HANG|ALL_NA|SLOW|CANDIDATES|NOISE)"  # below/'s
    r"|FAKE_ROCMLIR_(TOOLS_LOG|DRIVER_NO_BENCHMARK_CONFIG|KEY_LAYOUT)"  # bin/rocmlir-gen, driver's
)


def test_the_packages_stand_in_names_no_test_knob():
    named = [
        f"{path.relative_to(standin.BUILD.parent)}:{n}: {line.strip()}"
        for path in sorted(standin.BUILD.parent.rglob("*"))
        if path.is_file() and "__pycache__" not in path.parts
        for n, line in enumerate(path.read_text(errors="replace").splitlines(), 1)
        if TEST_ONLY_KNOBS.search(line)
    ]
    assert named == []


def test_the_packages_stand_in_takes_faults_and_old_eras_only_from_the_overlay(tmp_path):
    build = standin.install(tmp_path / "build")
    line = standin.GEMMS[0]
    base = {k: v for k, v in standin.environment().items() if not k.startswith("FAKE_")}
    base.pop("PYTHONPATH", None)

    def tuning_runner(
        env: dict[str, str], space: str = "quick"
    ) -> subprocess.CompletedProcess[str]:
        argv = [sys.executable, str(build / "bin" / "tuningRunner.py"), "--op", "gemm",
                "--config", line, "--tuning-space", space, "-o", "-"]  # fmt: skip
        return subprocess.run(argv, env=env, cwd=tmp_path, capture_output=True, text=True)

    faulty = base | {"FAKE_TUNINGRUNNER_ERA": "E4", "FAKE_TUNINGRUNNER_FAULT": "fail"}
    alone = tuning_runner(faulty)  # the package's build alone: the knob means nothing
    assert alone.returncode == 0 and line.split(" -transA")[0] in alone.stdout, alone.stderr
    overlaid = tuning_runner(with_overlay(faulty))
    assert overlaid.returncode == 1 and "Tuning pipeline failed" in overlaid.stderr
    old = tuning_runner(base | {"FAKE_TUNINGRUNNER_ERA": "E2"})
    assert old.returncode == 2 and "must be E3 or E4, not 'E2'" in old.stderr
    assert tuning_runner(with_overlay(base | {"FAKE_TUNINGRUNNER_ERA": "E2"})).returncode == 0
    # rocmlirTriton's other stored line: its lfbo space and split-K keys are the overlay's only
    other = base | {"FAKE_TUNINGRUNNER_ERA": "E4", "FAKE_TUNINGRUNNER_E4": "lfbo"}
    alone = tuning_runner(other, "lfbo")
    assert alone.returncode == 2 and "invalid choice: 'lfbo'" in alone.stderr
    overlaid = tuning_runner(with_overlay(other), "lfbo")
    assert overlaid.returncode == 0 and "-supportsSplitK true\tgemm:" in overlaid.stdout


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
