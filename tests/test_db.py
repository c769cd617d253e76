"""The database layer: URLs, migrations against the models, schema checks, SQLite settings."""

from __future__ import annotations

import pytest
import sqlalchemy as sa
from alembic.autogenerate import compare_metadata
from alembic.runtime.migration import MigrationContext

from mlirtuna import migrations
from mlirtuna.db import Database, db_now, mask, resolve_url, utcnow
from mlirtuna.db.models import Base
from mlirtuna.errors import DatabaseError, SchemaOutdated


def test_migrations_match_models(db):
    """All migrations applied == the schema the models describe (no drift on any backend)."""
    with db.engine.connect() as conn:
        diff = compare_metadata(
            MigrationContext.configure(conn, opts={"compare_type": True}), Base.metadata
        )
    assert diff == []
    assert migrations.current_revision(db.engine) == migrations.head_revision()
    # The fast reads that spare every command an Alembic import agree with Alembic's own.
    assert migrations.head_revision() == migrations.alembic_head_revision()
    with db.engine.connect() as conn:
        stamped = MigrationContext.configure(conn).get_current_revision()
    assert migrations.current_revision(db.engine) == stamped


def test_upgrade_twice_says_up_to_date(db):
    before, after = db.upgrade()
    assert before == after == migrations.head_revision()


def test_database_clock_is_utc_and_offsets(db):
    with db.session() as s:
        now, later = s.execute(sa.select(db_now(), db_now(90))).one()
    assert abs((now - utcnow()).total_seconds()) < 5
    assert 89 <= (later - now).total_seconds() <= 91


def test_new_sqlite_file_is_created_on_first_use(tmp_path):
    db = Database(f"sqlite:///{tmp_path / 'new.db'}")
    assert migrations.current_revision(db.engine) == migrations.head_revision()
    with db.engine.connect() as conn:
        assert conn.exec_driver_sql("PRAGMA journal_mode").scalar() == "wal"
        assert conn.exec_driver_sql("PRAGMA busy_timeout").scalar() >= 1000
    db.dispose()


def test_sqlite_file_of_something_else_is_not_touched(tmp_path):
    path = tmp_path / "other.db"
    eng = sa.create_engine(f"sqlite:///{path}")
    with eng.begin() as conn:
        conn.exec_driver_sql("CREATE TABLE notes (x INTEGER)")
    eng.dispose()
    with pytest.raises(SchemaOutdated, match="mlirtuna db upgrade"):
        Database(f"sqlite:///{path}")


def test_server_database_without_schema_asks_for_upgrade(empty_db_url):
    if empty_db_url.startswith("sqlite"):
        Database(empty_db_url).dispose()  # a new SQLite file is created instead
        return
    with pytest.raises(SchemaOutdated) as info:
        Database(empty_db_url)
    message = str(info.value)
    assert "run `mlirtuna db upgrade`" in message and "\n" not in message
    db = Database(empty_db_url, check_schema=False)
    assert db.upgrade() == (None, migrations.head_revision())
    db.dispose()
    Database(empty_db_url).dispose()


def test_url_precedence_and_driver_defaults(monkeypatch):
    monkeypatch.delenv("MLIRTUNA_DB", raising=False)
    assert resolve_url(None).render_as_string() == "sqlite:///mlirtuna.db"
    monkeypatch.setenv("MLIRTUNA_DB", "postgresql://u@h/d")
    assert resolve_url(None).drivername == "postgresql+psycopg"
    assert resolve_url("mysql://u@h/d").drivername == "mysql+pymysql"


def test_password_from_env_and_masked(monkeypatch):
    monkeypatch.setenv("MLIRTUNA_DB_PASSWORD", "s3cret")
    url = resolve_url("postgresql://tuna@db.example/tuna")
    assert url.password == "s3cret"
    assert "s3cret" not in mask(url) and "***" in mask(url)


def test_bad_url_is_one_line():
    with pytest.raises(DatabaseError) as info:
        resolve_url("not a url")
    assert "bad database URL" in str(info.value) and "\n" not in str(info.value)


def test_unreachable_server_is_one_line_with_masked_password():
    db = Database("postgresql://tuna:hunter2@127.0.0.1:1/x?connect_timeout=2", check_schema=False)
    with pytest.raises(DatabaseError) as info:
        db.ensure_schema()
    db.dispose()
    text = str(info.value)
    assert "cannot reach the database" in text and "hunter2" not in text and "***" in text


def test_deadlocks_and_lock_timeouts_are_transient():
    import psycopg
    import pymysql

    from mlirtuna.db import is_transient

    def wrapped(orig):
        return sa.exc.OperationalError("UPDATE job …", {}, orig)

    assert is_transient(wrapped(pymysql.err.OperationalError(1213, "Deadlock found")))
    assert is_transient(wrapped(pymysql.err.OperationalError(1205, "Lock wait timeout")))
    assert is_transient(wrapped(psycopg.errors.DeadlockDetected("deadlock detected")))
    assert is_transient(wrapped(psycopg.errors.SerializationFailure("could not serialize")))
    assert not is_transient(wrapped(pymysql.err.OperationalError(1045, "Access denied")))
    assert not is_transient(wrapped(psycopg.errors.UndefinedTable("no such table")))
    assert not is_transient(ValueError("not a database error"))


def test_0003_upgrades_a_database_with_sessions_in_place(empty_db_url):
    db = Database(empty_db_url, check_schema=False)
    migrations.upgrade(db.engine, "0002")
    with db.engine.begin() as conn:
        conn.exec_driver_sql(
            "INSERT INTO session (arch, arch_full, num_cu, num_chiplets, rocm_v, mlir_v, reason,"
            " ticket, docker, tuning_space, tuner, host, created_at) VALUES ('gfx942', 'gfx942',"
            " 304, 8, '', '', 'old', '', '', 'full', 'cpu', '', '2025-01-01 00:00:00')"
        )
        conn.exec_driver_sql(
            "INSERT INTO problem (op, test_vector, created_at) VALUES ('gemm', '-m 1',"
            " '2025-01-01 00:00:00')"
        )
        conn.exec_driver_sql(
            "INSERT INTO result (session_id, problem_id, perf_config) VALUES (1, 1, 'pc')"
        )
    assert db.upgrade() == ("0002", migrations.head_revision())
    with db.engine.connect() as conn:
        rows = conn.exec_driver_sql("SELECT reason, source_sha256 FROM session").all()
        assert conn.exec_driver_sql("SELECT count(*) FROM result").scalar() == 1
    assert [tuple(r) for r in rows] == [("old", None)]
    indexes = {ix["name"] for ix in sa.inspect(db.engine).get_indexes("job")}
    assert "ix_job_session_list" in indexes
    db.dispose()
