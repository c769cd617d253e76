"""Which perf configs a quick list holds, for one group's history: the minimum set cover at
`threshold x best` (an integer program on HiGHS; greedy when the instance is too large, and then
the method says so), or the per-problem top-k. Nothing of the database."""

from __future__ import annotations

import os
import sys
from collections.abc import Iterable, Mapping, Sequence
from dataclasses import dataclass

from mlirtuna.history.quick.groups import History, Options

#: Above this many (problem, covering config) pairs the ILP is not tried: greedy, said so.
GREEDY_ABOVE = 2_000_000
ILP_TIME_LIMIT_S = 120


@dataclass
class Cover:
    """A set cover's answer."""

    configs: list[str]  # chosen, in the order a tuner should try them
    uncovered: list[int]  # problems no chosen config covers
    method: str


def set_cover(covers: Mapping[int, set[str]], max_size: int | None = None) -> Cover:
    """The fewest perf configs covering every problem (with max_size: the most problems).

    Identical columns are merged first (that keeps optimality); the integer program runs on
    HiGHS; above GREEDY_ABOVE covering pairs, or when HiGHS finds nothing in ILP_TIME_LIMIT_S, the
    classic greedy (ln n-approximate) is used and the method says so.
    """
    coverable = {p: c for p, c in covers.items() if c}
    empty = sorted(p for p, c in covers.items() if not c)
    cols = columns(coverable)
    pairs = sum(len(c) for c in coverable.values())
    if not coverable:
        return Cover([], empty, "nothing to cover")
    if pairs > GREEDY_ABOVE:
        chosen, method = (
            greedy(coverable, cols, max_size),
            (f"greedy ({pairs} covering pairs > {GREEDY_ABOVE}: too large for the ILP)"),
        )
    else:
        chosen, method = _ilp(coverable, cols, max_size)
    ordered = _order(chosen, coverable)
    covered = {p for p, c in coverable.items() if c & set(ordered)}
    return Cover(ordered, sorted(empty + [p for p in coverable if p not in covered]), method)


def columns(covers: Mapping[int, set[str]]) -> dict[str, frozenset[int]]:
    """{config: problems it covers}, one config per distinct set (the first by name)."""
    cols: dict[str, set[int]] = {}
    for p, cs in covers.items():
        for c in cs:
            cols.setdefault(c, set()).add(p)
    seen: dict[frozenset[int], str] = {}
    for c in sorted(cols):
        seen.setdefault(frozenset(cols[c]), c)
    return {c: s for s, c in seen.items()}


def _ilp(
    covers: Mapping[int, set[str]], cols: Mapping[str, frozenset[int]], max_size: int | None
) -> tuple[list[str], str]:
    """The set cover as a 0/1 integer program, solved by HiGHS (highspy)."""
    import highspy
    import numpy as np

    names = sorted(cols)
    index = {c: j for j, c in enumerate(names)}
    problems = sorted(covers)
    n, m = len(names), len(problems)
    rows = [sorted(index[c] for c in names if p in cols[c]) for p in problems]
    h = _highs()
    h.setOptionValue("time_limit", float(ILP_TIME_LIMIT_S))
    inf = highspy.kHighsInf
    if max_size is None:
        # min sum x  s.t.  sum_{j covers i} x_j >= 1 for every problem i
        _binaries(h, np.ones(n))
        _add_rows(h, [(1.0, inf, r, [1.0] * len(r)) for r in rows])
    else:
        # Most problems covered (y_i), then fewest configs: the x weight never outweighs one y.
        # y_i - sum_{j covers i} x_j <= 0;  sum x <= max_size
        _binaries(h, np.concatenate([np.full(n, 1.0 / (n + 1)), -np.ones(m)]))
        _add_rows(
            h,
            [(-inf, 0.0, [*r, n + i], [-1.0] * len(r) + [1.0]) for i, r in enumerate(rows)]
            + [(-inf, float(max_size), list(range(n)), [1.0] * n)],
        )
    # Start from the greedy cover: a run stopped by the time limit is then never worse.
    start_cover = greedy(covers, cols, max_size)
    start = [index[c] for c in start_cover]
    if max_size is not None:
        picked = set(start_cover)
        start += [n + i for i, p in enumerate(problems) if cols_cover(cols, picked, p)]
    h.setSolution(len(start), np.array(start, dtype=np.int32), np.ones(len(start)))
    h.run()
    status = h.getModelStatus()
    values = list(h.getSolution().col_value)[:n]
    chosen = [c for c, v in zip(names, values, strict=True) if v > 0.5]
    if status == highspy.HighsModelStatus.kOptimal:
        return chosen, "ilp (HiGHS, optimal)"
    if chosen and h.getInfo().primal_solution_status == 2:  # a feasible incumbent
        gap = h.getInfo().mip_gap
        return chosen, f"ilp (HiGHS, stopped at {ILP_TIME_LIMIT_S} s, gap {gap:.1%})"
    return start_cover, f"greedy (HiGHS: {h.modelStatusToString(status)})"


