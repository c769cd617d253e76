"""The dashboard in a real Chromium (Debian's `chromium`, driven by Playwright's Python API; no
browser download): `mlirtuna serve` over a database filled by `mlirtuna run` on the example and
by the farm of tests/webfarm.py. Each page: the tables hold the database's rows, the plots have
as many points as there are rows behind them, the console stays clean; the farm page follows a
worker live. Screenshots at 1280x800 go to tests/screenshots/ (not committed).

On all three backends (tests/conftest.py's module_db_url): one database, one farm and one
`mlirtuna serve` per backend for the whole module, which runs in one test process per backend
(tests/support/scheduling.py); the farm's rows are copied from the run's first farm of that
backend (support/webfarm.make).
"""

from __future__ import annotations

import datetime as dt
import subprocess
from collections.abc import Iterator
from dataclasses import dataclass
from pathlib import Path
from zoneinfo import ZoneInfo

import pytest
import sqlalchemy as sa
from support.browser import Page, fixture_browser  # noqa: F401 (the browser fixture)
from support.clitools import mlirtuna_argv, run_cli, subprocess_env
from support.e4tuning import e4_tuning
from support.webfarm import Farm, make, run_folder
from support.webserve import serving_command

from mlirtuna import catalog, queue, sessions
from mlirtuna.db import Database
from mlirtuna.db.models import Attempt, Job
from mlirtuna.history import compare, perffields, winners
from mlirtuna.problems import ExpandOptions
from mlirtuna.queue import jobs
from mlirtuna.sessions import SessionSpec
from mlirtuna.web import explore, importance

pytestmark = pytest.mark.slow
# Layout at 1280 px (issue 44 §3) is the browser's and the templates', not the database's: one
# backend (the API behind each page runs on all three in test_web_api and test_web_views).
LAYOUT = pytest.mark.backends("sqlite")

EXAMPLE = Path(__file__).parent.parent / "examples" / "gemm-small"


@dataclass
class Site:
    url: str
    db: Database
    db_url: str
    run_session: int  # made by `mlirtuna run` on the example
    farm: Farm


@pytest.fixture(scope="module")
def site(module_db_url, tmp_path_factory) -> Iterator[Site]:
    tmp = tmp_path_factory.mktemp("web")
    db_url = module_db_url
    db = Database(db_url)
    try:
        # The farm first: into the empty database it is copied; after `mlirtuna run` it would
        # be tuned again (webfarm.make). The run loads only the problems it imports.
        farm = make(db, tmp, run_folder(tmp_path_factory))
        run = run_cli(
            db_url, "run", "--op", "gemm", "--tuning-space", "quick", "-o", str(tmp / "t.tsv"),
            "--json", str(EXAMPLE), timeout=600,
        )  # fmt: skip
        assert run.code == 0, run.stderr
        with serving_command(db_url) as url:  # the command itself, in a real browser
            yield Site(url, db, db_url, run.json()["session"], farm)
    finally:
        db.dispose()


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
        assert [int(x) for x in row[4:10]] == [
            c[s] for s in ("new", "waiting", "running", "completed", "error", "cancelled")
        ]
    assert "gfx942:sramecc+:xnack-" in page.tab.inner_text("#sessions")
    # Each row says what it tunes and when it was opened: the run's name, its op, its date.
    by_id = {int(r[0]): r[1] for r in rows}
    run = sessions.get(site.db, site.run_session)
    assert run.name.startswith("gemm: ") and run.name in by_id[run.id]
    for sid, what in by_id.items():
        assert "gemm" in what and local(page, sessions.get(site.db, sid).created_at) in what
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


