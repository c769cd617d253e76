"""`mlirtuna db roles`: each role, connected as itself, can do its job and nothing more."""

from __future__ import annotations

import pytest
import sqlalchemy as sa
from support.clitools import cli
from support.dbroles import as_role, fixture_server_db, refused, role_prefix  # noqa: F401 (the server_db fixture)
from support.workers import job_states, make_session

from mlirtuna.db import Database
from mlirtuna.tuners.sleep import SleepTuner
from mlirtuna.worker import Worker, WorkerSettings

# Roles are the servers' (SQLite has no users).
pytestmark = pytest.mark.backends("postgresql", "mysql")


@pytest.fixture
def prefix(server_db):
    with role_prefix(server_db) as name:
        yield name


def test_roles_prints_the_sql_and_applies_it(server_db, prefix, tmp_path):
    url = server_db.url.render_as_string(hide_password=False)
    printed = cli(url, "db", "roles", "--prefix", prefix)
    assert printed.code == 0 and f"{prefix}_worker" in printed.stdout
    assert "GRANT INSERT ON" in printed.stdout
    unset = {f"MLIRTUNA_ROLE_PASSWORD_{r}": None for r in ("ADMIN", "WORKER", "READER")}
    no_passwords = cli(url, "db", "roles", "--prefix", prefix, "--apply", env=unset)
    assert no_passwords.code == 2 and no_passwords.stderr.count("\n") == 1, no_passwords.stderr
    assert (
        "set MLIRTUNA_ROLE_PASSWORD_ADMIN, MLIRTUNA_ROLE_PASSWORD_WORKER, " in no_passwords.stderr
    )
    assert f"{prefix}_worker" not in roles_present(server_db, prefix)  # nothing made
    applied = cli(
        url, "db", "roles", "--prefix", prefix, "--apply", "--without-passwords", env=unset
    )
    assert applied.code == 0, applied.stderr
    assert "warning: MLIRTUNA_ROLE_PASSWORD_ADMIN" in applied.stderr
    # A command the role may not run names the role in use and the one it needs.
    configs = tmp_path / "one-gemm"
    configs.write_text("-t f32 -transA false -transB false -g 1 -m 8 -n 8 -k 8\n")
    reader = as_role(server_db, f"{prefix}_reader")
    try:
        reader_url = reader.url.render_as_string(hide_password=False)
        denied = cli(reader_url, "import", "--op", "gemm", str(configs))
    finally:
        reader.dispose()
    assert denied.code == 2 and denied.stderr.count("\n") == 1, denied.stderr
    assert f"connected as {prefix}_reader" in denied.stderr and "admin role" in denied.stderr

    sid = make_session(server_db, tmp_path, 3, tuner="sleep")
    worker_db = as_role(server_db, f"{prefix}_worker")
    w = Worker(
        worker_db,
        WorkerSettings(session_id=sid, tuner="sleep", until_empty=True),
        tuner=SleepTuner(0),
    )
    assert w.run().completed == 3  # a worker can tune: claim, heartbeat, record
    assert job_states(server_db, sid) == {"completed": 3}
    for statement in (
        "DROP TABLE candidate",
        "DELETE FROM job",
        "ALTER TABLE job ADD COLUMN x INTEGER",
        "UPDATE session SET reason = 'x'",
        "DELETE FROM result",
        "CREATE TABLE evil (x INTEGER)",
    ):
        assert refused(worker_db, statement), statement
    worker_db.dispose()

    reader_db = as_role(server_db, f"{prefix}_reader")
    with reader_db.session() as s:
        assert s.scalar(sa.text("SELECT count(*) FROM result")) == 3
    for statement in ("UPDATE job SET priority = 1", "INSERT INTO problem_tag VALUES (1, 'x', 0)",
                      "DELETE FROM attempt", "DROP TABLE result"):  # fmt: skip
        assert refused(reader_db, statement), statement
    reader_db.dispose()

    admin_db = as_role(server_db, f"{prefix}_admin")
    with admin_db.session() as s:
        s.execute(sa.text("UPDATE job SET priority = 1"))
    admin_db.dispose()


def test_sqlite_has_no_roles(tmp_path):
    url = f"sqlite:///{tmp_path / 'm.db'}"
    Database(url, create=True).dispose()
    run = cli(url, "db", "roles")
    assert run.code == 2 and "SQLite has no users" in run.stderr


def roles_present(db: Database, prefix: str) -> set[str]:
    """The server's roles (users) whose name starts with the prefix."""
    query = (
        "SELECT rolname FROM pg_roles WHERE rolname LIKE :p"
        if db.backend == "postgresql"
        else "SELECT User FROM mysql.user WHERE User LIKE :p"
    )
    with db.engine.connect() as conn:
        return set(conn.execute(sa.text(query), {"p": f"{prefix}\\_%"}).scalars())
