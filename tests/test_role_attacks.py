"""Attacks on the farm from within the worker role (issue 34 M2-M5), connected AS that role on
PostgreSQL and MariaDB: naming ids ahead of a sequence, an id at 2^31 - 2 rolled back, `ALTER
ROLE … SET` on the worker's own role, another host's password or connections, and ids past 32
bits. Each one stopped every worker before; now each is refused or harmless."""

from __future__ import annotations

import pytest
import sqlalchemy as sa
from support.clitools import cli
from support.dbroles import as_role, fixture_server_db, role_prefix  # noqa: F401 (the server_db fixture)
from support.workers import job_states, make_session

from mlirtuna import machine
from mlirtuna.db import Database, roles
from mlirtuna.tuners.sleep import SleepTuner
from mlirtuna.worker import Worker, WorkerSettings

HOSTS = ("a", "b")
BIG = 2**31 + 10  # past every 32-bit id


# Roles are the servers' (SQLite has no users).
pytestmark = pytest.mark.backends("postgresql", "mysql")


@pytest.fixture
def prefix(server_db):
    with role_prefix(server_db, hosts=HOSTS) as name:
        roles.apply_roles(server_db, name, hosts=HOSTS, shared=True)
        yield name
        if server_db.backend == "postgresql":  # the attacks' settings, undone before DROP ROLE
            with server_db.engine.begin() as conn:
                for role in (f"{name}_worker", *roles.host_roles(name, HOSTS)):
                    conn.exec_driver_sql(f'ALTER ROLE "{role}" RESET ALL')


def tune(worker_db: Database, sid: int) -> int:
    """Jobs a sleep worker connected as worker_db completes (it must not stop)."""
    w = Worker(worker_db, WorkerSettings(session_id=sid, tuner="sleep", until_empty=True),
               tuner=SleepTuner(0))  # fmt: skip
    try:
        return w.run().completed
    finally:
        worker_db.dispose()


REFUSALS = ("permission", "denied", "not owner", "must have", "must be")


def denied(db: Database, statement: str) -> str:
    """The server's refusal of `statement` for this login: a privilege error ("" if it ran)."""
    try:
        with db.engine.begin() as conn:
            conn.exec_driver_sql(statement)
    except sa.exc.DBAPIError as exc:
        message = str(exc.orig)
        assert any(
            w in message.lower()
            for w in ("permission", "denied", "not owner", "must have", "must be")
        ), message
        return message
    return ""


def _ids(db: Database, sid: int) -> dict[str, int]:
    with db.session() as s:
        return dict(
            s.execute(
                sa.text(
                    "SELECT min(j.id) AS job_id, min(j.problem_id) AS problem_id "
                    "FROM job j WHERE j.session_id = :s"
                ),
                {"s": sid},
            )
            .one()
            ._mapping
        )


EXPLICIT_IDS = {
    # M2 (PostgreSQL): ids ahead of the sequence made every later insert "duplicate key".
    "candidate": "INSERT INTO candidate (id, session_id, problem_id, job_id, perf_config, "
    "perf_family, remeasured) VALUES ({id}, {sid}, {problem_id}, {job_id}, 'x', '', false)",
    # M3 (MariaDB): one id at 2^31 - 2, rolled back, left AUTO_INCREMENT at its maximum.
    "result": "INSERT INTO result (id, session_id, problem_id, perf_config, perf_family, "
    "key_suffix) VALUES ({id}, {sid}, {problem_id}, 'x', '', '')",
    "attempt": "INSERT INTO attempt (id, job_id, lease_token, machine_name, gpu_id, pid, "
    "claimed_at, gpu, gpu_perf) VALUES ({id}, {job_id}, 'forged', 'h', 0, 1, "
    "CURRENT_TIMESTAMP, '', '')",
}


