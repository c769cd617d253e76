"""A login the server asks a password for, given none (issue 44): one line, exit 2, that says
where the password goes (MLIRTUNA_DB_PASSWORD, or what the backend's driver reads by itself),
and each place it names works. Never "cannot reach the database": the server is there, and
no wait brings a password."""

from __future__ import annotations

import uuid

import pytest
from support.clitools import cli
from support.ownservers import OwnPostgres

from mlirtuna.db import Database

SECRET = "s3cret-i44"
# Nothing of the environment may bring a password: the variables, and a HOME of the test's own
# (no ~/.pgpass, no ~/.my.cnf).
NO_PASSWORD = {"MLIRTUNA_DB_PASSWORD": None, "PGPASSWORD": None, "PGPASSFILE": None,
               "MYSQL_PWD": None}  # fmt: skip


def refused_for_no_password(url: str, home: str, *args: str) -> str:
    run = cli(url, *args, env={**NO_PASSWORD, "HOME": home})
    assert run.code == 2 and run.stderr.count("\n") == 1, run.stderr
    assert "cannot reach" not in run.stderr and SECRET not in run.stderr
    return run.stderr


@pytest.mark.backends("mysql")
def test_mariadb_names_the_password_variable_and_the_option_file(db, tmp_path):
    user = f"t{uuid.uuid4().hex[:10]}"
    with db.engine.begin() as conn:  # %% : PyMySQL formats the statement
        conn.exec_driver_sql(f"CREATE USER '{user}'@'%%' IDENTIFIED BY '{SECRET}'")
        conn.exec_driver_sql(f"GRANT ALL ON `{db.url.database}`.* TO '{user}'@'%%'")
    try:
        url = db.url.set(username=user, password=None).render_as_string(hide_password=False)
        said = refused_for_no_password(url, str(tmp_path), "status")
        assert "(1045" in said  # the server's own word stays
        assert (
            "(no password was given: set MLIRTUNA_DB_PASSWORD (or name an option file in the "
            "URL: ?read_default_file=~/.my.cnf))" in said
        ), said
        # Each way it names works.
        given = cli(url, "status", env={**NO_PASSWORD, "MLIRTUNA_DB_PASSWORD": SECRET})
        assert given.code == 0, given.stderr
        option_file = tmp_path / "my.cnf"
        option_file.write_text(f"[client]\npassword={SECRET}\n")
        from_file = cli(f"{url}?read_default_file={option_file}", "status", env=NO_PASSWORD)
        assert from_file.code == 0, from_file.stderr
        # A wrong password is not a missing one: the server's word alone.
        wrong = cli(url, "status", env={**NO_PASSWORD, "MLIRTUNA_DB_PASSWORD": "wrong"})
        assert wrong.code == 2 and "no password was given" not in wrong.stderr
    finally:
        with db.engine.begin() as conn:
            conn.exec_driver_sql(f"DROP USER IF EXISTS '{user}'@'%%'")


@pytest.mark.slow  # a PostgreSQL of its own: the shared one trusts every local login
def test_postgresql_names_the_password_variable_and_pgpass(tmp_path):
    server = OwnPostgres(hba_first=("host all needs_pw 127.0.0.1/32 scram-sha-256",))
    try:
        admin = Database(server.url(), check_schema=False)
        with admin.engine.connect() as conn:
            conn = conn.execution_options(isolation_level="AUTOCOMMIT")
            conn.exec_driver_sql(f"CREATE ROLE needs_pw LOGIN PASSWORD '{SECRET}'")
            conn.exec_driver_sql("CREATE DATABASE tuna OWNER needs_pw")
        admin.dispose()
        url = server.url("tuna", user="needs_pw")
        home = tmp_path / "home"
        home.mkdir()
        for command in (("db", "upgrade"), ("status",), ("worker", "--session", "1")):
            said = refused_for_no_password(url, str(home), *command)
            assert "no password supplied" in said  # libpq's own word stays
            assert said.endswith(
                "(no password was given: set MLIRTUNA_DB_PASSWORD (or PGPASSWORD, or a line in "
                "~/.pgpass (mode 0600)))\n"
            ), said
        given = cli(url, "db", "upgrade", env={**NO_PASSWORD, "MLIRTUNA_DB_PASSWORD": SECRET})
        assert given.code == 0, given.stderr
        pgpass = home / ".pgpass"
        pgpass.write_text(f"127.0.0.1:{server.port}:tuna:needs_pw:{SECRET}\n")
        pgpass.chmod(0o600)
        from_file = cli(url, "status", env={**NO_PASSWORD, "HOME": str(home)})
        assert from_file.code == 0, from_file.stderr
    finally:
        server.close()
