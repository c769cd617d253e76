"""The adaptive strategy: learn from the farm's history and from each measurement on the new unit.

Why this shape (docs/quick-tuning.md, "Adaptive search"): on a GPU it never saw, no static list
from the other GPUs reaches 0.99 of the best (the transfer ceiling of issue 36), but the new
GPU's own measurements say quickly which training GPU it resembles, if any. So a search:

1. measures a *transfer list* first: the config best on average over the training units, each
   training unit's best, and the best of each switch family (a new GPU's optimum often lies in a
   family the others rank low);
2. then, round by round, fits a model of the new unit's log time to what it measured: a ridge
   mix of the training units' log times (the transfer: a GPU like a training one gets its
   weights), plus a Gaussian process over the configs' parameters for what the mix does not
   explain (the residual: how this GPU differs, or everything when there is no history);
3. and picks each round from the model's lower confidence bound over the whole space and from
   the neighbours of the best configs so far (one parameter changed): local moves that find the
   optimum near an incumbent when the model is still wrong.

With no history (or a history of NaN) step 1 is a seeded space-filling sample and the mix is a
constant: the same search without history. Nothing in it knows a GPU or a kernel.
"""

from __future__ import annotations

import math

import numpy as np

from mlirtuna.search.base import History, Search, Space

#: The first round without history: this many configs spread over the space.
FIRST_ROUND = 8
#: Configs per later round: the model refits once a round.
ROUND = 5
#: Of each later round: how many climb from the best so far, how many explore other families
#: (the rest: the model's best).
EXPLOIT = 2
EXPLORE = 2
#: A failed config (NaN) is modelled this much slower than the slowest one measured (log ratio).
FAILED_PENALTY = math.log(2.0)
#: The Gaussian process: length scales tried (on parameters scaled to [0, 1]), the one with the
#: best marginal likelihood is kept; the noise share of the residual's variance; the weight of
#: its standard deviation in the lower confidence bound.
LENGTH_SCALES = (0.15, 0.3, 0.6, 1.2)
NOISE = 0.05
KAPPA = 2.5
#: The Gaussian process learns from the best this many measurements only: its cost grows with
#: the cube of them, and where the search goes is decided near the best.
GP_POINTS = 60
#: The ridge mix of the training units: its pull towards equal weights (the average unit).
RIDGE = 1.0


class Adaptive:
    """Transfer list, then model rounds and local moves (module docstring)."""

    name = "adaptive"

    def start(self, space: Space, history: History, budget: int, seed: int) -> Search:
        return AdaptiveSearch(space, history, budget, seed)