def test_parallel_coordinates_of_a_session(page, site):
    sid = site.farm.gpu
    expected = explore.parallel(site.db, sid, "gemm")
    page.open(f"/sessions/{sid}")
    page.tab.wait_for_function(
        f"() => document.querySelector('#parallel-plot').dataset.count === '{expected.total}'"
    )
    dims = page.tab.eval_on_selector(
        "#parallel-plot", "el => el.data[0].dimensions.map(d => [d.label, d.values.length])"
    )
    assert [d[0] for d in dims] == [*expected.axes, "TFlops / best"]
    assert all(n == expected.total for _, n in dims)
    # Drawn, not only given data: one axis per dimension and lines on the WebGL canvas (under the
    # app's CSP, plotly's default bundle shows "WebGL is not supported" here instead).
    axes = page.tab.eval_on_selector_all("#parallel-plot .parcoords .y-axis", "els => els.length")
    assert axes == len(dims)
    assert page.drawn("#parallel-plot") > 1000
    page.tab.select_option("#parallel-choice select[name=data_type]", "f16")
    f16 = explore.parallel(site.db, sid, "gemm", "f16").total
    page.tab.wait_for_function(
        f"() => document.querySelector('#parallel-plot').dataset.count === '{f16}'"
    )
    assert f"{f16} candidates" in page.tab.inner_text("#parallel-count")
    page.shot("parallel")


def test_parameter_importance_of_a_session(page, site):
    sid = site.farm.gpu
    expected = importance.importance(site.db, sid, "gemm")
    assert expected.rows == explore.parallel(site.db, sid, "gemm").total > 3
    page.open(f"/sessions/{sid}")
    page.tab.wait_for_function(
        f"() => document.querySelector('#importance-plot').dataset.count === '{expected.rows}'"
    )
    (bars,) = page.plot("#importance-plot")
    # Horizontal bars, the most important at the top (Plotly draws the first category lowest).
    assert bars["y"] == list(reversed(expected.fields))
    assert bars["x"] == pytest.approx(list(reversed(expected.importance)))
    method = page.tab.inner_text("#importance-method")
    assert f"{expected.rows} candidates fitted" in method and "impurity importance" in method
    page.tab.select_option("#parallel-choice select[name=data_type]", "f16")
    f16 = importance.importance(site.db, sid, "gemm", "f16").rows
    page.tab.wait_for_function(
        f"() => document.querySelector('#importance-plot').dataset.count === '{f16}'"
    )
    page.tab.locator("#importance-plot").scroll_into_view_if_needed()
    page.shot("importance")


def test_session_errors_link_to_the_job_and_its_attempts(page, site):
    sid = site.farm.failed
    failed = jobs.list_jobs(site.db, sid, state="error")
    page.open(f"/sessions/{sid}")
    page.tab.wait_for_selector("#errors tbody tr")
    (group,) = page.rows("#errors")
    assert int(group[0]) == len(failed) and failed[0].first_line.endswith(f"failed: {group[1]}")
    page.shot("session-errors")
    page.tab.click(f"#errors a[href='/jobs/{failed[0].id}']")
    page.tab.wait_for_url(f"**/jobs/{failed[0].id}")  # loaded: the job page is drawn on the server
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


def test_candidate_table_sort_filter_remeasured_and_rule(page, site):
    pid, sid = site.farm.problems[0], site.farm.cpu_a
    found = explore.candidates(site.db, sid, pid)
    every = found.valid + found.invalid
    again = [c for c in every if c.remeasured]
    assert again
    page.open(f"/problems/{pid}?session={sid}")
    page.tab.wait_for_function(
        f"() => document.querySelector('#candidates').dataset.total === '{len(every)}'"
    )
    head = page.tab.eval_on_selector_all("#candidates thead th", "ths => ths.map(t => t.innerText)")
    assert head[:2] == ["perf config", "TFlops ▼"]
    fields = head.index("mPerBlock")
    assert head[fields : fields + 3] == ["mPerBlock", "nPerBlock", "kPerBlock"]
    assert "median µs" in head and "spread (IQR) µs" in head and "samples" in head
    marked = head.index("re-measured")
    rows = page.rows("#candidates")
    assert {r[0] for r in rows if r[marked] == "re-measured"} == {c.perf_config for c in again}
    (winner,) = page.tab.eval_on_selector_all(
        "#candidates tr.winner", "trs => trs.map(tr => tr.cells[0].innerText)"
    )
    assert winner == found.winner
    rule = page.tab.inner_text("#winner-rule")
    assert "re-measured top" in rule and "winner by median time" in rule and found.winner in rule
    # Sort by median time, fastest first: the server answers.
    page.tab.click("#candidates th[data-sort=kernel_time]")
    page.tab.wait_for_selector("#candidates th[data-sort=kernel_time]:has-text('▲')")
    fastest = sorted((c for c in every if c.kernel_time is not None), key=lambda c: c.kernel_time)
    assert page.rows("#candidates")[0][0] == fastest[0].perf_config
    # Filter: re-measured only, then a perf-config substring.
    page.tab.select_option("#cand-filters select[name=show]", "remeasured")
    page.tab.wait_for_function(
        f"() => document.querySelector('#candidates').dataset.total === '{len(again)}'"
    )
    page.tab.fill("#cand-filters input[name=q]", found.winner)
    page.tab.wait_for_function("() => document.querySelector('#candidates').dataset.total === '1'")
    assert page.rows("#candidates")[0][0] == found.winner
    # The scatter marks the re-measured points.
    (scatter,) = page.plot("#candidates-plot")
    symbols = page.tab.eval_on_selector("#candidates-plot", "el => el.data[0].marker.symbol")
    assert symbols.count("diamond") == sum(c.remeasured for c in found.valid)
    assert len(symbols) == len(scatter["x"])
    page.shot("candidate-table")


