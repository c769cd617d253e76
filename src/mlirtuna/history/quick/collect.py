"""The farm's history read for quick lists: every valid measurement of some sessions, grouped
by (arch, op, data type), each perf config read as its tuner means it on its problem."""

from __future__ import annotations

import math
from collections.abc import Mapping, Sequence
from typing import Any

import sqlalchemy as sa

from mlirtuna import catalog, sessions
from mlirtuna.db import Database
from mlirtuna.db.models import Candidate, Problem, Result
from mlirtuna.errors import MlirtunaError, UserError
from mlirtuna.history.quick.groups import Expander, Group, History, Resolver
from mlirtuna.problems import parse
from mlirtuna.tuners.registry import Listed, listed_on, tuner_of


def histories(db: Database, session_ids: Sequence[int], op: str | None = None) -> list[History]:
    """Every valid measurement of these sessions: candidates, and winners of imported ones.

    One kind of time: a candidate's search-pass time (candidate.search_time), also where the
    top-k re-measurement replaced its stored median (a re-measured winner would otherwise beat
    configs timed only once, by the kind of its time). A winner (result) counts only for a
    problem of a session that has no candidates for it (imported history). Rows recorded before
    migration 0016 have no search time: their kernel_time is read."""
    if not session_ids:
        raise UserError("quick-list needs at least one --session")
    arch = {sid: sessions.get(db, sid).arch for sid in session_ids}
    # {(arch, problem): {perf config: best TFlops}}: one problem tuned on two chips is two rows.
    perf: dict[tuple[str, int], dict[str, float]] = {}
    tried: set[tuple[int, int]] = set()  # (session, problem) with candidates

    def add(sid: int, pid: int, pc: str, tf: float | None) -> None:
        if tf is None or tf <= 0 or not math.isfinite(tf):
            return
        row = perf.setdefault((arch[sid], pid), {})
        row[pc] = max(tf, row.get(pc, 0.0))

    C, R = Candidate, Result
    with db.session() as s:
        stmt = sa.select(
            C.session_id, C.problem_id, C.perf_config, C.tflops, C.kernel_time, C.search_time
        ).where(C.session_id.in_(session_ids), C.tflops.is_not(None))
        for sid, pid, pc, tf, kernel, search in s.execute(stmt):
            tried.add((sid, pid))
            if tf is not None and search is not None and kernel and search > 0:
                tf = tf * kernel / search  # the same flops over the search pass's time
            add(sid, pid, pc, tf)
        winners = sa.select(R.session_id, R.problem_id, R.perf_config, R.tflops).where(
            R.session_id.in_(session_ids), R.tflops.is_not(None)
        )
        for sid, pid, pc, tf in s.execute(winners):
            if (sid, pid) not in tried:
                add(sid, pid, pc, tf)
        problems = {
            pid: (p_op, tv)
            for pid, p_op, tv in s.execute(sa.select(Problem.id, Problem.op, Problem.test_vector))
        }
        parsed = {pid: _problem(s, pid, *problems[pid]) for pid in {p for _, p in perf}}
    return _group(perf, problems, {p: x for p, x in parsed.items() if x is not None}, op)


def _problem(s, pid: int, op: str, vector: str) -> Any:
    """The typed problem: parsed from its test vector, else (a fusion module, whose vector is
    its hash) loaded from its config row; None for an op this version cannot read."""
    try:
        return parse(op, vector)
    except MlirtunaError:
        pass
    try:
        return catalog.load_problem(s, pid)
    except (MlirtunaError, LookupError, KeyError):
        return None  # nothing to learn from it


def _group(perf, problems, parsed, op) -> list[History]:
    groups: dict[Group, History] = {}
    for (arch, pid), row in perf.items():
        p_op, vector = problems[pid]
        if (op is not None and p_op != op) or pid not in parsed:
            continue
        g = Group(arch, p_op, str(getattr(parsed[pid], "data_type", "") or "-"))
        hist = groups.setdefault(g, History(g, {}, {}, *_meanings(parsed)))
        hist.perf[pid], hist.vectors[pid] = row, vector
    if not groups:
        raise UserError("no valid measurements in those sessions" + (f" for {op}" if op else ""))
    return [groups[g] for g in sorted(groups)]


def _meanings(parsed: Mapping[int, Any]) -> tuple[Resolver, Expander]:
    """(resolve, expand) of every perf config on its problem, as the tuner that owns it says
    (TunerKind.listed, asked by family): the cpu tuner's clipped block sizes; rocMLIR's configs
    pass as is. One answer per (problem, first word), asked when first needed: this runs for
    every (config, problem) pair of a matrix."""
    known: dict[tuple[int, str], Listed] = {}

    def listed(pc: str, pid: int) -> Listed:
        key = (pid, pc.partition(":")[0])  # the first word decides the family (tuner_of)
        found = known.get(key)
        if found is None:
            found = known[key] = listed_on(parsed[pid], tuner_of(pc))
        return found

    def resolve(pc: str, pid: int) -> str:
        return listed(pc, pid).resolve(pc)

    def expand(pc: str, pid: int) -> list[str]:
        return listed(pc, pid).expand(pc)

    return resolve, expand
