"""`mlirtuna run`, `wait`, the progress view and the one-line errors a person can act on."""

from __future__ import annotations

import io
import signal
import subprocess
import time
from pathlib import Path

import pytest
from rich.console import Console
from support.clitools import cli, mlirtuna_argv, run_cli, subprocess_env
from support.perfrunner_reader import read_tuning_db
from support.queueing import two_job_session

from mlirtuna import queue
from mlirtuna.cli import progress
from mlirtuna.cli.progress import Busy, Snapshot
from mlirtuna.db import Database
from mlirtuna.queue import jobs

# The backend changes nothing here (the queue, records and SQL of their own are tested on every
# backend in their own files): SQLite only, to keep the suite quick.
pytestmark = pytest.mark.backends("sqlite")

EXAMPLES = Path(__file__).parent.parent / "examples"


def test_examples_are_valid_config_lists():
    from mlirtuna.problems.configlist import read_config_list

    for op in ("gemm", "conv", "attention", "gemm_gemm", "conv_gemm"):
        listed = read_config_list(str(EXAMPLES / f"{op}-small"), op)
        assert listed.entries and not listed.warnings


def test_fusion_example_modules_import_and_auto_detects_ops(db):
    from mlirtuna import catalog, flow

    report = catalog.import_modules(db, [str(EXAMPLES / "fusion-small")])
    assert report.new == report.lines == 4
    ops = {op: len(paths) for op, paths in flow.files_by_op("auto", [
        str(EXAMPLES / name) for name in (
            "fusion-small", "gemm-small", "conv-small", "attention-small", "gemm_gemm-small",
            "conv_gemm-small",
        )
    ]).items()}  # fmt: skip
    assert ops == dict.fromkeys(
        ["fusion", "gemm", "conv", "attention", "gemm_gemm", "conv_gemm"], 1
    )


def test_run_end_to_end_twice(db_url, tmp_path):
    configs = tmp_path / "gemm-configs"
    configs.write_text(
        "# two small GEMMs\n"
        "-t f32 -out_datatype f32 -transA false -transB false -g 1 -m 64 -n 64 -k 64\n"
        "-t f16 -out_datatype f16 -transA false -transB true -g 2 -m 32 -n 64 -k 32\n"
    )
    out = tmp_path / "tuning.tsv"
    args = (
        "run",
        "--op",
        "gemm",
        "--tuning-space",
        "quick",
        "-o",
        str(out),
        "--json",
        str(configs),
    )
    first = run_cli(db_url, *args, timeout=300)
    assert first.code == 0, first.stderr
    summary = first.json()
    assert summary["counts"]["completed"] == 2 and summary["exported"] == 2
    assert summary["tuner"] == "cpu" and len(summary["winners"]) == 2
    # perfRunner finds every winner under the session's arch and the canonical string.
    db = read_tuning_db(str(out), version="2219")
    for w in summary["winners"]:
        assert db[("cpu-" + _machine(), w["test_vector"])] == w["perf_config"]
    second = run_cli(db_url, *args, timeout=300).json()
    assert second["session"] == summary["session"] + 1  # a new session, the same problems
    # Each run's session is named from the op and the input; `session list` shows it and the op.
    listed = {r["id"]: r for r in cli(db_url, "session", "list", "--json").json()}
    assert listed[summary["session"]]["name"] == "gemm: gemm-configs"
    assert listed[second["session"]]["ops"] == ["gemm"]
    table = cli(db_url, "session", "list").stdout.splitlines()
    assert table[0].split()[:4] == ["id", "name", "op", "created"]
    assert all("gemm: gemm-configs" in line and " gemm " in line for line in table[1:])
    d = Database(db_url)
    try:
        import sqlalchemy as sa

        from mlirtuna.db.models import Problem

        with d.session() as s:
            assert s.scalar(sa.select(sa.func.count()).select_from(Problem)) == 2
    finally:
        d.dispose()


def _machine() -> str:
    import platform

    return platform.machine()


@pytest.mark.slow  # signals
def test_run_interrupted_then_resumed(db_url, tmp_path):
    """The session remembers what run was asked: `run --session N` alone resumes exactly that
    (the expansion flags included: no jobs for data types the user left out)."""
    lines = "".join(f"-transA false -transB false -g 1 -m {m} -n 8 -k 8\n" for m in range(1, 7))
    configs = tmp_path / "gemm"
    configs.write_text(lines)
    argv = mlirtuna_argv(
        "run", "--op", "gemm", "--tuner", "sleep:0.7", "--data-type", "f32",
        "-o", str(tmp_path / "t.tsv"), str(configs),
    )  # fmt: skip
    proc = subprocess.Popen(
        argv, env=subprocess_env(db_url), stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True
    )
    d = Database(db_url)
    try:
        deadline = time.monotonic() + 60
        while time.monotonic() < deadline:
            counts = jobs.counts(d, 1)[1] if _has_session(d) else {}
            if counts.get("running"):
                break
            time.sleep(0.1)
        proc.send_signal(signal.SIGINT)
        _, err = proc.communicate(timeout=60)
        assert proc.returncode == 130
        assert "interrupted: resume with `mlirtuna run --session 1`\n" in err
        assert "Traceback" not in err
        left = jobs.counts(d, 1)[1]
        assert left["running"] == 0 and left["new"] >= 1 and left["completed"] >= 1
        resumed = run_cli(db_url, "run", "--session", "1", "--json", timeout=120)
        assert resumed.code == 0, resumed.stderr
        summary = resumed.json()
        assert summary["counts"]["completed"] == 6 and summary["tuner"] == "sleep:0.7"
        assert summary["output"] == str(tmp_path / "t.tsv")
        assert {w["test_vector"].split()[1] for w in summary["winners"]} == {"f32"}
    finally:
        d.dispose()


