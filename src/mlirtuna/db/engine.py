"""Engines: connection pools per backend, and what each backend needs set on its connections
(SQLite's pragmas and BEGIN; MariaDB/MySQL's multi-statement scripts and cheap pool resets)."""

from __future__ import annotations

import re
import time
from pathlib import Path

import sqlalchemy as sa
from sqlalchemy import event
from sqlalchemy.dialects import sqlite
from sqlalchemy.engine import URL, Connection, Engine
from sqlalchemy.exc import ArgumentError, NoSuchModuleError

import mlirtuna.db.statements as statements
from mlirtuna.db.clock import stored_time
from mlirtuna.db.urls import mask
from mlirtuna.errors import DatabaseError

SQLITE_BUSY_TIMEOUT_MS = 30_000


def make_engine(url: URL, read_only: bool = False) -> Engine:
    """`read_only`: a SQLite file is only read, its journal mode left as it is (the dashboard)."""
    try:
        if url.get_backend_name() == "sqlite":
            return _sqlite_engine(url, read_only)
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
        if url.get_backend_name() == "postgresql" and not read_only:
            _own_session_settings(engine, url)
        if mysql:
            _roll_back_only_open_transactions(engine)
        return engine
    except (NoSuchModuleError, ArgumentError) as exc:
        raise DatabaseError(f"unsupported database URL {mask(url)}: {exc}") from None
    except ImportError as exc:  # a driver we do not ship: mysql+mysqldb://, postgresql+pg8000://
        raise DatabaseError(
            f"database URL {mask(url)}: its driver is not installed ({exc.name}); write "
            "postgresql://… or mysql://… for the drivers mlirtuna ships (psycopg, PyMySQL)"
        ) from None


# PostgreSQL: the session settings a writer relies on, whatever `ALTER ROLE … SET` or `ALTER
# DATABASE … SET` made the defaults (a role may set its own: one `default_transaction_read_only =
# on` or `statement_timeout = '1ms'` stopped every worker logged in as it). Sent in the startup
# packet, which outranks role and database defaults and applies before the first statement.
OWN_SESSION_SETTINGS = {
    "default_transaction_read_only": "off",
    "statement_timeout": "0",
    "lock_timeout": "0",
    "idle_in_transaction_session_timeout": "0",
    # mlirtuna's tables live in schema public (db roles grants there); a role's own
    # `search_path = 'nowhere'` made every worker on it say "no mlirtuna schema" (issue 43).
    "search_path": "public",
}
# Settings of newer servers (14, 17): asked for too; a server without them refuses the startup
# packet ("unrecognized configuration parameter"), and is asked again without them.
NEWER_SESSION_SETTINGS = {"idle_session_timeout": "0", "transaction_timeout": "0"}


def _options(url: URL, settings: dict[str, str]) -> str:
    theirs = url.query.get("options", "")
    theirs = theirs if isinstance(theirs, str) else ""
    # A search_path the URL names is the operator's choice (tables in another schema): kept.
    keep = {"search_path"} & set(re.findall(r"(\w+)=", theirs))
    ours = " ".join(f"-c {k}={v}" for k, v in settings.items() if k not in keep)
    return f"{theirs} {ours}".strip()


def _own_session_settings(engine: Engine, url: URL) -> None:
    settings = {**OWN_SESSION_SETTINGS, **NEWER_SESSION_SETTINGS}

    @event.listens_for(engine, "do_connect")
    def _connect(dialect, _record, cargs, cparams):
        while True:
            cparams["options"] = _options(url, settings)
            try:
                return dialect.connect(*cargs, **cparams)
            except dialect.loaded_dbapi.Error as exc:
                unknown = _UNKNOWN.search(str(exc))
                if not unknown or unknown.group(1) not in NEWER_SESSION_SETTINGS:
                    raise
                settings.pop(unknown.group(1), None)  # this server has no such setting


_UNKNOWN = re.compile(r'unrecognized configuration parameter "(\w+)"')


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


def require_sqlite_file(url: URL) -> None:
    if url.get_backend_name() != "sqlite" or url.database in (None, "", ":memory:"):
        return
    path = Path(url.database).expanduser().absolute()
    if not path.exists():
        raise DatabaseError(
            f"no database file {path}: `mlirtuna import`, `session new` or `run` "
            "create one (or choose another with --db / MLIRTUNA_DB)"
        )


def _sqlite_engine(url: URL, read_only: bool = False) -> Engine:
    if url.database and url.database != ":memory:":
        parent = Path(url.database).expanduser().resolve().parent
        if not parent.is_dir():
            raise DatabaseError(f"cannot create {url.database}: folder {parent} does not exist")
    # Worker heartbeats run in a thread of their own, with connections from the same pool.
    engine = sa.create_engine(
        url,
        connect_args={"timeout": SQLITE_BUSY_TIMEOUT_MS / 1000, "check_same_thread": False},
    )

    if read_only:  # a reader (the dashboard) shows a row SQLite let a wrong time into
        engine.dialect.colspecs = {**engine.dialect.colspecs, sa.DateTime: ReadBackDateTime}

    @event.listens_for(engine, "connect")
    def _on_connect(dbapi_conn, _record) -> None:
        # We issue BEGIN ourselves (below); pysqlite's own transaction handling would defer it.
        dbapi_conn.isolation_level = None
        cur = dbapi_conn.cursor()
        if read_only:  # a reader changes nothing, not even the journal mode
            cur.execute("PRAGMA query_only=ON")
        else:
            cur.execute("PRAGMA journal_mode=WAL")  # readers never block the writer
            cur.execute("PRAGMA synchronous=NORMAL")  # safe with WAL; a commit need not fsync
        cur.execute(f"PRAGMA busy_timeout={SQLITE_BUSY_TIMEOUT_MS}")
        cur.execute("PRAGMA foreign_keys=ON")
        cur.close()

    @event.listens_for(engine, "begin")
    def _on_begin(conn: Connection) -> None:
        immediate = conn.get_execution_options().get("sqlite_immediate", False)
        # At driver level, as the queue's statements (db.statements): SQLAlchemy's execution
        # context cost more than the BEGIN itself, on every transaction.
        statements.run_at_driver(conn, "BEGIN IMMEDIATE" if immediate else "BEGIN", ())

    return engine


class ReadBackDateTime(sqlite.DATETIME):
    """SQLite's DATETIME read through clock.stored_time: text that is no timestamp (written
    outside mlirtuna) reads as None where SQLAlchemy's own parser raises, failing the whole
    query. Writers keep the strict type: a queue must not take an unreadable lease for none."""

    def result_processor(self, dialect, coltype):
        return stored_time


def has_tables(engine: Engine) -> bool:
    return bool(sa.inspect(engine).get_table_names())
