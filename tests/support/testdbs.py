"""Test databases made cheaply: migrate once per test process and backend, then hand each test
a fresh database at head.

- SQLite: one migrated file, copied for each test (a copy is ~1 ms; 17 migrations are 0.3 s).
- PostgreSQL and MariaDB/MySQL: each test process keeps one migrated database per server and
  empties it between tests (TRUNCATE of the tables the test wrote, which also puts their id
  counters back at 1), so a test sees ids from 1 as in a new database. A test that changed the
  schema itself (a downgrade, a table of its own) leaves a database that is not reused: it is
  dropped and the next test gets a new one. (A PostgreSQL DROP DATABASE forces a checkpoint:
  seconds under load, so nothing is dropped that need not be.)

Names carry the process id, so parallel test processes (pytest-xdist) never share a database.
"""

from __future__ import annotations

import contextlib
import os
import shutil
import uuid
from collections.abc import Iterator
from pathlib import Path

import pytest
import sqlalchemy as sa

from mlirtuna.db import Database, resolve_url

BACKENDS = ("sqlite", "postgresql", "mysql")
SERVER_ENV = {"postgresql": "MLIRTUNA_TEST_POSTGRES", "mysql": "MLIRTUNA_TEST_MYSQL"}
REQUIRE_ALL = os.environ.get("MLIRTUNA_TEST_REQUIRE_ALL") == "1"

# How long a reset waits for a lock a test left behind before it gives the database up.
RESET_LOCK_WAIT_S = 5


def server_admin(backend: str) -> tuple[sa.Engine | None, str]:
    """An AUTOCOMMIT engine on the backend's server, or None and why not."""
    url = os.environ.get(SERVER_ENV[backend])
    if not url:
        return None, f"{SERVER_ENV[backend]} not set"
    engine = sa.create_engine(resolve_url(url), isolation_level="AUTOCOMMIT", poolclass=sa.NullPool)
    try:
        with engine.connect():
            pass
    except sa.exc.OperationalError as exc:
        engine.dispose()
        if REQUIRE_ALL:
            raise
        return None, f"unreachable: {str(exc.orig).splitlines()[0]}"
    return engine, ""


