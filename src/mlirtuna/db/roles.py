"""Least privilege on a server database: the SQL for three roles, and applying it.

- admin: everything on the database (migrations, import, sessions, requeue, delete);
- worker: what a worker does and nothing more: read everything, UPDATE job and attempt (claim,
  heartbeat, record, fail, release, expired leases), INSERT attempt, result and candidate;
  for two-stage sessions INSERT, UPDATE and DELETE bundle and bundle_chunk (a compile job stores
  a bundle, its benchmark job deletes it); it cannot DROP, ALTER or create anything, nor
  DELETE from any other table;
- reader: SELECT only (the dashboard, reports, export, compare).

Each role logs in with its own password (from the environment when applied); the SQL is printed
for a DBA to review or run by hand (`mlirtuna db roles`), or run (`--apply`).
"""

from __future__ import annotations

import os
import re

import sqlalchemy as sa

from mlirtuna.db import Database
from mlirtuna.defaults import ENV_ROLE_PASSWORD
from mlirtuna.errors import UserError

ROLES = ("admin", "worker", "reader")
WORKER_UPDATE = ("job", "attempt", "bundle")
WORKER_INSERT = ("attempt", "result", "candidate", "bundle", "bundle_chunk")
WORKER_DELETE = ("bundle", "bundle_chunk")
PASSWORD_ENV = ENV_ROLE_PASSWORD  # …_ADMIN, …_WORKER, …_READER
_NAME = re.compile(r"[a-z_][a-z0-9_]{0,40}\Z")


def role_names(prefix: str) -> dict[str, str]:
    if not _NAME.match(prefix):
        raise UserError(f"bad role prefix {prefix!r}: lowercase letters, digits and _ only")
    return {role: f"{prefix}_{role}" for role in ROLES}


def _password(role: str, with_passwords: bool) -> str | None:
    value = os.environ.get(PASSWORD_ENV.format(role.upper())) if with_passwords else None
    return value.replace("'", "''") if value else None


def roles_sql(db: Database, prefix: str = "tuna", with_passwords: bool = False) -> list[str]:
    """The statements that create (if missing) and grant the three roles, for this database."""
    names = role_names(prefix)
    if db.backend == "postgresql":
        return _postgresql(db, names, with_passwords)
    if db.backend in ("mysql", "mariadb"):
        return _mysql(db, names, with_passwords)
    raise UserError("roles exist on PostgreSQL and MariaDB/MySQL; SQLite has no users")


def _postgresql(db: Database, names: dict[str, str], with_passwords: bool) -> list[str]:
    database = db.url.database
    sql = []
    for role, name in names.items():
        password = _password(role, with_passwords)
        sql.append(
            f"DO $$ BEGIN IF NOT EXISTS (SELECT FROM pg_roles WHERE rolname = '{name}') "
            f'THEN CREATE ROLE "{name}" LOGIN; END IF; END $$'
        )
        if password:
            sql.append(f"ALTER ROLE \"{name}\" PASSWORD '{password}'")
        sql.append(f'GRANT CONNECT ON DATABASE "{database}" TO "{name}"')
        sql.append(f'GRANT USAGE ON SCHEMA public TO "{name}"')
    admin, worker, reader = names["admin"], names["worker"], names["reader"]
    sql += [
        f'GRANT ALL ON DATABASE "{database}" TO "{admin}"',
        f'GRANT ALL ON SCHEMA public TO "{admin}"',
        f'GRANT ALL ON ALL TABLES IN SCHEMA public TO "{admin}"',
        f'GRANT ALL ON ALL SEQUENCES IN SCHEMA public TO "{admin}"',
        f'GRANT SELECT ON ALL TABLES IN SCHEMA public TO "{worker}", "{reader}"',
        f'GRANT UPDATE ON {", ".join(WORKER_UPDATE)} TO "{worker}"',
        f'GRANT INSERT ON {", ".join(WORKER_INSERT)} TO "{worker}"',
        f'GRANT DELETE ON {", ".join(WORKER_DELETE)} TO "{worker}"',
        # The ids of the rows a worker inserts come from these tables' sequences.
        f'GRANT USAGE ON ALL SEQUENCES IN SCHEMA public TO "{worker}"',
    ]
    return sql


def _mysql(db: Database, names: dict[str, str], with_passwords: bool) -> list[str]:
    database = db.url.database
    sql = []
    for role, name in names.items():
        password = _password(role, with_passwords)
        identified = f" IDENTIFIED BY '{password}'" if password else ""
        sql.append(f"CREATE USER IF NOT EXISTS '{name}'@'%'{identified}")
    admin, worker, reader = names["admin"], names["worker"], names["reader"]
    sql += [
        f"GRANT ALL ON `{database}`.* TO '{admin}'@'%'",
        f"GRANT SELECT ON `{database}`.* TO '{worker}'@'%', '{reader}'@'%'",
        *(f"GRANT UPDATE ON `{database}`.`{t}` TO '{worker}'@'%'" for t in WORKER_UPDATE),
        *(f"GRANT INSERT ON `{database}`.`{t}` TO '{worker}'@'%'" for t in WORKER_INSERT),
        *(f"GRANT DELETE ON `{database}`.`{t}` TO '{worker}'@'%'" for t in WORKER_DELETE),
    ]
    return sql


def apply_roles(db: Database, prefix: str = "tuna") -> list[str]:
    """Run roles_sql (passwords from MLIRTUNA_ROLE_PASSWORD_*); returns the statements run."""
    statements = roles_sql(db, prefix, with_passwords=True)
    with db.engine.begin() as conn:
        for statement in statements:
            conn.exec_driver_sql(_driver_text(db, statement))
    return statements


def _driver_text(db: Database, statement: str) -> str:
    # PyMySQL formats every statement with Python's % operator: '%' (any host) must be doubled.
    return statement if db.backend == "postgresql" else statement.replace("%", "%%")


def drop_roles(db: Database, prefix: str = "tuna") -> None:
    """Remove the three roles again (tests; a farm that is taken down)."""
    names = role_names(prefix).values()
    with db.engine.begin() as conn:
        for name in names:
            if db.backend == "postgresql":
                exists = conn.execute(
                    sa.text("SELECT 1 FROM pg_roles WHERE rolname = :n"), {"n": name}
                )
                if exists.first():
                    conn.exec_driver_sql(f'DROP OWNED BY "{name}"')
                    conn.exec_driver_sql(f'DROP ROLE "{name}"')
            else:
                conn.exec_driver_sql(_driver_text(db, f"DROP USER IF EXISTS '{name}'@'%'"))