@pytest.mark.parametrize("table", sorted(EXPLICIT_IDS))
@pytest.mark.parametrize("explicit_id", [2147483646, 1_000_000])
def test_the_worker_role_cannot_choose_an_id(server_db, prefix, tmp_path, table, explicit_id):
    sid = make_session(server_db, tmp_path, 3, tuner="sleep")
    statement = EXPLICIT_IDS[table].format(id=explicit_id, sid=sid, **_ids(server_db, sid))
    worker_db = as_role(server_db, f"{prefix}_worker")
    try:
        assert denied(worker_db, statement), statement
        if server_db.backend == "postgresql":  # nor move a sequence
            assert denied(worker_db, f"SELECT setval('{table}_id_seq', {explicit_id})")
    finally:
        worker_db.dispose()
    assert tune(as_role(server_db, f"{prefix}_worker"), sid) == 3
    assert job_states(server_db, sid) == {"completed": 3}


ATTACK_SETTINGS = (
    "default_transaction_read_only = on",
    "statement_timeout = '1ms'",
    "lock_timeout = '1ms'",
    "idle_in_transaction_session_timeout = '1ms'",
    "idle_session_timeout = '1ms'",
)


def test_alter_role_set_on_the_workers_own_role_cannot_stop_it(server_db, prefix, tmp_path):
    """M4: a role may set its own session defaults; the worker sets its own on connecting."""
    if server_db.backend != "postgresql":
        pytest.skip("ALTER ROLE … SET is PostgreSQL's")
    for login in (f"{prefix}_worker", f"{prefix}_worker_a"):
        attacker = as_role(server_db, login)
        try:
            for setting in ATTACK_SETTINGS:
                assert not denied(attacker, f'ALTER ROLE "{login}" SET {setting}')
        finally:
            attacker.dispose()
    for login in (f"{prefix}_worker", f"{prefix}_worker_a"):
        sid = make_session(server_db, tmp_path, 4, tuner="sleep")
        assert tune(as_role(server_db, login), sid) == 4
        assert job_states(server_db, sid) == {"completed": 4}


def test_a_host_cannot_touch_another_hosts_login(server_db, prefix, tmp_path):
    """M4: each host logs in as its own role: another host's password, settings and
    connections, and the worker group's, are not its to change."""
    a = as_role(server_db, f"{prefix}_worker_a")
    b = as_role(server_db, f"{prefix}_worker_b")
    group = roles.worker_group(prefix)
    try:
        with b.engine.connect() as held:  # a connection of host b, open
            if server_db.backend == "postgresql":
                b_pid = held.exec_driver_sql("SELECT pg_backend_pid()").scalar()
                for statement in (
                    f"ALTER ROLE \"{prefix}_worker_b\" PASSWORD 'x'",
                    f"ALTER ROLE \"{prefix}_worker\" PASSWORD 'x'",
                    f'ALTER ROLE "{prefix}_worker_b" SET default_transaction_read_only = on',
                    f'ALTER ROLE "{group}" SET statement_timeout = 1',
                    f'ALTER ROLE "{group}" LOGIN',
                    f'GRANT "{group}" TO "{prefix}_reader"',
                    f"SELECT pg_terminate_backend({b_pid})",
                    f"SELECT pg_cancel_backend({b_pid})",
                ):
                    assert denied(a, statement), statement
            else:
                b_id = held.exec_driver_sql("SELECT CONNECTION_ID()").scalar()
                for statement in (
                    f"KILL CONNECTION {b_id}",
                    f"KILL QUERY {b_id}",
                    f"SET PASSWORD FOR '{prefix}_worker_b'@'%%' = PASSWORD('x')",
                    f"ALTER USER '{prefix}_worker_b'@'%%' IDENTIFIED BY 'x'",
                ):
                    assert denied(a, statement), statement
            assert held.exec_driver_sql("SELECT 1").scalar() == 1  # still connected
    finally:
        a.dispose()
        b.dispose()
    sid = make_session(server_db, tmp_path, 2, tuner="sleep")
    assert tune(as_role(server_db, f"{prefix}_worker_b"), sid) == 2


