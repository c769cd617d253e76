"""The dashboard in a real Chromium (Debian's `chromium`, driven by Playwright's Python API; no
browser download): `mlirtuna serve` over a database filled by `mlirtuna run` on the example and
by the farm of tests/webfarm.py. Each page: the tables hold the database's rows, the plots have
as many points as there are rows behind them, the console stays clean; the farm page follows a
worker live. Screenshots at 1280x800 go to tests/screenshots/ (not committed).

SQLite only: the backends are covered by test_web_api.py; this is about what the browser shows.
"""

from __future__ import annotations

import os
import shutil
import subprocess
from collections.abc import Iterator
from dataclasses import dataclass
from pathlib import Path

import pytest
import sqlalchemy as sa
from support.clitools import mlirtuna_argv, run_cli, subprocess_env
from support.webfarm import Farm, make
from support.webserve import serving

from mlirtuna import catalog, sessions
from mlirtuna.db import Database
from mlirtuna.db.models import Job
from mlirtuna.history import compare, winners
from mlirtuna.problems import ExpandOptions
from mlirtuna.queue import jobs
from mlirtuna.sessions import SessionSpec
from mlirtuna.web import explore

pytestmark = pytest.mark.slow

CHROMIUM = (
    os.environ.get("MLIRTUNA_TEST_CHROMIUM") or shutil.which("chromium") or "/usr/bin/chromium"
)
EXAMPLE = Path(__file__).parent.parent / "examples" / "gemm-small"
SHOTS = Path(__file__).parent / "screenshots"
VIEWPORT = {"width": 1280, "height": 800}

if not Path(CHROMIUM).is_file():
    pytest.skip(
        f"browser tests skipped: no Chromium at {CHROMIUM} (apt-get install chromium)",
        allow_module_level=True,
    )
sync_api = pytest.importorskip("playwright.sync_api", reason="browser tests need playwright")


@dataclass
class Site:
    url: str
    db: Database
    db_url: str
    run_session: int  # made by `mlirtuna run` on the example
    farm: Farm


@pytest.fixture(scope="module")
def site(tmp_path_factory) -> Iterator[Site]:
    tmp = tmp_path_factory.mktemp("web")
    db_url = f"sqlite:///{tmp / 'mlirtuna.db'}"
    run = run_cli(
        db_url, "run", "--op", "gemm", "--tuning-space", "quick", "-o", str(tmp / "t.tsv"),
        "--json", str(EXAMPLE), timeout=600,
    )  # fmt: skip
    assert run.code == 0, run.stderr
    db = Database(db_url)
    farm = make(db, tmp)
    try:
        with serving(db_url) as url:
            yield Site(url, db, db_url, run.json()["session"], farm)
    finally:
        db.dispose()


@pytest.fixture(scope="module")
def browser():
    with sync_api.sync_playwright() as p:
        chromium = p.chromium.launch(executable_path=CHROMIUM, args=["--no-sandbox"])
        yield chromium
        chromium.close()


class Page:
    """A Chromium tab that records every console error and uncaught exception."""

    def __init__(self, browser, base: str) -> None:
        self.base = base
        self.tab = browser.new_page(viewport=VIEWPORT)
        self.errors: list[str] = []
        self.tab.on("console", lambda m: m.type == "error" and self.errors.append(m.text))
        self.tab.on("pageerror", lambda e: self.errors.append(str(e)))

    def open(self, path: str) -> None:
        response = self.tab.goto(self.base + path)
        assert response is not None and response.status == 200, path
        self.tab.wait_for_load_state("networkidle")

    def rows(self, table: str) -> list[list[str]]:
        return self.tab.eval_on_selector_all(
            f"{table} tbody tr", "trs => trs.map(tr => [...tr.cells].map(td => td.innerText))"
        )

    def plot(self, element: str) -> list[dict]:
        """The traces Plotly drew in the element: x and y of each."""
        self.tab.wait_for_function(
            f"() => document.querySelector('{element}') && "
            f"document.querySelector('{element}').data !== undefined"
        )
        return self.tab.eval_on_selector(
            element, "el => el.data.map(t => ({x: t.x || [], y: t.y || [], name: t.name}))"
        )

    def shot(self, name: str) -> None:
        SHOTS.mkdir(exist_ok=True)
        self.tab.screenshot(path=str(SHOTS / f"{name}.png"))

    def close(self) -> None:
        assert self.errors == [], self.errors
        self.tab.close()


