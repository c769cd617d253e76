"""Tune less, measured on the same work: exhaustive vs a quick list from history vs `quick`.

Problems: from the tier-1 lists in tests/data, gemm shapes (retyped to f32) and f32 forward convs
(one canonical problem each) whose flops fall in a CPU-sized range, N per op spread over it.
Steps, all through mlirtuna's real API and CPU worker (one SQLite scratch database):

1. tune every problem with the CPU tuner over the `exhaustive` space (the reference);
2. split each op's problems in two halves (seeded); build a quick list (set cover at
   --threshold x best, HiGHS) from the exhaustive candidates of the first half, store it;
3. tune the second half twice more: `--tuning-space list:bench` and the built-in `quick` space;
4. report per op and space: candidates per problem, wall time, and TFlops(space winner) /
   TFlops(exhaustive winner) per held-out problem, twice: *paired* (the three winners timed
   again interleaved, best of --rounds, on one data set: the fair comparison on a loaded
   machine) and *as tuned* (each run's own measurement of its winner: what the sessions hold);
   plus the k-fold evaluation of the list over all problems (quick.evaluate, from the
   exhaustive measurements).

    python bench/bench_quick_tuning.py [--per-op 24] [--repeats 3] [--smoke] [--out FILE]
"""

from __future__ import annotations

import argparse
import dataclasses
import math
import random
import time
from pathlib import Path

import common
import numpy as np
import sqlalchemy as sa

from mlirtuna import configs, jobs, quick, sessions
from mlirtuna.db import Database
from mlirtuna.models import Candidate, Result
from mlirtuna.problems import ExpandOptions, Problem
from mlirtuna.problems.configlist import read_config_list
from mlirtuna.sessions import SessionSpec
from mlirtuna.tuners.cpu import CpuTuner, parse_blocks
from mlirtuna.tuners.cpu_kernels import make_op
from mlirtuna.worker import Worker, WorkerSettings

ROOT = Path(__file__).resolve().parent.parent
FLOPS = (2e6, 5e7)
# rocMLIR's published A/B (rocmlirTriton per-problem quick tuning, gfx1201; reference §7).
PUBLISHED = {
    "gemm": ("18.07 → 3.02", "0.9991", "0.50 (any op)"),
    "conv": ("n/a", "0.9657", "0.50 (any op)"),
}


def pick(op: str, n: int) -> list[Problem]:
    """N problems of `op` spread over FLOPS. Gemm shapes of every data type, retyped to f32
    (the tier-1 gemm list is mostly f16/i8 and few of its f32 lines are CPU-sized); conv: the
    f32 forward lines."""
    path = ROOT / "tests" / "data" / f"tier1-{op}-configs"
    opts = ExpandOptions(data_types=("f32",), directions=("fwd",)) if op == "conv" else None
    entries = read_config_list(str(path), op, opts or ExpandOptions(expand=False)).entries
    found = [e.problem for e in entries]
    if op == "gemm":
        found = [dataclasses.replace(p, data_type="f32", out_data_type="f32") for p in found]
    unique = {p.canonical(): p for p in found}.values()
    ranked = sorted(
        (
            p
            for p in unique
            if p.data_type == "f32"
            and str(getattr(p, "direction", "fwd")) in ("fwd", "1")
            and FLOPS[0] <= p.flops() < FLOPS[1]
        ),
        key=lambda p: (p.flops(), p.canonical()),
    )
    if len(ranked) > n:
        step = (len(ranked) - 1) / (n - 1)
        ranked = [ranked[round(i * step)] for i in range(n)]
    return ranked


def tag(db: Database, op: str, problems: list[Problem], name: str) -> dict[str, int]:
    with db.session() as s:
        ids, _ = configs.ensure_problems(s, op, problems)
        configs.tag_problems(s, name, dict.fromkeys(ids.values(), 0))
    return ids


def tune(db: Database, space: str, tags: list[str], repeats: int) -> tuple[int, float]:
    sid = sessions.create(db, SessionSpec(tuner="cpu", tuning_space=space)).id
    for t in tags:
        jobs.load(db, sid, tag=t)
    t0 = time.perf_counter()
    Worker(db, WorkerSettings(sid, until_empty=True), CpuTuner(repeats=repeats)).run()
    seconds = time.perf_counter() - t0
    left = jobs.counts(db, sid)[sid]
    if left["completed"] != sum(left.values()):
        raise SystemExit(f"session {sid} ({space}) did not complete: {left}")
    return sid, seconds


