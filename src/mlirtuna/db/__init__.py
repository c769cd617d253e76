"""Connecting to the database: URLs, engines, transactions, the database clock, the schema check.

SQLite (the embedded default), PostgreSQL (psycopg 3) and MySQL/MariaDB (PyMySQL) are served by
the same code; where they differ (the claim, the clock), the difference is in one function here or
in queue.py.
"""

from __future__ import annotations

import contextlib
import copy
import datetime as dt
import functools
import logging
import os
import random
import socket
import time
from collections.abc import Callable, Iterable, Iterator
from pathlib import Path
from typing import TypeVar

import sqlalchemy as sa
from sqlalchemy import event
from sqlalchemy.engine import URL, Connection, Engine, make_url
from sqlalchemy.exc import ArgumentError, DBAPIError, NoSuchModuleError
from sqlalchemy.ext.compiler import compiles
from sqlalchemy.orm import Session
from sqlalchemy.sql.expression import FunctionElement

from mlirtuna.defaults import ENV_DB, ENV_DB_PASSWORD
from mlirtuna.errors import DatabaseError, DatabaseUnavailable, SchemaOutdated

log = logging.getLogger(__name__)
T = TypeVar("T")

ENV_URL = ENV_DB
ENV_PASSWORD = ENV_DB_PASSWORD
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
        parsed.port  # noqa: B018 (a port that is not a number fails here, not at connect)
    except (ArgumentError, ValueError):
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
    _check_query(parsed)
    return parsed


_SSLMODES = ("disable", "allow", "prefer", "require", "verify-ca", "verify-full")


def _check_query(url: URL) -> None:
    """Options the drivers would refuse only at connect time (PyMySQL with a traceback)."""
    bad = None
    if url.get_backend_name() == "postgresql":
        mode = url.query.get("sslmode")
        if mode is not None and mode not in _SSLMODES:
            bad = f"sslmode={mode!r} (known: {', '.join(_SSLMODES)})"
    elif url.get_backend_name() in ("mysql", "mariadb"):
        charset = url.query.get("charset")
        if charset is not None:
            from pymysql.charset import charset_by_name

            if not isinstance(charset, str) or charset_by_name(charset) is None:
                bad = f"charset={charset!r}"
    if bad:
        raise DatabaseError(f"bad database URL {mask(url)}: unknown {bad}")


def mask(url: URL) -> str:
    """The URL as it may be printed: the password replaced by ***."""
    return url.render_as_string(hide_password=True)


def mask_text(text: str) -> str:
    """Mask a password in a URL string that may not even parse."""
    try:
        return mask(make_url(text))
    except (ArgumentError, ValueError):
        # Unparseable: keep the scheme and what follows the last @, never what precedes it.
        scheme, sep, rest = text.partition("://")
        if "@" not in rest:
            return text
        return f"{scheme}{sep}***@{rest.rsplit('@', 1)[1]}"


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


class JsonObject(FunctionElement):
    """A JSON object built by the database from (name, value, name, value, …): one column for a
    whole row, where reading the row's many columns costs more on the client than the query."""

    inherit_cache = True


@compiles(JsonObject)
def _json_object(element: JsonObject, compiler, **kw) -> str:
    return f"json_object({compiler.process(element.clauses, **kw)})"  # SQLite, MariaDB/MySQL


@compiles(JsonObject, "postgresql")
def _pg_json_object(element: JsonObject, compiler, **kw) -> str:
    return f"json_build_object({compiler.process(element.clauses, **kw)})"


