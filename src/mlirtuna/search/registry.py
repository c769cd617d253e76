"""The strategies, by name: one place, as tuners/registry.py is for tuners."""

from __future__ import annotations

from importlib.util import find_spec

from mlirtuna.errors import UserError
from mlirtuna.search.base import Strategy
from mlirtuna.search.peers import OptunaTPE
from mlirtuna.search.simple import Exhaustive, RandomSearch
from mlirtuna.search.transfer import Adaptive

_BUILT_IN: tuple[Strategy, ...] = (Exhaustive(), RandomSearch(), Adaptive())
# Optuna is the bench extra: its sampler is a strategy only where it is installed (found
# without importing it, so loading the registry stays cheap).
_PEERS: tuple[Strategy, ...] = (OptunaTPE(),) if find_spec("optuna") else ()

STRATEGIES: dict[str, Strategy] = {s.name: s for s in (*_BUILT_IN, *_PEERS)}


def names() -> list[str]:
    return list(STRATEGIES)


def get(name: str) -> Strategy:
    """The strategy called `name`; UserError naming the known ones otherwise."""
    try:
        return STRATEGIES[name]
    except KeyError:
        raise UserError(f"unknown search {name!r} (known: {', '.join(STRATEGIES)})") from None
