"""The strategies that learn nothing: the whole space, and random search (the baseline)."""

from __future__ import annotations

import numpy as np

from mlirtuna.search.base import History, Search, Space, untold


class _Listed:
    """A search that measures a fixed order, `round_size` configs a round, up to the budget."""

    def __init__(self, order: list[int], budget: int, round_size: int) -> None:
        self.order = order
        self.left = budget
        self.round_size = round_size
        self.told: set[int] = set()
        self.asked: set[int] = set()

    def ask(self) -> list[int]:
        fresh = [i for i in self.order if i not in self.told and i not in self.asked]
        take = fresh[: min(self.round_size, self.left)]
        self.asked.update(take)
        self.left -= len(take)
        return take

    def tell(self, index: int, time: float) -> None:
        if index not in self.asked:
            self.left -= 1  # a replayed measurement spends the budget as one asked would
        self.told.add(index)


class Exhaustive:
    """Every config, in the space's order, in one round (the budget caps it)."""

    name = "exhaustive"

    def start(self, space: Space, history: History, budget: int, seed: int) -> Search:
        return _Listed(untold(len(space), ()), budget, round_size=max(1, len(space)))


class RandomSearch:
    """Configs in a seeded random order, ten a round: the baseline every search must beat."""

    name = "random"

    def start(self, space: Space, history: History, budget: int, seed: int) -> Search:
        order = [int(i) for i in np.random.default_rng(seed).permutation(len(space))]
        return _Listed(order, budget, round_size=10)
