"""Quick-tuning lists from the farm's own history (`mlirtuna quick-list`).

What rocMLIR's quickTuningGen.py does with scattered `.debug` files, done over the candidate table:
per (arch, op, data type), each problem's best TFlops per perf config; a perf config *covers* a
problem when it reaches `threshold x best`; the list is a minimum set cover, solved as an integer
program with HiGHS (highspy; greedy only when the instance is too large, and then the list
says so). Also the per-problem top-k variant, a k-fold evaluation as rocMLIR's
analysis/tuning_eval does it (coverage@k, regret@k, TFlops(list) / TFlops(full) on held-out
problems), the outputs (plain list, JSON, the QuickTuningPerfconfigs.inc layout) and stored lists,
which a session with `--tuning-space list:NAME` tunes over.
"""

from __future__ import annotations

import math
import os
import random
import re
import sys
from collections.abc import Callable, Iterable, Mapping, Sequence
from dataclasses import asdict, dataclass, field
from typing import Any

import sqlalchemy as sa

from mlirtuna import catalog, sessions
from mlirtuna.db import Database, utcnow
from mlirtuna.db.models import Candidate, Problem, QuickList, Result
from mlirtuna.defaults import DEFAULT_QUICK_THRESHOLD as DEFAULT_THRESHOLD
from mlirtuna.errors import MlirtunaError, UserError
from mlirtuna.problems import parse, spec_of

#: Above this many (problem, covering config) pairs the ILP is not tried: greedy, said so.
GREEDY_ABOVE = 2_000_000
ILP_TIME_LIMIT_S = 120
BUDGETS = (1, 2, 4, 8, 16)


@dataclass(frozen=True, order=True)
class Group:
    arch: str
    op: str
    data_type: str

    def __str__(self) -> str:
        return f"{self.arch} {self.op} {self.data_type}"


#: How a listed perf config reads on a given problem (the CPU tuner clips block sizes to the
#: problem's dims, so `cpu:v1:256,…` on a 100-row problem is the measured `cpu:v1:100,…`).
Resolver = Callable[[str, int], str]


@dataclass
class History:
    """One group's measurements: {problem_id: {perf_config: best TFlops}}."""

    group: Group
    perf: dict[int, dict[str, float]]
    vectors: dict[int, str]
    resolve: Resolver = field(default=lambda pc, pid: pc, repr=False)
    #: The portable names of a measured perf config (cpu: every grid value a clipped one means).
    expand: Callable[[str, int], list[str]] = field(default=lambda pc, pid: [pc], repr=False)

    def achieved(self, pc: str, pid: int) -> float | None:
        return self.perf[pid].get(self.resolve(pc, pid))

    def best(self, pid: int) -> float:
        return max(self.perf[pid].values())

    def configs(self) -> list[str]:
        return sorted(
            {n for pid, row in self.perf.items() for pc in row for n in self.expand(pc, pid)}
        )

    def covers(self, pids: Iterable[int], threshold: float) -> dict[int, set[str]]:
        """{problem: the (portable) perf configs reaching threshold x its best}.

        Linear in the measurements: a name covers a problem exactly when what it resolves to
        there is a good measured config, i.e. when it is one of the good configs' portable names.
        """
        out = {}
        for pid in pids:
            floor = threshold * self.best(pid)
            good = (pc for pc, tf in self.perf[pid].items() if tf >= floor)
            out[pid] = {name for pc in good for name in self.expand(pc, pid)}
        return out


# -- reading the history -------------------------------------------------------------------------


def collect(db: Database, session_ids: Sequence[int], op: str | None = None) -> list[History]:
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
        hist = groups.setdefault(g, History(g, {}, {}, *_resolver(parsed)))
        hist.perf[pid], hist.vectors[pid] = row, vector
    if not groups:
        raise UserError("no valid measurements in those sessions" + (f" for {op}" if op else ""))
    return [groups[g] for g in sorted(groups)]


