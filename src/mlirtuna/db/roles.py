"""Least privilege on a server database: the SQL for three roles, and applying it.

- admin: everything on the database (migrations, import, sessions, requeue, delete);
- worker: what a worker does and nothing more: read everything; UPDATE only the columns a
  claim, heartbeat, record, fail, release or lease expiry writes (column GRANTs: never what a
  job *is*, its session, problem, stage, reason or priority, nor who claimed an attempt);
  INSERT attempt, result, candidate and search_step (a searched job's measurements); for
  two-stage sessions INSERT and DELETE bundle and bundle_chunk and UPDATE bundle.complete
  only. It cannot DROP, ALTER or create anything, nor DELETE from any other table, nor UPDATE
  result, candidate, search_step, session or problem.
  PostgreSQL: with UPDATE granted on columns only, LOCK TABLE job/attempt in any mode stronger
  than ACCESS SHARE is refused (LOCK needs a table-level UPDATE/DELETE/TRUNCATE); row-level
  security lets it UPDATE only jobs that are new, waiting or running (never a completed,
  failed or cancelled one). MariaDB: no LOCK TABLES privilege; no row-level security.
- reader: SELECT only (the dashboard, reports, export, compare).

The worker never chooses an id: INSERT is granted on every column but `id` (a row named ahead
of its sequence made every later insert fail "duplicate key"; one at 2^31 - 2 left MariaDB's
AUTO_INCREMENT at its maximum), and it draws only the sequences of the rows it inserts (never
session, problem or quick_list: 32-bit, drawn to their end they stopped import). On PostgreSQL
the worker's privileges belong to a NOLOGIN group role, PREFIX_workers; each host's
PREFIX_worker_HOST (`--host`) logs in as a member of it, and so does the shared PREFIX_worker,
made only without `--host` or when asked for (shared_login). A host's role can change only its
own settings and password and end only its own connections (ALTER ROLE … SET,
pg_terminate_backend), and the worker sets the session settings it relies on when it connects
(engine.py), so one host cannot stop another. On MariaDB/MySQL each host is a user of its own
with the worker's grants.

What each role can still do is listed in docs/architecture.md's failure-model table.

Each role logs in with its own password (from the environment when applied); the SQL is printed
for a DBA to review or run by hand (`mlirtuna db roles`), or run (`--apply`).
"""

from __future__ import annotations

import contextlib
import os
import re

import sqlalchemy as sa

from mlirtuna.db import Database
from mlirtuna.db.models import NEW, RUNNING, WAITING, Attempt, Base, Job
from mlirtuna.defaults import ENV_ROLE_PASSWORD
from mlirtuna.errors import UserError

ROLES = ("admin", "worker", "reader")
# search_step: a searched job's measurements, written round by round (worker/search.py).
WORKER_INSERT = ("attempt", "result", "candidate", "bundle", "bundle_chunk", "search_step")
# The auto-increment ids the worker's inserts draw from their sequences, never name.
_DRAWN_ID = "id"
WORKER_DELETE = ("bundle", "bundle_chunk")
# The columns a worker never changes: what a job is, who claimed an attempt and when.
_FIXED = {
    "job": {"id", "session_id", "problem_id", "stage", "reason", "priority"},
    "attempt": {
        "id",
        "job_id",
        "lease_token",
        "machine_name",
        "gpu_id",
        "pid",
        "claimed_at",
        "gpu",
        "gpu_perf",
        "worker",
    },
}
# The job states a worker moves a job out of (PostgreSQL row-level security).
WORKER_JOB_STATES = (NEW, WAITING, RUNNING)


def worker_update_columns() -> dict[str, tuple[str, ...]]:
    """Per table, the columns the worker role may UPDATE (every other column of the table is
    refused): job and attempt but their fixed columns, bundle.complete."""
    tables = {"job": Job.__table__, "attempt": Attempt.__table__}
    columns = {
        name: tuple(c.name for c in table.columns if c.name not in _FIXED[name])
        for name, table in tables.items()
    }
    columns["bundle"] = ("complete",)
    return columns


WORKER_UPDATE = tuple(worker_update_columns())


