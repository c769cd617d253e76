"""Adaptive search on the farm's own CPU-tuner history: searched sessions against the exhaustive
one, every op (issue 45 §3, the farm half of bench_adaptive.py's comparison).

Problems: per op those of bench_quick_farm.py / bench_tuning_spread.py (examples/<op>-small;
fusion: the smallest --fusion rocMLIR test modules whose space holds more than one config).
In a scratch SQLite database:

1. each problem tuned alone with the CPU tuner over the `exhaustive` space (topk=1, as the
   searched sessions: every stored time is a search-pass time), through the real queue and
   worker: the truth per problem;
2. per problem, strategy (--strategies) and budget (--budgets), a searched session
   (`--search NAME --budget B`, same space and topk) in its OWN copy of that database: with the
   history a real farm would have (`loo`: the exhaustive sessions of the op's OTHER problems;
   the problem's own exhaustive result is deleted from the copy, so the worker's history query
   cannot see it) and with no history at all (`none`: every result deleted);
3. the score: the exhaustive winner's time / the searched winner's true time (its config's time
   in the exhaustive session where measured there, else the searched session's own time), the
   measurements the search used, its wall and CPU time (this process: search + measuring).

    python bench/bench_adaptive_farm.py [--ops gemm,conv,...] [--budgets 10,20]
        [--strategies adaptive,random] [--history loo,none] [--fusion 3] [--smoke] [--out FILE]
"""

from __future__ import annotations

import argparse
import math
import os
import sqlite3
import sys
import time
from dataclasses import dataclass
from pathlib import Path

import common
import sqlalchemy as sa
from bench_tuning_spread import pick

from mlirtuna import catalog, sessions
from mlirtuna.db import Database
from mlirtuna.db.models import Candidate, Result
from mlirtuna.history import quick
from mlirtuna.problems import OPS, Problem
from mlirtuna.queue import jobs
from mlirtuna.sessions import SessionSpec
from mlirtuna.tuners.base import TuneContext
from mlirtuna.tuners.cpu import CpuTuner
from mlirtuna.worker import Worker, WorkerSettings

SPACE = "exhaustive"  # the CPU tuner's whole space: the truth


@dataclass(frozen=True)
class Truth:
    """A problem's exhaustive session: its winner's time and every config's time (ns)."""

    op: str
    problem_id: int
    session_id: int
    vector: str
    best_ns: float
    times: dict[str, float]
    measured: int
    wall_s: float
    cpu_s: float


@dataclass(frozen=True)
class Searched:
    """One searched session's outcome, scored against its problem's truth."""

    op: str
    problem_id: int
    strategy: str
    budget: int
    history: str  # loo | none
    units: int  # (session, problem) pairs in the database the search could learn from
    fraction: float  # best_ns / the found winner's true time
    measured: int
    wall_s: float
    cpu_s: float
    # Its own time of each config the exhaustive session also measured / that session's time:
    # how far two measurements of one config disagree (the noise every fraction carries).
    repeat_ratios: tuple[float, ...] = ()


def main() -> int:
    args = parse_args()
    load, t0 = os.getloadavg(), time.monotonic()
    tuner = CpuTuner(repeats=1) if args.smoke else CpuTuner()
    rows: list[Searched] = []
    truths: list[Truth] = []
    with common.scratch_db("sqlite") as url:
        base = Path(sa.make_url(url).database or "")
        for op in args.ops:
            problems = problems_of(op, args)
            op_truths = [exhaustive(url, op, p, tuner) for p in problems]
            truths += op_truths
            for truth in op_truths:
                others = [t.session_id for t in op_truths if t is not truth]
                for history in args.history:
                    keep = others if history == "loo" else []
                    for strategy in args.strategies:
                        for budget in args.budgets:
                            rows.append(
                                searched(base, truth, strategy, budget, history, keep, tuner)
                            )
    common.emit(report(args, truths, rows, load, time.monotonic() - t0), args.out)
    return 0


def parse_args() -> argparse.Namespace:
    p = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    p.add_argument("--ops", default=",".join(OPS), help="comma-separated ops [all]")
    p.add_argument("--budgets", default="10,20", help="measurements per searched job [10,20]")
    p.add_argument("--strategies", default="adaptive,random", help="search strategies")
    p.add_argument("--history", default="loo,none", help="loo (other problems), none")
    p.add_argument(
        "--fusion", type=int, default=3, help="fusion modules (smallest first, >1 config) [3]"
    )
    p.add_argument("--smoke", action="store_true", help="two problems of one op, 1 repeat")
    p.add_argument("--out", type=Path, help="also write the report to this file")
    args = p.parse_args()
    args.ops = [o for o in args.ops.split(",") if o]
    args.budgets = sorted({int(x) for x in args.budgets.split(",") if x.strip()})
    args.strategies = [s for s in args.strategies.split(",") if s]
    args.history = [h for h in args.history.split(",") if h]
    if set(args.history) - {"loo", "none"}:
        raise SystemExit(f"--history: expected loo and/or none, got {','.join(args.history)}")
    return args


