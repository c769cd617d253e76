"""The strategies, by name: one place, as tuners/registry.py is for tuners."""

from __future__ import annotations

from mlirtuna.errors import UserError
from mlirtuna.search.base import Strategy
from mlirtuna.search.simple import Exhaustive, RandomSearch

STRATEGIES: dict[str, Strategy] = {s.name: s for s in (Exhaustive(), RandomSearch())}


def names() -> list[str]:
    return list(STRATEGIES)


def get(name: str) -> Strategy:
    """The strategy called `name`; UserError naming the known ones otherwise."""
    try:
        return STRATEGIES[name]
    except KeyError:
        raise UserError(f"unknown search {name!r} (known: {', '.join(STRATEGIES)})") from None
