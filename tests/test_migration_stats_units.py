"""Migration 0021 (issue 42 §2): candidate statistics stored from E3 `.debug` Stats, which are
in ms but were read as ns, are corrected; rows in the right unit are left alone (SQLite,
PostgreSQL, MariaDB)."""

from __future__ import annotations

import pytest
import sqlalchemy as sa

from mlirtuna import migrations
from mlirtuna.db import Database

# (session, perf config, kernel_time ns, time_min, time_iqr, samples) as releases before 0021
# stored them, and what each must read after it.
ROWS = {
    # E3 Stats read as ns: a 100 µs kernel's fastest run 0.0985 "ns", its IQR 0.0013 "ns".
    "e3-full": (1, 100_474.0, 0.0985087, 0.00132553, None),
    # A 7.3 ms one: the same error at another scale.
    "e3-large": (1, 7_300_000.0, 7.1, 0.05, None),
    # rocmlirTriton's MeasurementsMs (always read in ms -> ns, with a count): right already.
    "e4": (1, 100_000.0, 98_000.0, 1_500.0, 11),
    # The stand-in of those releases printed ns: its row is right already.
    "standin-e3": (1, 100_000.0, 98_100.0, 1_200.0, None),
    # No statistics (the legacy {total_cpu_time, iterations} shape, E2, N/A): nothing to fix.
    "none": (1, 100_000.0, None, None, None),
    # The CPU tuner: its own numbers, in ns, with a count.
    "cpu": (2, 50.0, 0.04, 0.001, None),
}
FIXED = {
    "e3-full": (98_508.7, 1_325.53),
    "e3-large": (7_100_000.0, 50_000.0),
}


def _rows_at_0020(db: Database) -> None:
    with db.engine.begin() as conn:
        for tuner in ("rocmlir", "cpu"):
            conn.execute(
                sa.text(
                    "INSERT INTO session (arch, arch_full, num_cu, num_chiplets, rocm_v, mlir_v,"
                    " reason, ticket, docker, tuning_space, tuner, host, created_at) VALUES"
                    " ('gfx942', 'gfx942', 304, 8, '', '', 'old', '', '', 'full', :t, '',"
                    " '2025-01-01 00:00:00')"
                ),
                {"t": tuner},
            )
        conn.exec_driver_sql(
            "INSERT INTO problem (op, test_vector, created_at) VALUES ('gemm', '-m 1',"
            " '2025-01-01 00:00:00')"
        )
        for sid in (1, 2):
            conn.execute(
                sa.text(
                    "INSERT INTO job (session_id, problem_id, state, stage) VALUES"
                    " (:s, 1, 'completed', 'compile')"
                ),
                {"s": sid},
            )
        for pc, (sid, ns, low, iqr, n) in ROWS.items():
            conn.execute(
                sa.text(
                    "INSERT INTO candidate (session_id, problem_id, job_id, perf_config,"
                    " kernel_time, tflops, time_min, time_iqr, samples) VALUES"
                    " (:s, 1, :s, :pc, :ns, 1.0, :low, :iqr, :n)"
                ),
                {"s": sid, "pc": pc, "ns": ns, "low": low, "iqr": iqr, "n": n},
            )


def _stats(db: Database) -> dict[str, tuple]:
    with db.engine.connect() as conn:
        rows = conn.exec_driver_sql(
            "SELECT perf_config, kernel_time, time_min, time_iqr, samples FROM candidate"
        ).all()
    return {r[0]: tuple(r[1:]) for r in rows}


def test_0021_corrects_e3_stats_stored_in_ms_and_nothing_else(empty_db_url):
    db = Database(empty_db_url, check_schema=False)
    migrations.upgrade(db.engine, "0020")
    _rows_at_0020(db)
    before = _stats(db)
    assert db.upgrade() == ("0020", migrations.head_revision())
    after = _stats(db)
    for pc, (ns, low, iqr, n) in before.items():
        if pc in FIXED:
            want_min, want_iqr = FIXED[pc]
            assert after[pc][0] == ns and after[pc][3] == n
            assert after[pc][1] == pytest.approx(want_min, rel=1e-9)
            assert after[pc][2] == pytest.approx(want_iqr, rel=1e-9)
        else:
            assert after[pc] == (ns, low, iqr, n), pc
    # Down and up again: the corrected numbers stay, and are not multiplied twice.
    assert migrations.downgrade(db.engine, "0020") == (migrations.head_revision(), "0020")
    assert _stats(db) == after
    assert db.upgrade() == ("0020", migrations.head_revision())
    assert _stats(db) == after
    db.dispose()