def problems_of(op: str, args: argparse.Namespace) -> list[Problem]:
    found = pick(op, False)
    if op == "fusion":  # the mixr-gemm modules' space is one config: nothing to search
        ctx = TuneContext("cpu", "cpu", 1, 1, SPACE)
        found = [p for p in found if len(CpuTuner().search_space(p, ctx)) > 1][: args.fusion]
    return found[:2] if args.smoke else found


# -- the truth: one exhaustive session per problem ---------------------------------------------
def exhaustive(url: str, op: str, problem: Problem, tuner: CpuTuner) -> Truth:
    db = Database(url)
    try:
        with db.session() as s:
            ids, _ = catalog.ensure_problems(s, op, [problem])
            pid = next(iter(ids.values()))
        spec = SessionSpec(tuner="cpu", tuning_space=SPACE, topk=1, reason=f"exhaustive {pid}")
        common.status(f"exhaustive {op} {problem.canonical()[:70]}")
        sid, wall, cpu = run_session(db, spec, pid, tuner)
        times = config_times(db, sid)
        with db.session() as s:
            best = s.scalar(sa.select(Result.kernel_time).where(Result.session_id == sid))
    finally:
        db.dispose()
    if best is None:
        raise SystemExit(f"{op} {problem.canonical()}: the exhaustive session found no winner")
    return Truth(op, pid, sid, problem.canonical(), best, times, len(times), wall, cpu)


def run_session(
    db: Database, spec: SessionSpec, pid: int, tuner: CpuTuner
) -> tuple[int, float, float]:
    """(session, wall s, CPU s): a session of one problem, run to the end by a worker here."""
    sid = sessions.create(db, spec).id
    with db.session() as s:
        catalog.tag_problems(s, f"bench-{sid}", {pid: 0})
    jobs.load(db, sid, tag=f"bench-{sid}")
    wall0, cpu0 = time.perf_counter(), time.process_time()
    Worker(db, WorkerSettings(sid, until_empty=True), tuner).run()
    return sid, time.perf_counter() - wall0, time.process_time() - cpu0


def config_times(db: Database, sid: int) -> dict[str, float]:
    """Each valid config's kernel time (ns) in session `sid`."""
    C = Candidate
    with db.session() as s:
        got = s.execute(
            sa.select(C.perf_config, C.kernel_time).where(
                C.session_id == sid, C.error.is_(None), C.kernel_time > 0
            )
        ).all()
    return {k: float(t) for k, t in got}


# -- a searched session in a copy holding only the history it may see --------------------------
def searched(
    base: Path,
    truth: Truth,
    strategy: str,
    budget: int,
    history: str,
    keep: list[int],
    tuner: CpuTuner,
) -> Searched:
    copy = base.with_name(f"search-{os.getpid()}.db")
    copy_db(base, copy)
    try:
        units = forget_all_but(copy, keep)
        db = Database(f"sqlite:///{copy}")
        try:
            spec = SessionSpec(
                tuner="cpu",
                tuning_space=SPACE,
                topk=1,
                search=strategy,
                search_budget=budget,
                reason=f"{strategy} {budget} {history} {truth.problem_id}",
            )
            common.status(f"  {strategy} --budget {budget}, history {history} ({units} units)")
            sid, wall, cpu = run_session(db, spec, truth.problem_id, tuner)
            own = config_times(db, sid)
            with db.session() as s:
                n = s.scalar(sa.select(sa.func.count()).where(Candidate.session_id == sid))
                winner = s.scalar(sa.select(Result.perf_config).where(Result.session_id == sid))
        finally:
            db.dispose()
    finally:
        copy.unlink(missing_ok=True)
    found = truth.times.get(winner or "", own.get(winner or "", math.inf))
    frac = truth.best_ns / found if found > 0 else 0.0
    ratios = tuple(t / truth.times[k] for k, t in own.items() if k in truth.times)
    return Searched(
        truth.op,
        truth.problem_id,
        strategy,
        budget,
        history,
        units,
        frac,
        n or 0,
        wall,
        cpu,
        ratios,
    )


def copy_db(src: Path, dst: Path) -> None:
    """A consistent copy of the SQLite file (the backup API: the WAL's pages included)."""
    dst.unlink(missing_ok=True)
    with sqlite3.connect(src) as a, sqlite3.connect(dst) as b:
        a.backup(b)
    a.close()
    b.close()


