"""Rules about the suite itself (docs/ci.md "No wall-clock bounds in a test", "The tiers").

Every test has exactly one tier (support/tiers.py), from one table; a unit test neither starts
a process nor opens a database, a database test starts no process, and a process test starts
one.

A test must not assert that something was fast by the wall clock: on a machine loaded by other
work every such bound fails sooner or later (`test_large_list_is_linear`: 36.6 s against 20 s,
issue 46). CPU time (time.process_time, resource.getrusage), a ratio within one run, or a
benchmark in bench/ say the same without the load in them. A deadline that only keeps a test
from hanging (`proc.wait(timeout=60)`, support/hangguard.py) is fine: it is no assertion.
"""

from __future__ import annotations

import ast
import importlib
import re
import sys
from pathlib import Path

import pytest
from support import tiers, webroutes

TESTS = Path(__file__).parent
# Wall clocks; CPU clocks (process_time, thread_time, getrusage) are what a test may compare.
WALL_CLOCKS = {"monotonic", "monotonic_ns", "perf_counter", "perf_counter_ns", "time", "time_ns"}


def _is_wall_clock(node: ast.AST) -> bool:
    if not isinstance(node, ast.Call):
        return False
    func = node.func
    if isinstance(func, ast.Attribute):  # time.monotonic()
        return (
            func.attr in WALL_CLOCKS
            and isinstance(func.value, ast.Name)
            and func.value.id == "time"
        )
    return isinstance(func, ast.Name) and func.id in WALL_CLOCKS - {"time"}  # from time import …


class _Timed(ast.NodeVisitor):
    """The asserts of one function that bound a wall-clock reading from above."""

    def __init__(self) -> None:
        self.clock_names: set[str] = set()  # names that hold a wall-clock reading or delta
        self.found: list[int] = []

    def _timed(self, node: ast.AST) -> bool:
        return any(
            _is_wall_clock(n) or (isinstance(n, ast.Name) and n.id in self.clock_names)
            for n in ast.walk(node)
        )

    def visit_Assign(self, node: ast.Assign) -> None:
        if self._timed(node.value):
            for target in node.targets:
                self.clock_names |= {n.id for n in ast.walk(target) if isinstance(n, ast.Name)}
        self.generic_visit(node)

    def visit_Assert(self, node: ast.Assert) -> None:
        for cmp in (n for n in ast.walk(node.test) if isinstance(n, ast.Compare)):
            sides = [cmp.left, *cmp.comparators]
            for i, op in enumerate(cmp.ops):
                small, large = sides[i], sides[i + 1]
                if isinstance(op, ast.Gt | ast.GtE):
                    small, large = large, small
                elif not isinstance(op, ast.Lt | ast.LtE):
                    continue
                # An upper bound on a wall-clock reading ("it was fast"); a lower bound
                # ("it waited at least") cannot fail on a slow machine.
                if self._timed(small) and not self._timed(large):
                    self.found.append(node.lineno)


def wall_clock_bounds(source: str) -> list[int]:
    """The lines of `source` that assert an upper bound on a wall-clock time."""
    visitor = _Timed()
    visitor.visit(ast.parse(source))
    return visitor.found


def test_the_scan_finds_what_it_forbids():
    bad = """
import time
from time import perf_counter
start = time.monotonic()
work()
elapsed = time.monotonic() - start
assert elapsed < 20
assert time.monotonic() - start < 30
t0 = perf_counter()
assert 5 > perf_counter() - t0
"""
    assert wall_clock_bounds(bad) == [7, 8, 10]
    good = """
import time
start = time.process_time()
assert time.process_time() - start < 30
deadline = time.monotonic() + 60
while time.monotonic() < deadline:
    pass
took = time.perf_counter() - begin
assert took >= 0.04
assert proc.wait(timeout=60) == 0
"""
    assert wall_clock_bounds(good) == []


def test_no_test_asserts_a_wall_clock_bound():
    found = [
        f"{path.relative_to(TESTS.parent)}:{line}"
        for path in sorted(TESTS.rglob("*.py"))
        for line in wall_clock_bounds(path.read_text())
    ]
    assert found == [], (
        "an upper bound on wall-clock time fails on a busy machine: compare CPU time "
        "(time.process_time) or a ratio within one run, or move the speed goal to bench/ "
        "(docs/ci.md)"
    )