def _resolver(parsed: Mapping[int, Any]) -> tuple[Resolver, Callable[[str, int], list[str]]]:
    """(resolve, expand) for the CPU tuner's clipped block sizes; rocMLIR's configs pass as is."""
    from mlirtuna.tuners import cpu

    resolvers: dict[int, Callable[[str], str]] = {}
    expanders: dict[int, Callable[[str], list[str]]] = {}

    def resolve(pc: str, pid: int) -> str:
        if not pc.startswith("cpu:"):
            return pc
        if pid not in resolvers:
            resolvers[pid] = cpu.resolver(parsed[pid])
        return resolvers[pid](pc)

    def expand(pc: str, pid: int) -> list[str]:
        if not pc.startswith("cpu:"):
            return [pc]
        if pid not in expanders:
            expanders[pid] = cpu.portable(parsed[pid])
        return expanders[pid](pc)

    return resolve, expand


# -- set cover -----------------------------------------------------------------------------------


@dataclass
class Cover:
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


# -- building and evaluating ---------------------------------------------------------------------


@dataclass
class Options:
    threshold: float = DEFAULT_THRESHOLD
    max_size: int | None = None
    top_k: int | None = None  # the per-problem variant instead of the set cover
    across: str | None = None  # one list for an arch (problem) none of the history's is

    def check(self) -> None:
        if not 0 < self.threshold <= 1:
            raise UserError(f"--threshold must be in (0, 1], not {self.threshold}")
        if self.max_size is not None and self.max_size < 1:
            raise UserError("--max-size must be at least 1")
        if self.top_k is not None and (self.top_k < 1 or self.max_size is not None):
            raise UserError("--top-k K (K >= 1) is the per-problem variant: not with --max-size")


@dataclass
class GroupList:
    group: Group
    perf_configs: list[str]
    problems: int
    uncovered: list[str]  # test vectors
    method: str
    evaluation: dict[str, Any] | None = None

    def as_dict(self) -> dict[str, Any]:
        d = asdict(self)
        d.update(asdict(self.group))
        del d["group"]
        return d


def build_one(
    hist: History, pids: Sequence[int], opts: Options
) -> tuple[list[str], list[int], str]:
    if opts.top_k is not None:
        return top_k(hist, pids, opts.top_k), [], f"top-{opts.top_k} per problem"
    cover = set_cover(hist.covers(pids, opts.threshold), opts.max_size)
    return cover.configs, cover.uncovered, f"set cover at {opts.threshold:g} x best, {cover.method}"


def build(
    histories: Sequence[History], opts: Options, folds: int | None = None, seed: int = 0
) -> list[GroupList]:
    opts.check()
    out = []
    for hist in histories:
        pids = sorted(hist.perf)
        configs, uncovered, method = build_one(hist, pids, opts)
        ev = evaluate(hist, opts, folds, seed) if folds else None
        out.append(
            GroupList(
                hist.group, configs, len(pids), [hist.vectors[p] for p in uncovered], method, ev
            )
        )
    return out


def evaluate(hist: History, opts: Options, folds: int, seed: int = 0) -> dict[str, Any]:
    """k-fold over problems: build on k-1 folds, score the held-out fold against its own best.

    coverage@k: share of held-out problems where one of the list's first k configs reaches
    threshold x best; regret@k: mean of 1 - (best of the first k) / best. ratio: TFlops of the
    best list config / TFlops of the best of all (the full space), per held-out problem.
    """
    if folds < 2:
        raise UserError("--folds needs at least 2")
    pids = sorted(hist.perf)
    random.Random(seed).shuffle(pids)
    parts = [pids[i::folds] for i in range(folds)]
    rows: list[tuple[float, dict[int, float], dict[int, bool]]] = []
    sizes = []
    for i, held in enumerate(parts):
        train = [p for j, part in enumerate(parts) if j != i for p in part]
        if not held or not train:
            continue
        configs, _, _ = build_one(hist, train, opts)
        sizes.append(len(configs))
        for pid in held:
            rows.append(_score(hist, configs, pid, opts.threshold))
    ratios = [r for r, _, _ in rows]
    return {
        "folds": folds,
        "held_out": len(rows),
        "list_size_mean": sum(sizes) / len(sizes) if sizes else 0,
        "coverage_at": {k: _mean([c[k] for _, _, c in rows]) for k in BUDGETS},
        "regret_at": {k: _mean([g[k] for _, g, _ in rows]) for k in BUDGETS},
        "coverage_all": _mean([float(r >= opts.threshold) for r in ratios]),
        "ratio_geomean": geomean(ratios),
        "ratio_min": min(ratios) if ratios else None,
    }


