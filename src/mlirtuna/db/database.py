"""A database: its engine, the transaction every query runs in, the one schema check, and
connecting to a server that may still be starting."""

from __future__ import annotations

import contextlib
import functools
import logging
import time
from collections.abc import Callable, Iterator
from typing import TypeVar

from sqlalchemy.engine import URL, Connection, Engine
from sqlalchemy.exc import DBAPIError
from sqlalchemy.orm import Session

import mlirtuna.db.faults as faults
from mlirtuna.db.engine import has_tables, make_engine, require_sqlite_file
from mlirtuna.db.faults import UNAVAILABLE, fault_of
from mlirtuna.db.urls import mask, password_hint, resolve_url, scrub, wrong_url
from mlirtuna.errors import DatabaseError, DatabaseUnavailable, SchemaOutdated

log = logging.getLogger(__name__)
T = TypeVar("T")


class Database:
    """One database: an engine plus the unit-of-work context manager every query runs in."""

    def __init__(
        self,
        url: str | URL | None = None,
        *,
        check_schema: bool = True,
        create: bool = True,
        read_only: bool = False,
    ) -> None:
        """`create=False`: a SQLite file that does not exist is an error, never made (reads);
        `read_only`: a SQLite file's journal mode is left as it is (make_engine)."""
        self.url = url if isinstance(url, URL) else resolve_url(url)
        self.backend = self.url.get_backend_name()  # sqlite | postgresql | mysql | mariadb
        if not create:
            require_sqlite_file(self.url)
        self.engine = make_engine(self.url, read_only)
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
                    f"cannot reach the database {self.display_url}: "
                    f"{scrub(_first_line(exc.orig), self.url)}"
                ) from exc
            # Anything else (a missing table, a refused login, a read-only file) waiting will
            # not cure: it goes up as it is; the CLI prints it as one line (error_line).
            raise

    def ensure_schema(self) -> None:
        """Create a new database (SQLite file) or stop when the schema is not at head."""
        self.check_schema(create=True)

    def check_schema(self, *, create: bool = False) -> None:
        """At head, or SchemaOutdated naming `mlirtuna db upgrade`: the one schema check.

        `create`: an empty SQLite file gets the schema (a new database); without it (the
        read-only dashboard) nothing is ever created."""
        from mlirtuna import migrations

        current, head = self.current_revision(), migrations.head_revision()
        if current == head:
            return
        if create and current is None and self.is_sqlite and not has_tables(self.engine):
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
        writer (faults.retrying_conflicts)."""
        return faults.retrying_conflicts(write, tries)


def error_line(url: URL | None, exc: DBAPIError) -> DatabaseError:
    """A database error as the one line a command prints (the URL masked, its secrets scrubbed
    from the driver's message)."""
    if url is None:
        return DatabaseError(f"database error: {_first_line(exc.orig)}")
    line = f"database error on {mask(url)}: {scrub(_first_line(exc.orig), url)}"
    if is_permission_error(exc):
        role = url.username or "the server's default user"
        line += (
            f" (connected as {role}: this command needs a role that may do it, e.g. the admin "
            "role for import, session and jobs commands, the worker role for `worker`; "
            "docs/ci.md, section 6)"
        )
    elif needed_a_password(url, exc):
        line += f" ({password_hint(url)})"
    return DatabaseError(line)


# MariaDB/MySQL's "denied" errors: database, table, column, privilege, routine.
_MYSQL_DENIED = frozenset({1044, 1142, 1143, 1227, 1370})


def is_permission_error(exc: DBAPIError) -> bool:
    """A statement the connected role has no privilege for (PostgreSQL SQLSTATE 42501,
    MariaDB's "command denied to user")."""
    orig = exc.orig
    if getattr(orig, "sqlstate", None) == "42501":
        return True
    args: tuple[object, ...] = getattr(orig, "args", ())
    code = args[0] if args else None
    return isinstance(code, int) and code in _MYSQL_DENIED


# MariaDB/MySQL's "Access denied for user" (ER_ACCESS_DENIED_ERROR).
_MYSQL_LOGIN_DENIED = 1045


def needed_a_password(url: URL, exc: DBAPIError) -> bool:
    """The server refused a login that was given no password: libpq says a password was
    needed and none was available (PGconn.needs_password), MariaDB refused the user (1045)
    where neither the URL nor an option file it names held one."""
    orig = exc.orig
    pgconn = getattr(orig, "pgconn", None)
    if pgconn is not None:
        return bool(getattr(pgconn, "needs_password", False))
    args: tuple[object, ...] = getattr(orig, "args", ())
    given = url.password is not None or "read_default_file" in url.query
    return (
        url.get_backend_name() in ("mysql", "mariadb")
        and not given
        and args[:1] == (_MYSQL_LOGIN_DENIED,)
    )


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
