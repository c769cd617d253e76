"""The suite's tiers (docs/ci.md "The tiers"): every test is exactly one of

- `unit`: in this process, no database, no other process (`pytest -m unit`: seconds);
- `database`: uses a test database (the db fixtures: SQLite, and PostgreSQL and MariaDB when
  their servers are given);
- `process`: its file starts processes (workers, the CLI, the stand-in's tools, servers);
- `browser`: drives Chromium over a served dashboard.

tests/conftest.py marks each collected test from this one table: by the fixtures it uses (a
browser, a database) and by its file (the files that start processes); the heaviest tier wins.
A test file never marks a tier itself. The light tiers are checked as they run: a unit test that
starts a process or opens a database connection fails, and so does a database test that starts
a process, naming the table to put it in."""

from __future__ import annotations

import sys
from collections.abc import Iterator
from contextlib import contextmanager
from pathlib import Path

import pytest

TIERS = ("unit", "database", "process", "browser")  # lightest first

BROWSER_FIXTURES = frozenset({"browser"})
DATABASE_FIXTURES = frozenset(
    {"test_databases", "db_url", "empty_db_url", "module_db_url", "sqlite_url"}
)
# The test files whose tests start processes: `mlirtuna` as a subprocess (run_cli, a worker),
# the stand-in's tools, a database server of their own, a served dashboard, a pipeline.
PROCESS_FILES = frozenset(
    {
        "test_adaptive_session.py", "test_batch.py", "test_bench_smoke.py", "test_build_commit.py",
        "test_bundle_cap.py", "test_bundle_safety.py", "test_cli_help.py", "test_cli_ops.py",
        "test_compare_verdicts.py", "test_conformance.py", "test_conformance_e4.py",
        "test_db_password.py", "test_dbfaults.py", "test_dead_worker.py", "test_driver_units.py",
        "test_eras.py", "test_eras_rocmlir.py", "test_fused_tuning.py", "test_fusion_rocmlir.py",
        "test_fuzz_hostile.py", "test_gpu_exclusive.py", "test_gpu_lock_safety.py",
        "test_gpu_overlap.py", "test_gpus_auto_race.py", "test_jenkinsfile.py",
        "test_job_faults.py", "test_lease_lost.py", "test_measurement.py", "test_netns.py",
        "test_operator_told.py", "test_operator_wording.py", "test_poison.py", "test_quick.py",
        "test_quick_real.py", "test_rdna.py", "test_restarts.py", "test_reuse.py",
        "test_rocmlir_chosen.py", "test_rocmlir_tuner.py", "test_rocmlir_worker.py",
        "test_role_limits.py", "test_run.py", "test_run_flow.py", "test_session_tuner.py",
        "test_standin_provenance.py", "test_storage.py", "test_stream.py", "test_stream_bounds.py",
        "test_supervisor_restarts.py", "test_temp_sweep.py", "test_timeouts.py", "test_tls.py",
        "test_trans_o.py", "test_try_rocmlir.py", "test_tsv_roundtrip.py", "test_tuner_contract.py",
        "test_tuner_plugin.py", "test_two_stage.py", "test_web_api.py", "test_web_views.py",
        "test_worker.py",
    }
)  # fmt: skip


# Tests that start processes in a file whose other tests do not (a fake rocminfo on PATH).
PROCESS_TESTS = frozenset(
    {
        "test_sessions.py::test_rocmlir_session_detected_from_rocminfo",
        "test_sessions.py::test_rocmlir_session_with_gpu_but_no_chiplet_count_asks_for_it",
    }
)
# Tests that open a database of their own (a SQLite file they make) without a db fixture.
DATABASE_TESTS = frozenset(
    {
        "test_db.py::test_new_sqlite_file_is_created_on_first_use",
        "test_db.py::test_sqlite_file_of_something_else_is_not_touched",
        "test_fuzz_input.py::test_an_error_line_quotes_at_most_80_characters",
        "test_roles.py::test_sqlite_has_no_roles",
        "test_web_safety.py::test_serving_a_sqlite_file_changes_nothing",
    }
)


def tier_of(item: pytest.Item) -> str:
    """The one tier of a collected test: the heaviest that applies."""
    fixtures = set(getattr(item, "fixturenames", ()))
    file = Path(str(item.path)).name
    if fixtures & BROWSER_FIXTURES:
        return "browser"
    test = f"{file}::{getattr(item, 'originalname', item.name)}"  # without its parameters
    if file in PROCESS_FILES or test in PROCESS_TESTS:
        return "process"
    if fixtures & DATABASE_FIXTURES or test in DATABASE_TESTS:
        return "database"
    return "unit"


def mark(items: list[pytest.Item]) -> None:
    for item in items:
        item.add_marker(getattr(pytest.mark, tier_of(item)))


# What a test of a light tier must not do, as audit events (sys.addaudithook: they are seen
# wherever they happen in this process): a unit test neither starts a process nor opens a
# database (sqlite3, or a socket: a server's driver; one in C, libpq, connects unseen, and its
# tests use the db fixtures); a database test starts no process.
PROCESS_EVENTS = ("subprocess.Popen", "os.fork", "os.forkpty", "os.posix_spawn", "os.spawn",
                  "os.exec", "os.system")  # fmt: skip
FORBIDDEN = {
    "unit": frozenset((*PROCESS_EVENTS, "sqlite3.connect", "socket.connect")),
    "database": frozenset(PROCESS_EVENTS),
}
_watched: list[str] = []  # the forbidden events the test now running raised
_forbidden: list[frozenset[str]] = [frozenset()]  # what the test now running must not do


def _audit(event: str, _args: tuple) -> None:
    if event in _forbidden[-1]:
        _watched.append(event)


def install_check() -> None:
    sys.addaudithook(_audit)  # for the process's life: a hook cannot be removed


@contextmanager
def tier_check(tier: str) -> Iterator[None]:
    """Around a test of `tier`: fails it if it did what its tier must not (nested, as in the
    check's own test, the outer check goes on as before)."""
    start = len(_watched)
    _forbidden.append(FORBIDDEN.get(tier, frozenset()))
    try:
        yield
    finally:
        _forbidden.pop()
    seen = _watched[start:]
    del _watched[start:]
    if seen:
        pytest.fail(
            f"a {tier} test must not {seen[0]!r}: give it the fixture of its tier, or add it "
            "to PROCESS_FILES, PROCESS_TESTS or DATABASE_TESTS in tests/support/tiers.py",
            pytrace=False,
        )
