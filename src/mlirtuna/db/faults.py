"""What to do when the database fails: the retry policies, written once.

- `retrying`: a worker's queue operation waits out a database that is away (restart, cut link,
  SQLite lock held past the busy timeout) with a growing, jittered pause, and runs again a
  transaction the server rolled back (deadlock, lock timeout);
- `retrying_conflicts`: a write that lost a race with another writer (a unique key inserted
  first by another import, a deadlock) runs again and inserts only what is still missing.

Which error is which is `fault_of`'s decision (by driver code, never by message text).
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

from mlirtuna.db import ROLLED_BACK, fault_of
from mlirtuna.errors import DatabaseError

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
