"""Workers outlive database server restarts: each test owns its server (ownservers.py), stops
it mid-run (clean and crash) and starts it again, while real worker processes drain a session.
"""

from __future__ import annotations

import time

import pytest
import sqlalchemy as sa
from plugins.claimlog import read_log
from support.ownservers import OwnMariadb, OwnPostgres
from support.rocmlir import work
from support.standin import standin_build
from support.streamrace import LeasesLostInStream, assert_each_recorded_from_its_second_attempt
from support.twostage import problems, session
from support.workers import (
    assert_done_exactly_once,
    assert_never_held_twice,
    claimed_with_record,
    finish,
    job_states,
    make_session,
    start_worker,
    stderr_of,
    wait_for,
)

from mlirtuna.db import Database, resolve_url

pytestmark = pytest.mark.slow


def _fresh_database(server) -> str:
    admin = sa.create_engine(resolve_url(server.url()), isolation_level="AUTOCOMMIT")
    with admin.connect() as conn:
        conn.exec_driver_sql(
            "CREATE DATABASE tuna"
            + (" CHARACTER SET utf8mb4" if isinstance(server, OwnMariadb) else "")
        )
    admin.dispose()
    url = server.url("tuna")
    db = Database(url, check_schema=False)
    db.upgrade()
    db.dispose()
    return url


@pytest.fixture(params=["postgresql", "mariadb"])
def own_server(request):
    server = OwnPostgres() if request.param == "postgresql" else OwnMariadb()
    yield server
    server.close()


def test_workers_outlive_server_restarts(own_server, tmp_path):
    url = _fresh_database(own_server)
    db = Database(url)
    n = 150
    sid = make_session(db, tmp_path, n)
    db.dispose()
    log = tmp_path / "claims.log"
    procs = [
        start_worker(url, sid, log, "--until-empty", "--lease", "30", sleep_s=0.1) for _ in range(3)
    ]
    done = 0
    for mode in ("fast", "immediate"):
        db = Database(url)
        target = done + 15
        wait_for(lambda d=db, t=target: job_states(d, sid).get("completed", 0) >= t, timeout=120)
        db.dispose()
        own_server.restart(mode)
        time.sleep(1.0)
        # Every worker lived through it (none drained the session yet: 150 jobs of 0.1 s).
        assert [p.poll() for p in procs] == [None] * 3, stderr_of(procs[0])
        db = Database(url)
        done = job_states(db, sid).get("completed", 0)
        db.dispose()
        assert done < n
    finish(procs, timeout=300)
    assert [p.returncode for p in procs] == [0, 0, 0], stderr_of(procs[0])
    db = Database(url)
    assert_done_exactly_once(db, sid, n)  # 0 lost, 0 doubled, 0 stuck running
    assert claimed_with_record(procs) > 0  # records claimed the next job in their commit
    db.dispose()
    assert_never_held_twice(read_log(log))
    assert "database unavailable" in "".join(stderr_of(p) for p in procs)


def test_a_crash_restart_during_a_benchmark_stream_strands_no_job(
    own_server, tmp_path, monkeypatch
):
    # Issue 43 §2 (MariaDB, 23 s): the server crashes while both jobs sit in the worker's
    # stream and stays down past their leases; the worker claims them again when it is back and
    # feeds them again before the stream answered the first attempts. Each new attempt's reply
    # is recorded; the old ones' are dropped; nothing waits out the job timeout.
    build = standin_build(tmp_path, monkeypatch)
    for name, value in (("ERA", "E4"), ("STREAM", "1"), ("LOG", str(tmp_path / "tool.jsonl"))):
        monkeypatch.setenv(f"FAKE_TUNINGRUNNER_{name}", value)
    db = Database(_fresh_database(own_server))
    problems(db, tmp_path, 2)
    sid = session(db, build)
    work(db, sid, build, "compile")
    lease_s = 5.0
    race = LeasesLostInStream(
        monkeypatch, 2, lambda: own_server.restart("immediate", down_s=lease_s + 1)
    )
    try:
        gpu = work(db, sid, build, "gpu", max_retries=3, job_timeout_s=60, lease_s=lease_s)
    finally:
        race.release()
    assert_each_recorded_from_its_second_attempt(db, sid, gpu, race, 2)
    db.dispose()
