"""Batch isolation (issue 22): a config line rocMLIR's tuningRunner refuses never fails the
innocent jobs of its batch; a usage error (exit 2) is never retried; import refuses what the
real perfRunner parser refuses. On every backend, against the stand-in, which fails a bad line
the way the real tool does (tests/data/rocmlir-real/gemm-bad-line)."""

from __future__ import annotations

import datetime as dt
from pathlib import Path

import pytest
import sqlalchemy as sa
from support.clitools import run_cli
from test_batch import attempts_of, gemm_lines, job_rows, session_of, tool_calls, worker
from test_rocmlir_tuner import fake_build
from test_run import one_line

from mlirtuna import catalog
from mlirtuna.db.models import Problem
from mlirtuna.errors import BatchRefused, InputError, Unsupported
from mlirtuna.problems import ExpandOptions
from mlirtuna.tuners.rocmlir import outcome
from mlirtuna.tuners.rocmlir.process import Run

REAL = Path(__file__).parent / "data" / "rocmlir-real"
BAD = "-t f16 -out_datatype f16 -transA false -transB false -transO true -g 1 -m 64 -n 64 -k 64"


@pytest.fixture
def build(tmp_path, monkeypatch):
    return fake_build(tmp_path, monkeypatch)


def test_import_refuses_what_the_real_gemm_parser_refuses(db, db_url, tmp_path):
    path = tmp_path / "configs"
    path.write_text(f"{gemm_lines(1)[0]}\n{BAD}\n")
    with pytest.raises(InputError, match=rf"{path}:2: .*-transO true.*Unknown GEMM config"):
        catalog.import_files(db, "gemm", [str(path)], ExpandOptions(expand=False), tag="x")
    with db.session() as s:  # nothing half-written
        assert s.scalar(sa.select(sa.func.count()).select_from(Problem)) == 0
    one_line(run_cli(db_url, "import", "--op", "gemm", str(path)), 2, f"{path}:2:", "-transO")
    # A missing -out_datatype is no error: the canonical form spells it, as the tool's -c does.
    path.write_text("-t f16 -transA false -transB false -g 1 -m 8 -n 8 -k 8\n")
    catalog.import_files(db, "gemm", [str(path)], ExpandOptions(expand=False), tag="y")


def test_a_batch_the_tool_refuses_is_tuned_alone_without_a_retry_counted(
    db, tmp_path, build, monkeypatch
):
    # -transO false is imported (newer perfRunners take it) but this tool refuses any -transO:
    # the batch call fails before tuning anything, as the real one does.
    monkeypatch.setenv("FAKE_TUNINGRUNNER_ERA", "E3")
    log = tmp_path / "calls.jsonl"
    monkeypatch.setenv("FAKE_TUNINGRUNNER_LOG", str(log))
    lines = gemm_lines(3)
    lines[1] = lines[1].replace("-transB false", "-transB false -transO false")
    sid = session_of(db, tmp_path, lines)
    w = worker(db, sid, build, batch=3, max_retries=1)
    w.run()
    rows = job_rows(db, sid)
    assert [j.state for j in rows] == ["completed", "error", "completed"]
    assert "Unknown GEMM config argument -transO" in rows[1].result
    # The innocent ones: completed in their first attempt, no retry counted.
    for job in (rows[0], rows[2]):
        assert job.retries == 0 and attempts_of(db, job.id) == ["completed"]
    calls = tool_calls(log)
    assert "--configs-file=-" in calls[0]["argv"]  # the batch, then each alone
    assert sum("--configs-file=-" not in c["argv"] for c in calls) >= 3


def test_a_usage_error_is_never_retried(db, tmp_path, build, monkeypatch):
    monkeypatch.setenv("FAKE_TUNINGRUNNER_ERA", "E3")
    monkeypatch.setenv("FAKE_TUNINGRUNNER_FAULT", "usage")
    log = tmp_path / "calls.jsonl"
    monkeypatch.setenv("FAKE_TUNINGRUNNER_LOG", str(log))
    for batch, tag in ((1, "one"), (3, "three")):
        sid = session_of(db, tmp_path, gemm_lines(3), tag=tag)
        w = worker(db, sid, build, batch=batch, max_retries=3)
        w.run()
        rows = job_rows(db, sid)
        assert [j.state for j in rows] == ["error"] * 3
        for job in rows:
            assert len(attempts_of(db, job.id)) == 1  # one attempt, no retry
            assert "exit 2, not retried" in job.result
            assert "error: argument --op: refused" in job.result


def run(returncode: int, stderr: str) -> Run:
    now = dt.datetime.now(dt.UTC)
    return Run(returncode, "", stderr, now, now)


def test_the_real_tools_usage_error_and_parse_failure_are_told_apart() -> None:
    usage = (REAL / "fusion-config-usage" / "stderr.txt").read_text()
    err = outcome.failure(run(2, usage))
    assert isinstance(err, Unsupported)
    assert str(err).endswith(
        "tuningRunner.py: error: argument --op=fusion: requires --test-dir to be specified"
    )
    bad = (REAL / "gemm-bad-line" / "stderr.txt").read_text()
    err = outcome.failure(run(1, bad))
    assert not isinstance(err, Unsupported | BatchRefused)
    assert "Unknown GEMM config argument -transO -> true" in str(err)
    assert outcome.usage_error(run(2, "no argparse line here\n")) is None