def json_object(columns: Iterable[sa.ColumnElement]) -> JsonObject:
    """{column name: value} of `columns`, as JSON built by the database."""
    pairs: list[sa.ColumnElement] = []
    for c in columns:
        pairs += [sa.literal_column(f"'{c.name}'"), c]
    return JsonObject(*pairs)


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
    def transaction(self, *, immediate: bool = False, single: bool = False) -> Iterator[Connection]:
        """One transaction on a Core connection, for the queue's hot path (no ORM Session).

        `immediate`: as for session(). `single`: the caller sends one statement only, which is
        atomic by itself; PostgreSQL then runs it in autocommit mode, saving the BEGIN and
        COMMIT round trips (elsewhere it is an ordinary transaction).
        """
        if single and self.backend == "postgresql":
            bind = self._autocommit
        else:
            bind = self._immediate if immediate else self.engine
        with self._translate_errors(), bind.connect() as conn, conn.begin():
            yield conn

    @functools.cached_property
    def _immediate(self) -> Engine:
        return self.engine.execution_options(sqlite_immediate=True)

    @functools.cached_property
    def _autocommit(self) -> Engine:
        return self.engine.execution_options(isolation_level="AUTOCOMMIT")

    @contextlib.contextmanager
    def _translate_errors(self) -> Iterator[None]:
        try:
            yield
        except DBAPIError as exc:
            if fault_of(exc) == UNAVAILABLE:
                raise DatabaseUnavailable(
                    f"cannot reach the database {self.display_url}: {_first_line(exc.orig)}"
                ) from exc
            # Anything else (a missing table, a refused login, a read-only file) waiting will
            # not cure: it goes up as it is; the CLI prints it as one line (error_line).
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

    def retrying_conflicts(self, write: Callable[[], T], tries: int = 5) -> T:
        """Run `write` (one transaction of its own) again when it lost a race with another
        writer: a unique key another transaction inserted first (two `import` at once), or a
        deadlock. The next try sees the winner's rows and inserts only what is still missing."""
        for attempt in range(1, tries + 1):
            try:
                return write()
            except (DatabaseError, DBAPIError) as exc:
                conflict = isinstance(exc, sa.exc.IntegrityError) or isinstance(
                    exc.__cause__, sa.exc.IntegrityError
                )
                if attempt == tries or not (conflict or fault_of(exc) == ROLLED_BACK):
                    raise
                time.sleep(random.uniform(0.0, 0.05 * attempt))
        raise AssertionError("unreachable")


class Precompiled:
    """Core statements compiled once per dialect and sent at driver level.

    The queue's hot statements run once per job on every worker: executing them as SQL text
    skips SQLAlchemy's per-call cache-key generation and compiled-cache lookup, the cost that
    dominated a job. Bind values still go through each column type's bind processor (SQLite
    stores datetimes as text); result rows come back as the driver returns them.

    Several statements make a script, sent in one round trip by `run_script` (MariaDB/MySQL,
    whose connections allow multiple statements: _make_engine).
    """

    def __init__(
        self, *stmts: sa.Executable, edit: Callable[[int, str], str] | None = None
    ) -> None:
        """`edit(i, sql)`: the i-th statement's SQL text as sent, for what Core cannot say."""
        self.stmts, self.edit = stmts, edit
        self._compiled: dict[str, tuple[str, dict, dict]] = {}

    def run(self, conn: Connection, params: dict | list[dict]) -> sa.CursorResult:
        sql, bound = self._prepare(conn.dialect)
        if isinstance(params, list):
            return conn.exec_driver_sql(sql, [bound(p) for p in params])
        return conn.exec_driver_sql(sql, bound(params))

    def run_script(self, conn: Connection, params: dict) -> list[list[tuple]]:
        """Every statement's rows, the script sent in one round trip; a failing statement
        raises as exec_driver_sql would (the transaction is then rolled back whole)."""
        sql, bound = self._prepare(conn.dialect)
        args = bound(params)
        cursor = conn.connection.dbapi_connection.cursor()
        conn.dispatch.before_cursor_execute(conn, cursor, sql, args, None, False)
        try:
            cursor.execute(sql, args)
            rows = [list(cursor.fetchall())]
            while cursor.nextset():  # the later statements' errors surface here
                rows.append(list(cursor.fetchall()))
        except Exception as exc:
            conn._handle_dbapi_exception(exc, sql, args, cursor, None)  # wraps; drops dead links
            raise
        finally:
            cursor.close()
        conn.dispatch.after_cursor_execute(conn, cursor, sql, args, None, False)
        return rows

    def _prepare(self, dialect: sa.Dialect) -> tuple[str, Callable[[dict], dict]]:
        sql, constants, processors = self._compiled.get(dialect.name) or self._compile(dialect)

        def bound(values: dict) -> dict:
            args = {**constants, **values}
            for key, process in processors.items():
                args[key] = process(args[key])
            return args

        return sql, bound

    def _compile(self, dialect: sa.Dialect) -> tuple[str, dict, dict]:
        if dialect.positional:  # SQLite's driver also takes named parameters (:name)
            dialect = copy.copy(dialect)
            dialect.paramstyle, dialect.positional = "named", False
        texts, constants, processors = [], {}, {}
        for i, stmt in enumerate(self.stmts):
            compiled = stmt.compile(dialect=dialect)
            text = compiled.string
            if "POSTCOMPILE" in text:
                raise AssertionError(f"statement needs per-call rendering: {text}")
            for bind, name in compiled.bind_names.items():
                if not bind.required:  # a constant (param_1 …): its own name per statement
                    unique = f"s{i}_{name}" if len(self.stmts) > 1 else name
                    text = text.replace(f"%({name})s", f"%({unique})s")
                    constants[unique] = bind.effective_value
                    name = unique
                process = bind.type._cached_bind_processor(dialect)
                if process is not None:
                    processors[name] = process
            texts.append(self.edit(i, text) if self.edit else text)
        self._compiled[dialect.name] = (";\n".join(texts), constants, processors)
        return self._compiled[dialect.name]