class TestDatabases:
    """The databases of one test process (a session-scoped fixture)."""

    __test__ = False  # not a test class, whatever pytest's name rule says

    def __init__(self, workdir: Path) -> None:
        self.workdir = workdir
        self.tag = f"{os.getpid()}_{uuid.uuid4().hex[:6]}"
        self._admins: dict[str, sa.Engine] = {}
        self._sqlite_template: Path | None = None
        self._spare: dict[str, str] = {}  # backend → a migrated database, empty, ready
        self._fingerprints: dict[str, tuple] = {}  # backend → its schema as migrated
        self._made: set[str] = set()

    # -- what the fixtures call -----------------------------------------------------------

    def migrated(self, backend: str, path: Path, shared: bool = True) -> Iterator[str]:
        """A database at head. `shared=False`: never a reused one (a module keeps it)."""
        if backend == "sqlite":
            shutil.copyfile(self._sqlite_file(), path)
            yield f"sqlite:///{path}"
            return
        admin = self._admin(backend)
        if shared:
            yield from self._reused(admin)
            return
        name = self._create(admin)
        self._migrate(admin, name)
        yield from self._used_then_dropped(admin, name)

    def empty(self, backend: str, path: Path) -> Iterator[str]:
        """A database with no tables at all."""
        if backend == "sqlite":
            yield f"sqlite:///{path}"
            return
        admin = self._admin(backend)
        yield from self._used_then_dropped(admin, self._create(admin))

    def close(self) -> None:
        for backend, admin in self._admins.items():
            with admin.connect() as conn:
                for name in list(self._made):
                    _drop(conn, backend, name)
            admin.dispose()
        self._admins.clear()
        self._made.clear()

    @staticmethod
    def summary() -> tuple[list[str], dict[str, str]]:
        """The backends this run could use and why others were skipped (probed afresh, so the
        answer is the same in pytest-xdist's controller, which opens no database itself)."""
        ran, skipped = ["sqlite"], {}
        for backend in SERVER_ENV:
            try:
                admin, why = server_admin(backend)
            except sa.exc.OperationalError as exc:
                admin, why = None, f"unreachable: {str(exc.orig).splitlines()[0]}"
            if admin is None:
                skipped[backend] = why
            else:
                admin.dispose()
                ran.append(backend)
        return ran, skipped

    # -- per backend ----------------------------------------------------------------------

    def _admin(self, backend: str) -> sa.Engine:
        if backend not in self._admins:
            admin, why = server_admin(backend)
            if admin is None:
                if REQUIRE_ALL:
                    pytest.fail(f"{backend} required (MLIRTUNA_TEST_REQUIRE_ALL=1): {why}")
                pytest.skip(f"{backend}: {why}")
            self._admins[backend] = admin
        return self._admins[backend]

    def _sqlite_file(self) -> Path:
        if self._sqlite_template is None:
            path = self.workdir / "migrated.db"
            Database(f"sqlite:///{path}").dispose()  # a new SQLite file gets the schema
            self._sqlite_template = path
        return self._sqlite_template

    def _reused(self, admin: sa.Engine) -> Iterator[str]:
        """The process's reused database for this backend, emptied after the test. A drop is
        what costs on PostgreSQL (it forces a checkpoint: seconds under load), so nothing is
        dropped unless the test changed the schema."""
        backend = admin.dialect.name
        name = self._spare.pop(backend, None) or self._new_reusable(admin)
        url = _url_of(admin, name)
        yield url
        if self._reset(url):
            self._spare[backend] = name
        else:
            with admin.connect() as conn:
                _drop(conn, backend, name)
            self._made.discard(name)

    def _new_reusable(self, admin: sa.Engine) -> str:
        name = self._create(admin)
        self._migrate(admin, name)
        self._fingerprints.setdefault(_family(admin), fingerprint(_url_of(admin, name)))
        return name

    def _reset(self, url: str) -> bool:
        """Empty every table, if the schema is still as migrated; False: give the database up."""
        engine = sa.create_engine(resolve_url(url), poolclass=sa.NullPool)
        try:
            with engine.begin() as conn:
                if _schema(conn) != self._fingerprints[_family(engine)]:
                    return False
                _end_other_connections(conn)
                tables = [t for t in sa.inspect(conn).get_table_names() if t != "alembic_version"]
                _empty(conn, _written(conn, tables))
        except sa.exc.DBAPIError:
            return False  # a lock the test left behind: a new database is cheaper than waiting
        finally:
            engine.dispose()
        return True

    # -- creating and dropping ------------------------------------------------------------

    def _create(self, admin: sa.Engine, template: str | None = None) -> str:
        name = f"mlirtuna_t_{self.tag}_{len(self._made)}_{uuid.uuid4().hex[:4]}"
        with admin.connect() as conn:
            if admin.dialect.name == "postgresql":
                clause = f' TEMPLATE "{template}"' if template else ""
                conn.exec_driver_sql(f'CREATE DATABASE "{name}"{clause}')
            else:
                conn.exec_driver_sql(f"CREATE DATABASE `{name}` CHARACTER SET utf8mb4")
        self._made.add(name)
        return name

    def _migrate(self, admin: sa.Engine, name: str) -> None:
        database = Database(_url_of(admin, name), check_schema=False)
        database.upgrade()
        database.dispose()

    def _used_then_dropped(self, admin: sa.Engine, name: str) -> Iterator[str]:
        try:
            yield _url_of(admin, name)
        finally:
            with admin.connect() as conn:
                _drop(conn, admin.dialect.name, name)
            self._made.discard(name)


def _url_of(admin: sa.Engine, name: str) -> str:
    return admin.url.set(database=name).render_as_string(hide_password=False)


def _drop(conn: sa.Connection, backend: str, name: str) -> None:
    if backend == "postgresql":
        conn.exec_driver_sql(f'DROP DATABASE IF EXISTS "{name}" WITH (FORCE)')
    else:
        conn.exec_driver_sql(f"DROP DATABASE IF EXISTS `{name}`")


def _end_other_connections(conn: sa.Connection) -> None:
    """Connections the test left open (a pool never disposed, a thread still running) could
    hold a lock or write after the reset: end them, as PostgreSQL's DROP … WITH (FORCE) does."""
    if conn.dialect.name == "postgresql":
        conn.exec_driver_sql(
            "SELECT pg_terminate_backend(pid) FROM pg_stat_activity "
            "WHERE datname = current_database() AND pid <> pg_backend_pid()"
        )
        return
    others = conn.exec_driver_sql(
        "SELECT id FROM information_schema.processlist WHERE db = DATABASE() "
        "AND id <> CONNECTION_ID()"
    ).scalars()
    for connection_id in others:
        with contextlib.suppress(sa.exc.DBAPIError):  # it may have ended meanwhile
            conn.exec_driver_sql(f"KILL CONNECTION {int(connection_id)}")


