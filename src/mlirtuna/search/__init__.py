"""Search strategies: which of a job's candidate configs to measure, and in what order.

A strategy (`Strategy`) starts a `Search` for one job from its space (the candidate configs and
their parameter values) and the farm's history (what other GPUs or problems measured of the same
configs); the worker then asks it for rounds of configs and tells it each measurement, until it
asks for nothing more or the budget is spent. Strategies live in one registry (registry.py), and
one contract test (tests/test_search_contract.py) runs over every entry.
"""

from __future__ import annotations

from mlirtuna.search.base import History, Search, Space, Strategy
from mlirtuna.search.registry import get, names

__all__ = ["History", "Search", "Space", "Strategy", "get", "names"]
