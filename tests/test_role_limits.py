"""Roles that bound harm (issue 23 item 9): connected AS the worker and reader roles, on
PostgreSQL and MariaDB, the attacks of the audit are refused or harmless; the worker role still
does all a worker does (one- and two-stage sessions)."""

from __future__ import annotations

import threading

import pytest
import sqlalchemy as sa
from support import hangguard
from support.dbroles import as_role, fixture_server_db, refused, role_prefix  # noqa: F401 (the server_db fixture)
from support.rocmlir import work
from support.standin import standin_build
from support.twostage import problems, session
from support.workers import job_states, make_session

from mlirtuna import queue
from mlirtuna.db import Database, roles
from mlirtuna.db.models import JOB_CLAIMABLE_CHANNEL
from mlirtuna.queue import Claimant
from mlirtuna.queue.wakeup import Wakeup
from mlirtuna.tuners.sleep import SleepTuner
from mlirtuna.worker import Worker, WorkerSettings

# Roles are the servers' (SQLite has no users).
pytestmark = pytest.mark.backends("postgresql", "mysql")


@pytest.fixture
def prefix(server_db):
    with role_prefix(server_db) as name:
        roles.apply_roles(server_db, name)
        roles.apply_roles(server_db, name)  # again (after `db upgrade`): the same grants, no error
        yield name


def changed(db: Database, statement: str) -> int:
    with db.engine.begin() as conn:
        return conn.exec_driver_sql(statement).rowcount


@pytest.fixture
def done(server_db, prefix, tmp_path):
    """A session of 3 jobs tuned by a worker connected as the worker role; that role's db."""
    sid = make_session(server_db, tmp_path, 3, tuner="sleep")
    worker_db = as_role(server_db, f"{prefix}_worker")
    w = Worker(worker_db, WorkerSettings(session_id=sid, tuner="sleep", until_empty=True),
               tuner=SleepTuner(0))  # fmt: skip
    assert w.run().completed == 3
    yield sid, worker_db
    worker_db.dispose()


WORKER_REFUSED = [
    # what a job is: redirecting work, reordering the queue
    "UPDATE job SET priority = 99",
    "UPDATE job SET session_id = session_id",
    "UPDATE job SET problem_id = problem_id",
    "UPDATE job SET stage = 'benchmark'",
    "UPDATE job SET reason = 'x'",
    # who claimed an attempt
    "UPDATE attempt SET machine_name = 'elsewhere'",
    "UPDATE attempt SET pid = 1",
    "UPDATE attempt SET lease_token = 'f'",
    # forged results: a result or candidate once written is not the worker's to change
    "UPDATE result SET tflops = 1e9",
    "UPDATE candidate SET tflops = 1e9",
    "DELETE FROM result",
    "DELETE FROM candidate",
    "DELETE FROM job",
    "DELETE FROM attempt",
    # a bundle's identity and checks
    "UPDATE bundle SET sha256 = 'x'",
    "UPDATE bundle SET size = 1",
    "UPDATE bundle SET lease_token = 'x'",
    "UPDATE bundle SET job_id = job_id",
    "UPDATE bundle SET in_store = in_store",
    # everything else
    "UPDATE session SET artifact_store = '/'",
    "UPDATE problem SET op = 'gemm'",
    "INSERT INTO session (arch) VALUES ('x')",
    "TRUNCATE TABLE job",
    "DROP TABLE result",
    "ALTER TABLE job ADD COLUMN x INTEGER",
    "CREATE TABLE evil (x INTEGER)",
]


@pytest.fixture(scope="module")
def worked(module_db_url, tmp_path_factory):
    """As `done`, once per backend for the module: the refusals below change nothing (a
    statement that is not refused is rolled back where the server can), so they share it."""
    db = Database(module_db_url)
    with role_prefix(db) as name:
        roles.apply_roles(db, name)
        sid = make_session(db, tmp_path_factory.mktemp("worked"), 3, tuner="sleep")
        worker_db = as_role(db, f"{name}_worker")
        w = Worker(worker_db, WorkerSettings(session_id=sid, tuner="sleep", until_empty=True),
                   tuner=SleepTuner(0))  # fmt: skip
        assert w.run().completed == 3
        yield worker_db
        worker_db.dispose()
    db.dispose()


@pytest.mark.parametrize("statement", WORKER_REFUSED)
def test_the_worker_role_cannot(worked, statement):
    assert refused(worked, statement, commit=False), statement


LOCKS = {
    "postgresql": [
        f"LOCK TABLE {t} IN {m} MODE"
        for t in ("job", "attempt", "result", "session")
        for m in ("ACCESS EXCLUSIVE", "EXCLUSIVE", "SHARE ROW EXCLUSIVE", "SHARE")
    ],
    "mysql": [f"LOCK TABLES {t} WRITE" for t in ("job", "attempt", "result", "session")]
    + [f"LOCK TABLES {t} READ" for t in ("job", "session")],
}