@pytest.fixture
def page(browser, site) -> Iterator[Page]:
    tab = Page(browser, site.url)
    yield tab
    tab.close()


def test_farm_lists_every_session(page, site):
    page.open("/")
    page.tab.wait_for_selector("#sessions tbody tr")
    rows = page.rows("#sessions")
    counts = jobs.counts(site.db)
    assert [int(r[0]) for r in rows] == sorted(counts, reverse=True)
    for row in rows:
        c = counts[int(row[0])]
        assert [int(x) for x in row[3:9]] == [
            c[s] for s in ("new", "waiting", "running", "completed", "error", "cancelled")
        ]
    assert "gfx942:sramecc+:xnack-" in page.tab.inner_text("#sessions")
    page.shot("farm")


def test_session_winners_sort_filter_and_plots(page, site):
    sid = site.run_session
    best = winners.winners(site.db, sid)
    page.open(f"/sessions/{sid}")
    page.tab.wait_for_selector("#winners tbody tr")
    shown = page.rows("#winners")
    assert sorted(r[0] for r in shown) == sorted(w.test_vector for w in best)
    by_vector = {w.test_vector: w for w in best}
    for r in shown:
        assert r[3] == by_vector[r[0]].perf_config and int(r[6]) == by_vector[r[0]].candidates
    # Sort by TFlops (best first), then filter by data type: the server answers each.
    page.tab.click("#winners th[data-sort=tflops]")
    page.tab.wait_for_selector("#winners th[data-sort=tflops]:has-text('▼')")
    best_first = [r[0] for r in page.rows("#winners")]
    assert best_first == [w.test_vector for w in sorted(best, key=lambda w: -w.tflops)]
    page.tab.select_option("#filters select[name=data_type]", "f16")
    page.tab.wait_for_function("() => document.querySelector('#winners').dataset.total === '2'")
    assert sorted(r[0] for r in page.rows("#winners")) == sorted(
        w.test_vector for w in best if w.test_vector.startswith("-t f16")
    )
    tflops = page.plot("#tflops-plot")
    assert sum(tflops[0]["y"]) == len(best)
    times = page.plot("#times-plot")
    assert sum(times[0]["y"]) == jobs.counts(site.db, sid)[sid]["completed"]
    page.tab.select_option("#filters select[name=data_type]", "")
    page.tab.wait_for_function(
        f"() => document.querySelector('#winners').dataset.total === '{len(best)}'"
    )
    page.shot("session")


def test_session_errors_link_to_the_job_and_its_attempts(page, site):
    sid = site.farm.failed
    failed = jobs.list_jobs(site.db, sid, state="error")
    page.open(f"/sessions/{sid}")
    page.tab.wait_for_selector("#errors tbody tr")
    (group,) = page.rows("#errors")
    assert int(group[0]) == len(failed) and failed[0].first_line.endswith(f"failed: {group[1]}")
    page.shot("session-errors")
    page.tab.click(f"#errors a[href='/jobs/{failed[0].id}']")
    page.tab.wait_for_load_state("networkidle")
    shown = jobs.show(site.db, failed[0].id)
    assert len(page.rows("#attempts")) == len(shown.attempts)
    assert shown.result.strip().splitlines()[0] in page.tab.inner_text("#job-text")
    page.shot("job")


