"""A pytest plugin: each test's CPU time, in this process and in the processes it started and
waited for, beside its wall time (docs/ci.md "Where the time goes"). On a machine shared with
other work the wall time measures the load; the CPU time measures the test.

    MLIRTUNA_TEST_CPU_REPORT=cpu.tsv PYTHONPATH=tests python -m pytest -p support.cputime …
    sort -t$'\\t' -k2 -gr cpu.tsv | head -40

Each line: node id, CPU seconds in all (own + children), own, children, wall, tier. With xdist
every test process appends its own lines."""

from __future__ import annotations

import os
import resource
import time

import pytest


def _children() -> float:
    usage = resource.getrusage(resource.RUSAGE_CHILDREN)
    return usage.ru_utime + usage.ru_stime


@pytest.hookimpl(wrapper=True)
def pytest_runtest_protocol(item: pytest.Item, nextitem: pytest.Item | None):
    path = os.environ.get("MLIRTUNA_TEST_CPU_REPORT")
    own, children, wall = time.process_time(), _children(), time.perf_counter()
    try:
        return (yield)
    finally:
        if path:
            own, children = time.process_time() - own, _children() - children
            tier = next((m.name for m in item.iter_markers() if m.name in _TIERS), "")
            with open(path, "a") as out:
                out.write(f"{item.nodeid}\t{own + children:.3f}\t{own:.3f}\t{children:.3f}\t"
                          f"{time.perf_counter() - wall:.3f}\t{tier}\n")  # fmt: skip


_TIERS = ("unit", "database", "process", "browser")
