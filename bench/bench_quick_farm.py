"""Quick lists on the farm's own history: the bench_quick_real.py comparison on CPU tuner
sessions of every op, a problem never tuned standing in for a GPU never seen.

Problems: per op those of bench_tuning_spread.py (examples/<op>-small, else CPU-sized tier-1
lines; fusion: the rocMLIR test modules); each tuned with the CPU tuner over --space (default
`full`, topk=1: every stored time is a search-pass time) in a session of its own, through the
real queue and worker (a scratch SQLite database). Then leave-one-problem-out: for each problem,
lists of size k are built from the other problems' sessions of its op and data type only, and
scored on it (best TFlops in the list / best TFlops measured, from its own session):

- mlirtuna: quick.across_list over the history as `quick-list --across problem` reads it
  (quick.histories: portable CPU names, each scored by what it clips to on the problem);
- baseline: the k configs with the best mean log(best/time) over the training problems;
- set cover: the farm's classic `quick-list` (minimum set cover at 0.93 x best, HiGHS), cut at k;
- quickTuningGen: rocMLIR's script (--peers DIR, as in bench_quick_real.py) on the training
  sessions' `mlirtuna export --format debug` file; gemm, conv and attention only (the .debug
  format has no other op's columns), else the column says why.

    python bench/bench_quick_farm.py [--ops gemm,conv,...] [--k 1,4,10] [--smoke] [--out FILE]
        [--db sqlite:///farm.db]   # keep the sessions: a rerun only re-evaluates
"""

from __future__ import annotations

import argparse
import contextlib
import os
import subprocess
import sys
import tempfile
import time
from pathlib import Path

import bench_quick_real as real
import common
import sqlalchemy as sa
from bench_tuning_spread import pick

from mlirtuna import catalog, sessions
from mlirtuna.db import Database
from mlirtuna.db.models import TuningSession
from mlirtuna.errors import UserError
from mlirtuna.history import quick
from mlirtuna.problems import OPS
from mlirtuna.queue import jobs
from mlirtuna.sessions import SessionSpec
from mlirtuna.tuners.cpu import CpuTuner
from mlirtuna.worker import Worker, WorkerSettings

ROOT = Path(__file__).resolve().parent.parent
DEBUG_OPS = ("gemm", "conv", "attention")  # the ops a .debug file has columns for
NAMES = ("mlirtuna", "baseline", "set cover", real.QTG)


def main() -> int:
    args = parse_args()
    load, t0 = os.getloadavg(), time.monotonic()
    peer = real.Peer(args.peers, args.peer_python)
    rows, notes = [], []
    with contextlib.nullcontext(args.db) if args.db else common.scratch_db("sqlite") as url:
        db = Database(url)
        for op in args.ops:
            problems = pick(op, False)[: 2 if args.smoke else None]
            tuned = [tune(db, op, p, args) for p in problems]
            try:
                got, note = evaluate_op(db, url, op, tuned, args.k, peer)
            except UserError as e:  # one op the lists cannot read must not lose the others
                got, note = [], [f"{op}: not evaluated: {e}"]
            rows += got
            notes += note
        db.dispose()
    common.emit(report(args, rows, notes, peer, load, time.monotonic() - t0), args.out)
    return 0


def parse_args() -> argparse.Namespace:
    p = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    p.add_argument("--ops", default=",".join(OPS), help="comma-separated ops [all]")
    p.add_argument("--k", default="1,4,10", help="list sizes (default 1,4,10)")
    p.add_argument("--space", default="full", help="CPU tuning space [full]")
    p.add_argument("--smoke", action="store_true", help="two problems per op, 1 repeat")
    p.add_argument("--peers", type=Path, default=real.PEERS, help="DIR with quickTuningGen.py")
    p.add_argument("--peer-python", type=Path, help="its interpreter (DIR/venv/bin/python)")
    p.add_argument("--out", type=Path, help="also write the report to this file")
    p.add_argument("--db", help="keep the tuned history in this database URL (a rerun reuses it)")
    args = p.parse_args()
    args.ops = [o for o in args.ops.split(",") if o]
    args.k = sorted({int(x) for x in args.k.split(",") if x.strip()})
    return args


def tune(db: Database, op: str, problem, args) -> tuple[int, str]:
    """(session, test vector): the problem tuned alone in a session of its own."""
    with db.session() as s:
        ids, _ = catalog.ensure_problems(s, op, [problem])
        pid = next(iter(ids.values()))
    reason = f"bench_quick_farm {args.space} {'smoke' if args.smoke else 'full'} problem {pid}"
    with db.session() as s:  # --db: a problem tuned by an earlier run is not tuned again
        done = s.scalar(sa.select(TuningSession.id).where(TuningSession.reason == reason))
    if done is not None and not jobs.counts(db, done)[done].get("new"):
        return done, problem.canonical()
    spec = SessionSpec(tuner="cpu", tuning_space=args.space, topk=1, reason=reason)
    sid = sessions.create(db, spec).id
    tag = f"farm-{sid}"
    with db.session() as s:
        catalog.tag_problems(s, tag, {pid: 0})
    jobs.load(db, sid, tag=tag)
    common.status(f"tuning {op} {problem.canonical()[:70]}")
    tuner = CpuTuner(repeats=1) if args.smoke else CpuTuner()
    Worker(db, WorkerSettings(sid, until_empty=True), tuner).run()
    return sid, problem.canonical()