class AdaptiveSearch:
    def __init__(self, space: Space, history: History, budget: int, seed: int) -> None:
        self.n = len(space)
        self.left = max(0, budget)
        self.rng = np.random.default_rng(seed)
        self.unit_logs = training_logs(history)  # (units, n), NaN filled
        self.values = np.asarray(space.values, dtype=float)
        self.features = scaled_levels(space.values)
        self.neighbours = Neighbours(space.values)
        self.families = families(space.values)
        self.told: dict[int, float] = {}
        self.asked: set[int] = set()
        self.rounds = 0
        self.turns: dict[int, int] = {}  # start config -> the parameter its next move changes

    # -- the protocol ---------------------------------------------------------------------------

    def ask(self) -> list[int]:
        want = min(self.left, self.n - len(self.told.keys() | self.asked))
        if want <= 0:
            return []
        pick = self.first_round() if self.rounds == 0 else self.model_round()
        pick = self.fill(pick, min(want, len(pick) or ROUND))
        self.rounds += 1
        self.asked.update(pick)
        self.left -= len(pick)
        return pick

    def tell(self, index: int, time: float) -> None:
        if index in self.told:
            return
        if index not in self.asked:
            self.left -= 1  # a replayed measurement spends the budget as an asked one would
        ok = math.isfinite(time) and time > 0
        self.told[index] = math.log(time) if ok else math.nan

    # -- rounds ---------------------------------------------------------------------------------

    def open(self) -> np.ndarray:
        """Configs neither told nor asked: what a round may pick."""
        mask = np.ones(self.n, dtype=bool)
        mask[list(self.told.keys() | self.asked)] = False
        return mask

    def first_round(self) -> list[int]:
        if len(self.unit_logs):
            return transfer_list(self.unit_logs, self.families)
        return spread(self.features, FIRST_ROUND, self.rng)

    def model_round(self) -> list[int]:
        measured = list(self.told)
        if not measured:
            return []
        score = self.lower_bound(measured)
        score[~self.open()] = np.inf
        y = self.targets(measured)
        ranked = [int(i) for i in np.array(measured)[np.argsort(y, kind="stable")]]
        pick = self.climb(ranked, score, EXPLOIT)
        score[pick] = np.inf
        pick += self.explore(ranked, score, EXPLORE)
        score[pick] = np.inf
        order = np.argsort(score, kind="stable")
        return pick + [int(i) for i in order[: ROUND - len(pick)] if np.isfinite(score[i])]

    def fill(self, pick: list[int], k: int) -> list[int]:
        """`pick` cut to k fresh configs, topped up at random when it has fewer."""
        open_ = self.open()
        out = [i for i in dict.fromkeys(pick) if open_[i]][:k]
        if len(out) < k:
            rest = np.flatnonzero(open_)
            rest = rest[~np.isin(rest, out)]
            out += [int(i) for i in self.rng.permutation(rest)[: k - len(out)]]
        return out

    # -- the model ------------------------------------------------------------------------------

    def targets(self, measured: list[int]) -> np.ndarray:
        """The measured log times, a failure as FAILED_PENALTY above the slowest."""
        y = np.array([self.told[i] for i in measured])
        ok = np.isfinite(y)
        worst = y[ok].max() if ok.any() else 0.0
        return np.where(ok, y, worst + FAILED_PENALTY)

    def lower_bound(self, measured: list[int]) -> np.ndarray:
        """Per config: predicted log time minus KAPPA standard deviations."""
        idx = np.array(measured)
        y = self.targets(measured)
        prior = transfer_mean(self.unit_logs, idx, y)
        near = np.argsort(y, kind="stable")[:GP_POINTS]
        mean, std = residual_gp(self.features, idx[near], (y - prior[idx])[near])
        return prior + mean - KAPPA * std

    def climb(self, ranked: list[int], score: np.ndarray, k: int) -> list[int]:
        """Up to k coordinate moves, best-scored along the parameter changed: one from the best
        config so far, one from the best of the runner-up switch family, then from the next
        best configs (a climber in each of the two best families: the runner-up is often one
        move from the optimum, as the incumbent's family may be a plateau)."""
        firsts = np.sort(np.unique(self.families[ranked], return_index=True)[1])
        starts = [ranked[i] for i in firsts[:2]] + ranked[1:]
        out: list[int] = []
        for i in dict.fromkeys(starts):
            j = self.coordinate_move(i, score, out, least_seen=False)
            if j is not None:
                out.append(j)
            if len(out) >= k:
                break
        return out

    def explore(self, ranked: list[int], score: np.ndarray, k: int) -> list[int]:
        """Up to k moves from the best config of each switch family but the incumbent's, a
        few families a round in turn: each move changes the start's next parameter to its value
        least measured in that family (the optimum of a new unit often lies in a family, or at
        a value, the history ranks low)."""
        firsts = np.sort(np.unique(self.families[ranked], return_index=True)[1])
        heads = [ranked[i] for i in firsts[1:]]
        if not heads:
            return []
        shift = (self.rounds * k) % len(heads)
        out: list[int] = []
        for i in heads[shift:] + heads[:shift]:
            j = self.coordinate_move(i, score, out)
            if j is not None:
                out.append(j)
            if len(out) >= k:
                break
        return out

    def coordinate_move(
        self, start: int, score: np.ndarray, taken: list[int], least_seen: bool = True
    ) -> int | None:
        """An open neighbour of `start` that changes its next parameter in turn (each start goes
        round its parameters: the history's favourite value of one must not hide the others)."""
        params = len(self.neighbours.groups)
        for step in range(params):
            j = (self.turns.get(start, 0) + step) % params
            near = [c for c in self.neighbours.along(start, j) if np.isfinite(score[c])]
            near = [c for c in near if c not in taken]
            if near:
                self.turns[start] = j + 1
                if not least_seen:
                    return min(near, key=lambda c: score[c])
                seen = self.levels_seen(start, j)
                return min(near, key=lambda c: (seen.get(self.values[c, j], 0), score[c]))
        return None

    def levels_seen(self, start: int, param: int) -> dict[float, int]:
        """How often each value of `param` was measured in the switch family of `start`: a
        local move tries the least measured value first (one the history never favoured may be
        the new unit's best)."""
        fam = self.families[start]
        out: dict[float, int] = {}
        for i in self.told:
            if self.families[i] == fam:
                v = float(self.values[i, param])
                out[v] = out.get(v, 0) + 1
        return out


