"""Poison from tools: long, non-UTF-8, NUL-laden or endless output, and database secrets.

Whatever a tool prints is stored cut to a byte budget and made valid text on every backend;
its output is streamed with bounded memory; it never sees the database's URL or password.
"""

from __future__ import annotations

import json
import subprocess
import sys
import textwrap

import pytest
import sqlalchemy as sa
from support.queueing import ME, fixture_session_with_jobs, outcome  # noqa: F401 (a fixture)
from support.rocmlir import GEMM, calls, context, tuner

from mlirtuna import queue
from mlirtuna.db.models import Attempt, Candidate, Job
from mlirtuna.db.text import MAX_TEXT_BYTES, cut_text
from mlirtuna.problems import parse
from mlirtuna.tuners.base import Candidate as Cand
from mlirtuna.tuners.base import TuneOutcome

POISON = "é" * 70_000 + "\udcff\udc80 lone surrogates, a NUL \x00, an emoji 🦀, the end"


def test_cut_text_counts_bytes_and_replaces_what_no_database_takes():
    cut = cut_text(POISON)
    data = cut.encode("utf-8")  # would raise on a surrogate
    assert len(data) <= MAX_TEXT_BYTES and "\x00" not in cut
    assert cut.startswith("…") and cut.endswith("the end")  # the tail is kept
    assert cut_text("short") == "short" and cut_text(None) is None
    assert cut_text("ab\x00c\udcff") == "ab\ufffdc\ufffd"
    assert len(cut_text("🦀" * 1000, 10).encode()) <= 10  # never half a character


def test_poison_output_is_stored_on_every_backend(db, session_with_jobs):
    sid = session_with_jobs
    lease = queue.claim(db, sid, ME, 60)
    bad = [Cand(f"pc{i}", error=POISON) for i in range(3)]
    good = Cand("pc9", 1000.0, 1.0)
    assert queue.record(db, lease, TuneOutcome([*bad, good], good, output=POISON))
    lease2 = queue.claim(db, sid, ME, 60)
    assert queue.fail(db, lease2, POISON, max_retries=3, backoff_s=0) == "new"
    with db.session() as s:
        texts = [
            s.get(Job, lease.job_id).result,
            s.get(Job, lease2.job_id).result,
            *s.scalars(sa.select(Attempt.message).where(Attempt.message.is_not(None))),
            *s.scalars(sa.select(Candidate.error).where(Candidate.error.is_not(None))),
        ]
    assert len(texts) == 6
    for text in texts:
        assert text.endswith("the end") and len(text.encode()) <= MAX_TEXT_BYTES
        assert "\ufffd" in text and "\x00" not in text


def test_the_tool_never_sees_the_database_secrets(build, monkeypatch):
    monkeypatch.setenv("MLIRTUNA_DB", "postgresql://tuna:hunter2@db/tuna")
    monkeypatch.setenv("MLIRTUNA_DB_PASSWORD", "hunter2")
    monkeypatch.setenv("PGPASSWORD", "hunter2")
    tuner(build, "E3", monkeypatch).tune(parse("gemm", GEMM), context(tuning_space="quick"))
    seen = calls(build)
    assert len(seen) == 2  # --help and the tuning
    for call in seen:
        assert "hunter2" not in json.dumps(call) and "MLIRTUNA_DB" not in call["env"]
        assert "PGPASSWORD" not in call["env"]


def test_long_non_utf8_stderr_becomes_a_bounded_valid_tail(build, monkeypatch):
    monkeypatch.setenv("FAKE_TUNINGRUNNER_STDERR_BYTES", str(20 << 20))
    out = tuner(build, "E3", monkeypatch).tune(parse("gemm", GEMM), context(tuning_space="quick"))
    assert "a cut character" in out.output and len(out.output.encode()) < 2 << 20
    out.output.encode("utf-8")  # valid text


@pytest.mark.slow
def test_a_gigabyte_of_stderr_keeps_worker_memory_bounded(build, tmp_path, monkeypatch):
    """1 GB of stderr through the real tuner, in a process of its own: its peak RSS grows by less
    than 200 MB while the tool runs (it grew by 3.7 GB when the output was read whole). The
    growth, not the absolute peak, is asserted: what the process holds before the tool starts
    depends on what the interpreter loaded, not on the tool's output."""
    monkeypatch.setenv("FAKE_TUNINGRUNNER_ERA", "E3")
    monkeypatch.setenv("FAKE_TUNINGRUNNER_STDERR_BYTES", str(1 << 30))
    script = textwrap.dedent(f"""
        import resource, sys
        from mlirtuna.db.text import cut_text
        from mlirtuna.problems import parse
        from mlirtuna.tuners.base import TuneContext
        from mlirtuna.tuners.rocmlir import RocmlirTuner
        ctx = TuneContext(arch="gfx942", arch_full="gfx942:sramecc+:xnack-", num_cu=304,
                          num_chiplets=8, tuning_space="quick", gpu_id=0, timeout_s=600)
        before = resource.getrusage(resource.RUSAGE_SELF).ru_maxrss
        out = RocmlirTuner({str(build)!r}).tune(parse("gemm", {GEMM!r}), ctx)
        assert "a cut character" in cut_text(out.output)
        print(before, resource.getrusage(resource.RUSAGE_SELF).ru_maxrss)  # KiB, this process
    """)
    run = subprocess.run([sys.executable, "-c", script], capture_output=True, text=True,
                         timeout=600, check=False)  # fmt: skip
    assert run.returncode == 0, run.stderr[-2000:]
    before_mb, peak_mb = (int(kib) / 1024 for kib in run.stdout.split()[-2:])
    assert peak_mb - before_mb < 200, f"peak RSS {peak_mb:.0f} MB, {before_mb:.0f} MB before"


@pytest.mark.slow  # waits out a timeout
def test_a_tuner_that_ignores_the_timeout_is_stopped_by_the_worker(db, db_url, tmp_path):
    from support.workers import job_states, make_session, start_worker, stderr_of

    sid = make_session(db, tmp_path, 1, tuner="plugins.stubborn:Stubborn")
    # The smallest timeout: the worker's alarm fires its grace (10 s, whatever the timeout)
    # after it, once per attempt.
    w = start_worker(db_url, sid, tmp_path / "log", "--until-empty", "--job-timeout", "0.1",
                     "--max-retries", "2", "--retry-backoff", "0")  # fmt: skip
    assert w.wait(timeout=120) == 0, stderr_of(w)  # a hang guard: Stubborn never returns
    assert job_states(db, sid) == {"error": 1}
    with db.session() as s:
        job = s.scalars(sa.select(Job)).one()
        assert job.retries == 2 and "timed out after 0.1 s" in job.result
        assert sorted(s.scalars(sa.select(Attempt.outcome))) == ["failed", "failed"]
