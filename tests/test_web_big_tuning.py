"""The problem page of a tuning past the answers' caps, in Chromium (issue 43 §3): the history
plot draws its sample at the candidates' own places in the order tried, up to the last one and
the best; the scatter draws the best CANDIDATES_SHOWN and says of how many. SQLite: the SQL is
covered on every backend by tests/test_web_bounds.py."""

from __future__ import annotations

import pytest
from support.browser import fixture_browser, served_page  # noqa: F401 (the browser and page fixtures)
from support.webfarm import Farm, add_candidates, make, run_folder

from mlirtuna.web import explore

pytestmark = [pytest.mark.slow, pytest.mark.backends("sqlite")]

MANY = explore.HISTORY_POINTS + 2000


@pytest.fixture
def farm(db, tmp_path, tmp_path_factory) -> Farm:
    made = make(db, tmp_path, run_folder(tmp_path_factory))
    add_candidates(db, made.cpu_a, made.problems[0], MANY)
    return made


def test_problem_page_draws_the_sampled_history_and_the_best_candidates(page, db, farm):
    sid, pid = farm.cpu_a, farm.problems[0]
    history = explore.history(db, sid, pid)
    assert history.total > MANY
    page.open(f"/problems/{pid}?session={sid}")
    page.tab.wait_for_function(
        f"() => document.querySelector('#tried-plot').dataset.count === '{history.total}'"
    )
    tried, best = page.plot("#tried-plot")
    assert len(best["x"]) == len(history.index) <= explore.HISTORY_POINTS
    assert best["x"][-1] == history.total and best["y"][-1] == max(tried["y"])
    assert set(tried["x"]) <= set(history.index)  # each at its place in the order tried
    title = page.tab.eval_on_selector("#tried-plot", "el => el.layout.xaxis.title.text")
    assert f"of {history.total} drawn" in title
    (scatter,) = page.plot("#candidates-plot")
    found = explore.candidates(db, sid, pid)
    assert len(scatter["x"]) == len(found.valid) == explore.CANDIDATES_SHOWN
    title = page.tab.eval_on_selector("#candidates-plot", "el => el.layout.xaxis.title.text")
    assert f"the best {explore.CANDIDATES_SHOWN} of {found.totals['valid']}" in title