def _make_engine(url: URL) -> Engine:
    try:
        if url.get_backend_name() == "sqlite":
            return _sqlite_engine(url)
        # READ COMMITTED on MariaDB/MySQL: no gap locks, so concurrent claims and records of
        # different jobs do not deadlock over index ranges (PostgreSQL's default already is).
        mysql = url.get_backend_name() in ("mysql", "mariadb")
        engine = sa.create_engine(
            url,
            pool_size=2,
            max_overflow=2,
            isolation_level="READ COMMITTED",
            connect_args=_connect_args(url),
            pool_reset_on_return=None if mysql else "rollback",
        )
        _ping_when_idle(engine)
        if mysql:
            _roll_back_only_open_transactions(engine)
        return engine
    except (NoSuchModuleError, ArgumentError) as exc:
        raise DatabaseError(f"unsupported database URL {mask(url)}: {exc}") from None


# A pooled connection idle longer than this is pinged before use (a round trip).
PING_IDLE_S = 1.0


def _ping_when_idle(engine: Engine) -> None:
    """Ping a pooled connection before use when it sat idle for more than PING_IDLE_S, so that a
    worker whose server restarted while it tuned reconnects instead of failing (what
    pool_pre_ping does at every checkout: a round trip per transaction, a third of a busy
    queue's). A connection used within that second is trusted: a restart in that second
    surfaces on the next statement as the server being away, which callers wait out."""

    @event.listens_for(engine.pool, "checkin")
    def _checked_in(_dbapi_conn, record) -> None:
        record.info["checked_in"] = time.monotonic()

    @event.listens_for(engine.pool, "checkout")
    def _checkout(dbapi_conn, record, _proxy) -> None:
        idle = time.monotonic() - record.info.get("checked_in", time.monotonic())
        if idle > PING_IDLE_S and not engine.dialect._do_ping_w_event(dbapi_conn):
            # As pool_pre_ping: this and every older pooled connection are dropped.
            raise sa.exc.InvalidatePoolError()


def _roll_back_only_open_transactions(engine: Engine) -> None:
    """MariaDB/MySQL: a connection going back to the pool is rolled back only when the server
    says a transaction is open. PyMySQL sends ROLLBACK whatever the state, so the pool's default
    reset cost a round trip after every committed transaction."""
    from pymysql.constants import SERVER_STATUS

    @event.listens_for(engine, "reset")
    def _reset(dbapi_conn, _record, _state) -> None:
        if dbapi_conn.server_status & SERVER_STATUS.SERVER_STATUS_IN_TRANS:
            dbapi_conn.rollback()


def _connect_args(url: URL) -> dict[str, object]:
    """MariaDB/MySQL: allow several statements per round trip (the queue's claim and record
    send scripts of bound statements, never text from users); found rows, not changed rows, as
    the update count (as SQLAlchemy sets it itself)."""
    if url.get_backend_name() not in ("mysql", "mariadb"):
        return {}
    from pymysql.constants import CLIENT

    return {"client_flag": CLIENT.FOUND_ROWS | CLIENT.MULTI_STATEMENTS}


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


# What a database error means for a worker, decided by the driver's error class and code (SQLSTATE,
# MySQL errno, SQLite result code), never by message text, which servers translate and reword.
ROLLED_BACK = "rolled back"  # deadlock, serialization failure, lock wait timeout: run it again
UNAVAILABLE = "unavailable"  # server restarting, link cut, SQLite file locked: wait, then again

# Deadlock / lock timeout (MariaDB 1213, 1205), deadlock / serialization failure (PostgreSQL):
# the transaction was rolled back whole and can simply run again.
_ROLLBACK_MYSQL = {1205, 1213}
_ROLLBACK_PG = {"40P01", "40001"}
# Server shutdown / crash / start-up (57P01-57P03), the connection exceptions (class 08), too many
# connections and out of resources (class 53: disk full is waited out, the result kept).
_UNAVAILABLE_PG = {"57P01", "57P02", "57P03"}
_UNAVAILABLE_PG_CLASSES = {"08", "53"}
# Can't connect (2002 socket, 2003 TCP), server gone away (2006), lost connection (2013), lost
# during handshake (2055), connection killed (1927), shutdown in progress (1053), too many
# connections (1040), disk full (1021).
_UNAVAILABLE_MYSQL = {2002, 2003, 2006, 2013, 2055, 1927, 1053, 1040, 1021}
# SQLITE_BUSY (5), SQLITE_LOCKED (6): another connection holds the lock past the busy timeout;
# SQLITE_FULL (13): the disk is full. Primary codes are the low byte of the extended code.
_UNAVAILABLE_SQLITE = {5, 6, 13}