def test_ids_past_32_bits_are_recorded(server_db, prefix, tmp_path):
    """M5: 2 M nextval/s is within the worker role; job, result, candidate, attempt and bundle
    ids are 64-bit, so the worker records past 2^31 (here every sequence is moved there)."""
    with server_db.engine.begin() as conn:
        for table in ("job", "result", "candidate", "attempt", "bundle"):
            if server_db.backend == "postgresql":
                conn.exec_driver_sql(f"SELECT setval('{table}_id_seq', {BIG})")
            else:
                conn.exec_driver_sql(f"ALTER TABLE `{table}` AUTO_INCREMENT = {BIG}")
    sid = make_session(server_db, tmp_path, 3, tuner="sleep")
    assert tune(as_role(server_db, f"{prefix}_worker"), sid) == 3
    with server_db.session() as s:
        for table in ("job", "result", "candidate", "attempt"):
            low = s.scalar(sa.text(f"SELECT min(id) FROM {table}"))
            assert low is not None and low >= BIG, table
        for column in ("result.job_id", "candidate.job_id", "attempt.job_id"):
            table, name = column.split(".")
            assert s.scalar(sa.text(f"SELECT min({name}) FROM {table}")) >= BIG, column


def test_every_growing_id_is_64_bit(db):
    """M5 on every backend: the ids of the tables that grow without bound and their foreign
    keys are 64-bit (SQLite's INTEGER PRIMARY KEY is)."""
    columns = {"job": ["id"], "result": ["id", "job_id"], "candidate": ["id", "job_id"],
               "attempt": ["id", "job_id"], "bundle": ["id", "job_id"],
               "bundle_chunk": ["bundle_id"]}  # fmt: skip
    inspector = sa.inspect(db.engine)
    narrow = []
    for table, names in columns.items():
        types = {c["name"]: c["type"] for c in inspector.get_columns(table)}
        for name in names:
            kind = str(types[name]).upper()
            if not (kind.startswith("BIGINT") or (db.is_sqlite and kind == "INTEGER")):
                narrow.append(f"{table}.{name} {kind}")
    assert narrow == []


def test_db_roles_prints_a_login_per_host(server_db, tmp_path):
    url = server_db.url.render_as_string(hide_password=False)
    hosts = ("--host", "gpu01", "--host", "gpu02")
    printed = cli(url, "db", "roles", "--prefix", "tq", *hosts, "--shared-worker-login")
    assert printed.code == 0, printed.stderr
    if server_db.backend == "postgresql":
        assert 'CREATE ROLE "tq_workers" NOLOGIN' in printed.stdout
        assert 'GRANT "tq_workers" TO "tq_worker", "tq_worker_gpu01", "tq_worker_gpu02"' in (
            printed.stdout
        )
    else:
        assert "CREATE USER IF NOT EXISTS 'tq_worker_gpu02'@'%'" in printed.stdout
        assert "CREATE USER IF NOT EXISTS 'tq_worker'@'%'" in printed.stdout
    assert "GRANT INSERT (" in printed.stdout  # column grants: never the id
    bad = cli(url, "db", "roles", "--host", "Gpu-01")
    assert bad.code == 2 and "bad host name 'Gpu-01'" in bad.stderr


# -- issue 43 §1: one host's login cannot stop other hosts' workers ---------------------------
PASSWORDS = {host: f"pw-{host}-{i}" for i, host in enumerate(HOSTS)}


@pytest.fixture
def host_logins(server_db, monkeypatch):
    """Per-host worker logins only (no shared one), each with a password of its own; a login
    maker for each host."""
    for host, password in PASSWORDS.items():
        monkeypatch.setenv(roles.PASSWORD_ENV.format(f"WORKER_{host.upper()}"), password)
    made: list[Database] = []

    def login(host: str) -> Database:
        made.append(Database(server_db.url.set(username=f"{name}_worker_{host}",
                                               password=PASSWORDS[host])))  # fmt: skip
        return made[-1]

    with role_prefix(server_db, hosts=HOSTS) as name:
        roles.apply_roles(server_db, name, hosts=HOSTS)
        yield login
        for db in made:
            db.dispose()
        if server_db.backend == "postgresql":
            with server_db.engine.begin() as conn:
                for role in roles.host_roles(name, HOSTS):
                    conn.exec_driver_sql(f'ALTER ROLE "{role}" RESET ALL')


