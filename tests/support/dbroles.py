"""Acting as one of mlirtuna's database roles in a test (tests/test_roles.py,
tests/test_role_limits.py, tests/test_role_attacks.py).

The `server_db` fixture: a test module imports it and its tests request `server_db`."""

from __future__ import annotations

import uuid
from collections.abc import Iterator
from contextlib import contextmanager

import pytest
import sqlalchemy as sa

from mlirtuna.db import Database, roles


@pytest.fixture(name="server_db")
def fixture_server_db(db: Database) -> Database:
    """The test's database on a server: SQLite has no users."""
    if db.is_sqlite:
        pytest.skip("SQLite has no users")
    return db


@contextmanager
def role_prefix(db: Database, hosts: tuple[str, ...] = ()) -> Iterator[str]:
    """A role prefix no other test uses, and its roles (with the logins of `hosts`) dropped when
    the block ends: a prefix fixture's teardown."""
    name = f"t{uuid.uuid4().hex[:10]}"
    yield name
    roles.drop_roles(db, name, hosts=hosts)


def as_role(db: Database, user: str) -> Database:
    """The same database, logged in as `user` (a role made by roles.apply_roles)."""
    return Database(db.url.set(username=user, password=None))


def refused(db: Database, statement: str, *, commit: bool = True) -> bool:
    """Whether the server refuses `statement` for this login. `commit=False`: what it did is
    rolled back where the server can (not DDL on MariaDB), for tests that share a database."""
    with db.engine.connect() as conn:
        transaction = conn.begin()
        try:
            conn.exec_driver_sql(statement)
        except sa.exc.DBAPIError:
            transaction.rollback()
            return True
        transaction.commit() if commit else transaction.rollback()
    return False
