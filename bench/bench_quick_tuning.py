"""Tune less, measured on the same work: exhaustive vs a quick list from history vs `quick`.

Problems: from the tier-1 lists in tests/data, gemm shapes (retyped to f32) and f32 forward convs
(one canonical problem each) whose flops fall in a CPU-sized range, N per op spread over it.
Steps, all through mlirtuna's real API and CPU worker (one SQLite scratch database):

1. tune every problem with the CPU tuner over the `exhaustive` space (the reference);
2. split each op's problems in two halves (seeded); per --thresholds value t build a quick list
   (set cover at t x best, HiGHS) from the exhaustive candidates of the first half, store it as
   `bench-t`;
3. tune the second half again with each `--tuning-space list:bench-t` and the built-in `quick`;
4. report per op and space: candidates per problem, wall time, and TFlops(space winner) /
   TFlops(full) per held-out problem, twice: *paired* (every space's winner, exhaustive's
   5 best candidates and exhaustive's own winner timed again interleaved by the tuners' timing
   harness: one BLAS thread, the thread's CPU clock, best of --rounds, on one data set; full =
   the fastest of exhaustive's timed candidates: the fair comparison on a loaded machine) and
   *as tuned* (each run's own measurement of its winner over exhaustive's own measurement of its
   winner);
   plus the k-fold evaluation of the list over all problems (quick.k_fold, from the
   exhaustive measurements).

Every session runs with `topk=1`: no top-k re-measurement, so each stored time (candidates and
winners alike) is a search-pass time and the lists learn from one kind of time
(docs/quick-tuning.md, "Which times a list learns from").

    python bench/bench_quick_tuning.py [--per-op 24] [--repeats 3] [--smoke] [--out FILE]
"""

from __future__ import annotations

import argparse
import dataclasses
import functools
import random
import time
from pathlib import Path

import common
import numpy as np
import sqlalchemy as sa

from mlirtuna import catalog, sessions
from mlirtuna.db import Database
from mlirtuna.db.models import Candidate, Result
from mlirtuna.history import quick
from mlirtuna.problems import ExpandOptions, Problem
from mlirtuna.problems.configlist import read_config_list
from mlirtuna.queue import jobs
from mlirtuna.sessions import SessionSpec
from mlirtuna.tuners import timing
from mlirtuna.tuners.cpu import CpuTuner, parse_blocks
from mlirtuna.tuners.cpu.ops import make_op
from mlirtuna.worker import Worker, WorkerSettings

ROOT = Path(__file__).resolve().parent.parent
FLOPS = (2e6, 5e7)
TOP = 5  # exhaustive's best candidates re-timed for the paired reference
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
        ids, _ = catalog.ensure_problems(s, op, problems)
        catalog.tag_problems(s, name, dict.fromkeys(ids.values(), 0))
    return ids