def _score(hist: History, configs: Sequence[str], pid: int, threshold: float):
    best = hist.best(pid)
    got = [hist.achieved(c, pid) or 0.0 for c in configs]
    regret, cover = {}, {}
    for k in BUDGETS:
        top = max(got[:k], default=0.0)
        regret[k] = max(0.0, 1.0 - top / best)
        cover[k] = float(top >= threshold * best)
    return (max(got, default=0.0) / best, regret, cover)


def _mean(values: list[float]) -> float | None:
    return sum(values) / len(values) if values else None


def geomean(values: Sequence[float]) -> float | None:
    if not values:
        return None
    if min(values) <= 0:
        return 0.0
    return math.exp(sum(math.log(v) for v in values) / len(values))


# -- outputs -------------------------------------------------------------------------------------


def render_list(lists: Sequence[GroupList]) -> str:
    blocks = []
    for gl in lists:
        head = [
            f"# {gl.group}: {len(gl.perf_configs)} perf configs for {gl.problems} problems "
            f"({gl.method})"
        ]
        head += [f"# uncovered: {tv}" for tv in gl.uncovered]
        blocks.append("\n".join(head + gl.perf_configs) + "\n")
    return "\n".join(blocks)


def render_json(lists: Sequence[GroupList], meta: Mapping[str, Any]) -> dict[str, Any]:
    return {**meta, "lists": [gl.as_dict() for gl in lists]}


# The layout of rocMLIR's mlir/include/mlir/Dialect/Rock/Tuning/QuickTuningPerfconfigs.inc as
# mlir/utils/performance/analysis/quickTuningGen.py writes it: per instruction family a
# DEFINITIONS and a DECLARATIONS section, then the lookup tables keyed "<arch>_<op>_<type>".
INC_SECTIONS = ("NonAccel", "XDL", "Wmma", "GemmGemm")
INC_LOOKUPS = ("NonAccel", "Accel", "GemmGemm")


def instruction_type(arch: str, data_type: str, op: str) -> str:
    fixed = spec_of(op).inc_section  # the op's own section on every arch (attention: GemmGemm)
    if fixed:
        return fixed
    if arch.startswith("gfx9"):
        return "XDL"
    if arch.startswith("gfx1") and data_type != "f32":
        return "Wmma"
    return "NonAccel"


def _ident(text: str) -> str:
    """A C++ identifier piece: `cpu-x86_64` → `Cpux86_64` (gfx names pass unchanged)."""
    clean = re.sub(r"[^0-9A-Za-z_]", "", text)
    return clean[:1].upper() + clean[1:]


def inc_skeleton() -> str:
    lines = ["// Generated by: mlirtuna quick-list", "", "// clang-format off", ""]
    for s in INC_SECTIONS:
        for kind in ("DEFINITIONS", "DECLARATIONS"):
            lines += [f"#ifdef {s}_{kind}_GEN", "", f"#endif  // {s}_{kind}_GEN", ""]
    for s in INC_LOOKUPS:
        lines += [f"#ifdef {s}_LOOKUP_TABLE_GEN", "", f"#endif  // {s}_LOOKUP_TABLE_GEN", ""]
    return "\n".join(lines)