def _written(conn: sa.Connection, tables: list[str]) -> list[str]:
    """The tables a test wrote: rows in them, or an id counter moved (a rolled-back insert
    moves it too). Truncating only these halves a reset (a TRUNCATE makes new files)."""
    q, dual = ('"', "") if conn.dialect.name == "postgresql" else ("`", " FROM DUAL")
    with_rows = conn.exec_driver_sql(
        " UNION ALL ".join(
            f"SELECT '{t}'{dual} WHERE EXISTS (SELECT 1 FROM {q}{t}{q})" for t in tables
        )
    ).scalars()
    if conn.dialect.name == "postgresql":
        counted = conn.exec_driver_sql(
            "SELECT d.refobjid::regclass::text FROM pg_sequences s "
            "JOIN pg_class c ON c.relname = s.sequencename "
            "JOIN pg_namespace n ON n.oid = c.relnamespace AND n.nspname = s.schemaname "
            "JOIN pg_depend d ON d.objid = c.oid AND d.refclassid = 'pg_class'::regclass "
            "WHERE s.schemaname = current_schema() AND s.last_value IS NOT NULL"
        ).scalars()
    else:
        counted = conn.exec_driver_sql(
            "SELECT table_name FROM information_schema.tables "
            "WHERE table_schema = DATABASE() AND auto_increment > 1"
        ).scalars()
    written = set(with_rows) | {t.strip('"') for t in counted}
    return [t for t in tables if t in written]


def _empty(conn: sa.Connection, tables: list[str]) -> None:
    """Every table emptied and its id counter back at 1, as in a new database."""
    if not tables:
        return
    if conn.dialect.name == "postgresql":
        conn.exec_driver_sql(f"SET LOCAL lock_timeout = '{RESET_LOCK_WAIT_S}s'")
        names = ", ".join(f'"{t}"' for t in tables)
        conn.exec_driver_sql(f"TRUNCATE {names} RESTART IDENTITY CASCADE")
        return
    conn.exec_driver_sql(f"SET SESSION lock_wait_timeout = {RESET_LOCK_WAIT_S}")
    conn.exec_driver_sql("SET SESSION foreign_key_checks = 0")
    for table in tables:
        conn.exec_driver_sql(f"TRUNCATE TABLE `{table}`")


# What a test could change of the schema, per backend: columns, indexes, triggers, routines,
# (PostgreSQL) row-level security and its policies; the revision is read apart.
_SCHEMA_QUERIES = {
    "postgresql": (
        "SELECT table_name, column_name, data_type, is_nullable, column_default "
        "FROM information_schema.columns WHERE table_schema = 'public'",
        "SELECT tablename, indexname, indexdef FROM pg_indexes WHERE schemaname = 'public'",
        "SELECT event_object_table, trigger_name FROM information_schema.triggers",
        "SELECT proname FROM pg_proc JOIN pg_namespace n ON n.oid = pronamespace "
        "WHERE nspname = 'public'",
        "SELECT relname, relrowsecurity FROM pg_class JOIN pg_namespace n ON n.oid = relnamespace "
        "WHERE nspname = 'public' AND relkind = 'r'",
        "SELECT tablename, policyname FROM pg_policies",
    ),
    "mysql": (
        "SELECT table_name, column_name, column_type, is_nullable, column_default "
        "FROM information_schema.columns WHERE table_schema = DATABASE()",
        "SELECT table_name, index_name, column_name FROM information_schema.statistics "
        "WHERE table_schema = DATABASE()",
        "SELECT trigger_name FROM information_schema.triggers WHERE trigger_schema = DATABASE()",
        "SELECT routine_name FROM information_schema.routines WHERE routine_schema = DATABASE()",
    ),
}


def _family(engine: sa.Engine) -> str:
    return "postgresql" if engine.dialect.name == "postgresql" else "mysql"


def fingerprint(url: str) -> tuple:
    """The schema of a server database as a comparable value."""
    engine = sa.create_engine(resolve_url(url), poolclass=sa.NullPool)
    try:
        with engine.connect() as conn:
            return _schema(conn)
    finally:
        engine.dispose()


def _schema(conn: sa.Connection) -> tuple:
    family = "postgresql" if conn.dialect.name == "postgresql" else "mysql"
    parts = [
        tuple(sorted(tuple(map(str, row)) for row in conn.exec_driver_sql(query)))
        for query in _SCHEMA_QUERIES[family]
    ]
    try:
        with conn.begin_nested():  # a database without the table: the revision is empty
            version = conn.exec_driver_sql("SELECT version_num FROM alembic_version").all()
    except sa.exc.DBAPIError:
        version = []
    parts.append(tuple(map(tuple, version)))
    return tuple(parts)
