"""The clock: naive UTC timestamps from Python, and the database's own clock for leases."""

from __future__ import annotations

import datetime as dt

import sqlalchemy as sa
from sqlalchemy.ext.compiler import compiles
from sqlalchemy.sql.expression import FunctionElement


def stored_time(value: object) -> dt.datetime | None:
    """A timestamp column's value as read back, or None when it is not a timestamp: SQLite keeps
    whatever it was given (`'yesterday'` in a DATETIME column), so a reader shows such a row
    without its time instead of failing on it (the timestamps' stats.stored_number)."""
    if isinstance(value, dt.datetime):
        return value
    if not isinstance(value, str):
        return None
    try:
        when = dt.datetime.fromisoformat(value)
    except ValueError:
        return None
    # Every column holds naive UTC; an offset written from outside is made so, not compared raw.
    return when if when.tzinfo is None else when.astimezone(dt.UTC).replace(tzinfo=None)


def utcnow() -> dt.datetime:
    """Now, as the naive UTC datetime every timestamp column holds."""
    return dt.datetime.now(dt.UTC).replace(tzinfo=None)


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