def render_inc(lists: Sequence[GroupList], existing: str | None = None) -> str:
    """The .inc text; with `existing`, its sections for these groups are replaced in place."""
    text = existing if existing is not None else inc_skeleton()
    for gl in lists:
        text = _inc_group(text, gl)
    return text


def _inc_group(text: str, gl: GroupList) -> str:
    arch, op, dtype = gl.group.arch, gl.group.op, gl.group.data_type
    instr = instruction_type(arch, dtype, op)
    cls = f"PopulateParams{instr}" if instr != "NonAccel" else "PopulateParams"
    param = f"initParameters{_ident(dtype)}{_ident(op)}{_ident(arch)}"
    count = f"n{param[0].upper()}{param[1:]}"
    tag = f"{op.upper()}_{instr}_{dtype}_{arch}"
    body = [f"const StringRef {cls}::{param}[] = {{"]
    body += [
        f'    "{pc}"{"," if i < len(gl.perf_configs) - 1 else ""}'
        for i, pc in enumerate(gl.perf_configs)
    ]
    body.append("};")
    text = _put_section(text, f"{instr}_DEFINITIONS_GEN", f"{tag}_DEFS", "\n".join(body))
    decl = [
        f"static constexpr size_t {count} = {len(gl.perf_configs)};",
        f"static const StringRef {param}[{count}];",
    ]
    text = _put_section(text, f"{instr}_DECLARATIONS_GEN", f"{tag}_DECS", "\n".join(decl))
    lookup = instr if instr in ("NonAccel", "GemmGemm") else "Accel"  # XDL and Wmma: Accel
    entry = f'{{"{arch}_{op}_{dtype}", {{{cls}::{param}, {cls}::{count}}}}},'
    return _put_lookup(text, f"{lookup}_LOOKUP_TABLE_GEN", f'"{arch}_{op}_{dtype}"', entry)


def _put_section(text: str, section: str, name: str, content: str) -> str:
    begin, end = f"// BEGIN_{name}", f"// END_{name}"
    block = f"{begin}\n{content}\n{end}"
    start = text.find(begin)
    if start >= 0:
        stop = text.index(end, start) + len(end)
        return text[:start] + block + text[stop:]
    at = text.find(f"#endif  // {section}")
    if at < 0:
        raise UserError(f"not a QuickTuningPerfconfigs.inc: no `#endif  // {section}`")
    return text[:at] + block + "\n\n" + text[at:]


def _put_lookup(text: str, section: str, key: str, entry: str) -> str:
    old = re.search(r"\{" + re.escape(key) + r",\s*\{[^}]+\}\},?[^\n]*\n*", text)
    if old:
        return text[: old.start()] + entry + "\n\n" + text[old.end() :]
    at = text.find(f"#endif  // {section}")
    if at < 0:
        raise UserError(f"not a QuickTuningPerfconfigs.inc: no `#endif  // {section}`")
    return text[:at] + entry + "\n\n" + text[at:]


# -- stored lists (sessions.py reads them for a list:NAME tuning space) -------------------------


def store(db: Database, name: str, lists: Sequence[GroupList], session_ids: Sequence[int]) -> int:
    """Save (replace) the lists of NAME, one row per (arch, op, data type); one transaction."""
    sessions.check_quick_list_name(name)
    now = utcnow()
    with db.session() as s:
        for gl in lists:
            s.execute(
                sa.delete(QuickList).where(
                    QuickList.name == name,
                    QuickList.arch == gl.group.arch,
                    QuickList.op == gl.group.op,
                    QuickList.data_type == gl.group.data_type,
                )
            )
            s.add(
                QuickList(
                    name=name,
                    arch=gl.group.arch,
                    op=gl.group.op,
                    data_type=gl.group.data_type,
                    perf_configs="\n".join(gl.perf_configs),
                    method=gl.method[:200],
                    sessions=",".join(map(str, session_ids))[:200],
                    created_at=now,
                )
            )
    return len(lists)


