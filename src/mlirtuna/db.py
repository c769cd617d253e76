"""Connecting to the database: URLs, engines, transactions, the database clock, the schema check.

SQLite (the embedded default), PostgreSQL (psycopg 3) and MySQL/MariaDB (PyMySQL) are served by
the same code; where they differ (the claim, the clock), the difference is in one function here or
in queue.py.
"""

from __future__ import annotations

import contextlib
import datetime as dt
import os
from collections.abc import Iterator
from pathlib import Path

import sqlalchemy as sa
from sqlalchemy import event
from sqlalchemy.engine import URL, Connection, Engine, make_url
from sqlalchemy.exc import ArgumentError, DBAPIError, NoSuchModuleError
from sqlalchemy.ext.compiler import compiles
from sqlalchemy.orm import Session
from sqlalchemy.sql.expression import FunctionElement

from mlirtuna.errors import DatabaseError, SchemaOutdated

ENV_URL = "MLIRTUNA_DB"
ENV_PASSWORD = "MLIRTUNA_DB_PASSWORD"
DEFAULT_URL = "sqlite:///mlirtuna.db"
SQLITE_BUSY_TIMEOUT_MS = 30_000

# The drivers we ship, so that plain `postgresql://` and `mysql://` URLs just work.
_DRIVERS = {
    "postgresql": "postgresql+psycopg",
    "postgres": "postgresql+psycopg",
    "mysql": "mysql+pymysql",
    "mariadb": "mariadb+pymysql",
}


def utcnow() -> dt.datetime:
    """Now, as the naive UTC datetime every timestamp column holds."""
    return dt.datetime.now(dt.UTC).replace(tzinfo=None)


def resolve_url(url: str | None = None) -> URL:
    """--db URL > env MLIRTUNA_DB > sqlite:///mlirtuna.db; the password may come from the env."""
    text = url or os.environ.get(ENV_URL) or DEFAULT_URL
    try:
        parsed = make_url(text)
    except ArgumentError:
        raise DatabaseError(
            f"bad database URL {mask_text(text)!r}: expected e.g. sqlite:///mlirtuna.db, "
            "postgresql://user@host/db or mysql://user@host/db"
        ) from None
    driver = _DRIVERS.get(parsed.drivername)
    if driver:
        parsed = parsed.set(drivername=driver)
    if (
        parsed.password is None
        and os.environ.get(ENV_PASSWORD)
        and parsed.get_backend_name() != "sqlite"
    ):
        parsed = parsed.set(password=os.environ[ENV_PASSWORD])
    return parsed


def mask(url: URL) -> str:
    """The URL as it may be printed: the password replaced by ***."""
    return url.render_as_string(hide_password=True)


def mask_text(text: str) -> str:
    """Mask a password in a URL string that may not even parse."""
    try:
        return mask(make_url(text))
    except ArgumentError:
        return text.split("@")[-1] if "@" in text else text


class DbNow(FunctionElement):
    """The database's UTC clock (+ an offset in seconds): leases never trust a worker's clock."""

    type = sa.DateTime()
    inherit_cache = True

    def __init__(self, seconds: float | sa.ColumnElement = 0.0) -> None:
        # A bind parameter lets a statement be built once and run with any offset.
        offset = seconds if isinstance(seconds, sa.ColumnElement) else sa.literal(float(seconds))
        super().__init__(offset)


@compiles(DbNow, "postgresql")
def _pg_now(element: DbNow, compiler, **kw) -> str:
    secs = compiler.process(element.clauses, **kw)
    return f"((statement_timestamp() AT TIME ZONE 'UTC') + make_interval(secs => {secs}))"


@compiles(DbNow, "mysql")
@compiles(DbNow, "mariadb")
def _mysql_now(element: DbNow, compiler, **kw) -> str:
    secs = compiler.process(element.clauses, **kw)
    return f"(UTC_TIMESTAMP(6) + INTERVAL ROUND({secs} * 1000000) MICROSECOND)"


@compiles(DbNow, "sqlite")
def _sqlite_now(element: DbNow, compiler, **kw) -> str:
    secs = compiler.process(element.clauses, **kw)
    # %f gives SS.SSS; '000' pads it to the microseconds SQLAlchemy writes, so values compare
    # correctly as strings with those written from Python.
    return f"strftime('%Y-%m-%d %H:%M:%f000', 'now', ({secs}) || ' seconds')"


def db_now(seconds: float | sa.ColumnElement = 0.0) -> DbNow:
    return DbNow(seconds)