# -- pieces, each a function of arrays ------------------------------------------------------------


def training_logs(history: History) -> np.ndarray:
    """Each training unit's log time minus its best, a failure FAILED_PENALTY above its slowest;
    units with no valid time left out."""
    rows = []
    for t in np.asarray(history.times, dtype=float):
        ok = np.isfinite(t) & (t > 0)
        if not ok.any():
            continue
        logs = np.full(t.shape, np.nan)
        logs[ok] = np.log(t[ok])
        logs -= logs[ok].min()
        rows.append(np.where(ok, logs, logs[ok].max() + FAILED_PENALTY))
    return np.array(rows).reshape(len(rows), history.times.shape[1])


def scaled_levels(values: np.ndarray) -> np.ndarray:
    """Each parameter as its level's rank scaled to [0, 1]; constant parameters dropped."""
    cols = []
    for col in np.asarray(values, dtype=float).T:
        levels, rank = np.unique(col, return_inverse=True)
        if len(levels) > 1:
            cols.append(rank / (len(levels) - 1))
    return np.array(cols).T.reshape(len(values), len(cols))


def families(values: np.ndarray) -> np.ndarray:
    """Each config's switch family: the combination of its two-valued parameters (use_shmem,
    read_only, tile_stride_x, rocMLIR's forceUnroll, ...), as one id."""
    switches = [col for col in np.asarray(values, dtype=float).T if len(np.unique(col)) == 2]
    if not switches:
        return np.zeros(len(values), dtype=int)
    _, ids = np.unique(np.array(switches).T, axis=0, return_inverse=True)
    return ids.reshape(len(values))


def transfer_list(logs: np.ndarray, family: np.ndarray) -> list[int]:
    """The best config on average over the units, each unit's best, each family's best on
    average (best family first)."""
    mean = logs.mean(axis=0)
    out = [int(np.argmin(mean))]
    out += [int(np.argmin(row)) for row in logs]
    best_of = {
        int(f): int(np.flatnonzero(family == f)[np.argmin(mean[family == f])])
        for f in np.unique(family)
    }
    out += sorted(best_of.values(), key=lambda i: mean[i])
    return list(dict.fromkeys(out))


def spread_over_families(score: np.ndarray, family: np.ndarray, k: int) -> list[int]:
    """The k best-scored configs, at most one per switch family while families last (the
    model's favourite family must not take every pick: it is the history's favourite too)."""
    order = np.argsort(score, kind="stable")
    order = order[np.isfinite(score[order])]
    firsts = order[np.sort(np.unique(family[order], return_index=True)[1])]
    out = [int(i) for i in firsts[:k]]
    out += [int(i) for i in order if int(i) not in out][: k - len(out)]
    return out


def spread(features: np.ndarray, k: int, rng: np.random.Generator) -> list[int]:
    """k configs spread over the space: a seeded start, then each next the farthest from those
    picked (greedy max-min distance over a seeded sample of candidates)."""
    n = len(features)
    pool = rng.permutation(n)[: min(n, 2000)]
    out = [int(pool[0])]
    dist = ((features[pool] - features[pool[0]]) ** 2).sum(axis=1)
    while len(out) < min(k, n):
        j = int(np.argmax(dist))
        out.append(int(pool[j]))
        dist = np.minimum(dist, ((features[pool] - features[pool[j]]) ** 2).sum(axis=1))
    return out


