"""Acting as one of mlirtuna's database roles in a test (tests/test_roles.py,
tests/test_role_limits.py)."""

from __future__ import annotations

import sqlalchemy as sa

from mlirtuna.db import Database


def as_role(db: Database, user: str) -> Database:
    """The same database, logged in as `user` (a role made by roles.apply_roles)."""
    return Database(db.url.set(username=user, password=None))


def refused(db: Database, statement: str) -> bool:
    """Whether the server refuses `statement` for this login."""
    try:
        with db.engine.begin() as conn:
            conn.exec_driver_sql(statement)
    except sa.exc.DBAPIError:
        return True
    return False