def test_compare_scatter_and_tables(page, site):
    a, b = site.farm.cpu_a, site.farm.cpu_b
    side_a, side_b = compare.load_sides(str(a), str(b), None, lambda: site.db)
    expected = compare.compare(side_a, side_b)
    page.open(f"/compare?a={a}&b={b}")
    page.tab.wait_for_selector("#summary tr")
    points, _diagonal = page.plot("#compare-plot")
    assert len(points["x"]) == expected.with_tflops
    # The CLI's three groups, each row linked to its problem page.
    changed = [r for r in expected.regressions if r.winner_changed]
    assert len(page.rows("#regressions")) == len(changed)
    assert len(page.rows("#same-winner")) == len(expected.regressions) - len(changed)
    assert len(page.rows("#within-noise")) == len(expected.within_noise)
    assert len(page.rows("#improvements")) == len(compare.improvements(side_a, side_b))
    heads = page.tab.eval_on_selector_all(
        "#improvements thead th", "ths => ths.map(t => t.innerText)"
    )
    assert "noise" in heads
    links = page.tab.eval_on_selector_all(
        "#regressions a, #same-winner a, #within-noise a, #improvements a",
        "as => as.map(a => a.getAttribute('href'))",
    )
    shown = sum(
        len(page.rows(t))
        for t in ("#regressions", "#same-winner", "#within-noise", "#improvements")
    )
    assert len(links) == shown and all(
        h.startswith("/problems/") and h.endswith(f"?session={b}") for h in links
    )
    counted = page.tab.inner_text("#reg-count")
    assert f"Regressions counted: {len(expected.regressions)}" in counted
    assert f"{len(expected.within_noise)} noise not counted" in counted
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


def test_fusion_problems_are_named_not_hashed(page, site):
    example = Path(__file__).parent.parent / "examples" / "fusion-small"
    catalog.import_modules(site.db, [str(example)])
    sid = sessions.create(site.db, SessionSpec(tuner="cpu", name="fusion example")).id
    jobs.load(site.db, sid, op="fusion", all_problems=True)
    run = subprocess.run(
        mlirtuna_argv("worker", "--session", str(sid), "--until-empty"),
        env=subprocess_env(site.db_url),
        capture_output=True,
        timeout=600,
    )
    assert run.returncode == 0, run.stderr
    best = winners.winners(site.db, sid)
    page.open(f"/sessions/{sid}")
    page.tab.wait_for_selector("#winners tbody tr")
    shown = sorted(r[0] for r in page.rows("#winners"))
    assert shown == sorted(w.test_vector for w in best)
    assert all(" @" in v and not v.startswith("sha256:") for v in shown)
    pid = best[0].problem_id
    page.open(f"/problems/{pid}?session={sid}")
    label = explore.problem(site.db, pid).label
    assert page.tab.inner_text("#label") == label == best[0].test_vector
    assert "sha256:" not in page.tab.title() and label.split(" @")[0] in page.tab.title()
    page.tab.wait_for_selector("#candidates tbody tr")
    page.shot("fusion-problem")
    page.open("/")
    page.tab.wait_for_selector(f"#sessions a[href='/sessions/{sid}']")
    assert "fusion example" in page.tab.inner_text("#sessions") and "fusion" in page.tab.inner_text(
        "#sessions"
    )


