"""Running the CLI in tests: in-process (CliRunner) or as a real subprocess."""

from __future__ import annotations

import functools
import json
import os
import subprocess
import sys
from dataclasses import dataclass
from pathlib import Path

import click
import typer
from click.testing import CliRunner

from mlirtuna.cli import app

SRC = str(Path(__file__).resolve().parent.parent.parent / "src")


@dataclass
class Run:
    code: int
    stdout: str
    stderr: str

    def json(self):
        return json.loads(self.stdout)


def cli(db_url: str, *args: str, env: dict[str, str] | None = None) -> Run:
    """`mlirtuna --db URL ARGS…` in-process; stdout and stderr kept apart."""
    result = CliRunner().invoke(command(), ["--db", db_url, *args], env=env, catch_exceptions=False)
    return Run(result.exit_code, result.stdout, result.stderr)


@functools.cache
def command() -> click.Command:
    """The app as Click sees it, made once per test process: Typer's CliRunner remakes it from
    the annotations on every call (27 ms, 80 % of a refused command's time in-process)."""
    return typer.main.get_command(app)


def subprocess_env(db_url: str, **extra: str) -> dict[str, str]:
    env = dict(os.environ, MLIRTUNA_DB=db_url, PYTHONUNBUFFERED="1", **extra)
    env["PYTHONPATH"] = SRC + os.pathsep + env.get("PYTHONPATH", "")
    return env


def mlirtuna_argv(*args: str) -> list[str]:
    return [sys.executable, "-m", "mlirtuna", *args]


def run_cli(db_url: str, *args: str, timeout: float = 120, **extra: str) -> Run:
    """The real `mlirtuna` as a subprocess (for signals, exit codes, process isolation)."""
    proc = subprocess.run(
        mlirtuna_argv(*args),
        env=subprocess_env(db_url, **extra),
        capture_output=True,
        text=True,
        timeout=timeout,
        check=False,
    )
    return Run(proc.returncode, proc.stdout, proc.stderr)


def one_line(run: Run, *fragments: str) -> str:
    """The refusal's one stderr line (exit 2, no traceback), holding every fragment."""
    assert run.code == 2, (run.code, run.stderr)
    lines = run.stderr.strip().splitlines()
    assert len(lines) == 1 and "Traceback" not in run.stderr, run.stderr
    for fragment in fragments:
        assert fragment in lines[0], lines[0]
    return lines[0]
