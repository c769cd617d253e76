"""What a database error means, and what to do about it, written once.

Classification (`fault_of`): run the transaction again (ROLLED_BACK), wait for the server
(UNAVAILABLE), or stop (None), by driver code, never by message text. The retry policies:

- `retrying`: a worker's queue operation waits out a database that is away (restart, cut link,
  SQLite lock held past the busy timeout) with a growing, jittered pause, and runs again a
  transaction the server rolled back (deadlock, lock timeout);
- `retrying_conflicts`: a write that lost a race with another writer (a unique key inserted
  first by another import, a deadlock) runs again and inserts only what is still missing.
"""

from __future__ import annotations

import logging
import random
import threading
import time
from collections.abc import Callable
from typing import TypeVar

import sqlalchemy as sa
from sqlalchemy import exc as sa_exc
from sqlalchemy.exc import DBAPIError

from mlirtuna.errors import DatabaseError

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
    cause: BaseException | None = exc
    while cause is not None and id(cause) not in seen:  # a DatabaseError wraps the driver's error
        seen.add(id(cause))
        if isinstance(cause, DBAPIError):
            return _driver_fault(cause.orig, cause.connection_invalidated)
        cause = cause.__cause__
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
        # A login the server asked a password for, and none was given: no wait will bring one.
        pgconn = getattr(orig, "pgconn", None)
        if pgconn is not None and getattr(pgconn, "needs_password", False):
            return None
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


log = logging.getLogger(__name__)
T = TypeVar("T")

DB_RETRY_S = 1.0  # the first pause while the database is away; it doubles up to DB_RETRY_MAX_S
DB_RETRY_MAX_S = 15.0
DB_LOG_EVERY_S = 60.0  # while the database stays away, say so again this often (not per try)


def retrying(
    fn: Callable[[], T], stop: threading.Event, holding: Callable[[], bool] = lambda: False
) -> T:
    """Run `fn` (a queue operation), waiting out a database that is away and running again a
    transaction the server rolled back. Every try after a failure waits first, growing, even
    while the worker stops (`stop` set); a stopping worker that `holding()` no job gives up
    with DatabaseError, and an error that waiting cannot cure raises DatabaseError at once."""
    delay, away_since, told_at, rolled_back = DB_RETRY_S, None, -DB_LOG_EVERY_S, 0
    while True:
        try:
            result = fn()
            if away_since is not None:
                log.warning("database back after %.0f s", time.monotonic() - away_since)
            return result
        except Exception as exc:
            fault = fault_of(exc)
            if fault is None:
                if isinstance(exc, DatabaseError):
                    raise
                if isinstance(exc, sa_exc.DBAPIError):
                    raise DatabaseError(f"database error: {first_line(exc.orig)}") from exc
                raise
            if fault == ROLLED_BACK:
                log.info("transaction rolled back by the server (%s); again", first_line(exc))
                rolled_back += 1
                time.sleep(random.uniform(0.0, min(0.05 * 2**rolled_back, DB_RETRY_S)))
                continue
            now = time.monotonic()
            if away_since is None:
                away_since = now
            if now - told_at >= DB_LOG_EVERY_S:
                told_at = now
                log.warning("database unavailable (%s); waiting", first_line(exc))
        if stop.is_set() and not holding():
            raise DatabaseError("stopped while the database was unavailable")
        # Jittered, so that a farm of workers does not return in lockstep.
        pause = random.uniform(delay / 2, delay)
        if stop.is_set():
            time.sleep(pause)  # wait() would return at once: a stopping worker must pause too
        else:
            stop.wait(pause)
        delay = min(delay * 2, DB_RETRY_MAX_S)


def retrying_conflicts(write: Callable[[], T], tries: int = 5) -> T:
    """Run `write` (one transaction of its own) again when it lost a race with another
    writer: a unique key another transaction inserted first (two `import` at once), or a
    deadlock. The next try sees the winner's rows and inserts only what is still missing."""
    for attempt in range(1, tries + 1):
        try:
            return write()
        except (DatabaseError, sa_exc.DBAPIError) as exc:
            conflict = isinstance(exc, sa.exc.IntegrityError) or isinstance(
                exc.__cause__, sa.exc.IntegrityError
            )
            if attempt == tries or not (conflict or fault_of(exc) == ROLLED_BACK):
                raise
            time.sleep(random.uniform(0.0, 0.05 * attempt))
    raise AssertionError("unreachable")


def first_line(exc: object) -> str:
    """The first line of an error's text (its type's name when it has none), for a log line."""
    text = str(exc).strip()
    return text.splitlines()[0] if text else type(exc).__name__
