"""Fixtures: every database test runs on SQLite, PostgreSQL and MariaDB/MySQL.

Server URLs come from MLIRTUNA_TEST_POSTGRES and MLIRTUNA_TEST_MYSQL; without them only SQLite
runs and the summary says which backends were skipped. With MLIRTUNA_TEST_REQUIRE_ALL=1 (CI) a
missing or unreachable server is a failure, not a skip. Each test gets a fresh database.
"""

from __future__ import annotations

import os
import uuid
from collections.abc import Iterator
from pathlib import Path

import pytest
import sqlalchemy as sa

from mlirtuna.db import Database, resolve_url

HERE = Path(__file__).parent
DATA = HERE / "data"
FAKE_ROCMLIR = HERE / "fake_rocmlir"

# The stand-in tool reads FAKE_* variables; the tool's environment is an allowlist.
os.environ.setdefault("MLIRTUNA_TOOL_ENV", "FAKE_*")

SERVER_ENV = {"postgresql": "MLIRTUNA_TEST_POSTGRES", "mysql": "MLIRTUNA_TEST_MYSQL"}
REQUIRE_ALL = os.environ.get("MLIRTUNA_TEST_REQUIRE_ALL") == "1"
_skipped: dict[str, str] = {}
_template_ready: set[str] = set()


def _server_admin(backend: str) -> sa.Engine | None:
    if backend in _skipped:
        return None
    url = os.environ.get(SERVER_ENV[backend])
    if not url:
        _skipped[backend] = f"{SERVER_ENV[backend]} not set"
        return None
    engine = sa.create_engine(resolve_url(url), isolation_level="AUTOCOMMIT", poolclass=sa.NullPool)
    try:
        with engine.connect():
            pass
    except sa.exc.OperationalError as exc:
        if REQUIRE_ALL:
            raise
        _skipped[backend] = f"unreachable: {str(exc.orig).splitlines()[0]}"
        return None
    return engine


def _fresh_server_db(backend: str, migrated: bool = True) -> Iterator[str]:
    admin = _server_admin(backend)
    if admin is None:
        if REQUIRE_ALL:
            pytest.fail(f"{backend} required (MLIRTUNA_TEST_REQUIRE_ALL=1): {_skipped[backend]}")
        pytest.skip(f"{backend}: {_skipped[backend]}")
    name = f"mlirtuna_t_{os.getpid()}_{uuid.uuid4().hex[:8]}"
    base = resolve_url(os.environ[SERVER_ENV[backend]])
    with admin.connect() as conn:
        if backend == "postgresql":
            template = f" TEMPLATE {_pg_template(admin, base)}" if migrated else ""
            conn.exec_driver_sql(f'CREATE DATABASE "{name}"{template}')
        else:
            conn.exec_driver_sql(f"CREATE DATABASE `{name}` CHARACTER SET utf8mb4")
    url = base.set(database=name)
    if migrated and backend == "mysql":
        migrate = Database(url, check_schema=False)
        migrate.upgrade()
        migrate.dispose()
    try:
        yield url.render_as_string(hide_password=False)
    finally:
        with admin.connect() as conn:
            if backend == "postgresql":
                conn.exec_driver_sql(f'DROP DATABASE IF EXISTS "{name}" WITH (FORCE)')
            else:
                conn.exec_driver_sql(f"DROP DATABASE IF EXISTS `{name}`")
        admin.dispose()


def _pg_template(admin: sa.Engine, base: sa.URL) -> str:
    """A database migrated once per run; each test's database is a cheap copy of it."""
    name = f"mlirtuna_tmpl_{os.getpid()}"
    if name not in _template_ready:
        with admin.connect() as conn:
            conn.exec_driver_sql(f'DROP DATABASE IF EXISTS "{name}" WITH (FORCE)')
            conn.exec_driver_sql(f'CREATE DATABASE "{name}"')
        db = Database(base.set(database=name), check_schema=False)
        db.upgrade()
        db.dispose()
        _template_ready.add(name)
    return f'"{name}"'


BACKENDS = ["sqlite", "postgresql", "mysql"]


@pytest.fixture(params=BACKENDS)
def db_url(request, tmp_path) -> Iterator[str]:
    """A URL of a fresh database with the schema at head, once per backend."""
    if request.param == "sqlite":
        url = f"sqlite:///{tmp_path / 'mlirtuna.db'}"
        Database(url).dispose()  # the first use of a new SQLite file creates the schema
        yield url
        return
    yield from _fresh_server_db(request.param)


@pytest.fixture(scope="module", params=BACKENDS)
def module_db_url(request, tmp_path_factory) -> Iterator[str]:
    """As db_url, but one database per backend for a whole test module (its tests share it):
    for modules that fill a database once and start a server over it (the browser tests)."""
    if request.param == "sqlite":
        url = f"sqlite:///{tmp_path_factory.mktemp('db') / 'mlirtuna.db'}"
        Database(url).dispose()
        yield url
        return
    yield from _fresh_server_db(request.param)


@pytest.fixture(params=BACKENDS)
def empty_db_url(request, tmp_path) -> Iterator[str]:
    """A URL of a fresh database with no tables at all."""
    if request.param == "sqlite":
        yield f"sqlite:///{tmp_path / 'empty.db'}"
        return
    yield from _fresh_server_db(request.param, migrated=False)


@pytest.fixture
def db(db_url) -> Iterator[Database]:
    database = Database(db_url)
    yield database
    database.dispose()


def pytest_sessionfinish(session, exitstatus):
    # Drop the PostgreSQL template this run made.
    for name in _template_ready:
        admin = _server_admin("postgresql")
        if admin is not None:
            with admin.connect() as conn:
                conn.exec_driver_sql(f'DROP DATABASE IF EXISTS "{name}" WITH (FORCE)')
            admin.dispose()


def pytest_terminal_summary(terminalreporter):
    for backend, var in SERVER_ENV.items():
        if not os.environ.get(var):
            _skipped.setdefault(backend, f"{var} not set")
    ran = ["sqlite"] + [b for b in SERVER_ENV if b not in _skipped]
    terminalreporter.write_sep("-", "database backends")
    terminalreporter.write_line(f"ran: {', '.join(ran)}")
    for backend, why in _skipped.items():
        terminalreporter.write_line(f"SKIPPED backend {backend}: {why}")