def test_every_test_has_exactly_one_tier(request):
    items = request.session.items  # every test this run collected, this one too
    assert request.node in items
    wrong = [
        (item.nodeid, names)
        for item in items
        if len(names := [m.name for m in item.iter_markers() if m.name in tiers.TIERS]) != 1
    ]
    assert wrong == []


def test_the_tier_tables_name_what_exists():
    files = {p.name for p in TESTS.glob("test_*.py")}
    assert files >= tiers.PROCESS_FILES, tiers.PROCESS_FILES - files
    for test in tiers.PROCESS_TESTS | tiers.NOT_PROCESS_TESTS | tiers.DATABASE_TESTS:
        # A function, or a class's method (one it inherits too), maybe with its parameters.
        file, *names = test.partition("[")[0].split("::")
        found = importlib.import_module(file.removesuffix(".py"))  # as pytest imports it
        for name in names:
            found = getattr(found, name, None)
        assert callable(found), test
    # An exception to a file of process tests, or a process test of another file: one place each.
    assert {t.split("::")[0] for t in tiers.NOT_PROCESS_TESTS} <= tiers.PROCESS_FILES
    assert not {t.split("::")[0] for t in tiers.PROCESS_TESTS} & tiers.PROCESS_FILES


@pytest.mark.parametrize("param", ["mysql"])
def test_a_table_names_a_test_or_one_parametrization_of_it(request, param):
    # A test whose parametrizations differ (one starts a process, the others do not) is named
    # with its parameters in the table of the one.
    name = f"test_suite_rules.py::{request.node.originalname}"
    assert tiers.names_of(request.node) == {name, f"{name}[mysql]"}


def test_no_test_file_marks_a_tier_itself():
    # One table (support/tiers.py) says each test's tier; a mark of a file's own would be a second.
    pattern = re.compile(r"mark\.(" + "|".join(tiers.TIERS) + r")\b")
    found = [p.name for p in TESTS.glob("test_*.py") if pattern.search(p.read_text())]
    assert found == []


def test_a_light_test_that_does_what_its_tier_must_not_fails():
    popen = ("subprocess.Popen", "true", ["true"], None, None)  # what Popen raises
    for tier, event in [("unit", popen), ("unit", ("sqlite3.connect", ":memory:")),
                        ("database", popen)]:  # fmt: skip
        failed = pytest.raises(pytest.fail.Exception, match=rf"{tier} test must not {event[0]!r}")
        with failed, tiers.tier_check(tier):
            sys.audit(*event)
    with tiers.tier_check("database"):  # what its tier may do passes
        sys.audit("sqlite3.connect", ":memory:")
    with tiers.tier_check("process"):
        sys.audit(*popen)
    # Both ways: a process test that started none fails; one its own fixture started counts.
    n = tiers.started()
    started_none = pytest.raises(pytest.fail.Exception, match="a process test that starts no")
    with started_none, tiers.tier_check("process"):
        pass
    with tiers.tier_check("process", n - 1, n):
        pass
    fixture = "a database test must not start a process in a fixture of its own"
    with (
        pytest.raises(pytest.fail.Exception, match=fixture),
        tiers.tier_check("database", n - 1, n),
    ):
        pass


def test_a_route_the_tests_cannot_fill_fails_them():
    """The dashboard tests walk every route (support/webroutes.py): a route with a parameter
    they have no value for fails them instead of going untested."""
    route = webroutes.Route(
        "/api/things/{thing_id}",
        (
            webroutes.Param("thing_id", "path", True, True),
            webroutes.Param("q", "query", False, False),
        ),
    )
    with pytest.raises(AssertionError, match=r"no value for \['thing_id'\]"):
        route.url({"session_id": "1"})
    assert route.url({"thing_id": "7"}) == "/api/things/7"  # an optional one left out
    assert list(route.urls({"thing_id": ["7", "8"], "q": "a b"})) == [
        "/api/things/7?q=a+b", "/api/things/8?q=a+b",
    ]  # fmt: skip
