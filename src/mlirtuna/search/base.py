"""What a search strategy takes and gives: the protocol every entry of the registry follows."""

from __future__ import annotations

import re
from collections.abc import Sequence
from dataclasses import dataclass
from typing import Protocol, runtime_checkable

import numpy as np


@dataclass(frozen=True)
class Space:
    """One job's candidates: config keys (perf configs) and each one's parameter values.

    `values[i, j]` is config i's value of parameter `params[j]`, as a number (a categorical
    value is its index among that parameter's values, sorted).
    """

    keys: tuple[str, ...]
    params: tuple[str, ...]
    values: np.ndarray  # (len(keys), len(params)) float

    def __len__(self) -> int:
        return len(self.keys)

    @staticmethod
    def from_keys(keys: Sequence[str]) -> Space:
        """A space read off its config keys alone: each field of a key (split on `,` and `:`,
        as perf configs and Kernel Tuner's cache keys are written) is a parameter; a field
        that is a number everywhere keeps its value, any other is the index of its text."""
        rows = [re.split(r"[,:]", k) for k in keys]
        width = max((len(r) for r in rows), default=0)
        rows = [r + [""] * (width - len(r)) for r in rows]
        columns = [_numeric([r[j] for r in rows]) for j in range(width)]
        values = np.array(columns, dtype=float).T.reshape(len(rows), width)
        return Space(tuple(keys), tuple(f"f{j + 1}" for j in range(width)), values)


@dataclass(frozen=True)
class History:
    """What other units (another GPU, another problem of the op) measured of the same configs.

    `times[u, i]` is unit `units[u]`'s time of config `Space.keys[i]` (lower is better; any unit
    of time, one per row); NaN where it failed or was not measured there. No rows: no history.
    """

    units: tuple[str, ...]
    times: np.ndarray  # (len(units), len(space)) float

    @staticmethod
    def empty(space: Space) -> History:
        return History((), np.full((0, len(space)), np.nan))


@runtime_checkable
class Search(Protocol):
    """One job's search, asked for rounds and told measurements (ask-and-tell, as Optuna's).

    Contract (tests/test_search_contract.py):
    - `ask()` returns the next round: distinct indices into the space, none told or asked
      before; [] when the search is done (budget spent, space exhausted, or confident);
    - `tell(i, t)` takes config i's time t (NaN: it failed); it accepts any index not told
      yet, asked or not, so a resumed job replays what an earlier attempt measured first;
    - the same space, history, budget, seed and tells give the same rounds.
    """

    def ask(self) -> list[int]: ...

    def tell(self, index: int, time: float) -> None: ...


@runtime_checkable
class Strategy(Protocol):
    """A registered way of choosing configs; `start` begins one job's search."""

    name: str

    def start(self, space: Space, history: History, budget: int, seed: int) -> Search: ...


def untold(n: int, told: Sequence[int] | set[int]) -> list[int]:
    """Indices 0..n-1 not in `told`, in order."""
    seen = set(told)
    return [i for i in range(n) if i not in seen]


def _numeric(column: list[str]) -> list[float]:
    try:
        return [float(v) for v in column]
    except ValueError:
        levels = {v: i for i, v in enumerate(sorted(set(column)))}
        return [float(levels[v]) for v in column]