def winners(db: Database, sid: int) -> dict[int, tuple[str, float]]:
    with db.session() as s:
        rows = s.execute(
            sa.select(Result.problem_id, Result.perf_config, Result.tflops).where(
                Result.session_id == sid
            )
        )
        return {pid: (pc, tf) for pid, pc, tf in rows}


def measured(db: Database, sid: int) -> dict[int, dict[str, float]]:
    out: dict[int, dict[str, float]] = {}
    with db.session() as s:
        rows = s.execute(
            sa.select(Candidate.problem_id, Candidate.perf_config, Candidate.tflops).where(
                Candidate.session_id == sid
            )
        )
        for pid, pc, tf in rows:
            out.setdefault(pid, {})[pc] = tf or 0.0
    return out


def paired(problem: Problem, names: list[str], rounds: int) -> dict[str, float]:
    """Best-of-`rounds` ns of each named tiling, timed interleaved (round-robin) on one data
    set, so that the winners of the three spaces meet the same machine load."""
    op = make_op(problem)
    op.setup(np.random.default_rng(0))
    blocks = {n: parse_blocks(n, op) for n in dict.fromkeys(names)}
    best = dict.fromkeys(blocks, math.inf)
    for _ in range(rounds):
        for name, b in blocks.items():
            t0 = time.perf_counter_ns()
            op.run_blocked(b)
            best[name] = min(best[name], float(time.perf_counter_ns() - t0))
    return best


def row(op, space, ids, db, sid, seconds, ref, timed):
    win = winners(db, sid)
    cands = measured(db, sid)
    per_problem = sum(len(cands[p]) for p in ids) / len(ids)
    as_tuned = [win[p][1] / ref[p][1] for p in ids]
    again = [timed[p][ref[p][0]] / timed[p][win[p][0]] for p in ids]
    return [
        op,
        space,
        len(ids),
        f"{per_problem:.2f}",
        f"{seconds:.1f}",
        f"{quick.geomean(again):.4f}",
        f"{min(again):.3f}",
        f"{quick.geomean(as_tuned):.4f}",
        f"{min(as_tuned):.3f}",
    ]


def main() -> None:
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    p.add_argument("--per-op", type=int, default=24, help="problems per op (half build the list)")
    p.add_argument("--repeats", type=int, default=3, help="timed runs per candidate (median)")
    p.add_argument("--threshold", type=float, default=quick.DEFAULT_THRESHOLD)
    p.add_argument("--folds", type=int, default=4, help="k of the k-fold evaluation")
    p.add_argument("--seed", type=int, default=15)
    p.add_argument("--rounds", type=int, default=15, help="paired re-measurement rounds")
    p.add_argument("--smoke", action="store_true", help="4 problems per op, 1 repeat")
    p.add_argument("--out", type=Path, help="also write the Markdown to this file")
    args = p.parse_args()
    per_op, repeats = (4, 1) if args.smoke else (args.per_op, args.repeats)
    with common.scratch_db("sqlite") as url:
        db = Database(url)
        text = run(db, per_op, repeats, args)
        db.dispose()
    common.emit(text, args.out)