def stored(db: Database) -> list[dict[str, Any]]:
    with db.session() as s:
        rows = s.scalars(
            sa.select(QuickList).order_by(
                QuickList.name, QuickList.arch, QuickList.op, QuickList.data_type
            )
        )
        return [
            {
                "name": r.name,
                "arch": r.arch,
                "op": r.op,
                "data_type": r.data_type,
                "size": len(r.perf_configs.splitlines()),
                "method": r.method,
                "sessions": r.sessions,
            }
            for r in rows
        ]


# -- any candidate matrix; lists that transfer to problems (GPUs) never seen -------------------
#
# A matrix is problem x config -> measured time, NaN where the config failed or was never
# measured (a failure is never fast). Its rows are grouped in *units* (a GPU, an arch): a list
# built across units is meant for a unit none of them is, and is judged by leaving each unit out.

#: A failed config's ratio in the log objectives: 1/1000 of the best (log(0) would let one
#: failure outweigh everything, and a failed config must still rank below every valid one).
FAILED_RATIO = 1e-3
#: The robust cover stops when one more config gains less than this in mean log ratio (0.1 %).
GAIN_FLOOR = 1e-3
#: A config field with exactly this many distinct values is a switch (use_shmem, forceUnroll…):
#: the combinations of switches are the families a transferable list samples from.
SWITCH_VALUES = 2
#: Virtual problems for the tail of a transferable list: VIRTUAL mixtures of the known rows with
#: Dirichlet(VIRTUAL_ALPHA) weights (< 1: most weight on a few rows, as a new GPU resembles
#: some known ones more than others).
VIRTUAL, VIRTUAL_ALPHA, VIRTUAL_SEED = 64, 0.5, 36


@dataclass
class Matrix:
    """Measured times (lower is better): rows = problems, columns = configs, NaN = failed."""

    rows: list[str]
    configs: list[str]
    times: Any  # numpy float array (len(rows), len(configs))
    units: list[str] = field(default_factory=list)  # per row; default: each row its own unit

    def __post_init__(self) -> None:
        if not self.units:
            self.units = list(self.rows)

    def ratios(self) -> Any:
        """best / time per row (1 = the row's best), 0 where the config failed."""
        import numpy as np

        t = np.where(np.isfinite(self.times) & (self.times > 0), self.times, np.inf)
        best = t.min(axis=1, keepdims=True)
        with np.errstate(divide="ignore", invalid="ignore"):
            return np.where(np.isfinite(best), best / t, 0.0)

    def take(self, keep: Sequence[int]) -> Matrix:
        return Matrix(
            [self.rows[i] for i in keep],
            self.configs,
            self.times[list(keep)],
            [self.units[i] for i in keep],
        )

    def unit_names(self) -> list[str]:
        return sorted(set(self.units))


def matrix_of(histories: Sequence[History]) -> Matrix:
    """The farm's history as a matrix: one row per (arch, problem), time = 1 / TFlops (the
    ratios are the same), every portable config name scored by what it resolves to there."""
    import numpy as np

    configs = sorted({c for h in histories for c in h.configs()})
    rows, units, times = [], [], []
    for h in histories:
        for pid in sorted(h.perf):
            tf = [h.achieved(c, pid) for c in configs]
            times.append([1.0 / x if x else np.nan for x in tf])
            rows.append(f"{h.group.arch} {h.vectors[pid]}")
            units.append(h.group.arch)
    return Matrix(rows, configs, np.array(times, dtype=float).reshape(len(rows), -1), units)


def _row_weights(units: Sequence[str]) -> Any:
    """Each unit weighs the same, whatever its number of problems (an arch tuned on 200
    problems must not drown one tuned on 20): the objectives are means over units."""
    import numpy as np

    count = {u: units.count(u) for u in set(units)}
    w = np.array([1.0 / count[u] for u in units])
    return w / w.sum()


