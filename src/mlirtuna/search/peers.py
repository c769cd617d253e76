"""Strategies from libraries, as peers of our own: Optuna's TPE sampler over the config space.

Optuna is the `bench` extra, not a core dependency: it is imported when a search starts, and the
registry lists this strategy only where Optuna is installed (registry.py).
"""

from __future__ import annotations

import math
from typing import Any

import numpy as np

from mlirtuna.search.base import History, Search, Space
from mlirtuna.search.transfer import scaled_levels

#: Configs per round (TPE proposes them one by one from the same model).
ROUND = 5
#: A failed config is told to TPE as this much slower than the slowest measured (log ratio).
FAILED_PENALTY = math.log(2.0)


class OptunaTPE:
    """Optuna's TPE sampler, each parameter a categorical of its values, learning from the
    measurements of this job only (no history: a peer without transfer). TPE proposes
    parameter values; the space is not a full grid, so the proposal becomes the nearest open
    config of the space (scaled parameter levels), which is what Optuna is then told."""

    name = "optuna-tpe"

    def start(self, space: Space, history: History, budget: int, seed: int) -> Search:
        return OptunaSearch(space, budget, seed)


class OptunaSearch:
    def __init__(self, space: Space, budget: int, seed: int) -> None:
        import optuna  # the bench extra: only a search that runs needs it

        optuna.logging.set_verbosity(optuna.logging.WARNING)
        self.optuna = optuna
        self.values = np.asarray(space.values, dtype=float)
        self.scaled = scaled_levels(space.values)
        self.names = [f"p{j}" for j in range(self.values.shape[1])]
        self.levels = [
            sorted({float(v) for v in self.values[:, j]}) for j in range(len(self.names))
        ]
        self.dists: dict[str, Any] = {
            name: optuna.distributions.CategoricalDistribution(levels)
            for name, levels in zip(self.names, self.levels, strict=True)
        }
        sampler = optuna.samplers.TPESampler(seed=seed, n_startup_trials=10)
        self.study = optuna.create_study(sampler=sampler)
        self.left = max(0, budget)
        self.taken: set[int] = set()  # asked or told
        self.told: set[int] = set()
        self.worst = 0.0

    def ask(self) -> list[int]:
        out: list[int] = []
        while len(out) < ROUND and self.left > 0 and len(self.taken) < len(self.values):
            out.append(self.propose())
        return out

    def propose(self) -> int:
        trial = self.study.ask(self.dists)
        wanted = np.array([trial.params[name] for name in self.names], dtype=float)
        # Optuna records the proposal as failed (TPE ignores failed trials); the config
        # measured instead is told as a trial of its own.
        self.study.tell(trial, state=self.optuna.trial.TrialState.FAIL)
        index = self.nearest_open(wanted)
        self.taken.add(index)
        self.left -= 1
        return index

    def nearest_open(self, wanted: np.ndarray) -> int:
        target = np.array(
            [
                lv.index(float(w)) / max(1, len(lv) - 1)
                for lv, w in zip(self.levels, wanted, strict=True)
                if len(lv) > 1
            ]
        )
        dist = ((self.scaled - target) ** 2).sum(axis=1)
        dist[list(self.taken)] = np.inf
        return int(np.argmin(dist))

    def tell(self, index: int, time: float) -> None:
        if index in self.told:
            return
        if index not in self.taken:
            self.taken.add(index)
            self.left -= 1  # a replayed measurement spends the budget as an asked one would
        self.told.add(index)
        ok = math.isfinite(time) and time > 0
        if ok:
            self.worst = max(self.worst, math.log(time))
        value = math.log(time) if ok else self.worst + FAILED_PENALTY
        params: dict[str, Any] = {
            name: float(self.values[index, j]) for j, name in enumerate(self.names)
        }
        self.study.add_trial(
            self.optuna.trial.create_trial(params=params, distributions=self.dists, value=value)
        )
