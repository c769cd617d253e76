"""Stored quick lists (`quick-list --name NAME`): the rows a session with `--tuning-space
list:NAME` tunes over (sessions.py reads them; this module writes them and lists them)."""

from __future__ import annotations

from collections.abc import Sequence
from typing import Any

import sqlalchemy as sa

from mlirtuna import sessions
from mlirtuna.db import Database, utcnow
from mlirtuna.db.models import QuickList
from mlirtuna.history.quick.groups import GroupList


def save(db: Database, name: str, lists: Sequence[GroupList], session_ids: Sequence[int]) -> int:
    """Save (replace) the lists of NAME, one row per (arch, op, data type); one transaction."""
    sessions.check_quick_list_name(name)
    now = utcnow()
    with db.session() as s:
        for gl in lists:
            s.execute(
                sa.delete(QuickList).where(
                    QuickList.name == name,
                    QuickList.arch == gl.group.arch,
                    QuickList.op == gl.group.op,
                    QuickList.data_type == gl.group.data_type,
                )
            )
            s.add(
                QuickList(
                    name=name,
                    arch=gl.group.arch,
                    op=gl.group.op,
                    data_type=gl.group.data_type,
                    perf_configs="\n".join(gl.perf_configs),
                    method=gl.method[:200],
                    sessions=",".join(map(str, session_ids))[:200],
                    created_at=now,
                )
            )
    return len(lists)


def stored(db: Database) -> list[dict[str, Any]]:
    """Every stored list (name, arch, op, data type), its size, method and sessions."""
    with db.session() as s:
        rows = s.scalars(
            sa.select(QuickList).order_by(
                QuickList.name, QuickList.arch, QuickList.op, QuickList.data_type
            )
        )
        return [
            {
                "name": r.name,
                "arch": r.arch,
                "op": r.op,
                "data_type": r.data_type,
                "size": len(r.perf_configs.splitlines()),
                "method": r.method,
                "sessions": r.sessions,
            }
            for r in rows
        ]