def evaluate_op(db, url, op, tuned, ks, peer):
    """Leave-one-problem-out rows (op, data type, problem, k, {maker: ratio}) and notes."""
    rows, notes = [], []
    for i, (sid, vector) in enumerate(tuned):
        (test,) = quick.histories(db, [sid], op)
        train_ids = [s for j, (s, _) in enumerate(tuned) if j != i]
        train = (
            [
                h
                for h in quick.histories(db, train_ids, op)
                if h.group.data_type == test.group.data_type
            ]
            if train_ids
            else []
        )
        if not train:
            notes.append(f"{op} {vector[:50]}: no other problem of its type to learn from")
            continue
        made = lists_for(train, max(ks))
        made[real.QTG] = farm_peer(peer, url, op, train_ids)
        pid = next(iter(test.perf))
        for k in ks:
            scores = {n: ratio(test, pid, lst[:k]) for n, lst in made.items() if lst is not None}
            rows.append((op, test.group.data_type, short(vector), k, scores))
    if op not in DEBUG_OPS:
        notes.append(f"{real.QTG} on {op}: not run: rocMLIR's .debug has no {op} columns")
    return rows, notes


def lists_for(train: list[quick.History], k: int) -> dict[str, list[str] | None]:
    m = quick.matrix_of(train)
    m.units = list(m.rows)  # each problem a unit, as `quick-list --across problem`
    (hist,) = train
    pids = sorted(hist.perf)
    cover = quick.set_cover(hist.covers(pids, quick.DEFAULT_THRESHOLD)).configs
    return {
        "mlirtuna": quick.across_list(m, k),
        "baseline": quick.baseline_list(m, k),
        "set cover": cover,
    }


def ratio(hist: quick.History, pid: int, configs: list[str]) -> float:
    got = [hist.achieved(c, pid) or 0.0 for c in configs]
    return max(got, default=0.0) / hist.best(pid)


def farm_peer(peer: real.Peer, url: str, op: str, sids: list[int]) -> list[str] | None:
    """quickTuningGen.py on the training sessions' `mlirtuna export --format debug` file."""
    if peer.why_not or op not in DEBUG_OPS:
        return None
    with tempfile.TemporaryDirectory(prefix="farm_debug_") as tmp:
        debug = Path(tmp) / "train.debug"
        env = dict(os.environ, PYTHONPATH=str(ROOT / "src"))
        ids = ",".join(map(str, sids))
        cmd = [
            sys.executable,
            "-m",
            "mlirtuna",
            "--db",
            url,
            "export",
            "--format",
            "debug",
            "--op",
            op,
            "-o",
            str(debug),
        ] + [a for s in sids for a in ("--session", str(s))]
        run = subprocess.run(cmd, capture_output=True, text=True, env=env, check=False)
        if run.returncode != 0:
            raise SystemExit(f"export of sessions {ids} failed: {run.stderr.strip()}")
        return peer.run_on(debug)


def short(vector: str) -> str:
    return vector if len(vector) <= 48 else vector[:45] + "..."


def report(args, rows, notes, peer, load, seconds) -> str:
    names = [n for n in NAMES if any(n in s for *_, s in rows)]
    head = [
        "# Quick lists on the farm's own history (bench/bench_quick_farm.py)",
        "",
        common.machine_line() + f" Load average at start: {load[0]:.2f} {load[1]:.2f} "
        f"{load[2]:.2f}.",
        f"CPU tuner, `{args.space}` space, one session per problem; leave-one-problem-out per "
        "op and data type. Cells: best TFlops in the list / best TFlops measured.",
        "",
        common.table(
            ["op", "type", "problem", "k", *names],
            [
                (o, t, p, k, *(f"{s[n]:.3f}" if n in s else "-" for n in names))
                for o, t, p, k, s in rows
            ],
        ),
        "",
        "Geometric mean per op (and over every problem):",
        "",
    ]
    summary = []
    for op in [*args.ops, "all"]:
        for k in args.k:
            sel = [s for o, _, _, kk, s in rows if kk == k and op in (o, "all")]
            if sel:
                summary.append(
                    (op, k, len(sel), *(fmt_geo([s[n] for s in sel if n in s]) for n in names))
                )
    head += [common.table(["op", "k", "problems", *names], summary), ""]
    if peer.why_not:
        notes.append(f"{real.QTG}: not run: {peer.why_not}")
    head += [f"- {n}" for n in notes]
    head.append(f"\nRan in {seconds:.0f} s.")
    return "\n".join(head)


def fmt_geo(values: list[float]) -> str:
    return f"{quick.geomean(values):.4f}" if values else "-"


if __name__ == "__main__":
    sys.exit(main())