def fault_of(exc: BaseException) -> str | None:
    """ROLLED_BACK, UNAVAILABLE, or None for an error that waiting will not cure (a missing
    table, a constraint, a wrong password): the caller must stop, not retry."""
    seen: set[int] = set()
    while exc is not None and id(exc) not in seen:  # a DatabaseError wraps the driver's error
        seen.add(id(exc))
        if isinstance(exc, DBAPIError):
            return _driver_fault(exc.orig, exc.connection_invalidated)
        exc = exc.__cause__
    return None


def _driver_fault(orig: BaseException | None, invalidated: bool) -> str | None:
    if orig is None:
        return UNAVAILABLE if invalidated else None
    module = type(orig).__module__.split(".")[0]
    if module == "sqlite3":
        code = getattr(orig, "sqlite_errorcode", None)
        return UNAVAILABLE if code is not None and code & 0xFF in _UNAVAILABLE_SQLITE else None
    if module == "psycopg":
        import psycopg

        state = getattr(orig, "sqlstate", None)
        if state in _ROLLBACK_PG:
            return ROLLED_BACK
        if state in _UNAVAILABLE_PG or (state and state[:2] in _UNAVAILABLE_PG_CLASSES):
            return UNAVAILABLE
        # libpq gives a failed connection attempt or a dropped link no SQLSTATE at all; an
        # InterfaceError is a connection psycopg already closed.
        if state is None and isinstance(orig, psycopg.OperationalError | psycopg.InterfaceError):
            return UNAVAILABLE
        return UNAVAILABLE if invalidated else None
    if module == "pymysql":
        import pymysql

        args = getattr(orig, "args", ())
        code = args[0] if args and isinstance(args[0], int) else None
        if code in _ROLLBACK_MYSQL:
            return ROLLED_BACK
        if code in _UNAVAILABLE_MYSQL or isinstance(orig, pymysql.err.InterfaceError):
            return UNAVAILABLE
        return UNAVAILABLE if invalidated else None
    return UNAVAILABLE if invalidated else None


def is_transient(exc: BaseException) -> bool:
    """A database error that means "run the same transaction again", nothing more."""
    return fault_of(exc) == ROLLED_BACK


def wrong_url(url: URL) -> str | None:
    """Why connecting to `url` can never work (a host name that does not resolve, a PostgreSQL
    server that accepts connections yet refused ours: user, password or database name), or
    None when the server may simply be away for now."""
    if url.get_backend_name() == "sqlite":
        return None
    host = url.host or "localhost"
    if not host.startswith("/"):
        try:
            socket.getaddrinfo(host, url.port or 0)
        except OSError:
            return f"unknown host {host!r}"
    if url.get_backend_name() == "postgresql":
        from psycopg import pq
        from psycopg.conninfo import make_conninfo

        _args, kwargs = sa.create_engine(url).dialect.create_connect_args(url)
        # Only libpq's own options (SQLAlchemy adds Python objects such as an adapters context).
        kwargs = {k: v for k, v in kwargs.items() if isinstance(v, str | int)}
        kwargs.setdefault("connect_timeout", 5)
        # PQping asks only "do you accept connections?", without logging in: OK means the server
        # is up, so a failed connection is our fault (auth, database name), not its.
        if pq.PGconn.ping(make_conninfo(**kwargs).encode()) == pq.Ping.OK:
            return "the server is up but refused this user, password or database"
    return None


def error_line(display_url: str | None, exc: DBAPIError) -> DatabaseError:
    """A database error as the one line a command prints (the URL masked)."""
    where = f" on {display_url}" if display_url else ""
    return DatabaseError(f"database error{where}: {_first_line(exc.orig)}")


def _first_line(exc: BaseException | None) -> str:
    text = str(exc or "").strip()
    return text.splitlines()[0] if text else type(exc).__name__


def connect(url: str | URL | None, wait_s: float = 0.0) -> Database:
    """A Database, waiting up to `wait_s` for a server that is away (still starting, restarting,
    its network not up yet); a URL that can never work (unknown host, refused login) stops at
    once. A farm's workers often start before, or together with, their database."""
    parsed = url if isinstance(url, URL) else resolve_url(url)
    deadline, delay, told = time.monotonic() + wait_s, 1.0, False
    while True:
        try:
            return Database(parsed)
        except DatabaseUnavailable as exc:
            why = wrong_url(parsed)
            if why:
                raise DatabaseError(f"{exc} ({why})") from None
            if time.monotonic() + delay > deadline:
                raise
            if not told:
                log.warning("%s; waiting up to %.0f s for it", exc, wait_s)
                told = True
            time.sleep(delay)
            delay = min(delay * 2, 10.0)
