"""Quick lists on real GPUs: trained on some GPUs, scored exactly on GPUs they never saw.

Reads every KERNEL/GPU.json.gz (Kernel Tuner caches: every config of the space measured on that
GPU, ../shared/data/real-tuning/) under --train and --test; per kernel builds lists of size k
from the --train GPUs only and scores each on each test GPU: best time in the list / true best
time there (the file holds every config, so the loss is exact). Without --test: leave-one-GPU-
out over --train (each GPU in turn is the test GPU, the others train).

List makers, all on the same inputs and k:
- mlirtuna: quick.across_list (robust cover over the training GPUs, then one config per family
  of switches, then by mean log ratio);
- baseline: the k configs with the best mean log(best/time) over the training GPUs;
- quickTuningGen: rocMLIR's mlir/utils/performance/analysis/quickTuningGen.py, run as it is
  (its interpreter needs pandas, pulp, xxhash) on .debug files written from the same caches,
  its set cover at 0.93 x best taken in its own order, cut at k (it lists no more than its
  cover). Not shipped: --peers DIR holds a scratch copy (docs/quick-tuning.md says how);
  without it the column says why it did not run. rocMLIR's tuning_eval is not run: see
  docs/quick-tuning.md.

Prints the machine, the table per kernel x GPU x k, per list built from all --train GPUs its
leave-one-out loss on each training GPU, the transfer ceiling (from the data alone: per kernel x
test GPU, how its near-best configs rank and how many configs dominate them on the training
GPUs; the best a list of k that holds every config dominating one it holds, overall or within
its switch family, can reach there; the one config for every GPU), and last the line
`goal: k=1 AA.A %, k=10 BB.B % (geomean of best-in-list / true best on the test GPUs)`.

    python bench/bench_quick_real.py --train ../shared/data/real-tuning/kernel-tuner-hub --goal
"""

from __future__ import annotations

import argparse
import json
import math
import os
import re
import subprocess
import sys
import tempfile
import time
from pathlib import Path

import common
import kerneltuner as kt
import numpy as np

from mlirtuna.history import quick

PEERS = Path("/tmp/peers")
GOAL = {1: 0.90, 10: 0.99}
MAKERS = ("mlirtuna", "baseline")
QTG = "quickTuningGen"
#: The transfer ceiling's levels (the goal's: within 10 % and 1 % of the best) and its lists:
#: closed = holding every config that dominates one it holds on the training GPUs; in-family =
#: every one of the same switch family (quick.switch_families) that does.
NEAR = (0.90, 0.99)
CEILINGS = ("closed", "in-family")
TOL = 1e-9


def main() -> int:
    args = parse_args()
    t0 = time.monotonic()
    load = os.getloadavg()
    for d in (args.train, args.test):
        if d is not None and not d.is_dir():
            print(f"skipped: {d} is not there (the real-GPU data lives in ../shared)")
            return 0
    try:
        train = kt.read_tree(args.train)
        test = kt.read_tree(args.test) if args.test else None
    except kt.CacheError as e:
        print(f"error: {e}", file=sys.stderr)
        return 2
    peer = Peer(args.peers, args.peer_python)
    rows, ceil, lists, single = [], [], {}, {}
    for kernel in sorted(train):
        got = evaluate_kernel(kernel, train[kernel], (test or {}).get(kernel), args.k, peer)
        rows, ceil = rows + got[0], ceil + got[1]
        lists[kernel] = final_lists(train[kernel], args.k)
        single[kernel] = one_for_every_gpu(every_gpu(train[kernel], (test or {}).get(kernel)))
    if args.lists_out:
        out = {
            kernel: {str(k): v["mlirtuna"][str(k)] for k in args.k} for kernel, v in lists.items()
        }
        args.lists_out.write_text(json.dumps(out, indent=1) + "\n", encoding="utf-8")
    text = report(args, rows, (ceil, single), lists, peer, load, time.monotonic() - t0)
    common.emit(text, args.out)
    return 0


