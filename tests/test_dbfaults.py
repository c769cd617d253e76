"""Database faults a worker meets: restarts, locks, lost replies, renamed tables, slow starts.

Errors are classified by the driver's error class and code, never by message text; a worker
waits out what waiting cures (always backing off), and stops with one line on what it cannot.
"""

from __future__ import annotations

import dataclasses
import logging
import sqlite3
import threading
import time

import psycopg
import pymysql
import pytest
import sqlalchemy as sa
from support.clitools import cli, run_cli
from support.ownservers import OwnPostgres
from support.workers import job_states, make_session, start_worker, stderr_of, wait_for

from mlirtuna import db as dbmod
from mlirtuna import queue
from mlirtuna.db import ROLLED_BACK, UNAVAILABLE, Database, fault_of, faults
from mlirtuna.db.models import Attempt, Job
from mlirtuna.errors import DatabaseUnavailable
from mlirtuna.queue import Claimant
from mlirtuna.tuners.sleep import SleepTuner
from mlirtuna.worker import Heartbeat, Worker, WorkerSettings


def _wrapped(orig: BaseException) -> sa.exc.DBAPIError:
    return sa.exc.OperationalError("UPDATE job …", {}, orig)


def test_faults_are_told_by_code_not_by_message():
    pg, my = psycopg.errors, pymysql.err.OperationalError
    # The messages lie on purpose: only the class / SQLSTATE / errno may decide.
    assert fault_of(_wrapped(pg.AdminShutdown("relation does not exist"))) == UNAVAILABLE  # 57P01
    assert fault_of(_wrapped(pg.CrashShutdown("x"))) == UNAVAILABLE  # 57P02
    assert fault_of(_wrapped(pg.CannotConnectNow("x"))) == UNAVAILABLE  # 57P03
    assert fault_of(_wrapped(pg.ConnectionFailure("x"))) == UNAVAILABLE  # 08006
    assert fault_of(_wrapped(pg.DeadlockDetected("x"))) == ROLLED_BACK
    assert fault_of(_wrapped(pg.UndefinedTable("terminating connection: gone away"))) is None
    assert fault_of(_wrapped(psycopg.OperationalError("is starting up"))) == UNAVAILABLE
    for errno in (2002, 2003, 2006, 2013, 1927):
        assert fault_of(_wrapped(my(errno, "table result does not exist"))) == UNAVAILABLE
    assert fault_of(_wrapped(my(1213, "x"))) == ROLLED_BACK
    assert fault_of(_wrapped(my(1146, "Lost connection to server"))) is None  # no such table
    assert fault_of(_wrapped(my(1045, "Can't connect"))) is None  # access denied
    assert fault_of(ValueError("lost connection")) is None


def test_sqlite_busy_and_locked_are_unavailable(tmp_path):
    path = str(tmp_path / "x.db")
    a, b = sqlite3.connect(path, timeout=0.05), sqlite3.connect(path, timeout=0.05)
    a.isolation_level = b.isolation_level = None
    a.execute("CREATE TABLE t (x)")
    a.execute("BEGIN IMMEDIATE")
    with pytest.raises(sqlite3.OperationalError) as info:
        b.execute("BEGIN IMMEDIATE")
    a.rollback()
    a.close()
    b.close()
    assert fault_of(_wrapped(info.value)) == UNAVAILABLE
    bad = sqlite3.connect(":memory:")
    with pytest.raises(sqlite3.OperationalError) as info:
        bad.execute("SELECT * FROM missing")
    bad.close()
    assert fault_of(_wrapped(info.value)) is None


def test_a_server_that_is_down_is_unavailable_not_fatal():
    for url in ("postgresql://tuna@127.0.0.1:1/x", "mysql://tuna@127.0.0.1:1/x"):
        with pytest.raises(DatabaseUnavailable) as info:
            Database(url)
        assert fault_of(info.value) == UNAVAILABLE


def _in_process_worker(db, sid, seconds=0.2, **kw) -> Worker:
    settings = WorkerSettings(session_id=sid, tuner="sleep", until_empty=True, **kw)
    return Worker(db, settings, tuner=SleepTuner(seconds))