def test_a_stale_heartbeat_is_flagged_before_the_lease_expires(page, site):
    sid = site.farm.cpu_b
    with site.db.session() as s:  # one job of a finished session back in the queue, held
        first = s.scalar(sa.select(sa.func.min(Job.id)).where(Job.session_id == sid))
        s.execute(sa.update(Job).where(Job.id == first).values(state="new"))
    lease = queue.claim(site.db, sid, queue.Claimant("node9", 1, 4343), lease_s=3600)
    assert lease is not None
    try:
        page.open("/")
        row = f"#workers tr:has(a[href='/sessions/{sid}'])"
        page.tab.wait_for_selector(row)
        assert page.tab.inner_text(row).rstrip().endswith("ok")
        # The worker goes quiet: its last beat 40 minutes ago, 20 minutes of lease left.
        with site.db.session() as s:
            clock = s.scalar(sa.select(sa.func.max(Job.heartbeat_at)).where(Job.id == lease.job_id))
            s.execute(
                sa.update(Job)
                .where(Job.id == lease.job_id)
                .values(
                    heartbeat_at=clock - dt.timedelta(minutes=40),
                    lease_expires_at=clock + dt.timedelta(minutes=20),
                )
            )
        page.tab.wait_for_selector(f"{row} .warn-text:has-text('stale heartbeat')")
        page.shot("farm-stale")
    finally:
        with site.db.session() as s:  # as the farm made it
            s.execute(sa.update(Job).where(Job.id == lease.job_id).values(state="completed"))


# ---------------------------------------------------------------- issue 44 §3: 1280 px

# The words (between spaces) of each cell that a line break cut in two: a Range over a word
# has one client rect per line it is drawn on.
WORDS_BROKEN = """tds => tds.flatMap(td => {
    const broken = [];
    const walk = document.createTreeWalker(td, NodeFilter.SHOW_TEXT);
    for (let node = walk.nextNode(); node; node = walk.nextNode()) {
        let at = 0;
        for (const word of node.textContent.split(' ')) {
            if (word) {
                const r = document.createRange();
                r.setStart(node, at);
                r.setEnd(node, at + word.length);
                if (r.getClientRects().length > 1) broken.push(word);
            }
            at += word.length + 1;
        }
    }
    return broken;
})"""
# The cells whose text runs over more than one line.
WRAPPED = """tds => tds.filter(td => {
    const r = document.createRange();
    r.selectNodeContents(td);
    return new Set([...r.getClientRects()].map(b => Math.round(b.top))).size > 1;
}).map(td => td.innerText)"""


def local(page: Page, iso: str) -> str:
    """The ISO time as the browser shows it: local "YYYY-MM-DD HH:MM"."""
    zone = page.tab.evaluate("() => Intl.DateTimeFormat().resolvedOptions().timeZone")
    when = dt.datetime.fromisoformat(iso.replace("Z", "+00:00"))
    return when.astimezone(ZoneInfo(zone)).strftime("%Y-%m-%d %H:%M")


@LAYOUT
def test_farm_page_loads_no_plotly_and_fits_1280(page, site):
    asked: list[str] = []
    page.tab.on("request", lambda r: asked.append(r.url))
    page.open("/")
    page.tab.wait_for_selector("#sessions tbody tr")
    assert asked and not [u for u in asked if "plotly" in u]
    # jobs/min and ETA in view at 1280 px, without scrolling the table.
    right = page.tab.eval_on_selector_all(
        "#sessions thead th",
        "ths => Object.fromEntries(ths.map(t => [t.innerText.trim(), "
        "t.getBoundingClientRect().right]))",
    )
    width = page.tab.evaluate("() => document.documentElement.clientWidth")
    assert right["jobs/min"] <= width and right["ETA"] <= width, right
    # Times local and to the minute, the stored ISO in the title.
    times = page.tab.eval_on_selector_all(
        "#sessions td.what time",
        "ts => ts.map(t => [t.getAttribute('datetime'), t.title, t.innerText])",
    )
    assert len(times) == len(page.rows("#sessions"))
    for iso, title, text in times:
        assert title == iso and text == local(page, iso)
    page.shot("farm-1280")


