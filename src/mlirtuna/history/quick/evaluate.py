"""Lists built for every group and judged as rocMLIR's analysis/tuning_eval judges them: k-fold
over problems (coverage@k, regret@k, TFlops(list) / TFlops(full) on held-out problems), and the
geometric mean every score uses. Nothing of the database."""

from __future__ import annotations

import math
import random
from collections.abc import Sequence
from typing import Any

from mlirtuna.errors import UserError
from mlirtuna.history.quick.cover import build_one
from mlirtuna.history.quick.groups import GroupList, History, Options

#: The list prefixes (first k configs) that coverage@k and regret@k are reported for.
BUDGETS = (1, 2, 4, 8, 16)


def build(
    histories: Sequence[History], opts: Options, folds: int | None = None, seed: int = 0
) -> list[GroupList]:
    """Every group's list over all its problems; with `folds`, each with its k-fold evaluation."""
    opts.check()
    out = []
    for hist in histories:
        pids = sorted(hist.perf)
        configs, uncovered, method = build_one(hist, pids, opts)
        ev = k_fold(hist, opts, folds, seed) if folds else None
        out.append(
            GroupList(
                hist.group, configs, len(pids), [hist.vectors[p] for p in uncovered], method, ev
            )
        )
    return out


def k_fold(hist: History, opts: Options, folds: int, seed: int = 0) -> dict[str, Any]:
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
