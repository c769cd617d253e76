"""The queue's own cost on every backend: statements per claim and per record (each one a round
trip), a record with thousands of candidates, and idle workers woken by NOTIFY on PostgreSQL."""

from __future__ import annotations

import dataclasses
import threading
import time
from pathlib import Path

import pytest
import sqlalchemy as sa
from sqlalchemy import event

from mlirtuna import catalog, queue, sessions
from mlirtuna.db import PING_IDLE_S
from mlirtuna.db.models import CONFIG_TABLES, Attempt, Candidate, Job, Result
from mlirtuna.db.text import MAX_CANDIDATE_ERROR_BYTES
from mlirtuna.queue import Claimant, jobs
from mlirtuna.sessions import SessionSpec
from mlirtuna.stats import Spread
from mlirtuna.tuners.base import Candidate as Cand
from mlirtuna.tuners.base import TuneOutcome
from mlirtuna.worker import Worker, WorkerSettings, loop

ME = Claimant("test-host", 0, 1)

# Statements sent per call (COMMIT and the pool's pre-ping are not statements). PostgreSQL: one
# data-modifying CTE each, in autocommit. MariaDB: pick, take, attempt, problem / fenced update,
# result, candidates (one multi-row INSERT), attempt end. SQLite: as MariaDB, plus BEGIN
# IMMEDIATE, with pick and take in one UPDATE … RETURNING.
CLAIM_STATEMENTS = {"postgresql": 1, "mysql": 1, "sqlite": 4}
RECORD_STATEMENTS = {"postgresql": 1, "mysql": 2, "sqlite": 5}


def load_gemm(db, tmp_path, session_id: int, n: int, tag: str = "cost") -> None:
    path = tmp_path / f"gemm-{tag}"
    path.write_text(
        "".join(
            f"-t f32 -out_datatype f32 -transA false -transB false -g 1 -m {8 * (i + 1)} "
            "-n 8 -k 8\n"
            for i in range(n)
        )
    )
    catalog.import_files(db, "gemm", [str(path)], tag=tag)
    jobs.load(db, session_id, tag=tag)


@pytest.fixture
def session_id(db) -> int:
    return sessions.create(db, SessionSpec(tuner="sleep")).id


class StatementCounter:
    def __init__(self, engine: sa.Engine) -> None:
        self.sent: list[str] = []
        event.listen(engine, "before_cursor_execute", self._count)

    def _count(self, _conn, _cursor, statement, *_args) -> None:
        self.sent.append(statement)

    def take(self) -> list[str]:
        sent, self.sent = self.sent, []
        return sent


def outcome(n: int, error_bytes: int = 0) -> TuneOutcome:
    cands = [
        Cand(
            f"v2:{i},64,4,16,16,4,1,1,1", 1000.0 + i, 1.0, spread=Spread(1000.0 + i, 990.0, 5.0, 9)
        )
        for i in range(n)
    ]
    cands += [Cand(f"bad{i}", error="x" * error_bytes) for i in range(n if error_bytes else 1)]
    return TuneOutcome(candidates=cands, winner=cands[0], output="tool output")


def test_claim_and_record_send_the_fewest_statements(db, tmp_path, session_id):
    load_gemm(db, tmp_path, session_id, 3)
    counter = StatementCounter(db.engine)
    for _ in range(2):  # the first round also warms up (schema check, first connections)
        counter.take()
        lease = queue.claim(db, session_id, ME, 60.0)
        claim_sent = counter.take()
        assert lease is not None and lease.problem is not None
        assert lease.problem.m in (8, 16)  # the problem came with the claim
        assert queue.record(db, lease, outcome(5))
        record_sent = counter.take()
    assert len(claim_sent) == CLAIM_STATEMENTS[db.backend], claim_sent
    assert len(record_sent) == RECORD_STATEMENTS[db.backend], record_sent
    with db.session() as s:
        job = s.get(Job, lease.job_id)
        assert job.state == "completed" and job.finished_at is not None
        assert s.scalar(sa.select(Attempt.outcome).where(Attempt.lease_token == lease.token)) == (
            "completed"
        )
        rows = s.scalars(sa.select(Candidate).where(Candidate.job_id == lease.job_id)).all()
        assert len(rows) == 6
        valid = [c for c in rows if c.error is None]
        assert {c.perf_family for c in valid} == {"v2"} and all(c.samples == 9 for c in valid)
        winner = s.scalars(sa.select(Result).where(Result.job_id == lease.job_id)).one()
        assert winner.perf_config == "v2:0,64,4,16,16,4,1,1,1" and winner.perf_family == "v2"


def test_record_with_thousands_of_long_candidates(db, tmp_path, session_id):
    """5,000 failed candidates with long errors: ~20 MB, more than MariaDB's default
    max_allowed_packet (16 MB) in one statement; the driver splits the multi-row INSERT."""
    load_gemm(db, tmp_path, session_id, 1)
    lease = queue.claim(db, session_id, ME, 600.0)
    many = outcome(5_000, error_bytes=MAX_CANDIDATE_ERROR_BYTES)
    if db.backend == "mysql":
        with db.session() as s:
            packet = s.scalar(sa.text("SELECT @@max_allowed_packet"))
        assert sum(len(c.error or "") for c in many.candidates) > packet
    assert queue.record(db, lease, many)
    with db.session() as s:
        n = s.scalar(sa.select(sa.func.count()).where(Candidate.job_id == lease.job_id))
        assert n == 10_000