@LAYOUT
def test_job_page_fits_1280(page, site):
    with site.db.session() as s:
        ids = s.scalars(sa.select(Job.id).where(Job.session_id == site.farm.gpu)).all()
    # An attempt's message as long as a real one can get without a space (a list of E4 perf
    # configs): it wraps inside its cell, never widens the page.
    configs = ",".join(f"v4:{m},32,2,32,32,32,4,1,1,2,0,0,1,1" for m in range(60))
    with site.db.session() as s:
        attempt = s.scalar(sa.select(Attempt).where(Attempt.job_id == ids[0]))
        assert attempt is not None
        kept, attempt.message = attempt.message, f"tried:{configs}"
    try:
        _fits_1280(page, ids)
    finally:
        with site.db.session() as s:
            s.execute(sa.update(Attempt).where(Attempt.job_id == ids[0]).values(message=kept))


def _fits_1280(page: Page, ids: list[int]) -> None:
    for job in ids:
        page.open(f"/jobs/{job}")
        wide = page.tab.evaluate("() => document.documentElement.scrollWidth")
        assert wide <= 1280, (job, wide)
        claimed = page.tab.eval_on_selector_all(
            "#attempts time", "ts => ts.map(t => [t.getAttribute('datetime'), t.innerText])"
        )
        assert claimed and all(text == local(page, iso) for iso, text in claimed)
    page.open(f"/jobs/{ids[0]}")
    page.shot("job-1280")


@LAYOUT
def test_winners_never_wrap_mid_value(page, site):
    page.open(f"/sessions/{site.farm.gpu}")
    page.tab.wait_for_selector("#winners tbody tr")
    configs = page.tab.eval_on_selector_all(
        "#winners td.config", "tds => tds.map(td => td.getClientRects().length && td.innerText)"
    )
    assert configs and all(configs)
    assert page.tab.eval_on_selector_all("#winners td.config", WRAPPED) == []
    assert page.tab.eval_on_selector_all("#winners td.vector", WORDS_BROKEN) == []
    page.shot("winners-1280")


@LAYOUT
def test_candidate_numbers_sit_next_to_the_sticky_config(page, site):
    pid, sid = site.farm.problems[0], site.farm.gpu
    page.open(f"/problems/{pid}?session={sid}")
    page.tab.wait_for_selector("#candidates tbody tr")
    box = page.tab.eval_on_selector_all(
        "#candidates thead th",
        "ths => Object.fromEntries(ths.map(t => [t.innerText.replace(/ [▲▼]$/, ''), "
        "[t.getBoundingClientRect().left, t.getBoundingClientRect().right]]))",
    )
    assert box["TFlops"][0] - box["perf config"][1] < 2  # the next column
    assert box["median µs"][1] < 1280
    # Scrolled to the fields' end, the config column stays where it was.
    scroller = "#candidates"
    before = page.tab.eval_on_selector(
        f"{scroller} tbody td.config", "td => td.getBoundingClientRect().left"
    )
    page.tab.eval_on_selector(scroller, "t => { t.parentElement.scrollLeft = 5000; }")
    page.tab.wait_for_function(
        "() => document.querySelector('#candidates').parentElement.scrollLeft > 0"
    )
    after = page.tab.eval_on_selector(
        f"{scroller} tbody td.config", "td => td.getBoundingClientRect().left"
    )
    assert abs(after - before) < 1
    page.tab.locator("#candidates").scroll_into_view_if_needed()
    page.shot("candidates-sticky")