def tune(db: Database, space: str, tags: list[str], repeats: int) -> tuple[int, float]:
    # topk=1: every stored time is from the search pass (one kind; see the module docstring).
    sid = sessions.create(db, SessionSpec(tuner="cpu", tuning_space=space, topk=1)).id
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
    set by the tuners' harness (one BLAS thread, the thread's CPU clock), so that the winners
    of the three spaces meet the same machine load and no BLAS thread waits on another."""
    op = make_op(problem)
    op.setup(np.random.default_rng(0))
    kernels = {
        n: functools.partial(op.run_blocked, parse_blocks(n, op)) for n in dict.fromkeys(names)
    }
    budget = timing.Budget(warmup_ms=0.0, rep_ms=0.0, min_samples=rounds, max_samples=rounds)
    with timing.one_blas_thread():
        for kernel in kernels.values():  # one untimed run each: caches and page faults
            kernel()
        spreads = timing.measure_interleaved(kernels, budget)
    return {n: spread.min for n, spread in spreads.items()}


def row(op, space, ids, db, sid, seconds, ref, timed, best_ns):
    win = winners(db, sid)
    cands = measured(db, sid)
    per_problem = sum(len(cands[p]) for p in ids) / len(ids)
    as_tuned = [win[p][1] / ref[p][1] for p in ids]
    again = [best_ns[p] / timed[p][win[p][0]] for p in ids]
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
    p.add_argument(
        "--thresholds",
        type=lambda t: [float(x) for x in t.split(",")],
        default=[quick.DEFAULT_THRESHOLD, 0.97],
        help="one quick list per threshold (comma-separated)",
    )
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
    train: dict[str, list[int]] = {}
    for op, vs in ids.items():
        order = sorted(vs.values())
        rng.shuffle(order)
        held[op] = sorted(order[len(order) // 2 :])
        train[op] = order[: len(order) // 2]
        tag(db, op, [by_id[i] for i in held[op]], f"held-{op}")
    held_tags = [f"held-{op}" for op in picked]
    lists, spaces = [], {}
    for threshold in args.thresholds:
        name = f"bench-{threshold:g}"
        built = []
        for op in ids:
            (hist,) = quick.histories(db, [full_sid], op)
            opts = quick.Options(threshold)
            configs_, uncovered, method = quick.build_one(hist, train[op], opts)
            ev = quick.k_fold(hist, opts, args.folds, args.seed)
            lists.append((name, hist.group, configs_, uncovered, method, ev))
            built.append(quick.GroupList(hist.group, configs_, len(train[op]), [], method))
        quick.save(db, name, built, [full_sid])
        common.status(f"list:{name} on the held-out halves")
        spaces[f"list:{name}"] = tune(db, f"list:{name}", held_tags, repeats)
    common.status("quick on the held-out halves")
    spaces["quick"] = tune(db, "quick", held_tags, repeats)
    common.status("paired re-measurement of the winners")
    wins = {space: winners(db, sid) for space, (sid, _) in spaces.items()}
    ref_cands = measured(db, full_sid)
    # Exhaustive's TOP best by stored TFlops, and its winner: the two need not agree (the
    # winner is picked by the tuner's own rule), and both are timed again.
    top = {
        pid: list(
            dict.fromkeys(
                [*sorted(ref_cands[pid], key=lambda pc: -ref_cands[pid][pc])[:TOP], ref[pid][0]]
            )
        )
        for hs in held.values()
        for pid in hs
    }
    timed = {
        pid: paired(by_id[pid], [*top[pid], *(w[pid][0] for w in wins.values())], args.rounds)
        for pid in top
    }
    # The reference: the fastest, timed paired, of exhaustive's TOP best and its winner (its own
    # ranking is as noisy as the machine), so a list is not credited for exhaustive's
    # mis-measurements.
    best_ns = {pid: min(timed[pid][pc] for pc in top[pid]) for pid in top}
    rows = []
    full_held = {op: sum(len(ref_cands[p]) for p in held[op]) / len(held[op]) for op in held}
    for op, hs in held.items():
        own = [best_ns[p] / timed[p][ref[p][0]] for p in hs]
        rows.append([op, "exhaustive", len(hs), f"{full_held[op]:.2f}", "-",
                     f"{quick.geomean(own):.4f}", f"{min(own):.3f}", "1", "1"])  # fmt: skip
        for space, (sid, seconds) in spaces.items():
            rows.append(row(op, space, hs, db, sid, seconds, ref, timed, best_ns))
    walls = {space: seconds for space, (_, seconds) in spaces.items()}
    return report(args, per_op, repeats, rows, lists, full_s, walls, full_held)


def report(args, per_op, repeats, rows, lists, full_s, walls, full_held) -> str:
    headers = ["op", "space", "held-out problems", "candidates/problem", "wall s (both ops)",
               "geomean (paired)", "min (paired)", "geomean (as tuned)",
               "min (as tuned)"]  # fmt: skip
    list_rows = [
        [name, str(g), len(b), len(u), m,
         f"{ev['coverage_at'][4]:.2f}", f"{ev['regret_at'][4]:.3f}",
         f"{ev['coverage_all']:.2f}", f"{ev['ratio_geomean']:.4f}", f"{ev['ratio_min']:.3f}"]
        for name, g, b, u, m, ev in lists
    ]  # fmt: skip
    published = [[op, *v] for op, v in PUBLISHED.items()]
    reduction = "; ".join(
        f"{r[1]} {r[0]} {full_held[r[0]] / float(r[3]):.1f}x"
        for r in rows
        if r[1].startswith("list:")
    )
    times = ", ".join(f"{space} {seconds:.1f} s" for space, seconds in walls.items())
    return "\n\n".join(
        [
            "### Quick tuning from history: exhaustive vs quick list vs `quick` (CPU tuner)",
            common.machine_line(),
            f"{per_op} problems per op from tests/data/tier1-{{gemm,conv}}-configs (gemm shapes "
            "retyped to f32, f32 forward convs) "
            f"({FLOPS[0]:.0e} to {FLOPS[1]:.0e} flops), seed {args.seed}; each candidate "
            f"verified, then the median of {repeats} timed runs. Exhaustive tuning of all "
            f"problems took {full_s:.0f} s; the held-out halves took: {times}. Every session "
            "tuned with topk=1, so all stored times are search-pass times. Paired: each "
            f"space's winner, exhaustive's {TOP} best and its winner re-timed interleaved on "
            f"one BLAS thread by the CPU clock of the thread, best of {args.rounds} rounds; "
            "full = the fastest of exhaustive's (the exhaustive row shows how often "
            "exhaustive's own pick was not it). Fewer candidates than "
            f"exhaustive: {reduction}.",
            common.table(headers, rows),
            f"The lists (set cover on the training half; k-fold evaluation with k={args.folds} "
            "over all problems of the op, from the exhaustive measurements):",
            common.table(
                [
                    "list",
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