def test_idle_worker_is_woken_when_jobs_arrive(db, tmp_path, session_id, monkeypatch):
    """PostgreSQL: NOTIFY wakes an idle worker at once, though its poll interval is an hour (a
    claim within the hang guard's 60 s can only be the NOTIFY's); the other backends poll (here
    at a short interval, to keep the test quick)."""
    notify = db.backend == "postgresql"
    poll_s = 3600.0 if notify else 0.2
    monkeypatch.setattr(loop, "POLL_MIN_S", poll_s)
    monkeypatch.setattr(loop, "POLL_MAX_S", poll_s)
    w = Worker(db, WorkerSettings(session_id=session_id, tuner="sleep:0", max_jobs=1))
    thread = threading.Thread(target=w.run, daemon=True)
    thread.start()
    try:
        time.sleep(1.0)  # the worker found nothing and waits (at least poll_s / 2 without NOTIFY)
        assert thread.is_alive() and w.stats.completed == 0
        load_gemm(db, tmp_path, session_id, 1)
        thread.join(timeout=60.0)  # a hang guard; polling alone waits poll_s / 2 at least
    finally:
        w.stop_requested.set()
        thread.join(timeout=5.0)
    assert w.stats.completed == 1, "not claimed within the hang guard's 60 s"


EXAMPLES = Path(__file__).resolve().parent.parent / "examples"


def test_the_claim_reads_every_ops_problem_as_load_problem_does(db, session_id):
    """The claim reads the problem in the same statement (a JSON object of its config row):
    for every op, the same typed problem as catalog.load_problem."""
    for op in CONFIG_TABLES:
        examples = str(EXAMPLES / f"{op}-small")
        if op == "fusion":
            catalog.import_modules(db, [examples], tag="every-op")
        else:
            catalog.import_files(db, op, [examples], tag="every-op")
    jobs.load(db, session_id, tag="every-op")
    seen = set()
    while (lease := queue.claim(db, session_id, ME, 60.0)) is not None:
        with db.session() as s:
            expected = catalog.load_problem(s, lease.problem_id)
        assert lease.problem == expected and lease.problem.canonical() == expected.canonical()
        # Equal and of the same types (True, not 1: a boolean stored as 0/1 is converted).
        got, want = dataclasses.astuple(lease.problem), dataclasses.astuple(expected)
        assert [type(v) for v in got] == [type(v) for v in want]
        seen.add(lease.problem.op)
    assert seen == set(CONFIG_TABLES)


def test_a_claim_whose_attempt_row_fails_takes_nothing(db, tmp_path, session_id):
    """The claim's statements are one unit: when its last one fails (here: an attempt row with
    a token already used), the error surfaces as from any statement and the job stays new."""
    load_gemm(db, tmp_path, session_id, 2)
    first = queue.claim(db, session_id, ME, 60.0)
    assert queue.release(db, first)
    with pytest.raises(sa.exc.IntegrityError):
        queue.claim(db, session_id, ME, 60.0, token=first.token)
    with db.session() as s:
        states = s.execute(sa.select(Job.state, Job.lease_token)).all()
        assert sorted(states) == [("new", None), ("new", None)]
        assert s.scalar(sa.select(sa.func.count()).select_from(Attempt)) == 1
    # The connection that failed is usable again (rolled back, back in the pool).
    assert queue.claim(db, session_id, ME, 60.0) is not None


def test_a_connection_cut_while_idle_is_replaced_before_use(db, tmp_path, session_id):
    """No ping per transaction (a round trip): a pooled connection is pinged only after sitting
    idle over PING_IDLE_S, as a worker's is while it tunes; one the server dropped meanwhile is
    then replaced before the claim, which succeeds at once."""
    if db.is_sqlite:
        pytest.skip("SQLite has no server connection to lose")
    load_gemm(db, tmp_path, session_id, 1)
    with db.engine.connect() as conn:  # the pool's connection, as the claim will get it back
        me = conn.exec_driver_sql(
            "SELECT pg_backend_pid()" if db.backend == "postgresql" else "SELECT CONNECTION_ID()"
        ).scalar()
    killer = sa.create_engine(db.url, poolclass=sa.NullPool)
    with killer.connect() as conn:
        if db.backend == "postgresql":
            conn.exec_driver_sql(f"SELECT pg_terminate_backend({me})")
        else:
            conn.exec_driver_sql(f"KILL {me}")
    killer.dispose()
    time.sleep(PING_IDLE_S + 0.2)
    assert queue.claim(db, session_id, ME, 60.0) is not None


def test_a_connection_returned_mid_transaction_is_rolled_back(db):
    """MariaDB's pool rolls back only connections whose server says a transaction is open (the
    default sent ROLLBACK after every commit, a round trip): an open one still is."""
    if db.is_sqlite:
        pytest.skip("SQLite: the driver is in autocommit mode; mlirtuna sends BEGIN itself")
    raw = db.engine.raw_connection()
    cursor = raw.cursor()
    cursor.execute(
        "INSERT INTO problem (op, test_vector, created_at) "
        "VALUES ('gemm', 'left open', '2026-01-01 00:00:00')"
    )
    cursor.close()
    raw.close()  # back to the pool, the transaction still open
    for _ in range(3):  # whichever pooled connection comes next, it commits nothing of that
        with db.transaction() as conn:
            conn.exec_driver_sql("SELECT 1")
    with db.session() as s:
        left = sa.text("SELECT count(*) FROM problem WHERE test_vector = 'left open'")
        assert s.scalar(left) == 0
