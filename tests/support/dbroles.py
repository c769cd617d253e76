"""Acting as one of mlirtuna's database roles in a test (tests/test_roles.py,
tests/test_role_limits.py)."""

from __future__ import annotations

import sqlalchemy as sa

from mlirtuna.db import Database


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