class Database:
    """One database: an engine plus the unit-of-work context manager every query runs in."""

    def __init__(
        self, url: str | URL | None = None, *, check_schema: bool = True, create: bool = True
    ) -> None:
        """`create=False`: a SQLite file that does not exist is an error, never made (reads)."""
        self.url = url if isinstance(url, URL) else resolve_url(url)
        self.backend = self.url.get_backend_name()  # sqlite | postgresql | mysql | mariadb
        if not create:
            _require_sqlite_file(self.url)
        self.engine = _make_engine(self.url)
        if check_schema:
            try:
                self.ensure_schema()
            except BaseException:
                self.dispose()  # no pooled connection may outlive a Database that failed
                raise

    @property
    def is_sqlite(self) -> bool:
        return self.backend == "sqlite"

    @property
    def display_url(self) -> str:
        return mask(self.url)

    @contextlib.contextmanager
    def session(self, *, immediate: bool = False) -> Iterator[Session]:
        """One transaction: commit on success, roll back on error, always close.

        `immediate=True` takes SQLite's write lock at BEGIN, so that a read-then-write
        transaction can never fail to upgrade its lock halfway (other backends ignore it).
        """
        bind = self.engine.execution_options(sqlite_immediate=True) if immediate else self.engine
        with (
            self._translate_errors(),
            Session(bind=bind, expire_on_commit=False) as session,
            session.begin(),
        ):
            yield session

    @contextlib.contextmanager
    def _translate_errors(self) -> Iterator[None]:
        try:
            yield
        except DBAPIError as exc:
            if exc.connection_invalidated or _is_connect_error(exc):
                raise DatabaseError(
                    f"cannot reach the database {self.display_url}: {_first_line(exc.orig)}"
                ) from exc
            raise

    def ensure_schema(self) -> None:
        """Create a new database (SQLite file) or stop when the schema is not at head."""
        from mlirtuna import migrations

        with self._translate_errors():
            current, head = migrations.current_revision(self.engine), migrations.head_revision()
        if current == head:
            return
        if current is None and self.is_sqlite and not _has_tables(self.engine):
            self.upgrade()
            return
        what = "has no mlirtuna schema" if current is None else f"is at revision {current}"
        raise SchemaOutdated(
            f"the database {self.display_url} {what}, this mlirtuna needs {head}: "
            "run `mlirtuna db upgrade`"
        )

    def current_revision(self) -> str | None:
        """The schema revision the database is at (None: no mlirtuna schema)."""
        from mlirtuna import migrations

        with self._translate_errors():
            return migrations.current_revision(self.engine)

    def upgrade(self) -> tuple[str | None, str]:
        """Apply every pending migration; returns (revision before, revision after)."""
        from mlirtuna import migrations

        with self._translate_errors():
            return migrations.upgrade(self.engine)

    def dispose(self) -> None:
        self.engine.dispose()


def _make_engine(url: URL) -> Engine:
    try:
        if url.get_backend_name() == "sqlite":
            return _sqlite_engine(url)
        # pool_pre_ping: a worker whose server restarted reconnects instead of failing a job.
        # READ COMMITTED on MariaDB/MySQL: no gap locks, so concurrent claims and records of
        # different jobs do not deadlock over index ranges (PostgreSQL's default already is).
        return sa.create_engine(
            url, pool_pre_ping=True, pool_size=2, max_overflow=2, isolation_level="READ COMMITTED"
        )
    except (NoSuchModuleError, ArgumentError) as exc:
        raise DatabaseError(f"unsupported database URL {mask(url)}: {exc}") from None


def _require_sqlite_file(url: URL) -> None:
    if url.get_backend_name() != "sqlite" or url.database in (None, "", ":memory:"):
        return
    path = Path(url.database).expanduser().absolute()
    if not path.exists():
        raise DatabaseError(
            f"no database file {path}: `mlirtuna import`, `session new` or `run` "
            "create one (or choose another with --db / MLIRTUNA_DB)"
        )


def _sqlite_engine(url: URL) -> Engine:
    if url.database and url.database != ":memory:":
        parent = Path(url.database).expanduser().resolve().parent
        if not parent.is_dir():
            raise DatabaseError(f"cannot create {url.database}: folder {parent} does not exist")
    # Worker heartbeats run in a thread of their own, with connections from the same pool.
    engine = sa.create_engine(
        url,
        connect_args={"timeout": SQLITE_BUSY_TIMEOUT_MS / 1000, "check_same_thread": False},
    )

    @event.listens_for(engine, "connect")
    def _on_connect(dbapi_conn, _record) -> None:
        # We issue BEGIN ourselves (below); pysqlite's own transaction handling would defer it.
        dbapi_conn.isolation_level = None
        cur = dbapi_conn.cursor()
        cur.execute("PRAGMA journal_mode=WAL")  # readers never block the writer
        cur.execute(f"PRAGMA busy_timeout={SQLITE_BUSY_TIMEOUT_MS}")
        cur.execute("PRAGMA foreign_keys=ON")
        cur.execute("PRAGMA synchronous=NORMAL")  # safe with WAL; a commit need not fsync
        cur.close()

    @event.listens_for(engine, "begin")
    def _on_begin(conn: Connection) -> None:
        immediate = conn.get_execution_options().get("sqlite_immediate", False)
        conn.exec_driver_sql("BEGIN IMMEDIATE" if immediate else "BEGIN")

    return engine


def _has_tables(engine: Engine) -> bool:
    return bool(sa.inspect(engine).get_table_names())


# Deadlock / lock timeout (MariaDB 1213, 1205), deadlock / serialization failure (PostgreSQL):
# the transaction was rolled back whole and can simply run again.
_TRANSIENT_MYSQL = {1205, 1213}
_TRANSIENT_PG = {"40P01", "40001"}


def is_transient(exc: BaseException) -> bool:
    """A database error that means "run the same transaction again", nothing more."""
    if not isinstance(exc, DBAPIError):
        return False
    orig = exc.orig
    args = getattr(orig, "args", ())
    if args and isinstance(args[0], int) and args[0] in _TRANSIENT_MYSQL:
        return True
    return getattr(orig, "sqlstate", None) in _TRANSIENT_PG


def _is_connect_error(exc: DBAPIError) -> bool:
    text = str(exc.orig).lower()
    return any(
        needle in text
        for needle in (
            "connection refused",
            "could not connect",
            "can't connect",
            "unable to open database",
            "server closed the connection",
            "connection is closed",
            "lost connection",
            "terminating connection",
            "gone away",
            "does not exist",
            "unknown database",
            "access denied",
            "authentication failed",
        )
    )


def _first_line(exc: BaseException | None) -> str:
    text = str(exc or "").strip()
    return text.splitlines()[0] if text else type(exc).__name__