@pytest.mark.slow  # holds a lock for seconds
def test_sqlite_lock_past_the_busy_timeout_is_waited_out(tmp_path, monkeypatch, caplog):
    """A foreign transaction holds SQLite's write lock far past the busy timeout while a worker
    wants to record: the worker keeps its tuned result, waits, and records it."""
    monkeypatch.setattr(dbmod.engine, "SQLITE_BUSY_TIMEOUT_MS", 100)
    url = f"sqlite:///{tmp_path / 'm.db'}"
    db = Database(url)
    sid = make_session(db, tmp_path, 3, tuner="sleep")
    w = _in_process_worker(db, sid, seconds=0.5)
    thread = threading.Thread(target=w.run)
    caplog.set_level(logging.INFO, logger="mlirtuna")
    thread.start()
    wait_for(lambda: job_states(db, sid).get("running") == 1)
    foreign = sqlite3.connect(str(tmp_path / "m.db"), isolation_level=None)
    foreign.execute("BEGIN IMMEDIATE")  # a long foreign transaction (or a paused worker)
    time.sleep(2.5)
    foreign.rollback()
    foreign.close()
    thread.join(60)
    assert not thread.is_alive()
    assert (w.stats.completed, w.stats.lost, w.stats.failed) == (3, 0, 0)
    assert job_states(db, sid) == {"completed": 3}
    waits = [r for r in caplog.records if "database unavailable" in r.getMessage()]
    assert 1 <= len(waits) <= 3  # said once per wait, not once per try
    db.dispose()


def test_retries_back_off_even_while_stopping():
    stop = threading.Event()
    stop.set()  # after one SIGTERM…
    calls = []

    def away():
        calls.append(time.monotonic())
        if calls[-1] - calls[0] > 2.5:
            return "recorded"
        raise _wrapped(pymysql.err.OperationalError(2013, "Lost connection"))

    # …with a job held: the worker keeps trying to record it
    assert faults.retrying(away, stop, holding=lambda: True) == "recorded"
    assert len(calls) <= 5  # 1 s, 2 s, …: not 13,865 tries in 8 s


def test_a_database_error_that_waiting_cannot_cure_stops_the_worker(db, db_url, tmp_path):
    """A renamed table is not "cannot reach the database": the worker says so in one line,
    gives its job back and stops (no retry loop, no log flood)."""
    sid = make_session(db, tmp_path, 1)
    log = tmp_path / "claims.log"
    w = start_worker(db_url, sid, log, "--until-empty", sleep_s=1.5)
    wait_for(lambda: job_states(db, sid).get("running") == 1)
    with db.engine.begin() as conn:
        conn.exec_driver_sql("ALTER TABLE result RENAME TO result_gone")
    assert w.wait(timeout=60) == 2
    err = stderr_of(w)
    assert "Traceback" not in err and len(err.splitlines()) < 6
    last = err.strip().splitlines()[-1]
    assert last.startswith("error: database error") and "result" in last
    assert job_states(db, sid) == {"new": 1}  # given back, not held for a lease
    with db.session() as s:
        assert s.scalars(sa.select(Attempt.outcome)).all() == ["released"]
        assert s.scalar(sa.select(Job.retries)) == 0


@pytest.fixture
def lossy_replies(monkeypatch):
    """The first claim, the first record and the first record+claim commit, then lose their
    reply (MariaDB restarted between the commit and the answer): the worker sees a lost
    connection."""
    lost = {"claim": 1, "record": 1, "record_and_claim": 1}

    def lossy(name, real):
        def call(*args, **kw):
            result = real(*args, **kw)
            if lost[name]:
                lost[name] -= 1
                raise _wrapped(pymysql.err.OperationalError(2013, "Lost connection to server"))
            return result

        return call

    monkeypatch.setattr(queue, "claim", lossy("claim", queue.claim))
    monkeypatch.setattr(queue, "record", lossy("record", queue.record))
    monkeypatch.setattr(
        queue, "record_and_claim", lossy("record_and_claim", queue.record_and_claim)
    )
    monkeypatch.setattr(faults, "DB_RETRY_S", 0.05)
    return lost


