"""One contract over every registered search strategy (as Kernel Tuner's
test/strategies/test_strategies.py runs one test over all its strategies), then what the
adaptive strategy must do with a history. Pure: no database, no timing."""

from __future__ import annotations

import itertools
import math

import numpy as np
import pytest

from mlirtuna import search
from mlirtuna.errors import UserError
from mlirtuna.search.transfer import Adaptive

STRATEGIES = search.names()


def grid_space(levels=(6, 6, 2, 3)) -> search.Space:
    """Every combination of the levels: keys like `3,0,1,2` (as Kernel Tuner's caches)."""
    keys = [",".join(map(str, c)) for c in itertools.product(*(range(n) for n in levels))]
    return search.Space.from_keys(keys)


def bowl(space: search.Space, centre, scale=(1.0, 1.0, 3.0, 0.5)) -> np.ndarray:
    """A smooth landscape (ms): one optimum at `centre`, a switch that costs 3x when wrong."""
    d = (space.values - np.asarray(centre, dtype=float)) ** 2 @ np.asarray(scale)
    return 1.0 + 0.2 * d


def history_of(space: search.Space, *times: np.ndarray) -> search.History:
    return search.History(tuple(f"u{i}" for i in range(len(times))), np.array(times))


def drive(s: search.Search, times: np.ndarray, budget: int) -> list[int]:
    """Ask until [] (or far past the budget: a search that never stops fails the test),
    telling each asked config its time; the configs in the order measured."""
    measured: list[int] = []
    for _ in range(budget + 5):
        asked = s.ask()
        if not asked:
            return measured
        assert len(set(asked)) == len(asked), f"a round repeats a config: {asked}"
        assert not set(asked) & set(measured), "asked a config already measured"
        for i in asked:
            assert 0 <= i < len(times)
            s.tell(i, float(times[i]))
            measured.append(i)
    pytest.fail("ask() never returned []")


def to_best(measured: list[int], times: np.ndarray) -> float:
    """Measurements until the true best was measured (inf: never)."""
    best = np.nanmin(times)
    hits = [n for n, i in enumerate(measured, start=1) if times[i] == best]
    return hits[0] if hits else math.inf


# -- the contract, every strategy -----------------------------------------------------------------


@pytest.mark.parametrize("name", STRATEGIES)
def test_asks_are_fresh_within_budget_and_end(name: str) -> None:
    space = grid_space()
    times = bowl(space, (2, 3, 1, 1))
    s = search.get(name).start(space, history_of(space, times * 1.1), 30, seed=1)
    measured = drive(s, times, 30)
    assert 0 < len(measured) <= 30
    assert len(set(measured)) == len(measured)
    assert s.ask() == [], "a finished search stays finished"


@pytest.mark.parametrize("name", STRATEGIES)
def test_replayed_tells_are_accepted_spend_the_budget_and_are_never_asked(name: str) -> None:
    space = grid_space()
    times = bowl(space, (4, 1, 0, 2))
    s = search.get(name).start(space, search.History.empty(space), 20, seed=3)
    replayed = [0, 17, 100, 5]  # what an earlier attempt of the job measured
    for i in replayed:
        s.tell(i, float(times[i]))
    measured = drive(s, times, 20)
    assert not set(measured) & set(replayed)
    assert len(measured) + len(replayed) <= 20


@pytest.mark.parametrize("name", STRATEGIES)
def test_same_seed_same_rounds(name: str) -> None:
    space = grid_space()
    times = bowl(space, (1, 4, 1, 0))
    history = history_of(space, bowl(space, (1, 3, 1, 0)), bowl(space, (2, 4, 0, 0)))
    runs = [drive(search.get(name).start(space, history, 25, seed=7), times, 25) for _ in "ab"]
    assert runs[0] == runs[1]


@pytest.mark.parametrize("name", STRATEGIES)
@pytest.mark.parametrize("kind", ["empty", "all-nan", "nan-columns"])
def test_odd_histories_and_failures(name: str, kind: str) -> None:
    """No history, a unit with no valid time, configs nobody measured; and a third of the
    configs fail on the new unit (NaN tells): the search still ends within its budget."""
    space = grid_space()
    times = bowl(space, (3, 3, 0, 1))
    times[::3] = np.nan
    other = bowl(space, (2, 2, 0, 1))
    if kind == "empty":
        history = search.History.empty(space)
    elif kind == "all-nan":
        history = history_of(space, np.full(len(space), np.nan), other)
    else:
        other[np.arange(len(space)) % 4 == 1] = np.nan
        history = history_of(space, other, np.where(np.isnan(other), np.nan, other * 2))
    measured = drive(search.get(name).start(space, history, 40, seed=0), times, 40)
    assert 0 < len(measured) <= 40


@pytest.mark.parametrize("name", STRATEGIES)
def test_finds_the_optimum_when_the_budget_covers_the_space(name: str) -> None:
    space = grid_space((4, 3, 2, 2))
    times = bowl(space, (3, 0, 1, 1))
    s = search.get(name).start(space, search.History.empty(space), len(space), seed=2)
    measured = drive(s, times, len(space))
    assert to_best(measured, times) <= len(space)


def test_unknown_strategy_is_a_user_error_naming_the_known_ones() -> None:
    with pytest.raises(UserError, match="adaptive"):
        search.get("no-such-search")


def test_the_registry_holds_the_adaptive_strategy() -> None:
    assert {"exhaustive", "random", "adaptive"} <= set(STRATEGIES)


# -- the adaptive strategy with a history -------------------------------------------------------


def rugged(space: search.Space, seed: int) -> np.ndarray:
    """A landscape of its own: smooth trend plus per-config noise, one clear optimum."""
    rng = np.random.default_rng(seed)
    centre = [rng.integers(0, int(space.values[:, j].max()) + 1) for j in range(4)]
    times = bowl(space, centre) * rng.uniform(1.0, 1.3, len(space))
    times[int(np.argmin(times))] *= 0.9
    return times


def test_a_unit_like_a_training_unit_is_found_in_few_measurements() -> None:
    space = grid_space()
    units = [rugged(space, s) for s in (11, 12, 13)]
    new = units[1] * 1.7  # another GPU of the same kind: slower, the same order
    history = history_of(space, *units)
    for seed in range(3):
        measured = drive(Adaptive().start(space, history, 60, seed), new, 60)
        assert to_best(measured, new) <= 6, "the history names its best: measure it first"


def test_a_unit_like_no_training_unit_still_beats_random_search() -> None:
    """The history points elsewhere; the adaptive search still reaches the new unit's best
    within the median a random search needs (about half the space)."""
    space = grid_space()
    history = history_of(space, *(rugged(space, s) for s in (21, 22, 23)))
    budget = len(space)
    ours, rand = [], []
    for seed in range(3):
        new = rugged(space, 100 + seed)
        ours.append(
            to_best(drive(Adaptive().start(space, history, budget, seed), new, budget), new)
        )
        r = search.get("random").start(space, search.History.empty(space), budget, seed)
        rand.append(to_best(drive(r, new, budget), new))
    assert np.median(ours) <= np.median(rand), (ours, rand)
