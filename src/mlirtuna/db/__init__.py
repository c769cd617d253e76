"""Connecting to the database: URLs, engines, transactions, the database clock, the schema check.

SQLite (the embedded default), PostgreSQL (psycopg 3) and MySQL/MariaDB (PyMySQL) are served by
the same code; where they differ (the claim, the clock), the difference is in one function of
this package or of the queue's statements (queue/sql.py).

- urls: which database, the password from the environment, masking, URLs that cannot work;
- engine: pools and per-backend connection settings (SQLite pragmas, MariaDB scripts);
- clock: utcnow and db_now, the database's clock; stored_time, a timestamp as read back;
- statements: Precompiled (the hot path's statements) and json_object;
- faults: what a driver error means (run again, wait, stop), and the retry policies;
- database: Database (transactions, the one schema check), connect, error_line;
- models (the schema only), roles, text.
"""

from mlirtuna.db.clock import DbNow, db_now, stored_time, utcnow
from mlirtuna.db.database import Database, connect, error_line
from mlirtuna.db.engine import PING_IDLE_S, SQLITE_BUSY_TIMEOUT_MS
from mlirtuna.db.faults import ROLLED_BACK, UNAVAILABLE, fault_of, is_transient
from mlirtuna.db.statements import JsonObject, Precompiled, json_object, rowcount
from mlirtuna.db.urls import (
    DEFAULT_URL,
    ENV_PASSWORD,
    ENV_URL,
    mask,
    mask_text,
    resolve_url,
    wrong_url,
)

__all__ = [
    "DEFAULT_URL",
    "ENV_PASSWORD",
    "ENV_URL",
    "PING_IDLE_S",
    "ROLLED_BACK",
    "SQLITE_BUSY_TIMEOUT_MS",
    "UNAVAILABLE",
    "Database",
    "DbNow",
    "JsonObject",
    "Precompiled",
    "connect",
    "db_now",
    "error_line",
    "fault_of",
    "is_transient",
    "json_object",
    "mask",
    "mask_text",
    "resolve_url",
    "rowcount",
    "stored_time",
    "utcnow",
    "wrong_url",
]