def worker_insert_columns() -> dict[str, tuple[str, ...] | None]:
    """Per table, the columns the worker role may INSERT: all but an auto-increment id (None:
    the whole table, bundle_chunk, whose key is its bundle and sequence number)."""
    tables = Base.metadata.tables
    return {
        name: tuple(c.name for c in tables[name].columns if c.name != _DRAWN_ID)
        if _DRAWN_ID in tables[name].columns
        else None
        for name in WORKER_INSERT
    }


PASSWORD_ENV = ENV_ROLE_PASSWORD  # …_ADMIN, …_WORKER, …_READER
_NAME = re.compile(r"[a-z_][a-z0-9_]{0,40}\Z")
_DQ = '"'  # PostgreSQL's identifier quote


def role_names(prefix: str) -> dict[str, str]:
    if not _NAME.match(prefix):
        raise UserError(f"bad role prefix {prefix!r}: lowercase letters, digits and _ only")
    return {role: f"{prefix}_{role}" for role in ROLES}


def shared_login(hosts: tuple[str, ...] | list[str], shared: bool | None) -> bool:
    """Whether the shared worker login PREFIX_worker is made: only without per-host logins,
    unless asked for (`shared`): every host on one login lets one host stop the others by
    changing that login's settings or password (issue 43)."""
    return not hosts if shared is None else shared


def unset_password_variables(hosts: tuple[str, ...] = (), shared: bool | None = None) -> list[str]:
    """The MLIRTUNA_ROLE_PASSWORD_* variables not set (or empty), in role order, then each
    host's (MLIRTUNA_ROLE_PASSWORD_WORKER_<HOST>)."""
    own = [r for r in ROLES if r != "worker" or shared_login(hosts, shared)]
    keys = [*own, *(f"worker_{host}" for host in hosts)]
    names = [PASSWORD_ENV.format(key.upper()) for key in keys]
    return [name for name in names if not os.environ.get(name)]


def worker_group(prefix: str) -> str:
    """The NOLOGIN role holding the worker's privileges (PostgreSQL)."""
    return f"{role_names(prefix)['worker']}s"


def host_roles(prefix: str, hosts: tuple[str, ...] | list[str]) -> list[str]:
    """Each host's own worker login, PREFIX_worker_HOST."""
    names = [f"{role_names(prefix)['worker']}_{h}" for h in hosts]
    for host, name in zip(hosts, names, strict=True):
        if not _NAME.match(name):
            raise UserError(f"bad host name {host!r}: lowercase letters, digits and _ only")
    return names


def existing_hosts(db: Database, prefix: str) -> tuple[str, ...]:
    """The hosts whose logins PREFIX_worker_HOST exist already (an earlier `db roles --host`):
    a later run without --host grants them again and makes no shared login beside them. ()
    where the server's list of users cannot be read."""
    query = (
        "SELECT rolname FROM pg_roles WHERE rolcanlogin"
        if db.backend == "postgresql"
        else "SELECT user FROM mysql.user WHERE host = '%%'"
    )
    start = f"{role_names(prefix)['worker']}_"
    try:
        with db.engine.connect() as conn:
            users = [row[0] for row in conn.exec_driver_sql(query)]
    except sa.exc.DBAPIError:  # no right to read the list of users: only --host counts
        return ()
    found = (u.removeprefix(start) for u in users if isinstance(u, str) and u.startswith(start))
    return tuple(sorted(h for h in found if _NAME.match(h)))


def _logins(names: dict[str, str], logins: list[str], shared: bool) -> list[tuple[str, str]]:
    """(password key, login) of every role that logs in (the shared worker login only when
    `shared`): a host's password is read from MLIRTUNA_ROLE_PASSWORD_WORKER_<HOST>."""
    worker = names["worker"]
    hosts = [(f"worker_{login.removeprefix(f'{worker}_')}", login) for login in logins]
    own = [(role, name) for role, name in names.items() if role != "worker" or shared]
    return [*own, *hosts]


def worker_logins(names: dict[str, str], logins: list[str], shared: bool) -> list[str]:
    """The logins that hold the worker's privileges: the shared one (when made), each host's."""
    return [*([names["worker"]] if shared else []), *logins]


def _password(role: str, with_passwords: bool) -> str | None:
    value = os.environ.get(PASSWORD_ENV.format(role.upper())) if with_passwords else None
    return value.replace("'", "''") if value else None


