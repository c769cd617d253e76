"""Fixtures: database tests run on SQLite, PostgreSQL and MariaDB/MySQL.

Server URLs come from MLIRTUNA_TEST_POSTGRES and MLIRTUNA_TEST_MYSQL; without them only SQLite
runs and the summary says which backends were skipped. With MLIRTUNA_TEST_REQUIRE_ALL=1 (CI) a
missing or unreachable server is a failure, not a skip.

Each test gets a database of its own at the schema's head, made cheaply from one migrated once
per test process (tests/support/testdbs.py): a file copy on SQLite, a reset of a reused database
(the tables the test wrote truncated) on PostgreSQL and MariaDB. A test file that needs fewer
backends says so with `pytestmark = pytest.mark.backends("sqlite")`; without the mark a test
runs on all three.
`backends(..., fast=("sqlite",))`: the other backends' runs carry the `slow` mark, so the quick
loop (`-m "not slow"`) runs such a test once and `.ci/run` on every backend named.
"""

from __future__ import annotations

import os
import sys
from collections.abc import Iterator
from pathlib import Path

import pytest
from support import tiers
from support.scheduling import SharedDatabaseScheduling, shared_id
from support.standin import standin_build
from support.testdbs import BACKENDS, TestDatabases

from mlirtuna.db import Database

HERE = Path(__file__).parent
DATA = HERE / "data"

# The stand-in tool reads FAKE_* variables; the tool's environment is an allowlist.
os.environ.setdefault("MLIRTUNA_TOOL_ENV", "FAKE_*")
# The tests start hundreds of Python processes (workers, the CLI, the stand-in's tools) on the
# source tree: with PYTHONDONTWRITEBYTECODE set (some images set it) each compiled every module
# it imports again; cached bytecode (__pycache__, ignored by git) spares that CPU.
os.environ.pop("PYTHONDONTWRITEBYTECODE", None)
# The stand-in's tools start with `#!/usr/bin/env python3`: they run on the interpreter running
# the tests (an activated venv's, as .ci/run has it), not on whatever `python3` comes first on
# PATH; a pyenv shim there costs 0.1 s a start instead of 0.01 s (the fusion key test: 96 starts).
os.environ["PATH"] = os.pathsep.join([str(Path(sys.executable).parent), os.environ["PATH"]])

DB_FIXTURES = ("db_url", "empty_db_url", "module_db_url")
# The toy plugin's own tests run in a pytest of their own, in its directory with it installed
# (test_tuner_contract.py), as a plugin's author runs them; never collected with these.
collect_ignore = ["plugin_dist"]


@pytest.fixture
def build(tmp_path, monkeypatch) -> Path:
    """A private stand-in rocMLIR build that logs its calls (support/standin.py: a test module
    that needs another era or knobs defines its own `build` with standin_build)."""
    return standin_build(tmp_path, monkeypatch, log=True)


def pytest_configure(config):
    config.addinivalue_line(
        "markers",
        "backends(*names, fast=names): the database backends a test runs on (sqlite, "
        "postgresql, mysql; without the mark, all three); runs on a backend not in `fast` are "
        "slow",
    )


def pytest_xdist_auto_num_workers(config):
    """`-n auto`: two test processes per core. Most tests wait (on a database, a worker process,
    a tool, a browser): the CPU sat 18-37 % busy with one process (issue 32)."""
    return 2 * (os.cpu_count() or 1)


def pytest_xdist_make_scheduler(config, log):
    """`-n auto` hands out tests as support/scheduling.py says: a module's shared database (one
    per backend) set up once, the slow tests first."""
    return SharedDatabaseScheduling(config, log)


def pytest_collection_modifyitems(items):
    """Each test's tier (support/tiers.py: unit, database, process, browser), then the slow
    tests first, so that the longest ones do not start last and leave the other test processes
    idle at the end. The sort is stable: a module's tests stay together."""
    tiers.mark(items)
    items.sort(key=lambda item: item.get_closest_marker("slow") is None)


tiers.install_check()


STARTED = pytest.StashKey[tuple[int, int]]()  # tiers.started() before and after setup


@pytest.hookimpl(wrapper=True)
def pytest_runtest_setup(item):
    before = tiers.started()
    try:
        return (yield)
    finally:
        item.stash[STARTED] = (before, tiers.started())


@pytest.hookimpl(wrapper=True)
def pytest_fixture_setup(fixturedef):
    """A fixture wider than one test is shared setup: whichever test asks first starts its
    processes (support/tiers.py)."""
    with tiers.shared_setup(fixturedef.scope != "function"):
        return (yield)


@pytest.hookimpl(wrapper=True)
def pytest_runtest_call(item):
    """Each test's tier checked both ways (support/tiers.py): a unit test that starts a process
    or opens a database fails, and so does a database test that starts a process; a process test
    that passes without starting one fails too. What counts is the test's own doing: its code
    and its fixtures of function scope, never setup shared with other tests."""
    with tiers.tier_check(tiers.tier_of(item), *item.stash[STARTED]):
        return (yield)


def pytest_generate_tests(metafunc):
    """Parametrize each database fixture over the backends the test (or its file) asks for."""
    marker = metafunc.definition.get_closest_marker("backends")
    backends = list(marker.args) if marker and marker.args else list(BACKENDS)
    fast = set(marker.kwargs.get("fast", backends)) if marker else set(backends)
    unknown = (set(backends) | fast) - set(BACKENDS)
    if unknown:
        raise pytest.UsageError(f"{metafunc.definition.nodeid}: unknown backends {unknown}")
    for name in DB_FIXTURES:
        if name in metafunc.fixturenames:
            shared = name == "module_db_url"
            params = [
                pytest.param(
                    b, marks=() if b in fast else pytest.mark.slow, id=shared_id(b) if shared else b
                )
                for b in backends
            ]
            scope = "module" if shared else "function"
            metafunc.parametrize(name, params, indirect=True, scope=scope)


@pytest.fixture(scope="session")
def test_databases(tmp_path_factory) -> Iterator[TestDatabases]:
    dbs = TestDatabases(tmp_path_factory.mktemp("templates"))
    yield dbs
    dbs.close()


@pytest.fixture
def db_url(request, tmp_path, test_databases) -> Iterator[str]:
    """A URL of a fresh database with the schema at head, once per backend."""
    yield from test_databases.migrated(request.param, tmp_path / "mlirtuna.db")


@pytest.fixture(scope="module")
def module_db_url(request, tmp_path_factory, test_databases) -> Iterator[str]:
    """As db_url, but one database per backend for a whole test module (its tests share it):
    for modules that fill a database once and start a server over it (the browser tests)."""
    path = tmp_path_factory.mktemp("db") / "mlirtuna.db"
    yield from test_databases.migrated(request.param, path, shared=False)


@pytest.fixture
def empty_db_url(request, tmp_path, test_databases) -> Iterator[str]:
    """A URL of a fresh database with no tables at all."""
    yield from test_databases.empty(request.param, tmp_path / "empty.db")


@pytest.fixture
def db(db_url) -> Iterator[Database]:
    database = Database(db_url)
    yield database
    database.dispose()


def pytest_terminal_summary(terminalreporter):
    ran, skipped = TestDatabases.summary()
    terminalreporter.write_sep("-", "database backends")
    terminalreporter.write_line(f"ran: {', '.join(ran)}")
    for backend, why in skipped.items():
        terminalreporter.write_line(f"SKIPPED backend {backend}: {why}")