def _has_session(d: Database) -> bool:
    from mlirtuna import sessions

    return bool(sessions.list_all(d))


def test_progress_render_shows_rate_eta_errors_and_workers():
    snap = Snapshot(
        total=10,
        done=4,
        completed=3,
        errors=1,
        elapsed_s=60.0,
        done_here=4,
        busy=[Busy("GPU 0", "-t f16 -m 64"), Busy("GPU 1", "-t f32 -m 8")],
    )
    console = Console(file=io.StringIO(), force_terminal=True, width=100, color_system=None)
    console.print(progress.render(snap))
    text = console.file.getvalue()
    assert "4/10 jobs" in text and "4.0/min" in text and "ETA 0:01:30" in text
    assert "1 errors" in text
    assert "GPU 0: -t f16 -m 64" in text and "GPU 1: -t f32 -m 8" in text


def test_live_view_reads_the_database(db, tmp_path):

    sid = two_job_session(db, tmp_path)
    queue.claim(db, sid, queue.Claimant("h", 3, 4242), 60)
    console = Console(file=io.StringIO(), force_terminal=True, width=120, color_system=None)
    with progress.LiveView(db, sid, console, enabled=True) as view:
        view.tick()
    text = console.file.getvalue()
    assert "0/2 jobs" in text and "GPU 3: -t f32" in text


# -- wait ----------------------------------------------------------------------------------------


def test_wait_exit_status_follows_the_outcome(db, db_url, tmp_path):
    from mlirtuna.tuners.base import Candidate, TuneOutcome

    sid = two_job_session(db, tmp_path)
    assert cli(db_url, "wait", "--session", str(sid), "--timeout", "0.5", "--poll", "0.1").code == 3
    who = queue.Claimant("h", 0, 1)
    win = Candidate("pc", 10.0, 1.0)
    queue.record(db, queue.claim(db, sid, who, 60), TuneOutcome([win], win))
    assert cli(db_url, "wait", "--session", str(sid), "--timeout", "0.3", "--poll", "0.1").code == 3
    lease = queue.claim(db, sid, who, 60)
    queue.fail(db, lease, "tool crashed", max_retries=1, backoff_s=0)
    run = cli(db_url, "wait", "--session", str(sid), "--poll", "0.1")
    assert (
        run.code == 1
        and f"job {lease.job_id} error: attempt 1/1 failed: tool crashed" in run.stderr
    )
    jobs.cancel(db, sid, lease.job_id)
    assert cli(db_url, "wait", "--session", str(sid), "--poll", "0.1").code == 0


# -- errors a person can act on --------------------------------------------------------------------


def one_line(run, code: int, *fragments: str) -> None:
    assert run.code == code, (run.code, run.stderr)
    lines = run.stderr.strip().splitlines()
    assert len(lines) == 1, run.stderr
    assert "Traceback" not in run.stderr
    for fragment in fragments:
        assert fragment in lines[0], lines[0]


def test_unreadable_file(db_url, tmp_path):
    one_line(
        cli(db_url, "import", "--op", "gemm", str(tmp_path / "nope")), 2, str(tmp_path / "nope")
    )
    one_line(cli(db_url, "run", "--op", "gemm", str(tmp_path / "nope")), 2, str(tmp_path / "nope"))


def test_unknown_op(db_url):
    one_line(
        cli(db_url, "import", "--op", "fft", str(EXAMPLES / "gemm-small")),
        2,
        "unknown op 'fft'",
        "conv",
    )


def test_bad_url(tmp_path):
    one_line(cli("nonsense://", "status"), 2, "database URL")


def test_unreachable_database_masks_the_password(tmp_path):
    url = "postgresql://tuna:hunter2@127.0.0.1:1/tuna?connect_timeout=2"
    run = cli(url, "status")
    one_line(run, 2, "cannot reach the database", "***")
    assert "hunter2" not in run.stderr


@pytest.mark.backends("postgresql", "mysql")  # a new SQLite file is created, never "too old"
def test_schema_too_old_names_the_upgrade(empty_db_url):
    one_line(cli(empty_db_url, "status"), 2, "run `mlirtuna db upgrade`")


def test_no_rocmlir_build_where_required(db_url, tmp_path, monkeypatch):
    monkeypatch.delenv("MLIRTUNA_ROCMLIR_BUILD", raising=False)
    run = cli(
        db_url,
        "run",
        "--op",
        "gemm",
        "--tuner",
        "rocmlir",
        "--arch",
        "gfx942",
        "--num-cu",
        "304",
        "--num-chiplets",
        "8",
        str(EXAMPLES / "gemm-small"),
    )
    one_line(run, 2, "--mlir-build-dir", "MLIRTUNA_ROCMLIR_BUILD")
    assert cli(db_url, "session", "list", "--json").json() == []  # nothing half-made


def test_debug_shows_the_traceback(db_url):
    run = cli(db_url, "--debug", "session", "show", "42")
    assert run.code != 0 and "Traceback" in run.stderr and "NotFound" in run.stderr


def test_runtime_failure_is_exit_1(db_url, tmp_path):
    path = tmp_path / "g"
    path.write_text("-t f32 -out_datatype f32 -transA false -transB false -g 1 -m 8 -n 8 -k 8\n")
    run = run_cli(
        db_url, "run", "--op", "gemm", "--quiet", "--max-retries", "1",
        "--job-timeout", "0.000001", str(path), timeout=120,
    )  # fmt: skip
    assert run.code == 1
    assert "1 errors" in run.stderr and "jobs list --session 1 --state error" in run.stderr