def switch_families(configs: Sequence[str]) -> Any:
    """Per config, its family: the values of its switch fields (fields split on `,` and `:`
    with exactly SWITCH_VALUES distinct values over all configs). One family when none."""
    import numpy as np

    split = [re.split("[,:]", c) for c in configs]
    width = max((len(s) for s in split), default=0)
    table = np.array([s + [""] * (width - len(s)) for s in split], dtype=object)
    switches = [j for j in range(width) if len(set(table[:, j])) == SWITCH_VALUES]
    if not switches:
        return np.zeros(len(configs), dtype=int)
    keys = ["\x1f".join(row) for row in table[:, switches]]
    return np.unique(np.array(keys), return_inverse=True)[1].ravel()


def baseline_list(m: Matrix, k: int) -> list[str]:
    """The plain baseline: the k configs with the best mean log(best/time) over the units."""
    import numpy as np

    score = _log_ratios(m) @ _row_weights(m.units)
    return [m.configs[j] for j in np.argsort(-score, kind="stable")[:k]]


def _log_ratios(m: Matrix) -> Any:
    import numpy as np

    return np.log(np.maximum(m.ratios(), FAILED_RATIO)).T  # (configs, rows)


def across_list(m: Matrix, k: int) -> list[str]:
    """A list of k configs meant for a unit (GPU, arch) that none of m's rows is.

    1. Robust cover: greedily the config that most raises the geometric mean over the units of
       best-in-list / best (ties: the best mean log ratio), while that gains >= GAIN_FLOOR.
       Every training unit is then served (nothing the cover adds is a near-copy: it must gain).
    2. Diversity: the best config (by mean log ratio) of each family of switches not in the
       list yet, best family first: a new GPU's optimum often lies in a family the training
       GPUs rank low (W6600 vs the NVIDIA GPUs on the convolution), and k near-copies of one
       family's best would all miss it.
    3. The rest by a robust cover of *virtual* problems between the known ones: VIRTUAL random
       mixtures (Dirichlet weights) of the rows' log ratios, each measured against its own best,
       so the tail holds configs that are best somewhere between the training GPUs rather than
       near-copies of the top one (seeded: the same matrix gives the same list).
    """
    logs = _log_ratios(m)  # (configs, rows)
    score = logs @ _row_weights(m.units)
    chosen = _robust_cover(logs, _row_weights(m.units), score, k)
    chosen += _family_picks(switch_families(m.configs), score, chosen, k)
    chosen += _virtual_cover(logs, score, chosen, k)
    return [m.configs[j] for j in chosen]


def _robust_cover(logs: Any, w: Any, score: Any, k: int) -> list[int]:
    """Greedy on the weighted mean of log(best-in-list / best), while a config gains."""
    import numpy as np

    chosen: list[int] = []
    best = np.full(logs.shape[1], math.log(FAILED_RATIO))
    while len(chosen) < min(k, len(score)):
        value = np.maximum(logs, best) @ w
        value[chosen] = -np.inf
        gain = value - best @ w
        j = int(np.lexsort((-score, -np.round(gain, 9)))[0])
        if chosen and gain[j] < GAIN_FLOOR:
            break
        chosen.append(j)
        best = np.maximum(best, logs[j])
    return chosen


def _family_picks(fam: Any, score: Any, chosen: list[int], k: int) -> list[int]:
    """The best config of each family not represented yet, best family first."""
    import numpy as np

    first: dict[int, int] = {}
    for j in np.argsort(-score, kind="stable"):
        first.setdefault(int(fam[j]), int(j))
    seen = {int(fam[j]) for j in chosen}
    more = [j for f, j in first.items() if f not in seen]  # dict order: best family first
    return more[: max(0, k - len(chosen))]


