"""What a database error means: run the transaction again (ROLLED_BACK), wait for the server
(UNAVAILABLE), or stop (None). Classification only: how long to wait and how often to retry is
the callers' policy."""

from __future__ import annotations

from sqlalchemy.exc import DBAPIError

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