def _run(worker_db: Database, sid: int, **settings):
    w = Worker(worker_db, WorkerSettings(session_id=sid, tuner="sleep", until_empty=True,
               **settings), tuner=SleepTuner(0))  # fmt: skip
    try:
        return w.run()
    finally:
        worker_db.dispose()


def test_a_forged_result_row_fails_only_its_job(server_db, host_logins, tmp_path):
    """Host a's login writes the winner of a job host b will record: b fails that job (final,
    naming the row) and goes on; before, b exited 2 and so did every next claimer."""
    sid = make_session(server_db, tmp_path, 3, tuner="sleep")
    ids = _ids(server_db, sid)
    with host_logins("a").engine.begin() as conn:
        conn.exec_driver_sql(
            "INSERT INTO result (session_id, problem_id, job_id, perf_config, perf_family, "
            f"key_suffix) VALUES ({sid}, {ids['problem_id']}, {ids['job_id']}, 'x', '', '')"
        )
    stats = _run(host_logins("b"), sid)
    assert (stats.completed, stats.failed) == (2, 1)
    assert job_states(server_db, sid) == {"completed": 2, "error": 1}
    with server_db.session() as s:
        message = s.scalar(sa.text(f"SELECT result FROM job WHERE id = {ids['job_id']}"))
    assert "record refused: result row" in message and "did not write it" in message
    # Failed for good: a next worker finds nothing to do (no poison job claimed again).
    assert _run(host_logins("a"), sid).failed == 0


def _login_exists(db: Database, name: str) -> bool:
    query = (
        "SELECT 1 FROM pg_roles WHERE rolname = :n"
        if db.backend == "postgresql"
        else "SELECT 1 FROM mysql.user WHERE user = :n"
    )
    with db.engine.connect() as conn:
        return conn.execute(sa.text(query), {"n": name}).first() is not None


def test_per_host_logins_make_no_shared_login(server_db, host_logins, tmp_path):
    """With --host, no PREFIX_worker that every host could share (and so stop): unless asked."""
    prefix = host_logins("a").url.username.removesuffix("_worker_a")
    assert not _login_exists(server_db, f"{prefix}_worker")
    assert _login_exists(server_db, f"{prefix}_worker_a")
    url = server_db.url.render_as_string(hide_password=False)
    printed = cli(url, "db", "roles", "--prefix", "tq", "--host", "gpu01")
    assert printed.code == 0, printed.stderr
    assert "no shared login tq_worker" in printed.stderr
    if server_db.backend == "postgresql":
        assert 'GRANT "tq_workers" TO "tq_worker_gpu01";' in printed.stdout
        assert "rolname = 'tq_worker'" not in printed.stdout
    else:
        assert "'tq_worker_gpu01'@" in printed.stdout and "'tq_worker'@" not in printed.stdout


def test_the_worker_group_draws_no_session_problem_or_quick_list_id(server_db, host_logins):
    """Those ids are 32-bit and workers never insert there: drawn to their end by one login,
    they stopped import and `session new`. The worker's own sequences stay drawable."""
    a = host_logins("a")
    try:
        for table in ("session", "problem", "quick_list"):
            if server_db.backend == "postgresql":
                assert denied(a, f"SELECT nextval('{table}_id_seq')"), table
            else:  # AUTO_INCREMENT: drawn only by an INSERT, which the worker may not do there
                assert denied(a, f"INSERT INTO {table} () VALUES ()"), table
        if server_db.backend == "postgresql":
            with a.engine.begin() as conn:
                assert conn.exec_driver_sql("SELECT nextval('attempt_id_seq')").scalar()
    finally:
        a.dispose()