def parse_args() -> argparse.Namespace:
    p = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    p.add_argument("--train", type=Path, required=True, help="DIR of KERNEL/GPU.json.gz")
    p.add_argument("--test", type=Path, help="DIR of test GPUs (default: leave-one-GPU-out)")
    p.add_argument("--k", default="1,10,30", help="list sizes (1 and 10 always)")
    p.add_argument("--lists-out", type=Path, help="write the lists built from all --train GPUs")
    p.add_argument("--goal", action="store_true", help="check the goal (k=1 0.90, k=10 0.99)")
    p.add_argument("--peers", type=Path, default=PEERS, help="DIR with quickTuningGen.py")
    p.add_argument("--peer-python", type=Path, help="interpreter for it (DIR/venv/bin/python)")
    p.add_argument("--out", type=Path, help="also write the report to this file")
    args = p.parse_args()
    try:
        args.k = sorted({int(x) for x in args.k.split(",") if x.strip()})
    except ValueError:
        p.error(f"--k takes list sizes like 1,10,30, not {args.k!r}")
    if not args.k or args.k[0] < 1:
        p.error("--k: sizes must be >= 1")
    args.k = sorted(set(args.k) | set(GOAL))  # the goal line always has k=1 and k=10
    return args


def evaluate_kernel(kernel, train, test, ks, peer):
    """([(kernel, test GPU, k, {maker: best-in-list / best on the test GPU})], [ceiling row])."""
    if test is None and len(train) < 2:
        common.status(f"{kernel}: one GPU only, nothing to leave out: skipped")
        return [], []
    out, ceil = [], []
    for tr, te in splits(train, test):
        m = kt.matrix(tr)
        made = {
            name: quick.MAKERS[key](m, max(ks))
            for name, key in (("mlirtuna", "across"), ("baseline", "baseline"))
        }
        made[QTG] = peer.quick_tuning_gen(tr)
        made = {name: lst for name, lst in made.items() if isinstance(lst, list)}
        view = training_view(m)
        for gpu in sorted(te):
            tm = kt.matrix({gpu: te[gpu]}, m.configs)
            for k in ks:
                scores = {
                    name: float(quick.best_in_list(tm, lst[:k])[0]) for name, lst in made.items()
                }
                out.append((kernel, gpu, k, scores))
            ceil.append(ceiling_row(kernel, gpu, tm.ratios()[0], view, made, ks))
    return out, ceil


def splits(train, test):
    """[(training caches, test caches)]: each GPU left out in turn, or all --train vs --test."""
    if test is not None:
        return [(train, test)]
    return [({g: c for g, c in train.items() if g != gpu}, {gpu: train[gpu]}) for gpu in train]


# -- the transfer ceiling: computed from the data, no timing in it ------------------------------


def training_view(m):
    """What the training GPUs say of each config of m: its rank in the baseline's order (1 =
    the best mean log ratio), how many configs dominate it, how many of its own family do."""
    index = {c: j for j, c in enumerate(m.configs)}
    order = [index[c] for c in quick.baseline_list(m, len(m.configs))]
    rank = np.empty(len(m.configs), dtype=int)
    rank[order] = np.arange(1, len(order) + 1)
    r = m.ratios()
    return {
        "index": index,
        "rank": rank,
        "closed": dominators(r),
        "in-family": dominators(r, quick.switch_families(m.configs)),
    }


def dominators(r, groups=None, chunk=256):
    """Per column of r (rows = GPUs, best/time: higher is better): how many columns of its
    group dominate it (at least as good on every row and better on one; an equal is not)."""
    n = r.shape[1]
    groups = np.zeros(n, dtype=int) if groups is None else np.asarray(groups)
    out = np.zeros(n, dtype=int)
    for s in range(0, n, chunk):
        them, me = r[:, None, :], r[:, s : s + chunk, None]  # (rows, 1, n), (rows, chunk, 1)
        dom = (them >= me).all(axis=0) & (them > me).any(axis=0)
        out[s : s + chunk] = (dom & (groups[None, :] == groups[s : s + chunk, None])).sum(axis=1)
    return out


def near_best(got, view, level):
    """The configs within `level` x best on the test GPU (`got`: best/time per config): how
    many; the best baseline rank among them; the fewest (in-family) dominators one has."""
    idx = np.flatnonzero(got >= level - TOL)
    if not len(idx):
        return (0, None, None, None)
    return (len(idx), *(int(view[key][idx].min()) for key in ("rank", "closed", "in-family")))


def ceiling(got, view, key, k):
    """The best that a list of k holding every (in-family) dominator of each config it holds
    can reach on the test GPU: the best config there with at most k - 1 dominators."""
    return float(got[view[key] <= k - 1].max())


