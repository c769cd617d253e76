"""Lists from any candidate matrix that transfer to a unit never seen (a GPU, an arch, a
problem), scored leave-one-unit-out (docs/quick-tuning.md). Nothing of the database.

A matrix is problem x config -> measured time, NaN where the config failed or was never
measured (a failure is never fast). Its rows are grouped in *units* (a GPU, an arch): a list
built across units is meant for a unit none of them is, and is judged by leaving each unit out.
"""

from __future__ import annotations

import math
from collections.abc import Callable, Sequence
from dataclasses import dataclass, field
from typing import Any

from mlirtuna.errors import UserError
from mlirtuna.history.quick.evaluate import geomean
from mlirtuna.history.quick.groups import Group, GroupList, History
from mlirtuna.search import Space, transfer

#: A failed config's ratio in the log objectives: 1/1000 of the best (log(0) would let one
#: failure outweigh everything, and a failed config must still rank below every valid one).
FAILED_RATIO = 1e-3
#: The robust cover stops when one more config gains less than this in mean log ratio (0.1 %).
GAIN_FLOOR = 1e-3
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
    with exactly two distinct values over all configs). One family when none. The adaptive
    search groups a job's space the same way (search.transfer.families)."""
    return transfer.families(Space.from_keys(configs).values)


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