def test_search_path_set_on_the_workers_role_cannot_stop_it(server_db, host_logins, tmp_path):
    """A role may set its own search_path; the worker sends its own in the startup packet."""
    if server_db.backend != "postgresql":
        pytest.skip("ALTER ROLE … SET is PostgreSQL's (MariaDB has no per-user defaults)")
    a = host_logins("a")
    try:
        assert not denied(a, f"ALTER ROLE \"{a.url.username}\" SET search_path = 'nowhere'")
    finally:
        a.dispose()
    sid = make_session(server_db, tmp_path, 2, tuner="sleep")
    assert _run(host_logins("a"), sid).completed == 2


FAR_FUTURE = "2999-01-01 00:00:00"


def test_a_forged_gpu_holder_does_not_stop_gpu_workers(server_db, host_logins, tmp_path,
                                                       monkeypatch):  # fmt: skip
    """Host a's login sets a job running under an unbounded lease, with an attempt naming host
    b's GPU key: before, every worker on that GPU exited 2 (or waited forever with
    --wait-for-gpu). A lease no claim could set is not trusted, and lease expiry ends it."""
    monkeypatch.setattr(machine, "gpu_identity", lambda i: machine.GpuIdentity("uid:0xbeef"))
    sid = make_session(server_db, tmp_path, 3, tuner="sleep")
    forged = _ids(server_db, sid)["job_id"]
    with host_logins("a").engine.begin() as conn:
        conn.exec_driver_sql(
            f"UPDATE job SET state = 'running', lease_token = 'forged', "
            f"lease_expires_at = '{FAR_FUTURE}' WHERE id = {forged}"
        )
        conn.exec_driver_sql(
            "INSERT INTO attempt (job_id, lease_token, machine_name, gpu_id, pid, claimed_at, "
            f"gpu, gpu_perf, worker) VALUES ({forged}, 'forged', 'elsewhere', 0, 1, "
            "CURRENT_TIMESTAMP, 'uid:0xbeef', '', 'forger')"
        )
    for wait in (False, True):
        settings = WorkerSettings(session_id=sid, tuner="sleep", gpu_id=0, until_empty=True,
                                  machine_name="b", wait_for_gpu=wait)  # fmt: skip
        worker = Worker(host_logins("b"), settings, tuner=SleepTuner(0))
        assert worker.claimant.gpu == "uid:0xbeef"
        worker.run()  # neither GpuHeld nor a wait without end
    # The forged job went back to the queue (lease expiry) and was tuned like the others.
    assert job_states(server_db, sid) == {"completed": 3}


def test_a_lease_longer_than_the_longest_allowed_is_refused(server_db, tmp_path):
    sid = make_session(server_db, tmp_path, 1, tuner="sleep")
    url = server_db.url.render_as_string(hide_password=False)
    ran = cli(url, "worker", "--session", str(sid), "--lease", "1e9", "--until-empty")
    assert ran.code == 2 and "--lease 1e+09: give more than 0 and at most 3600" in ran.stderr
    assert job_states(server_db, sid) == {"new": 1}


def test_a_rerun_without_host_keeps_to_the_per_host_logins(server_db, host_logins):
    """`db roles --apply` again (after `db upgrade`) without --host: the hosts' logins are
    granted again, and no shared login appears beside them."""
    prefix = host_logins("a").url.username.removesuffix("_worker_a")
    url = server_db.url.render_as_string(hide_password=False)
    ran = cli(url, "db", "roles", "--prefix", prefix, "--apply", "--without-passwords")
    assert ran.code == 0, ran.stderr
    assert "hosts with a worker login already: a, b" in ran.stderr
    assert not _login_exists(server_db, f"{prefix}_worker")
    printed = cli(url, "db", "roles", "--prefix", prefix)
    assert f"{prefix}_worker_b" in printed.stdout
    with host_logins("a").engine.connect() as conn:  # its password kept
        assert conn.exec_driver_sql("SELECT 1").scalar() == 1
