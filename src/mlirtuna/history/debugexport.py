"""`export --format debug`: every candidate of sessions as rocMLIR's `.debug` TSV.

rocMLIR's quick-tuning tools (`quickTuningGen.py`, `analysis/tuning_eval`) learn from the
`.debug` files tuningRunner writes with `--debug`: pandas TSV rows of perfRunner's
`table_entry()`, one per candidate (reference: rocmlir-newest §7). This writes the farm's whole
history in that layout, so those tools read every session instead of one run's file:

- the file tuningRunner writes with `--debug-quick-tune-data` (no statistics columns), in the
  newest era's columns (E4: gemm's `TransO` kept), as formats/debug.py and the op's OpSpec
  declare them: the op's problem columns with `Chip numCU numChiplets` (the session's, so
  several archs share one file), then `PerfConfig [LDSBankConflict] TFlops`;
- one row per candidate; an invalid candidate (N/A, Discarded, failed) has TFlops `NaN`;
  sessions without candidates (imported .tsv files) give their winners, all there is;
- one op per file: the columns differ per op, so sessions holding several ops need `--op`;
  fusion has none of its own (the tool writes its key's conv or gemm rows);
- booleans as pandas writes them (`True`/`False`), no index column, tab-separated.
"""

from __future__ import annotations

from collections.abc import Callable, Sequence
from typing import Any

import sqlalchemy as sa
from sqlalchemy.orm import Session

from mlirtuna import problems
from mlirtuna.db.models import Candidate, Problem, Result, TuningSession
from mlirtuna.errors import UserError
from mlirtuna.formats import debug

ERA = "E4"  # the newest columns: gemm's TransO tells two gemms apart that E3's rows would not


def render(s: Session, chosen: Sequence[TuningSession], op: str | None) -> tuple[str, int]:
    """The file's text and its number of candidate rows."""
    op = op or _single_op(s, chosen)
    layout = _layout(op)
    lines = ["\t".join(layout.header(ERA))]
    for x in sorted(chosen, key=lambda x: x.id):
        columns = _problem_cells(op, layout, debug.Gpu(x.arch, x.num_cu, x.num_chiplets))
        for test_vector, perf_config, tflops in _candidates(s, x, op):
            cells = columns(test_vector) + debug.candidate_cells(layout, perf_config, tflops)
            lines.append("\t".join(cells))
    if len(lines) == 1:
        ids = ", ".join(str(x.id) for x in chosen)
        raise UserError(f"session(s) {ids} have no {op} candidates or results")
    return "\n".join(lines) + "\n", len(lines) - 1


def _layout(op: str) -> debug.Layout:
    layout = problems.spec_of(op).debug
    if layout is None:
        known = ", ".join(s.name for s in problems.SPECS if s.debug)
        raise UserError(f"no .debug layout for op {op!r} (known: {known})")
    return layout


def _single_op(s: Session, chosen: Sequence[TuningSession]) -> str:
    ids = [x.id for x in chosen]
    found = set(
        s.scalars(
            sa.select(Problem.op)
            .join(Result, Result.problem_id == Problem.id)
            .where(Result.session_id.in_(ids))
            .distinct()
        )
    ) | set(
        s.scalars(
            sa.select(Problem.op)
            .join(Candidate, Candidate.problem_id == Problem.id)
            .where(Candidate.session_id.in_(ids))
            .distinct()
        )
    )
    if len(found) == 1:
        return found.pop()
    if not found:
        raise UserError(f"session(s) {', '.join(map(str, ids))} have no candidates or results")
    raise UserError(
        f"the sessions hold ops {', '.join(sorted(found))}: a .debug file has one op's columns, "
        "give --op"
    )


def _candidates(s: Session, x: TuningSession, op: str) -> list[tuple[str, str, float | None]]:
    """(test vector, perf config, TFlops or None when invalid), candidates in the order tried;
    a session without candidates gives its winners."""
    stmt = (
        sa.select(Problem.test_vector, Candidate.perf_config, Candidate.tflops, Candidate.error)
        .join(Problem, Problem.id == Candidate.problem_id)
        .where(Candidate.session_id == x.id, Problem.op == op)
        .order_by(Candidate.id)
    )
    rows = [(tv, pc, None if err else tf) for tv, pc, tf, err in s.execute(stmt)]
    if rows:
        return rows
    winners = (
        sa.select(Problem.test_vector, Result.perf_config, Result.tflops)
        .join(Problem, Problem.id == Result.problem_id)
        .where(Result.session_id == x.id, Problem.op == op)
        .order_by(Result.id)
    )
    return [(tv, pc, tf) for tv, pc, tf in s.execute(winners)]


def _problem_cells(
    op: str, layout: debug.Layout, gpu: debug.Gpu
) -> Callable[[str], tuple[str, ...]]:
    """test vector -> the cells before PerfConfig; cached per vector (a problem has tens to
    thousands of candidates)."""
    cache: dict[str, tuple[str, ...]] = {}

    def columns(test_vector: str) -> tuple[str, ...]:
        known = cache.get(test_vector)
        if known is None:
            problem: Any = problems.parse(op, test_vector)
            known = cache[test_vector] = debug.problem_cells(layout, ERA, problem, gpu)
        return known

    return columns
