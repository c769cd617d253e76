"""The dashboard's smaller points of issue 35, in Chromium at 1280x800 on every backend: an
imported session says so instead of "0/0", the farm table stays inside the page, TFlops axes
read as numbers (never "100µ"), CSV downloads hold what the CLI prints, the farm's sessions can
be searched, parameter importance of a poor fit says so."""

from __future__ import annotations

import csv
import io
import random

import httpx
import pytest
import sqlalchemy as sa
from support.browser import VIEWPORT, fixture_browser, served_page  # noqa: F401 (the browser and page fixtures)
from support.clitools import cli
from support.results import cand, gemm, new_session, put_results, record

from mlirtuna import sessions
from mlirtuna.db.models import TuningSession
from mlirtuna.web import explore, importance

pytestmark = pytest.mark.slow

V = [gemm(m) for m in (16, 32, 64)]


@pytest.fixture
def farm(db, db_url, tmp_path) -> dict[str, int]:
    """Two sessions of tiny TFlops (a CPU's), and one imported from a .tsv."""
    a, b = new_session(db), new_session(db, mlir_v="def456")
    put_results(db, a, {v: ("cpu:v1:16,16,8", 2e-6 * (i + 1)) for i, v in enumerate(V)})
    put_results(db, b, {v: ("cpu:v1:32,16,8", 3e-4 * (i + 1)) for i, v in enumerate(V)})
    tsv = tmp_path / "mlir_tuning_gfx942.tsv"
    tsv.write_text(
        "# arch\tnumCUs\tnumChiplets\ttestVector\tperfConfig\tTFlops\ttuningSpace\tcommitId"
        "\ttimestamp\tdurationSec\n"
        + "".join(f"gfx942\t304\t8\t{v}\tv2:64,64,8,32,32,4,1,1,1\t42.5\tfull\tabc\t"
                  "2025-01-01T00:00:00Z\t1.0\n" for v in V)
    )  # fmt: skip
    imported = cli(db_url, "import-tsv", str(tsv), "--json")
    assert imported.code == 0, imported.stderr
    with db.session() as s:
        newest = s.scalar(sa.select(sa.func.max(TuningSession.id)))
    assert sessions.get(db, newest).tuner == "imported"
    return {"a": a, "b": b, "imported": newest}


def test_farm_page_imported_sessions_width_and_search(page, farm):
    page.open("/")
    page.tab.wait_for_selector("#sessions tbody tr")
    rows = {int(r[0]): r for r in page.rows("#sessions")}
    assert (
        "imported: no jobs" in rows[farm["imported"]][-3]
        and "0/0" not in rows[farm["imported"]][-3]
    )
    assert page.tab.evaluate("() => document.documentElement.scrollWidth") <= VIEWPORT["width"]
    page.tab.fill("#farm-search", "def456")
    page.tab.wait_for_function("() => document.querySelector('#sessions').dataset.total === '1'")
    assert [int(r[0]) for r in page.rows("#sessions")] == [farm["b"]]
    page.tab.fill("#farm-search", str(farm["a"]))
    page.tab.wait_for_function(
        f"() => [...document.querySelectorAll('#sessions tbody tr')].some(tr =>"
        f" tr.cells[0].innerText === '{farm['a']}')"
    )
    page.shot("farm-search")


def test_trend_ticks_read_as_numbers(page, db, farm):
    pid = explore.winners_page(db, farm["a"], explore.WinnerFilter()).rows[0].problem_id
    page.open(f"/problems/{pid}")
    page.plot("#trend-plot")
    ticks = page.tab.eval_on_selector_all(
        "#trend-plot .ytick text", "ts => ts.map(t => t.textContent)"
    )
    assert ticks and not any("µ" in t or "m" in t for t in ticks), ticks
    assert all(float(t) > 0 for t in ticks), ticks  # plain numbers


def test_csv_downloads_hold_what_the_cli_prints(page, db_url, farm):
    base = page.base
    winners = httpx.get(f"{base}/api/sessions/{farm['a']}/winners.csv", timeout=30)
    assert winners.status_code == 200 and "attachment" in winners.headers["content-disposition"]
    assert winners.text == cli(db_url, "results", "--session", str(farm["a"]), "--csv").stdout
    sessions_csv = list(csv.DictReader(io.StringIO(httpx.get(f"{base}/api/farm.csv").text)))
    assert sorted(int(r["id"]) for r in sessions_csv) == sorted(farm.values())
    page.open(f"/sessions/{farm['a']}")
    href = page.tab.get_attribute("#winners-csv", "href")
    assert href == f"/api/sessions/{farm['a']}/winners.csv"


def test_importance_of_a_poor_fit_carries_a_caution(page, db, tmp_path):
    # TFlops that no perf-config field explains (seeded noise): the forest's R² is near 0.
    sid, rng = new_session(db), random.Random(7)
    configs = [f"cpu:v1:{m},{n},8" for m in (16, 32) for n in (16, 32)]
    problems = [gemm(16 * (i + 1), 128) for i in range(8)]
    cands = {v: [cand(v, pc, 1e5 * rng.uniform(1, 3)) for pc in configs] for v in problems}
    record(db, tmp_path, sid, cands,
           {v: max(cands[v], key=lambda c: c.tflops).perf_config for v in problems})  # fmt: skip
    fit = importance.importance(db, sid, "gemm")
    assert fit.r2 is not None and fit.r2 < 0.5
    page.open(f"/sessions/{sid}")
    page.tab.wait_for_function(
        f"() => document.querySelector('#importance-plot').dataset.count === '{fit.rows}'"
    )
    method = page.tab.inner_text("#importance-method")
    assert "Caution: the fit explains little" in method and "not a reliable ranking" in method
    assert "warn-text" in page.tab.get_attribute("#importance-method", "class")