def ceiling_row(kernel, gpu, got, view, made, ks):
    """The transfer ceiling on one test GPU, and which makers' lists it bounds: a list whose
    every config has at most k - 1 (in-family) dominators scores at most the ceiling."""
    return {
        "kernel": kernel,
        "gpu": gpu,
        "near": {level: near_best(got, view, level) for level in NEAR},
        "ceiling": {(key, k): ceiling(got, view, key, k) for key in CEILINGS for k in ks},
        "bounds": {
            (n, key): bounded(view, lst, key, ks) for n, lst in made.items() for key in CEILINGS
        },
    }


def bounded(view, lst, key, ks):
    """Whether each lst[:k] holds only configs with at most k - 1 (in-family) dominators."""
    cols = [view["index"][c] for c in lst if c in view["index"]]
    return all(view[key][cols[:k]].max(initial=0) <= k - 1 for k in ks)


def every_gpu(train, test):
    """The matrix of every GPU of a kernel, --test ones too, over the --train configs."""
    caches = {**train, **{f"{g} (test)": c for g, c in (test or {}).items()}}
    return kt.matrix(caches, kt.matrix(train).configs)


def one_for_every_gpu(m):
    """The config with the best geomean of best/time over every GPU (row) of m, test GPUs too:
    (config, that geomean, its worst GPU's ratio, the best worst-GPU ratio of any config, GPUs)."""
    r = m.ratios()
    with np.errstate(divide="ignore"):
        geo = np.exp(np.log(r).mean(axis=0))
    j = int(np.argmax(geo))
    return m.configs[j], float(geo[j]), float(r[:, j].min()), float(r.min(axis=0).max()), len(r)


def final_lists(caches, ks):
    """The lists from all --train GPUs, and each one's leave-one-out loss per training GPU."""
    m = kt.matrix(caches)
    full = quick.across_list(m, max(ks))
    return {
        "mlirtuna": {str(k): full[:k] for k in ks},
        "loo": {str(k): quick.leave_one_out(m, k) for k in ks},
    }


class Peer:
    """rocMLIR's quickTuningGen.py, run as it is in its own interpreter."""

    def __init__(self, folder: Path, python: Path | None) -> None:
        self.script = folder / "quickTuningGen.py"
        self.python = python or folder / "venv" / "bin" / "python"
        self.why_not = None
        if not self.script.is_file():
            self.why_not = f"no {self.script} (a scratch copy of ROCm/rocMLIR's, never shipped)"
        elif not Path(self.python).exists():
            self.why_not = f"no interpreter {self.python} with pandas, pulp, xxhash"
        self.seconds = 0.0

    def quick_tuning_gen(self, caches) -> list[str] | None:
        """Its list from the Kernel Tuner caches, written as one .debug file."""
        if self.why_not:
            return None
        with tempfile.TemporaryDirectory(prefix="qtg_") as tmp:
            debug = Path(tmp) / "train.debug"
            kt.write_debug(debug, caches)
            return self.run_on(debug)

    def run_on(self, debug: Path) -> list[str] | None:
        """Its cover from one .debug file (the first table key's), in its own order."""
        t0 = time.monotonic()
        with tempfile.TemporaryDirectory(prefix="qtg_out_") as out:
            run = subprocess.run(
                [str(self.python), str(self.script), str(debug), "-o", out],
                capture_output=True,
                text=True,
                check=False,
            )
            incs = sorted(Path(out).glob("*.inc"))
            if run.returncode != 0 or not incs:
                last = (run.stderr or run.stdout).strip().splitlines()[-1:] or ["no output"]
                self.why_not = f"quickTuningGen.py failed: {last[0]}"
                return None
            text = incs[0].read_text(encoding="utf-8")
        self.seconds += time.monotonic() - t0
        body = text.split("kSetCover", 1)[1].split("};", 1)[0]
        return re.findall(r'^\s+"(.*)",$', body, flags=re.M)


def geomean(values):
    return quick.geomean(values) or 0.0