def transfer_mean(logs: np.ndarray, idx: np.ndarray, y: np.ndarray) -> np.ndarray:
    """The new unit's log time predicted as a + logs.T @ w, fit to the measured (idx, y) by
    ridge regression pulled towards equal weights; a constant with no history."""
    if not len(logs):
        return np.full(logs.shape[1], float(y.mean()))
    units = len(logs)
    h = logs[:, idx].T  # (measured, units)
    hc, yc = h - h.mean(axis=0), y - y.mean()
    prior = np.full(units, 1.0 / units)
    w = np.linalg.solve(hc.T @ hc + RIDGE * np.eye(units), hc.T @ yc + RIDGE * prior)
    a = y.mean() - h.mean(axis=0) @ w
    return a + logs.T @ w


def residual_gp(x: np.ndarray, idx: np.ndarray, r: np.ndarray) -> tuple[np.ndarray, np.ndarray]:
    """Posterior mean and standard deviation over every config of a Gaussian process (squared
    exponential kernel) fit to residuals r at configs idx; the length scale with the best
    marginal likelihood."""
    scale = float(r.std()) or 1.0
    z = r / scale
    xm = x[idx]
    d2 = ((xm[:, None, :] - xm[None, :, :]) ** 2).sum(axis=2)
    fits = [gp_fit(d2, z, ell) for ell in LENGTH_SCALES]
    _, ell, chol, alpha = max(fits, key=lambda f: f[0])
    cross = np.exp(-sqdist(x, xm) / (2 * ell * ell))  # (n, measured)
    mean = cross @ alpha
    v = np.linalg.solve(chol, cross.T)
    var = np.clip(1.0 - (v * v).sum(axis=0), 0.0, None)
    return mean * scale, np.sqrt(var) * scale


def gp_fit(
    d2: np.ndarray, z: np.ndarray, ell: float
) -> tuple[float, float, np.ndarray, np.ndarray]:
    """(log marginal likelihood, ell, Cholesky factor, weights) of the GP with length scale ell
    on squared distances d2 and standardized targets z."""
    k = np.exp(-d2 / (2 * ell * ell)) + NOISE * np.eye(len(z))
    chol = np.linalg.cholesky(k)
    alpha = np.linalg.solve(chol.T, np.linalg.solve(chol, z))
    fit = float(-0.5 * z @ alpha - np.log(np.diag(chol)).sum())
    return fit, ell, chol, alpha


def sqdist(a: np.ndarray, b: np.ndarray) -> np.ndarray:
    """Squared distances between the rows of a and of b."""
    return np.clip((a * a).sum(1)[:, None] + (b * b).sum(1)[None, :] - 2 * a @ b.T, 0.0, None)


class Neighbours:
    """The configs that differ from one in a single parameter (any other value of it)."""

    def __init__(self, values: np.ndarray) -> None:
        values = np.asarray(values, dtype=float)
        self.groups = []
        for j in range(values.shape[1]):
            rest = np.delete(values, j, axis=1)
            _, ids = np.unique(rest, axis=0, return_inverse=True)
            ids = ids.reshape(len(values))
            order = np.argsort(ids, kind="stable")
            bounds = np.searchsorted(ids[order], np.arange(ids.max() + 2 if len(ids) else 1))
            self.groups.append((ids, order, bounds))

    def of(self, i: int) -> list[int]:
        """The configs that differ from config i in one parameter."""
        return [j for param in range(len(self.groups)) for j in self.along(i, param)]

    def along(self, i: int, param: int) -> list[int]:
        """The configs that differ from config i in parameter `param` only."""
        ids, order, bounds = self.groups[param]
        g = ids[i]
        return [int(j) for j in order[bounds[g] : bounds[g + 1]] if j != i]