def test_problem_trend_history_and_candidates(page, site):
    pid = site.farm.problems[0]
    trend = explore.trend(site.db, pid)
    page.open(f"/problems/{pid}?session={site.farm.gpu}")
    assert page.tab.inner_text("#test-vector") == explore.problem(site.db, pid).test_vector
    traces = page.plot("#trend-plot")
    assert sum(len(t["y"]) for t in traces) == len(trend)
    assert {t["name"] for t in traces} == {p.context for p in trend}
    assert len(page.rows("#history")) == len(trend)
    found = explore.candidates(site.db, site.farm.gpu, pid)
    page.tab.wait_for_selector("#invalid tbody tr")
    (scatter,) = page.plot("#candidates-plot")
    assert len(scatter["x"]) == len(found.valid) and scatter["x"][0] == found.winner
    assert len(page.rows("#invalid")) == len(found.invalid) > 0
    page.shot("problem")


def test_compare_scatter_and_tables(page, site):
    a, b = site.farm.cpu_a, site.farm.cpu_b
    side_a, side_b = compare.load_sides(str(a), str(b), None, lambda: site.db)
    expected = compare.compare(side_a, side_b)
    page.open(f"/compare?a={a}&b={b}")
    page.tab.wait_for_selector("#summary tr")
    points, _diagonal = page.plot("#compare-plot")
    assert len(points["x"]) == expected.with_tflops
    assert len(page.rows("#regressions")) == len(expected.regressions)
    assert len(page.rows("#improvements")) == len(compare.improvements(side_a, side_b))
    summary = page.tab.inner_text("#summary")
    assert f"{expected.same_winner} ({expected.same_winner_pct:.1f} %)" in summary
    page.shot("compare")


def test_farm_page_follows_a_worker_live(page, site, tmp_path):
    path = tmp_path / "live"
    path.write_text(
        "".join(
            f"-t f32 -out_datatype f32 -transA false -transB false -g 1 -m {m} -n 8 -k 8\n"
            for m in (3, 5, 7, 9)
        )
    )
    catalog.import_files(site.db, "gemm", [str(path)], ExpandOptions(expand=False), tag="live")
    sid = sessions.create(site.db, SessionSpec(tuner="sleep", reason="live")).id
    jobs.load(site.db, sid, tag="live")
    page.open("/")
    page.tab.wait_for_selector(f"#sessions a[href='/sessions/{sid}']")
    page.tab.evaluate("() => { window.sameDocument = true; }")
    worker = subprocess.Popen(
        mlirtuna_argv("worker", "--session", str(sid), "--tuner", "sleep:1.5", "--until-empty"),
        env=subprocess_env(site.db_url),
        stdout=subprocess.DEVNULL,
        stderr=subprocess.DEVNULL,
    )
    try:
        # A worker row appears while it holds a job, naming the session…
        page.tab.wait_for_selector(f"#workers a[href='/sessions/{sid}']", timeout=30_000)
        page.shot("farm-live")
        # …and the session's completed count climbs to 4 without a reload.
        # Columns found by their headers: the table grows columns (waiting came with issue 16).
        page.tab.wait_for_function(
            f"""() => {{
                const heads = [...document.querySelectorAll('#sessions thead th')]
                    .map(th => th.innerText.trim());
                const done = heads.indexOf('completed');
                return done > 0 && [...document.querySelectorAll('#sessions tbody tr')].some(tr =>
                    tr.cells[0].innerText === '{sid}' && tr.cells[done].innerText === '4');
            }}""",
            timeout=60_000,
        )
        assert worker.wait(timeout=60) == 0
    finally:
        if worker.poll() is None:
            worker.terminate()
            worker.wait(timeout=30)
    assert page.tab.evaluate("() => window.sameDocument === true")
    with site.db.session() as s:
        done = s.scalar(
            sa.select(sa.func.count()).where(Job.session_id == sid, Job.state == "completed")
        )
    assert done == 4