def report(args, rows, transfer, lists, peer, load, seconds) -> str:
    names = [*MAKERS] + ([QTG] if not peer.why_not else [])
    mode = (
        f"trained on {args.train}, tested on {args.test}"
        if args.test
        else (f"leave-one-GPU-out over {args.train}")
    )
    parts = [
        "# Quick lists on real GPUs (bench/bench_quick_real.py)",
        "",
        common.machine_line()
        + f" Load average at start: {load[0]:.2f} {load[1]:.2f} {load[2]:.2f}.",
        f"Lists {mode}; k = {', '.join(map(str, args.k))}. Cells: best time in the list / true "
        "best time on the test GPU.",
        "",
        common.table(
            ["kernel", "test GPU", "k", *names],
            [
                (kn, g, k, *(f"{s[n]:.3f}" if n in s else "-" for n in names))
                for kn, g, k, s in rows
            ],
        ),
        "",
    ]
    parts.append("Geometric mean over the kernels x test GPUs:")
    parts.append("")
    summary = []
    for k in args.k:
        cells = [rows_geo(rows, k, n) for n in names]
        summary.append((k, *(f"{c:.4f}" for c in cells)))
    parts += [common.table(["k", *names], summary), ""]
    if peer.why_not:
        parts.append(f"{QTG}: not run: {peer.why_not}.")
    else:
        parts.append(
            f"{QTG}: ran {peer.seconds:.1f} s in all (a minimal cover at 0.93 x best "
            "lists no more configs than it needs on the training GPUs)."
        )
    parts.append(
        "tuning_eval: not run (its proposers need amd_arch_db, LightGBM and a "
        "rocmlir-gen build for their candidate pool; its set_cover proposer is "
        "quickTuningGen's cover cut at k, the column above)."
    )
    parts += [
        "",
        "Lists from all --train GPUs, leave-one-out loss per training GPU "
        "(score on that GPU of the list built from the others):",
        "",
    ]
    gpus = sorted({g for v in lists.values() for loo in v["loo"].values() for g in loo})
    loo_rows = [
        (kernel, k, *(f"{v['loo'][str(k)][g]:.3f}" if g in v["loo"][str(k)] else "-" for g in gpus))
        for kernel, v in lists.items()
        for k in args.k
    ]
    parts += [common.table(["kernel", "k", *gpus], loo_rows), ""]
    parts += ceiling_lines(rows, *transfer, args.k, names)
    if args.goal:
        parts += goal_lines(rows, names, args.k)
    parts.append(f"Ran in {seconds:.1f} s.")
    g = {k: rows_geo(rows, k, "mlirtuna") for k in (1, 10)}
    parts.append(
        f"goal: k=1 {100 * g[1]:.1f} %, k=10 {100 * g[10]:.1f} % "
        "(geomean of best-in-list / true best on the test GPUs)"
    )
    return "\n".join(parts)


def rows_geo(rows, k, name) -> float:
    values = [s[name] for _, _, kk, s in rows if kk == k and name in s]
    return geomean(values) if values else math.nan


def ceiling_lines(rows, ceil, single, ks, names) -> list[str]:
    """The transfer ceiling section: near-best configs, ceilings per k, what they bound."""
    near = [
        (c["kernel"], c["gpu"], *(slashed(c["near"][lv][i] for lv in NEAR) for i in range(4)))
        for c in ceil
    ]
    scores = {(kn, g, k): s for kn, g, k, s in rows}
    per_k = [
        (
            c["kernel"],
            c["gpu"],
            k,
            *(f"{c['ceiling'][key, k]:.3f}" for key in CEILINGS),
            *(f"{scores[c['kernel'], c['gpu'], k][n]:.3f}" for n in names),
        )
        for c in ceil
        for k in ks
    ]
    geo = [(k, *(f"{ceiling_geo(ceil, key, k):.4f}" for key in CEILINGS)) for k in ks]
    levels = " / ".join(f"{lv:.2f}" for lv in NEAR)
    return [
        "Transfer ceiling (computed from the data: no timing in it). Per kernel x test GPU, the "
        f"configs within {levels} x the test GPU's best as the training GPUs see them: how many "
        "there are; the best rank one of them has in the baseline's order (mean log(best/time) "
        "over the training GPUs: how long a baseline list must be to hold one); the fewest "
        "configs dominating one of them on the training GPUs (as good on each, better on one), "
        "of all configs and of its own switch family.",
        "",
        common.table(
            [
                "kernel",
                "test GPU",
                f"configs >= {levels}",
                "baseline rank",
                "dominated by",
                "in family by",
            ],
            near,
        ),
        "",
        "Ceilings: the best on the test GPU of a list of k that holds, with each config, every "
        "config dominating it on the training GPUs (closed: so is a top k by any score that "
        "strictly rises with each training GPU's ratio), or every one of its own family that "
        "does (in-family): the best config there with at most k - 1 such dominators.",
        "",
        common.table(["kernel", "test GPU", "k", *CEILINGS, *names], per_k),
        "",
        "Geometric mean of the ceilings over the kernels x test GPUs:",
        "",
        common.table(["k", *CEILINGS], geo),
        "",
        *ceiling_verdicts(ceil, rows, names, ks),
        *single_lines(single),
        "",
    ]