def test_the_worker_role_cannot_lock_the_queue(done, server_db):
    _, worker_db = done
    statements = LOCKS["postgresql" if server_db.backend == "postgresql" else "mysql"]
    assert [s for s in statements if not refused(worker_db, s)] == []


def test_the_worker_role_cannot_move_a_finished_job(done, server_db):
    sid, worker_db = done
    if server_db.backend != "postgresql":
        pytest.skip("row-level security is PostgreSQL's (MariaDB: see the failure-model table)")
    # Row-level security: a completed job is not a row the worker may UPDATE (no error: none).
    assert changed(worker_db, "UPDATE job SET state = 'new', lease_token = NULL") == 0
    assert changed(worker_db, "UPDATE job SET result = 'forged'") == 0
    assert job_states(server_db, sid) == {"completed": 3}


def test_the_worker_role_still_runs_two_stage_sessions(server_db, prefix, tmp_path, monkeypatch):
    build = standin_build(tmp_path, monkeypatch)
    monkeypatch.setenv("FAKE_TUNINGRUNNER_ERA", "E4")
    problems(server_db, tmp_path, 2)
    sid = session(server_db, build)
    worker_db = as_role(server_db, f"{prefix}_worker")
    try:
        assert work(worker_db, sid, build, "compile").stats.completed == 2
        assert work(worker_db, sid, build, "gpu").stats.completed == 2
    finally:
        worker_db.dispose()
    assert job_states(server_db, sid) == {"completed": 4}


def test_the_reader_role_reads_only(done, prefix, server_db):
    reader_db = as_role(server_db, f"{prefix}_reader")
    try:
        with reader_db.session() as s:
            assert s.scalar(sa.text("SELECT count(*) FROM job")) == 3  # RLS hides no row
        for statement in ("UPDATE job SET state = 'new'", "INSERT INTO result (session_id) "
                          "VALUES (1)", "DELETE FROM attempt", "LOCK TABLES job WRITE"
                          if server_db.backend != "postgresql" else
                          "LOCK TABLE job IN ACCESS EXCLUSIVE MODE"):  # fmt: skip
            assert refused(reader_db, statement), statement
    finally:
        reader_db.dispose()


def test_a_notify_from_the_reader_costs_a_worker_one_empty_claim(done, prefix, server_db):
    """PostgreSQL lets any role NOTIFY any channel (it cannot be granted away): a reader can
    wake every idle worker. What a worker does then is one claim that finds nothing."""
    if server_db.backend != "postgresql":
        pytest.skip("NOTIFY is PostgreSQL's")
    sid, worker_db = done
    reader_db = as_role(server_db, f"{prefix}_reader")
    stop = threading.Event()
    wakeup = Wakeup(worker_db, sid)
    try:
        wakeup.wait(0.1, stop)  # LISTEN
        assert not refused(reader_db, f"NOTIFY {JOB_CLAIMABLE_CHANNEL}, '{sid}'")  # allowed
        # Told to wait an hour, it returns: woken by the reader (the 60 s is a hang guard).
        hangguard.returns(lambda: wakeup.wait(3600, stop))
        before = job_states(server_db, sid)
        assert queue.claim(worker_db, sid, Claimant("h", -1), 30) is None  # nothing to take
        assert job_states(server_db, sid) == before == {"completed": 3}
    finally:
        stop.set()
        wakeup.close()
        reader_db.dispose()


def test_the_worker_columns_leave_out_what_a_job_is():
    columns = roles.worker_update_columns()
    assert {"state", "lease_token", "lease_expires_at", "heartbeat_at", "result"} <= set(
        columns["job"]
    )
    assert not {"priority", "session_id", "problem_id", "stage", "reason"} & set(columns["job"])
    assert columns["bundle"] == ("complete",)
    assert {"ended_at", "outcome", "message"} <= set(columns["attempt"])


def test_applying_again_replaces_an_older_table_wide_update(done, prefix, server_db):
    _, worker_db = done
    worker = f"{prefix}_worker"
    if server_db.backend == "postgresql":
        grant = f'GRANT UPDATE ON job TO "{worker}"'
    else:  # PyMySQL formats with %: the host's % is doubled
        grant = f"GRANT UPDATE ON `{server_db.url.database}`.`job` TO '{worker}'@'%%'"
    with server_db.engine.begin() as conn:  # what `db roles` granted before issue 23
        conn.exec_driver_sql(grant)
    roles.apply_roles(server_db, prefix)
    assert refused(worker_db, "UPDATE job SET priority = 99")
