"""How an idle worker waits for a job: woken by PostgreSQL's NOTIFY, else by polling.

On PostgreSQL a job that becomes claimable notifies JOB_CLAIMABLE_CHANNEL with its session id
(triggers of migration 0012), and an idle worker waits on LISTEN with its poll interval as the
timeout, so a job loaded into an idle farm is claimed in milliseconds, not at the next poll.
Polling stays: on SQLite and MariaDB/MySQL (which have no such thing), whenever LISTEN fails
(the listening connection is retried later), and for what changes no row at all (a backoff's
not_before running out).
"""

from __future__ import annotations

import contextlib
import logging
import threading
import time
from typing import TYPE_CHECKING, Any

from mlirtuna.db import Database
from mlirtuna.db.models import JOB_CLAIMABLE_CHANNEL

if TYPE_CHECKING:
    import psycopg  # imported when a worker first listens: SQLite and MariaDB farms lack it

log = logging.getLogger(__name__)

STOP_CHECK_S = 0.25  # a stop request ends a wait this soon (a signal cannot interrupt libpq's wait)
RELISTEN_S = 30.0  # after LISTEN failed, poll this long before trying it again


class Wakeup:
    """One per worker: `wait` returns when a job of the session may have become claimable."""

    def __init__(self, db: Database, session_id: int) -> None:
        self.db = db
        self.payload = str(session_id)
        # The dedicated LISTEN connection, opened at the first wait.
        self._conn: psycopg.Connection | None = None
        self._retry_at = 0.0 if db.backend == "postgresql" else float("inf")

    def wait(self, timeout: float, stop: threading.Event) -> None:
        """Wait up to `timeout` seconds, less when notified or when `stop` is set."""
        if self._conn is None and time.monotonic() >= self._retry_at and self._listen():
            return  # a job loaded before LISTEN took effect sent its NOTIFY unheard: look now
        if self._conn is None:
            stop.wait(timeout)
            return
        deadline = time.monotonic() + timeout
        try:
            while not stop.is_set():
                left = deadline - time.monotonic()
                if left <= 0:
                    return
                for note in self._conn.notifies(timeout=min(left, STOP_CHECK_S), stop_after=1):
                    if note.payload == self.payload:
                        return
        except Exception as exc:  # the server went away: poll until it is back
            self._drop(exc)
            stop.wait(max(0.0, deadline - time.monotonic()))

    def _listen(self) -> bool:
        import psycopg

        try:
            self._conn = psycopg.connect(**_conninfo(self.db), autocommit=True)
            self._conn.execute(f"LISTEN {JOB_CLAIMABLE_CHANNEL}")
            return True
        except Exception as exc:
            self._drop(exc)
            return False

    def _drop(self, exc: BaseException) -> None:
        log.info("LISTEN for new jobs failed (%s); polling instead", str(exc).strip()[:200])
        if self._conn is not None:
            with contextlib.suppress(Exception):  # already broken: nothing to close
                self._conn.close()
        self._conn = None
        self._retry_at = time.monotonic() + RELISTEN_S

    def close(self) -> None:
        if self._conn is not None:
            self._conn.close()
            self._conn = None


def _conninfo(db: Database) -> dict[str, Any]:
    """libpq's connection options for the database, as the engine connects."""
    _args, kwargs = db.engine.dialect.create_connect_args(db.url)
    # Only libpq's own options (SQLAlchemy adds Python objects such as an adapters context).
    found = {k: v for k, v in kwargs.items() if isinstance(v, str | int)}
    found.setdefault("connect_timeout", 5)
    return found