@LAYOUT
def test_nav_api_and_the_collections_are_pages(page, site):
    page.open("/")
    page.tab.click("nav a:has-text('API')")
    page.tab.wait_for_selector("#endpoints tbody tr")
    assert page.tab.url.endswith("/api")
    listed = [r[0] for r in page.rows("#endpoints")]
    assert "/api/farm" in listed and "/api/sessions/{session_id}/winners" in listed
    page.shot("api")
    for path in ("/workers", "/sessions"):
        page.open(path)
        assert page.tab.url.endswith(f"/#{path[1:]}")
        page.tab.wait_for_selector("#sessions tbody tr")


@LAYOUT
def test_compare_picker_marks_differences_and_keeps_verdicts_whole(page, site):
    a, g = site.farm.cpu_a, site.farm.gpu
    page.open("/compare")
    page.tab.select_option("#pick-a", str(a))
    page.tab.select_option("#pick-b", str(g))
    page.tab.click("form.filters button")
    page.tab.wait_for_selector("#summary tr")
    page.answered()
    assert f"a={a}" in page.tab.url and f"b={g}" in page.tab.url
    differs = page.tab.eval_on_selector_all(
        "#contexts tr.differs th", "ths => ths.map(t => t.innerText)"
    )
    assert "tuner ≠" in differs and "arch ≠" in differs
    # One line per verdict, however narrow the table.
    assert page.tab.eval_on_selector_all("td.verdict", "tds => tds.length") > 0
    assert page.tab.eval_on_selector_all("td.verdict", WRAPPED) == []
    page.shot("compare-picker")


@LAYOUT
def test_trend_points_are_labelled_by_session(page, site):
    pid = site.farm.problems[0]
    trend = explore.trend(site.db, pid)
    page.open(f"/problems/{pid}?session={site.farm.gpu}")
    labels = page.tab.eval_on_selector("#trend-plot", "el => el.data.flatMap(t => t.text)")
    assert sorted(labels) == sorted(f"s{p.session_id}" for p in trend)
    drawn = page.tab.eval_on_selector_all(
        "#trend-plot .textpoint text", "ts => ts.map(t => t.textContent)"
    )
    assert sorted(drawn) == sorted(labels)
    page.tab.locator("#trend-plot").scroll_into_view_if_needed()
    page.shot("trend-labelled")


@LAYOUT
def test_session_notes_on_the_page(page, site):
    sid = site.farm.cpu_b
    for text in ("node b lost at 03:10", "re-tune queued as TKT-9"):
        added = run_cli(site.db_url, "session", "note", str(sid), text)
        assert added.code == 0, added.stderr
    page.open(f"/sessions/{sid}")
    notes = page.tab.eval_on_selector_all(
        "#notes li", "lis => lis.map(li => [li.querySelector('time').title, li.innerText])"
    )
    stored = sessions.notes(site.db, sid)
    assert [n[1] for n in notes] == [f"{local(page, n.created_at)} {n.text}" for n in stored]
    assert [n[0] for n in notes] == [n.created_at for n in stored]
    page.shot("session-notes")


@LAYOUT
def test_e4_dropped_and_constant_fields_are_named(page, site, tmp_path):
    sid, pid, dropped = e4_tuning(site.db, tmp_path)
    page.open(f"/problems/{pid}?session={sid}")
    title = page.tab.eval_on_selector("#tried-plot", "el => el.layout.xaxis.title.text")
    assert "1 failed" in title and f"{len(dropped)} dropped" in title, title
    page.open(f"/sessions/{sid}")
    page.tab.wait_for_function("() => document.querySelector('#parallel-plot').dataset.count")
    page.answered()
    constant = len(perffields.columns([dropped[0].perf_config])) - 1
    note = f"{constant} fields constant in all candidates, not drawn"
    assert note in page.tab.inner_text("#parallel-count")
    assert note in page.tab.inner_text("#importance-constant")
    axes = page.tab.eval_on_selector(
        "#parallel-plot", "el => el.data[0].dimensions.map(d => d.label)"
    )
    assert len(axes) == 2  # the one field that varies, and TFlops / best
    page.tab.locator("#parallel-plot").scroll_into_view_if_needed()
    page.shot("parallel-constant")