def test_claim_and_record_whose_reply_was_lost_count_once(db, tmp_path, lossy_replies):
    # Job 1 claimed alone; jobs 2 and 3 each claimed with the record before (the first of
    # those replies lost); job 3 recorded alone (--max-jobs 3 reached).
    sid = make_session(db, tmp_path, 4, tuner="sleep")
    w = _in_process_worker(db, sid, seconds=0.0, max_jobs=3)
    w.run()
    assert lossy_replies == {"claim": 0, "record": 0, "record_and_claim": 0}
    assert (w.stats.completed, w.stats.lost, w.stats.claimed_with_record) == (3, 0, 2)
    assert job_states(db, sid) == {"completed": 3, "new": 1}  # none held unowned
    with db.session() as s:
        assert sorted(s.scalars(sa.select(Attempt.outcome))) == ["completed"] * 3
        assert s.scalars(sa.select(Job.retries)).all() == [0] * 4  # no retry burnt


def test_a_worker_stopping_after_a_record_and_claim_gives_the_claimed_job_back(
    db, tmp_path, monkeypatch
):
    """Told to stop just after the commit that recorded job 1 and claimed job 2: job 2 goes
    back new, with no retry counted, and its attempt says so."""
    sid = make_session(db, tmp_path, 3, tuner="sleep")
    w = _in_process_worker(db, sid, seconds=0.0)
    real = queue.record_and_claim

    def then_stop(*args, **kw):
        done = real(*args, **kw)
        w.stop_requested.set()  # a SIGTERM between the commit and the next job
        return done

    monkeypatch.setattr(queue, "record_and_claim", then_stop)
    w.run()
    assert (w.stats.completed, w.stats.claimed_with_record, w.stats.released) == (1, 1, 1)
    assert job_states(db, sid) == {"completed": 1, "new": 2}
    with db.session() as s:
        rows = s.execute(sa.select(Attempt.job_id, Attempt.outcome).order_by(Attempt.id)).all()
        assert [r.outcome for r in rows] == ["completed", "released"]
        assert s.get(Job, rows[1].job_id).retries == 0


def test_a_record_whose_lease_was_lost_claims_nothing(db, tmp_path, monkeypatch):
    """Job 1's lease is taken over while it runs: its record is refused and the claim sent
    with it takes nothing; the worker goes on claiming on its own."""
    sid = make_session(db, tmp_path, 2, tuner="sleep")
    w = _in_process_worker(db, sid, seconds=0.0, max_jobs=2)
    real = queue.record_and_claim
    stolen = []

    def after_a_takeover(db_, lease, *args, **kw):
        if not stolen:
            with db.session() as s:
                s.execute(sa.update(Job).where(Job.id == lease.job_id).values(lease_token="x"))
            stolen.append(lease.job_id)
            assert real(db_, lease, *args, **kw) == (False, None)
            assert job_states(db, sid) == {"running": 1, "new": 1}  # nothing taken
            with db.session() as s:
                s.execute(sa.update(Job).where(Job.id == lease.job_id).values(state="new"))
            return False, None
        return real(db_, lease, *args, **kw)

    monkeypatch.setattr(queue, "record_and_claim", after_a_takeover)
    w.run()
    assert (w.stats.completed, w.stats.lost) == (1, 1)
    assert w.stats.claimed_with_record == 0


def test_a_heartbeat_racing_the_record_is_not_a_lost_lease(db, tmp_path, caplog):
    sid = make_session(db, tmp_path, 1)
    lease = queue.claim(db, sid, Claimant("h", 0, 1), 30.0)
    hb = Heartbeat(db, 30.0, 3600.0)
    with hb.hold(lease) as lost:
        outcome = SleepTuner(0).tune(lease.problem, _ctx())
    assert queue.record(db, lease, outcome)
    hb.renew(lease, lost)  # the renewal that was in flight when the job ended
    assert not lost.is_set()
    assert "lease lost" not in caplog.text


