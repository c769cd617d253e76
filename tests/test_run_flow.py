"""`mlirtuna run` as a new user meets it: the build dir, skipped problems, the exported file,
and every example of the README (issue 10, points 3, 4 and 6)."""

from __future__ import annotations

import os
import re
import subprocess
from pathlib import Path

import pytest
from support.clitools import cli, mlirtuna_argv, subprocess_env
from support.perfrunner_reader import read_tuning_db

from mlirtuna import flow
from mlirtuna.errors import UserError

# The backend changes nothing here (the queue, records and SQL of their own are tested on every
# backend in their own files): SQLite only, to keep the suite quick.
pytestmark = pytest.mark.backends("sqlite")

ROOT = Path(__file__).parent.parent
EXAMPLES = ROOT / "examples"
GEMM = "-t f32 -out_datatype f32 -transA false -transB false -g 1 -m {m} -n 16 -k 16\n"
CONV = "conv -F 1 -f NCHW -I NCHW -O NCHW -n 1 -c 8 -H 8 -W 8 -k 8 -y 3 -x 3 -p 1 -q 1 -u 1 -v 1 -l 1 -j 1 -g 1\n"  # noqa: E501


# --- 3. a typo'd build dir is an error, never a quiet cpu run ----------------------------------


@pytest.mark.parametrize("how", ["flag", "env"])
def test_typod_build_dir_is_an_error(db_url, tmp_path, monkeypatch, how):
    monkeypatch.delenv("MLIRTUNA_ROCMLIR_BUILD", raising=False)
    typo = tmp_path / "rocMLIR" / "biuld"
    typo.mkdir(parents=True)
    args = ["run", "--op", "gemm", str(EXAMPLES / "gemm-small")]
    if how == "flag":
        run = cli(db_url, *args, "--mlir-build-dir", str(typo))
    else:
        run = cli(db_url, *args, env={"MLIRTUNA_ROCMLIR_BUILD": str(typo)})
    assert run.code == 2, run.stderr
    line = run.stderr.strip()
    assert "\n" not in line and str(typo) in line and "bin/tuningRunner.py" in line
    assert cli(db_url, "session", "list", "--json").json() == []  # nothing written


def test_auto_picks_cpu_only_without_a_build_dir(tmp_path, monkeypatch):
    monkeypatch.delenv("MLIRTUNA_ROCMLIR_BUILD", raising=False)
    assert flow.choose_tuner("auto", None)[0] == "cpu"
    with pytest.raises(UserError, match=r"bin/tuningRunner\.py"):
        flow.choose_tuner("auto", str(tmp_path))
    (tmp_path / "bin").mkdir()
    (tmp_path / "bin" / "tuningRunner.py").write_text("")
    assert flow.choose_tuner("auto", str(tmp_path))[0] == "rocmlir"


# --- 4. problems the cpu tuner cannot run are left out up front, with a warning ---------------


def test_run_skips_what_the_cpu_tuner_cannot_run(db_url, tmp_path):
    path = tmp_path / "conv"
    path.write_text(CONV.replace("conv ", "", 1))  # no prefix: --data-type expands it
    run = cli(
        db_url, "run", "--op", "conv", "--tuning-space", "quick", "--data-type", "f32,fp8",
        "--direction", "fwd", "--quiet", "-o", str(tmp_path / "t.tsv"), str(path),
    )  # fmt: skip
    assert run.code == 0, run.stderr
    warning = [x for x in run.stderr.splitlines() if x.startswith("warning: skipping")]
    assert len(warning) == 1 and "1 problem" in warning[0] and "fp8" in warning[0]
    jobs = cli(db_url, "jobs", "list", "--session", "1", "--json").json()
    assert len(jobs) == 1 and "convfp8" not in jobs[0]["test_vector"]


def test_run_with_nothing_the_cpu_tuner_can_run_is_an_error(db_url, tmp_path):
    path = tmp_path / "g"
    path.write_text(GEMM.format(m=8).replace("f32", "fp8", 1))
    run = cli(db_url, "run", "--op", "gemm", "--quiet", str(path))
    assert run.code == 2 and "fp8" in run.stderr and "\n" not in run.stderr.strip()
    assert cli(db_url, "session", "list", "--json").json() == []


# --- 6. run writes every op's newest winners, never only the last run's -----------------------


def test_gemm_then_conv_run_keeps_both_ops_in_the_tuning_db(db_url, tmp_path):
    (tmp_path / "gemm").write_text(GEMM.format(m=8) + GEMM.format(m=16))
    (tmp_path / "conv").write_text(CONV)
    out = tmp_path / "t.tsv"
    for op, extra in (("gemm", ()), ("conv", ("--no-expand",))):
        run = cli(
            db_url, "run", "--op", op, "--tuner", "sleep:0", *extra, "--quiet", "-o", str(out),
            str(tmp_path / op),
        )  # fmt: skip
        assert run.code == 0, run.stderr
    assert "every op" in run.stderr and "export --arch" in run.stderr
    vectors = {key[1] for key in read_tuning_db(str(out), version="2219")}
    assert sum(v.startswith("-t f32") for v in vectors) == 2  # the gemm run's rows are kept
    assert sum(v.startswith("conv ") for v in vectors) == 1


# --- 4. every example runs with exactly the README's command and exits 0 ----------------------


def readme_commands() -> list[str]:
    text = (ROOT / "README.md").read_text()
    return re.findall(r"^(mlirtuna run --op \w+ examples/\S+)$", text, flags=re.M)


def test_readme_shows_a_command_for_every_example():
    shown = {cmd.split()[-1] for cmd in readme_commands()}
    configs = {f"examples/{p.name}" for p in EXAMPLES.iterdir() if p.name.endswith("-small")}
    assert configs and shown == configs


@pytest.mark.slow
@pytest.mark.parametrize("command", readme_commands())
def test_example_runs_as_the_readme_says(command, tmp_path):
    """In a fresh directory (the README's commands run from a clone's root): exit 0."""
    env = subprocess_env(f"sqlite:///{tmp_path / 'mlirtuna.db'}")
    env.pop("MLIRTUNA_DB")
    env.pop("MLIRTUNA_ROCMLIR_BUILD", None)
    workdir = tmp_path / "clone"
    workdir.mkdir()
    os.symlink(EXAMPLES, workdir / "examples")
    argv = mlirtuna_argv(*command.split()[1:])
    done = subprocess.run(
        argv, cwd=workdir, env=env, capture_output=True, text=True, timeout=600, check=False
    )
    assert done.returncode == 0, done.stderr
    written = "tuning_fusion_*.tsv" if "--op fusion" in command else "mlir_tuning_*.tsv"
    assert list(workdir.glob(written)) and (workdir / "mlirtuna.db").exists()