def _virtual_cover(logs: Any, score: Any, chosen: list[int], k: int) -> list[int]:
    """Up to k - len(chosen) more configs: greedy on the mean over VIRTUAL mixtures of the rows
    of log(best-in-list / best) (ties: the best mean log ratio)."""
    import numpy as np

    if len(chosen) >= min(k, len(score)):
        return []
    rng = np.random.default_rng(VIRTUAL_SEED)
    mix = logs @ rng.dirichlet(np.full(logs.shape[1], VIRTUAL_ALPHA), size=VIRTUAL).T
    mix -= mix.max(axis=0, keepdims=True)  # each virtual problem against its own best
    best = mix[chosen].max(axis=0)
    more: list[int] = []
    while len(chosen) + len(more) < min(k, len(score)):
        value = np.maximum(mix, best).mean(axis=1)
        value[chosen + more] = -np.inf
        j = int(np.lexsort((-score, -np.round(value, 9)))[0])
        more.append(j)
        best = np.maximum(best, mix[j])
    return more


#: The list makers a matrix can be given to, by name.
MAKERS: dict[str, Callable[[Matrix, int], list[str]]] = {
    "across": across_list,
    "baseline": baseline_list,
}


def best_in_list(m: Matrix, configs: Sequence[str]) -> Any:
    """Per row of m: the best listed config's best/time (0 when every listed config failed
    there or is unknown to m)."""
    import numpy as np

    index = {c: j for j, c in enumerate(m.configs)}
    cols = [index[c] for c in configs if c in index]
    if not cols:
        return np.zeros(len(m.rows))
    return m.ratios()[:, cols].max(axis=1)


def unit_scores(m: Matrix, configs: Sequence[str]) -> dict[str, float]:
    """{unit: geometric mean over its rows of best-in-list / best}."""
    got = best_in_list(m, configs)
    return {
        u: geomean([float(g) for g, r in zip(got, m.units, strict=True) if r == u]) or 0.0
        for u in m.unit_names()
    }


def leave_one_out(m: Matrix, k: int, maker: str = "across") -> dict[str, float]:
    """{unit: the score on that unit of a list of k built from every other unit}."""
    out = {}
    for unit in m.unit_names():
        train = m.take([i for i, u in enumerate(m.units) if u != unit])
        test = m.take([i for i, u in enumerate(m.units) if u == unit])
        if not train.rows:
            continue
        out[unit] = unit_scores(test, MAKERS[maker](train, k))[unit]
    return out


#: What `quick-list --across` can treat as the unit a list must transfer to.
ACROSS = ("arch", "problem")
DEFAULT_ACROSS_SIZE = 10


def build_across(histories: Sequence[History], across: str, size: int | None) -> list[GroupList]:
    """Per (op, data type), one list over every arch's history, meant for an arch (or problem)
    none of them is; its evaluation: leave-one-unit-out, of this list maker and the baseline."""
    if across not in ACROSS:
        raise UserError(f"unknown --across {across!r} (known: {', '.join(ACROSS)})")
    k = size or DEFAULT_ACROSS_SIZE
    if k < 1:
        raise UserError("--max-size must be at least 1")
    by_kind: dict[tuple[str, str], list[History]] = {}
    for h in histories:
        by_kind.setdefault((h.group.op, h.group.data_type), []).append(h)
    out = []
    for (op, dtype), hs in sorted(by_kind.items()):
        m = matrix_of(hs)
        if across == "problem":
            m.units = list(m.rows)
        units = m.unit_names()
        ev = None
        if len(units) > 1:
            ev = {
                "across": across,
                "size": k,
                "leave_one_out": leave_one_out(m, k),
                "baseline_leave_one_out": leave_one_out(m, k, "baseline"),
            }
        arch = "+".join(sorted({h.group.arch for h in hs}))
        method = (
            f"across {len(units)} {across}s: robust cover, switch families, virtual cover"
            f" ({k} configs)"
        )
        out.append(
            GroupList(Group(arch, op, dtype), across_list(m, k), len(m.rows), [], method, ev)
        )
    return out