def forget_all_but(path: Path, keep: list[int]) -> int:
    """Delete the result rows of every session but `keep` from the copy: the worker's history
    (worker/search.py: _units) reads the (session, problem) pairs off `result`, so a deleted
    result is history the search cannot see. Returns the pairs left."""
    con = sqlite3.connect(path)
    try:
        marks = ",".join("?" * len(keep))
        where = f"WHERE session_id NOT IN ({marks})" if keep else ""
        con.execute(f"DELETE FROM result {where}", keep)
        con.commit()
        return int(con.execute("SELECT count(*) FROM result").fetchone()[0])
    finally:
        con.close()


# -- the report --------------------------------------------------------------------------------
def report(args, truths: list[Truth], rows: list[Searched], load, seconds: float) -> str:
    out = [
        "# Adaptive search on the farm's own history (bench/bench_adaptive_farm.py)",
        "",
        common.machine_line() + f" Load average at start: {load[0]:.2f} {load[1]:.2f} "
        f"{load[2]:.2f}; {os.cpu_count()} CPUs.",
        f"CPU tuner, `{SPACE}` space, topk=1. History `loo`: the exhaustive sessions of the op's "
        "other problems; `none`: nothing. Fraction: exhaustive best / the searched winner's "
        "true time (its config's time in the exhaustive session). Off >10 %: the share of configs "
        "measured in both sessions whose two times differ by more than 10 % (the noise).",
        "",
        "Exhaustive sessions (the truth):",
        "",
        common.table(
            ["op", "problem", "configs", "best ms", "wall s", "CPU s"],
            [
                (t.op, short(t.vector), t.measured, t.best_ns / 1e6, t.wall_s, t.cpu_s)
                for t in truths
            ],
        ),
        "",
        "Searched sessions, geomean fraction of the best per op (min in brackets), mean "
        "measurements, mean wall / CPU s per session:",
        "",
    ]
    summary = []
    for op in [*args.ops, "all"]:
        for history in args.history:
            for strategy in args.strategies:
                for budget in args.budgets:
                    sel = [
                        r
                        for r in rows
                        if op in (r.op, "all")
                        and (r.history, r.strategy, r.budget) == (history, strategy, budget)
                    ]
                    if sel:
                        summary.append(summary_row(op, history, strategy, budget, sel))
    out += [
        common.table(
            [
                "op",
                "history",
                "strategy",
                "budget",
                "problems",
                "fraction geomean (min)",
                "at 1.00",
                "measured",
                "wall s",
                "CPU s",
                "off >10 %",
            ],
            summary,
        ),
        "",
        "Per problem, fraction of the best (strategy/budget/history):",
        "",
        per_problem(args, truths, rows),
        "",
        "Exhaustive per problem: "
        + f"{mean([t.measured for t in truths]):.0f} configs, "
        + f"{mean([t.wall_s for t in truths]):.1f} s wall, "
        + f"{mean([t.cpu_s for t in truths]):.1f} s CPU (mean).",
        f"\nRan in {seconds:.0f} s.",
    ]
    return "\n".join(out)


def per_problem(args, truths: list[Truth], rows: list[Searched]) -> str:
    runs = [(s, b, h) for h in args.history for s in args.strategies for b in args.budgets]
    got = {(r.problem_id, r.strategy, r.budget, r.history): r.fraction for r in rows}
    return common.table(
        ["op", "problem", *(f"{s} {b} {h}" for s, b, h in runs)],
        [
            (t.op, short(t.vector), *(f"{got[(t.problem_id, *run)]:.3f}" for run in runs))
            for t in truths
        ],
    )


def summary_row(op, history, strategy, budget, sel: list[Searched]) -> tuple:
    fr = [max(r.fraction, 1e-9) for r in sel]
    return (
        op,
        history,
        strategy,
        budget,
        len(sel),
        f"{quick.geomean(fr):.3f} ({min(fr):.3f})",
        f"{sum(f >= 0.999 for f in fr)}/{len(fr)}",
        f"{mean([r.measured for r in sel]):.1f}",
        f"{mean([r.wall_s for r in sel]):.2f}",
        f"{mean([r.cpu_s for r in sel]):.2f}",
        f"{off_share([x for r in sel for x in r.repeat_ratios]):.0%}",
    )


def off_share(ratios: list[float]) -> float:
    """The share of configs whose two measurements (searched, exhaustive) differ by > 10 %."""
    return sum(abs(x - 1) > 0.1 for x in ratios) / len(ratios) if ratios else float("nan")


def mean(values: list[float]) -> float:
    return sum(values) / len(values) if values else float("nan")


def short(vector: str) -> str:
    return vector if len(vector) <= 48 else vector[:45] + "..."


if __name__ == "__main__":
    sys.exit(main())
