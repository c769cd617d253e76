"""Migration 0015: bundle.path is dropped for `in_store`, up and down, on a database with rows
(SQLite in batch mode, PostgreSQL, MariaDB)."""

from __future__ import annotations

import sqlalchemy as sa

from mlirtuna import migrations
from mlirtuna.db import Database


def _rows_at_0014(db: Database) -> None:
    with db.engine.begin() as conn:
        conn.exec_driver_sql(
            "INSERT INTO session (arch, arch_full, num_cu, num_chiplets, rocm_v, mlir_v, reason,"
            " ticket, docker, tuning_space, tuner, host, created_at) VALUES ('gfx942', 'gfx942',"
            " 304, 8, '', '', 'old', '', '', 'full', 'rocmlir', '', '2025-01-01 00:00:00')"
        )
        conn.exec_driver_sql(
            "INSERT INTO problem (op, test_vector, created_at) VALUES ('gemm', '-m 1',"
            " '2025-01-01 00:00:00')"
        )
        conn.exec_driver_sql(
            "INSERT INTO job (session_id, problem_id, state, stage) VALUES"
            " (1, 1, 'done', 'compile')"
        )
        for path in ("/etc/passwd", None):  # a file bundle (its old path) and one in chunks
            conn.execute(
                sa.text(
                    "INSERT INTO bundle (session_id, problem_id, job_id, lease_token, commit_id,"
                    " size, sha256, path, complete, created_at) VALUES (1, 1, 1, :t, 'c', 3,"
                    " 'h', :p, :yes, '2025-01-01 00:00:00')"
                ),
                {"t": "a" * 32, "p": path, "yes": True},
            )
        conn.execute(  # the chunk of the bundle kept in the database
            sa.text("INSERT INTO bundle_chunk (bundle_id, seq, data) VALUES (2, 0, :d)"),
            {"d": b"\x1f\x8bchunk"},
        )


def _chunks(db: Database) -> list[tuple]:
    with db.engine.connect() as conn:
        rows = conn.exec_driver_sql("SELECT bundle_id, seq, data FROM bundle_chunk").all()
    return [(r[0], r[1], bytes(r[2])) for r in rows]


def _columns(db: Database) -> set[str]:
    inspect = sa.inspect(db.engine)
    session = {f"session.{c['name']}" for c in inspect.get_columns("session")}
    return {c["name"] for c in inspect.get_columns("bundle")} | session


def test_0015_drops_the_path_and_keeps_which_bundle_is_a_file(empty_db_url):
    db = Database(empty_db_url, check_schema=False)
    migrations.upgrade(db.engine, "0014")
    _rows_at_0014(db)
    assert db.upgrade() == ("0014", migrations.head_revision())
    assert "path" not in _columns(db) and "in_store" in _columns(db)
    assert "session.bundle_cap_mib" in _columns(db)
    with db.engine.connect() as conn:
        rows = conn.exec_driver_sql("SELECT id, in_store, size FROM bundle ORDER BY id").all()
    assert [(r[0], bool(r[1]), r[2]) for r in rows] == [(1, True, 3), (2, False, 3)]
    assert _chunks(db) == [(2, 0, b"\x1f\x8bchunk")]  # batch mode's table copy kept them

    assert migrations.downgrade(db.engine, "0014") == (migrations.head_revision(), "0014")
    assert "in_store" not in _columns(db) and "path" in _columns(db)
    assert "session.bundle_cap_mib" not in _columns(db)
    with db.engine.connect() as conn:
        paths = conn.exec_driver_sql("SELECT path FROM bundle ORDER BY id").scalars().all()
    assert [p is not None for p in paths] == [True, False]  # the old code's only question
    assert "/etc/passwd" not in paths  # a marker, never a path to read

    assert db.upgrade() == ("0014", migrations.head_revision())  # and up again
    with db.engine.connect() as conn:
        flags = conn.exec_driver_sql("SELECT in_store FROM bundle ORDER BY id").scalars().all()
    assert [bool(f) for f in flags] == [True, False]
    assert _chunks(db) == [(2, 0, b"\x1f\x8bchunk")]
    db.dispose()