def slashed(values) -> str:
    return " / ".join("-" if v is None else str(v) for v in values)


def ceiling_geo(ceil, key, k) -> float:
    return geomean([c["ceiling"][key, k] for c in ceil]) if ceil else math.nan


def ceiling_verdicts(ceil, rows, names, ks) -> list[str]:
    """The goal against the ceilings; which makers they bound; scores above a ceiling."""
    out = []
    for k, target in GOAL.items():
        got = {key: ceiling_geo(ceil, key, k) for key in CEILINGS}
        out.append(
            f"- k={k}, goal {target}: "
            + ", ".join(
                f"{key} ceiling {v:.4f} {'below' if v < target else 'not below'} it"
                for key, v in got.items()
            )
        )
    for key in CEILINGS:
        held = [n for n in names if ceil and all(c["bounds"][n, key] for c in ceil)]
        out.append(
            f"- the {key} ceiling bounds (each list of k held only configs with at most k - 1 "
            f"such dominators, in every fold): {', '.join(held) or 'none of the lists'}"
        )
    bound = {(c["kernel"], c["gpu"]): c["ceiling"] for c in ceil}
    above = [
        f"{n} on {kn} {g} k={k} {s[n]:.3f} > {key} {bound[kn, g][key, k]:.3f}"
        for kn, g, k, s in rows
        for n in names
        for key in CEILINGS
        if s[n] > bound[kn, g][key, k] + TOL
    ]
    out.append(f"- above a ceiling: {'; '.join(above) or 'none'}")
    return out


def single_lines(single) -> list[str]:
    """The one config for every GPU: what one config, chosen knowing every GPU, reaches."""
    parts = [
        f"{kernel} `{cfg}` {geo:.4f} (worst GPU {worst:.3f}; no config is above {maximin:.3f} "
        "on every GPU)"
        for kernel, (cfg, geo, worst, maximin, _) in single.items()
    ]
    n = sum(v[4] for v in single.values())
    logs = sum(v[4] * math.log(v[1]) for v in single.values() if v[1] > 0)
    overall = math.exp(logs / n) if n and all(v[1] > 0 for v in single.values()) else 0.0
    return [
        "- one config for every GPU (per kernel the config with the best geomean over all its "
        "GPUs, test ones included: the same whichever GPU is left out): "
        + "; ".join(parts)
        + f"; over the kernels x GPUs {overall:.4f}. A ceiling on k=1 only for a rule that "
        "picks one config per kernel for every GPU; a rule that picks per fold is bounded by "
        "the closed ceiling instead, if it picks no dominated config."
    ]


def goal_lines(rows, names, ks) -> list[str]:
    out = ["Goal check:", ""]
    for k, target in GOAL.items():
        got = rows_geo(rows, k, "mlirtuna")
        short = [
            f"{kn} on {g} {s['mlirtuna']:.3f}"
            for kn, g, kk, s in rows
            if kk == k and s["mlirtuna"] < target
        ]
        verdict = "met" if got >= target else "NOT met"
        out.append(
            f"- k={k}: {got:.4f} vs {target} {verdict}"
            + (f"; below it: {', '.join(short)}" if short else "")
        )
    for k in ks:
        ours = rows_geo(rows, k, "mlirtuna")
        for n in names[1:]:
            theirs = rows_geo(rows, k, n)
            word = "at least" if ours >= theirs - 1e-12 else "BELOW"
            out.append(f"- k={k}: mlirtuna {ours:.4f} {word} {n} {theirs:.4f}")
    return [*out, ""]


if __name__ == "__main__":
    sys.exit(main())
