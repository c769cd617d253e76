"""Two `import` (or two `jobs load`) at once, on every backend: both succeed, nothing doubles.

Before, the second crashed on the unique key the first inserted while it was deciding what was
missing; now the loser of the race runs its transaction again and finds the rows there."""

from __future__ import annotations

import threading

import sqlalchemy as sa
from conftest import DATA

from mlirtuna import catalog, sessions
from mlirtuna.db.models import Job, Problem, ProblemTag
from mlirtuna.queue import jobs
from mlirtuna.sessions import SessionSpec


def _at_once(n: int, fn) -> list:
    barrier, results, errors = threading.Barrier(n), [None] * n, []

    def run(i: int) -> None:
        barrier.wait()
        try:
            results[i] = fn()
        except Exception as exc:  # collected: the test shows what went wrong
            errors.append(exc)

    threads = [threading.Thread(target=run, args=(i,)) for i in range(n)]
    for t in threads:
        t.start()
    for t in threads:
        t.join(300)
    assert errors == []
    return results


def test_concurrent_imports_and_loads_both_succeed(db):
    path = str(DATA / "tier1-gemm-configs")
    for round_ in range(3):  # the race is not hit every time: give it a few chances
        tag = f"r{round_}"
        reports = _at_once(3, lambda tag=tag: catalog.import_files(db, "gemm", [path], tag=tag))
        assert len({r.problems for r in reports}) == 1
        sess = sessions.create(db, SessionSpec(tuner="sleep"))
        loads = _at_once(3, lambda s=sess, tag=tag: jobs.load(db, s.id, tag=tag))
        assert sum(r.added for r in loads) == reports[0].problems
        with db.session() as s:
            assert s.scalar(sa.select(sa.func.count()).select_from(Problem)) == reports[0].problems
            count = sa.select(sa.func.count()).select_from(Job).where(Job.session_id == sess.id)
            assert s.scalar(count) == reports[0].problems


def test_concurrent_fusion_imports_both_succeed(db):
    """The .mlir import retries the lost race as the config-list import does (its copy once
    did not: the second of two imports of the same modules crashed on the unique key)."""
    modules = [str(DATA / "fusion" / "resnet50"), str(DATA / "fusion" / "mixr-gemm")]
    for round_ in range(3):  # the race is not hit every time: give it a few chances
        tag = f"f{round_}"
        reports = _at_once(3, lambda tag=tag: catalog.import_modules(db, modules, tag=tag))
        assert len({r.problems for r in reports}) == 1
        assert sum(r.new for r in reports) == (reports[0].problems if round_ == 0 else 0)
        with db.session() as s:
            assert s.scalar(sa.select(sa.func.count()).select_from(Problem)) == reports[0].problems
            tagged = sa.select(sa.func.count()).where(ProblemTag.tag == tag)
            assert s.scalar(tagged) == reports[0].problems