def cols_cover(cols: Mapping[str, frozenset[int]], picked: set[str], problem: int) -> bool:
    return any(problem in cols[c] for c in picked)


def _highs():
    """A silent HiGHS. Its first instance prints a licence banner on the process's stdout (at C
    level, whatever `silent()` says), where it would corrupt a list written to stdout: drop it."""
    import highspy

    sys.stdout.flush()
    saved = os.dup(1)
    devnull = os.open(os.devnull, os.O_WRONLY)
    try:
        os.dup2(devnull, 1)
        h = highspy.Highs()
    finally:
        os.dup2(saved, 1)
        os.close(saved)
        os.close(devnull)
    h.silent()
    return h


def _binaries(h, costs) -> None:
    import highspy
    import numpy as np

    n = len(costs)
    h.addVars(n, np.zeros(n), np.ones(n))
    idx = np.arange(n, dtype=np.int32)
    h.changeColsCost(n, idx, np.asarray(costs, dtype=float))
    h.changeColsIntegrality(n, idx, np.full(n, highspy.HighsVarType.kInteger))


def _add_rows(h, rows: list[tuple[float, float, list[int], list[float]]]) -> None:
    import numpy as np

    starts: list[int] = []
    indices: list[int] = []
    values: list[float] = []
    for _, _, idx, vals in rows:
        starts.append(len(indices))
        indices += idx
        values += vals
    h.addRows(
        len(rows),
        np.array([r[0] for r in rows]),
        np.array([r[1] for r in rows]),
        len(indices),
        np.array(starts, dtype=np.int32),
        np.array(indices, dtype=np.int32),
        np.array(values, dtype=float),
    )


def greedy(
    covers: Mapping[int, set[str]], cols: Mapping[str, frozenset[int]], max_size: int | None
) -> list[str]:
    left, chosen = set(covers), list[str]()
    while left and (max_size is None or len(chosen) < max_size):
        best = max(sorted(cols), key=lambda c: len(cols[c] & left))
        if not cols[best] & left:
            break
        chosen.append(best)
        left -= cols[best]
    return chosen


def _order(chosen: Iterable[str], covers: Mapping[int, set[str]]) -> list[str]:
    """Most newly covered problems first, so that any prefix of the list is a good short list."""
    cols = {c: {p for p, cs in covers.items() if c in cs} for c in chosen}
    left, out = set(covers), []
    while cols:
        best = max(sorted(cols), key=lambda c: (len(cols[c] & left), len(cols[c])))
        out.append(best)
        left -= cols.pop(best)
    return out


def top_k(hist: History, pids: Iterable[int], k: int) -> list[str]:
    """The per-problem variant: each problem's k fastest configs, most frequent first."""
    count: dict[str, int] = {}
    for pid in pids:
        ranked = sorted(hist.perf[pid].items(), key=lambda kv: (-kv[1], kv[0]))[:k]
        for measured, _ in ranked:
            pc = hist.expand(measured, pid)[0]  # a portable name (cpu: the smallest grid value)
            count[pc] = count.get(pc, 0) + 1
    return sorted(count, key=lambda c: (-count[c], c))


def build_one(
    hist: History, pids: Sequence[int], opts: Options
) -> tuple[list[str], list[int], str]:
    """One group's list over these problems: (perf configs, problems left uncovered, method)."""
    if opts.top_k is not None:
        return top_k(hist, pids, opts.top_k), [], f"top-{opts.top_k} per problem"
    cover = set_cover(hist.covers(pids, opts.threshold), opts.max_size)
    return cover.configs, cover.uncovered, f"set cover at {opts.threshold:g} x best, {cover.method}"