def test_a_job_claimed_again_marks_its_earlier_attempt_lost(db, tmp_path):
    # Issue 43 §2: a worker whose lease ran out (a server restart) claims the job again while
    # the first attempt is still in its benchmark stream: that attempt is lost from then on.
    sid = make_session(db, tmp_path, 1)
    first = queue.claim(db, sid, Claimant("h", 0, 1), 30.0)
    hb = Heartbeat(db, 30.0, 3600.0)
    earlier = hb.add([first])[first.job_id]
    again = dataclasses.replace(first, token=queue.new_token())
    now = hb.add([again])[again.job_id]
    assert earlier.is_set() and not now.is_set()
    assert hb.add([again])[again.job_id] is now  # the same attempt again keeps its event


def _ctx():
    from mlirtuna.tuners.base import TuneContext

    return TuneContext(arch="gfx942", arch_full="gfx942", num_cu=304, num_chiplets=1,
                       tuning_space="quick")  # fmt: skip


def test_a_wrong_url_stops_at_once_even_when_told_to_wait(tmp_path):
    for url in (
        "postgresql://tuna@no-such-host.invalid/tuna",
        "mysql://tuna@no-such-host.invalid/tuna",
    ):
        # A worker that waits says "waiting up to 120 s" first; run_cli's 60 s is a hang guard.
        run = run_cli(url, "worker", "--session", "1", "--wait-for-db", "120", timeout=60)
        assert run.code == 2 and len(run.stderr.strip().splitlines()) == 1, run.stderr
        assert "waiting up to" not in run.stderr


@pytest.mark.parametrize("env", ["MLIRTUNA_TEST_POSTGRES", "MLIRTUNA_TEST_MYSQL"])
def test_a_refused_login_stops_at_once_even_when_told_to_wait(env):
    import os

    if not os.environ.get(env):
        pytest.skip(f"{env} not set")
    url = dbmod.resolve_url(os.environ[env]).set(username="no_such_role_i11", password="x")
    run = run_cli(url.render_as_string(False), "worker", "--session", "1", "--wait-for-db", "120",
                  timeout=60)  # fmt: skip
    assert run.code == 2 and len(run.stderr.strip().splitlines()) == 1, run.stderr
    assert "x@" not in run.stderr and "waiting up to" not in run.stderr


@pytest.mark.slow
def test_a_worker_waits_for_a_database_that_is_not_up_yet(tmp_path):
    server = OwnPostgres()
    try:
        db = Database(server.url(), check_schema=False)
        db.upgrade()
        sid = make_session(db, tmp_path, 3)
        db.dispose()
        server.stop("fast")
        w = start_worker(server.url(), sid, tmp_path / "log", "--until-empty",
                         "--wait-for-db", "90")  # fmt: skip
        time.sleep(4)
        assert w.poll() is None  # still waiting, not "exit 2 at once"
        server.start()
        assert w.wait(timeout=120) == 0, stderr_of(w)
        db = Database(server.url())
        assert job_states(db, sid) == {"completed": 3}
        db.dispose()
    finally:
        server.close()


def test_a_missing_table_is_one_line_for_a_command(db, db_url):
    with db.engine.begin() as conn:
        conn.exec_driver_sql("ALTER TABLE job RENAME TO job_gone")
    run = cli(db_url, "status")
    assert run.code == 2 and len(run.stderr.strip().splitlines()) == 1, run.stderr
    assert run.stderr.startswith("error: database error on ") and "job" in run.stderr


@pytest.mark.parametrize(
    "url",
    [
        "postgresql://u:p@ss:word@host/db",
        "postgresql://u:p@ssword@host:abc/db",
        "postgresql://u:p@ssword@127.0.0.1:1/db?sslmode=bogus",
        "mysql://u:p@ssword@127.0.0.1:1/db?charset=bogus",
    ],
)
def test_a_malformed_url_is_one_line_with_the_password_masked(url):
    run = cli(url, "status")
    assert run.code == 2 and len(run.stderr.strip().splitlines()) == 1, run.stderr
    assert "bad database URL" in run.stderr and "ss:word" not in run.stderr
    assert "p@ss" not in run.stderr and "Traceback" not in run.stderr