def roles_sql(
    db: Database,
    prefix: str = "tuna",
    with_passwords: bool = False,
    hosts: tuple[str, ...] = (),
    shared: bool | None = None,
) -> list[str]:
    """The statements that create (if missing) and grant the three roles, and a worker login of
    its own for each of `hosts`, for this database (the shared worker login: shared_login)."""
    names = role_names(prefix)
    logins = host_roles(prefix, hosts)
    made = shared_login(hosts, shared)
    if db.backend == "postgresql":
        return _postgresql(db, names, with_passwords, logins, made)
    if db.backend in ("mysql", "mariadb"):
        return _mysql(db, names, with_passwords, logins, made)
    raise UserError("roles exist on PostgreSQL and MariaDB/MySQL; SQLite has no users")


def _postgresql(
    db: Database, names: dict[str, str], with_passwords: bool, logins: list[str], shared: bool
) -> list[str]:
    database = db.url.database
    prefix = names["admin"].removesuffix("_admin")
    group = worker_group(prefix)
    sql = [_create_pg(group, "NOLOGIN")]
    for role, name in _logins(names, logins, shared):
        sql.append(_create_pg(name, "LOGIN"))
        password = _password(role, with_passwords)
        if password:
            sql.append(f"ALTER ROLE \"{name}\" PASSWORD '{password}'")
        sql.append(f'GRANT CONNECT ON DATABASE "{database}" TO "{name}"')
    admin, reader = names["admin"], names["reader"]
    workers = worker_logins(names, logins, shared)
    members = ", ".join(f'"{n}"' for n in workers)
    holders = ", ".join(f'"{n}"' for n in (*workers, group))
    sql += [
        f'GRANT USAGE ON SCHEMA public TO "{admin}", "{group}", "{reader}"',
        f'GRANT "{group}" TO {members}',
        f'GRANT ALL ON DATABASE "{database}" TO "{admin}"',
        f'GRANT ALL ON SCHEMA public TO "{admin}"',
        f'GRANT ALL ON ALL TABLES IN SCHEMA public TO "{admin}"',
        f'GRANT ALL ON ALL SEQUENCES IN SCHEMA public TO "{admin}"',
        # Column privileges only: what an older `db roles` granted (a table-level UPDATE or
        # INSERT, or grants to the worker login itself) goes first (revoking a table's
        # privilege revokes its column privileges too); all of it is granted again below.
        f"REVOKE ALL ON ALL TABLES IN SCHEMA public FROM {holders}",
        f"REVOKE ALL ON ALL SEQUENCES IN SCHEMA public FROM {holders}",
        f'GRANT SELECT ON ALL TABLES IN SCHEMA public TO "{group}", "{reader}"',
        *(
            f'GRANT UPDATE ({_quoted(columns, _DQ)}) ON {table} TO "{group}"'
            for table, columns in worker_update_columns().items()
        ),
        *(
            f'GRANT INSERT{_columns(columns, _DQ)} ON {table} TO "{group}"'
            for table, columns in worker_insert_columns().items()
        ),
        f'GRANT DELETE ON {", ".join(WORKER_DELETE)} TO "{group}"',
        # The ids of the rows a worker inserts come from these tables' sequences (USAGE:
        # nextval, never setval), and only theirs: the 32-bit session, problem and quick_list
        # sequences, drawn to their end, stopped import and `session new` (issue 43).
        f'GRANT USAGE ON SEQUENCE {", ".join(worker_sequences())} TO "{group}"',
        # Row-level security on job: everyone with SELECT reads every row; the admin role
        # writes any; the worker UPDATEs only a job it can move on (the table's owner and
        # superusers are not subject to it).
        "ALTER TABLE job ENABLE ROW LEVEL SECURITY",
        *_policy(prefix, "read", "FOR SELECT USING (true)"),
        *_policy(prefix, "admin", f'TO "{admin}" USING (true) WITH CHECK (true)'),
        *_policy(
            prefix,
            "worker",
            f'FOR UPDATE TO "{group}" USING (state IN '
            f"({', '.join(repr(s) for s in WORKER_JOB_STATES)})) WITH CHECK (true)",
        ),
    ]
    return sql


def worker_sequences() -> list[str]:
    """The sequences of the ids the worker's inserts draw (PostgreSQL's TABLE_id_seq)."""
    inserted = worker_insert_columns()
    return [f"{table}_{_DRAWN_ID}_seq" for table, columns in inserted.items() if columns]