def run(db: Database, per_op: int, repeats: int, args) -> str:
    rng = random.Random(args.seed)
    picked = {op: pick(op, per_op) for op in ("gemm", "conv")}
    ids = {op: tag(db, op, ps, f"all-{op}") for op, ps in picked.items()}
    by_id = {ids[op][p.canonical()]: p for op, ps in picked.items() for p in ps}
    common.status(f"exhaustive: {sum(map(len, picked.values()))} problems")
    full_sid, full_s = tune(db, "exhaustive", [f"all-{op}" for op in picked], repeats)
    ref = winners(db, full_sid)
    held: dict[str, list[int]] = {}
    lists = []
    for op, vs in ids.items():
        order = sorted(vs.values())
        rng.shuffle(order)
        train, held[op] = order[: len(order) // 2], sorted(order[len(order) // 2 :])
        (hist,) = quick.collect(db, [full_sid], op)
        built, uncovered, method = quick.build_one(hist, train, quick.Options(args.threshold))
        ev = quick.evaluate(hist, quick.Options(args.threshold), args.folds, args.seed)
        lists.append((hist.group, built, uncovered, method, ev))
        tag(db, op, [by_id[i] for i in held[op]], f"held-{op}")
    quick.store(
        db,
        "bench",
        [quick.GroupList(g, b, per_op // 2, [], m) for g, b, _, m, _ in lists],
        [full_sid],
    )
    common.status("list:bench and quick on the held-out halves")
    held_tags = [f"held-{op}" for op in picked]
    list_sid, list_s = tune(db, "list:bench", held_tags, repeats)
    quick_sid, quick_s = tune(db, "quick", held_tags, repeats)
    common.status("paired re-measurement of the winners")
    timed = {}
    for hs in held.values():
        for pid in hs:
            names = [
                ref[pid][0],
                *(
                    winners_of[pid][0]
                    for winners_of in (winners(db, list_sid), winners(db, quick_sid))
                ),
            ]
            timed[pid] = paired(by_id[pid], names, args.rounds)
    rows = []
    ref_cands = measured(db, full_sid)
    full_held = {op: sum(len(ref_cands[p]) for p in held[op]) / len(held[op]) for op in held}
    for op, hs in held.items():
        rows.append([op, "exhaustive", len(hs), f"{full_held[op]:.2f}", "-", "1", "1", "1", "1"])
        rows.append(row(op, "list:bench", hs, db, list_sid, list_s, ref, timed))
        rows.append(row(op, "quick", hs, db, quick_sid, quick_s, ref, timed))
    return report(args, per_op, repeats, rows, lists, (full_s, list_s, quick_s), full_held)


def report(args, per_op, repeats, rows, lists, walls, full_held) -> str:
    full_s, list_s, quick_s = walls
    headers = ["op", "space", "held-out problems", "candidates/problem", "wall s (both ops)",
               "geomean (paired)", "min (paired)", "geomean (as tuned)",
               "min (as tuned)"]  # fmt: skip
    list_rows = [
        [str(g), len(b), len(u), m,
         f"{ev['coverage_at'][4]:.2f}", f"{ev['regret_at'][4]:.3f}",
         f"{ev['coverage_all']:.2f}", f"{ev['ratio_geomean']:.4f}", f"{ev['ratio_min']:.3f}"]
        for g, b, u, m, ev in lists
    ]  # fmt: skip
    published = [[op, *v] for op, v in PUBLISHED.items()]
    reduction = ", ".join(
        f"{op} {full_held[op] / float(r[3]):.1f}x"
        for op in full_held
        for r in rows
        if r[0] == op and r[1] == "list:bench"
    )
    return "\n\n".join(
        [
            "### Quick tuning from history: exhaustive vs quick list vs `quick` (CPU tuner)",
            common.machine_line(),
            f"{per_op} problems per op from tests/data/tier1-{{gemm,conv}}-configs (gemm shapes "
            "retyped to f32, f32 forward convs) "
            f"({FLOPS[0]:.0e} to {FLOPS[1]:.0e} flops), seed {args.seed}; each candidate "
            f"verified, then the median of {repeats} timed runs. Exhaustive tuning of all "
            f"problems took {full_s:.0f} s; the held-out halves took {list_s:.1f} s with the "
            f"list and {quick_s:.1f} s with `quick`. Fewer candidates with the list: {reduction}.",
            common.table(headers, rows),
            f"The lists (set cover at {args.threshold} x best on the training half; k-fold "
            f"evaluation with k={args.folds} over all problems of the op, from the exhaustive "
            "candidates):",
            common.table(
                [
                    "group",
                    "size",
                    "uncovered",
                    "method",
                    "coverage@4",
                    "regret@4",
                    "coverage (whole list)",
                    "geomean list/full",
                    "min list/full",
                ],
                list_rows,
            ),
            "rocMLIR's published A/B (rocmlirTriton per-problem quick tuning, gfx1201):",
            common.table(["op", "candidates/problem", "geomean vs full", "worst"], published),
        ]
    )


if __name__ == "__main__":
    main()
