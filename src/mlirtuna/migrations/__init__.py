"""Alembic, shipped inside the package: every schema change is a migration in versions/.

`mlirtuna db upgrade` applies them; a new SQLite file is created by the same migrations, so there
is one way the schema comes to be.

Every command checks the schema revision first; that check reads the migration files' headers
and the `alembic_version` table itself, so that Alembic (slow to import) is loaded only to
upgrade. tests/test_db.py checks that both ways give the same revisions.
"""

from __future__ import annotations

import re
from pathlib import Path
from typing import TYPE_CHECKING

import sqlalchemy as sa
from sqlalchemy.engine import Engine

if TYPE_CHECKING:
    from alembic.config import Config

HERE = Path(__file__).parent
_REVISION = re.compile(r"""^(down_revision|revision)\s*=\s*(?:["']([^"']+)["']|None)""", re.M)


def _config(engine: Engine | None = None) -> Config:
    from alembic.config import Config

    cfg = Config()
    cfg.set_main_option("script_location", str(HERE))
    if engine is not None:
        cfg.attributes["engine"] = engine
    return cfg


def head_revision() -> str:
    """The revision no other migration revises (read from the files, as Alembic would)."""
    revisions, revised = set(), set()
    for path in (HERE / "versions").glob("*.py"):
        found = dict((key, value) for key, value in _REVISION.findall(path.read_text()))
        if found.get("revision"):
            revisions.add(found["revision"])
        if found.get("down_revision"):
            revised.add(found["down_revision"])
    heads = revisions - revised
    if len(heads) != 1:  # pragma: no cover - a packaging error, caught by the tests
        raise RuntimeError(f"expected one migration head, found {sorted(heads) or 'none'}")
    return heads.pop()


def alembic_head_revision() -> str | None:
    """Alembic's own answer, for the test that keeps head_revision honest."""
    from alembic.script import ScriptDirectory

    return ScriptDirectory.from_config(_config()).get_current_head()


def current_revision(engine: Engine) -> str | None:
    """The revision stamped in the database (None: no mlirtuna schema)."""
    with engine.connect() as conn:
        if not sa.inspect(conn).has_table("alembic_version"):
            return None
        versions = conn.exec_driver_sql("SELECT version_num FROM alembic_version").scalars().all()
    if len(versions) > 1:  # pragma: no cover - mlirtuna's history has one branch
        raise RuntimeError(f"the database has several schema heads: {', '.join(versions)}")
    return versions[0] if versions else None


def upgrade(engine: Engine, revision: str = "head") -> tuple[str | None, str]:
    from alembic import command

    before = current_revision(engine)
    command.upgrade(_config(engine), revision)
    return before, current_revision(engine) or ""


def downgrade(engine: Engine, revision: str) -> tuple[str | None, str]:
    """Back to `revision` (tests of a migration's way down; an admin undoing an upgrade)."""
    from alembic import command

    before = current_revision(engine)
    command.downgrade(_config(engine), revision)
    return before, current_revision(engine) or ""