def _create_pg(name: str, login: str) -> str:
    return (
        f"DO $$ BEGIN IF NOT EXISTS (SELECT FROM pg_roles WHERE rolname = '{name}') "
        f'THEN CREATE ROLE "{name}" {login}; END IF; END $$'
    )


def _columns(columns: tuple[str, ...] | None, quote: str) -> str:
    return "" if columns is None else f" ({_quoted(columns, quote)})"


def _quoted(columns: tuple[str, ...], quote: str) -> str:
    return ", ".join(f"{quote}{c}{quote}" for c in columns)


def _policy(prefix: str, name: str, body: str) -> list[str]:
    policy = f'"{prefix}_{name}"'
    return [f"DROP POLICY IF EXISTS {policy} ON job", f"CREATE POLICY {policy} ON job {body}"]


def _mysql(
    db: Database, names: dict[str, str], with_passwords: bool, logins: list[str], shared: bool
) -> list[str]:
    database = db.url.database or ""  # a MariaDB/MySQL URL names its database
    sql = []
    for role, name in _logins(names, logins, shared):
        password = _password(role, with_passwords)
        identified = f" IDENTIFIED BY '{password}'" if password else ""
        sql.append(f"CREATE USER IF NOT EXISTS '{name}'@'%'{identified}")
    admin, reader = names["admin"], names["reader"]
    sql.append(f"GRANT ALL ON `{database}`.* TO '{admin}'@'%'")
    sql.append(f"GRANT SELECT ON `{database}`.* TO '{reader}'@'%'")
    for worker in worker_logins(names, logins, shared):
        sql += _mysql_worker(database, worker)
    return sql


def _mysql_worker(database: str, worker: str) -> list[str]:
    return [
        f"GRANT SELECT ON `{database}`.* TO '{worker}'@'%'",
        *(
            f"GRANT UPDATE ({_quoted(columns, '`')}) ON `{database}`.`{t}` TO '{worker}'@'%'"
            for t, columns in worker_update_columns().items()
        ),
        *(
            f"GRANT INSERT{_columns(columns, '`')} ON `{database}`.`{t}` TO '{worker}'@'%'"
            for t, columns in worker_insert_columns().items()
        ),
        *(f"GRANT DELETE ON `{database}`.`{t}` TO '{worker}'@'%'" for t in WORKER_DELETE),
    ]


def apply_roles(
    db: Database, prefix: str = "tuna", hosts: tuple[str, ...] = (), shared: bool | None = None
) -> list[str]:
    """Run roles_sql (passwords from MLIRTUNA_ROLE_PASSWORD_*); returns the statements run."""
    statements = roles_sql(db, prefix, with_passwords=True, hosts=hosts, shared=shared)
    if db.backend != "postgresql":
        logins = host_roles(prefix, hosts)
        for worker in worker_logins(role_names(prefix), logins, shared_login(hosts, shared)):
            _revoke_table_grants(db, worker)
    with db.engine.begin() as conn:
        for statement in statements:
            conn.exec_driver_sql(_driver_text(db, statement))
    return statements


def _revoke_table_grants(db: Database, worker: str) -> None:
    """MariaDB/MySQL: a table-level UPDATE or INSERT an older `db roles` granted, revoked so
    that only the column privileges remain (REVOKE of a privilege never granted is an error
    there: each is tried alone)."""
    revoked = [("UPDATE", t) for t in WORKER_UPDATE] + [("INSERT", t) for t in WORKER_INSERT]
    for privilege, table in revoked:
        statement = f"REVOKE {privilege} ON `{db.url.database}`.`{table}` FROM '{worker}'@'%'"
        with contextlib.suppress(sa.exc.DBAPIError), db.engine.begin() as conn:
            conn.exec_driver_sql(_driver_text(db, statement))


def _driver_text(db: Database, statement: str) -> str:
    # PyMySQL formats every statement with Python's % operator: '%' (any host) must be doubled.
    return statement if db.backend == "postgresql" else statement.replace("%", "%%")


def drop_roles(db: Database, prefix: str = "tuna", hosts: tuple[str, ...] = ()) -> None:
    """Remove the roles again (tests; a farm that is taken down)."""
    names = [*role_names(prefix).values(), *host_roles(prefix, hosts)]
    if db.backend == "postgresql":
        names.append(worker_group(prefix))
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
