"""The dashboard's browser tests: Debian's Chromium driven by Playwright's Python API (no browser
download). Importing this skips the importing test module when either is missing.

Two fixtures a test module imports when it wants them: `browser` (fixture_browser), one
Chromium for the module; `page` (served_page), a tab on the dashboard (support/webserve.py) over
the test's database once the module's own `farm` fixture has filled it.

Chromium keeps one profile per test process (under pytest's base temp): the pages that draw load
a 5 MB plotly bundle, and V8 compiles it again each time (1.5 s of CPU on a loaded host) unless
the profile's code cache holds it, which only a persistent profile keeps; with it a page loads
in 0.2 s from its third load on."""

from __future__ import annotations

import os
import shutil
from collections.abc import Iterator
from pathlib import Path

import pytest

from support.webserve import serving

CHROMIUM = (
    os.environ.get("MLIRTUNA_TEST_CHROMIUM") or shutil.which("chromium") or "/usr/bin/chromium"
)
SHOTS = Path(__file__).parent.parent / "screenshots"  # tests/screenshots, not committed
VIEWPORT = {"width": 1280, "height": 800}

if not Path(CHROMIUM).is_file():
    pytest.skip(
        f"browser tests skipped: no Chromium at {CHROMIUM} (apt-get install chromium)",
        allow_module_level=True,
    )
sync_api = pytest.importorskip("playwright.sync_api", reason="browser tests need playwright")


# Run in each tab before the page's own scripts: counts the page's fetches until their answers
# are read (app.js's api() reads each one whole, then draws it in the same turn of the event
# loop), so a test can wait for "every answer drawn" instead of for a quiet network. Playwright's
# "networkidle" is no such thing: it fires after 500 ms without requests, which a page's first
# load can reach before app.js has asked for anything (while V8 compiles plotly), and a farm page
# polling more often than that never reaches.
COUNT_FETCHES = """(() => {
    let pending = 0;
    const fetch = window.fetch;
    window.fetch = (...args) => {
        pending++;
        let done = false;
        const settle = () => { if (!done) { done = true; pending--; } };
        return fetch(...args).then((res) => {
            for (const read of ["json", "text"]) {
                const whole = res[read].bind(res);
                res[read] = () => whole().finally(settle);
            }
            return res;
        }, (err) => { settle(); throw err; });
    };
    Object.defineProperty(window, "fetchesPending", { get: () => pending });
})();"""


class Page:
    """A Chromium tab that records every console error and uncaught exception."""

    def __init__(self, browser, base: str) -> None:
        self.base = base
        self.tab = browser.new_page()
        self.tab.add_init_script(COUNT_FETCHES)
        self.errors: list[str] = []
        self.tab.on("console", lambda m: m.type == "error" and self.errors.append(m.text))
        self.tab.on("pageerror", lambda e: self.errors.append(str(e)))

    def open(self, path: str) -> None:
        """Load the page, then wait until it is drawn: every answer it asked for, its plots."""
        response = self.tab.goto(self.base + path)
        assert response is not None and response.status == 200, path
        self.answered()
        self.plots_drawn()

    def answered(self) -> None:
        """Wait until every fetch the page has made is answered and drawn. After `goto` (the
        load event, so app.js has asked for what its page shows) that is the whole page."""
        self.tab.wait_for_function("() => window.fetchesPending === 0")

    def refreshed(self, times: int) -> None:
        """Wait until the farm page has drawn `times` answers: the one it asked for on loading,
        then one per poll."""
        self.tab.wait_for_function(f"() => Number(document.body.dataset.updated) >= {times}")

    def plots_drawn(self) -> int:
        """Wait until plotly has drawn every plot it was given (it clears _replotting at the
        end of a draw); how many plots the page holds."""
        self.tab.wait_for_function(
            """() => [...document.querySelectorAll('.js-plotly-plot')].every(el =>
                el._fullLayout && el._fullLayout._replotting === false
                && el.querySelector('.main-svg'))""",
            polling="raf",
        )
        return self.tab.eval_on_selector_all(".js-plotly-plot", "els => els.length")

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

    def drawn(self, element: str) -> int:
        """How many pixels the element's WebGL canvases hold (plotly draws parcoords there), after
        checking that plotly did not fall back to its "WebGL is not supported" notice (what the
        page shows when the CSP blocks plotly's shader compiler). 0: nothing was drawn."""
        no_webgl = self.tab.eval_on_selector_all(
            f"{element} .no-webgl", "els => els.map(e => e.innerText)"
        )
        assert no_webgl == [], no_webgl
        assert "WebGL is not supported" not in self.tab.inner_text(element)
        return self.tab.eval_on_selector(
            element,
            """el => [...el.querySelectorAll('canvas.gl-canvas')].reduce((sum, c) => {
                const copy = document.createElement('canvas');
                copy.width = c.width; copy.height = c.height;
                const ctx = copy.getContext('2d');
                ctx.drawImage(c, 0, 0);
                const px = ctx.getImageData(0, 0, c.width, c.height).data;
                let n = 0;
                for (let i = 3; i < px.length; i += 4) if (px[i] > 0) n++;
                return sum + n;
            }, 0)""",
        )

    def shot(self, name: str) -> None:
        SHOTS.mkdir(exist_ok=True)
        self.tab.screenshot(path=str(SHOTS / f"{name}.png"))

    def close(self) -> None:
        # Closed before the check: a tab left open by a failed check would go on polling the
        # next test's dashboard (every dashboard of a test process has one origin, webserve.py).
        self.tab.close()
        assert self.errors == [], self.errors


@pytest.fixture(scope="module", name="browser")
def fixture_browser(tmp_path_factory):
    """One Chromium for the test module, on the test process's profile (modules run one after
    another in a process, so one profile is never opened twice at once); each test opens its
    own tabs (Page)."""
    profile = tmp_path_factory.getbasetemp() / "chromium-profile"
    with sync_api.sync_playwright() as p:
        chromium = p.chromium.launch_persistent_context(
            profile, executable_path=CHROMIUM, args=["--no-sandbox"], viewport=VIEWPORT
        )
        for blank in chromium.pages:  # the tab a persistent context opens with
            blank.close()
        yield chromium
        chromium.close()


@pytest.fixture(name="page")
def served_page(browser, db_url, farm) -> Iterator[Page]:
    """A tab on the dashboard of the test's database (served from this process), started after
    the test module's `farm` fixture has filled it; closing it checks the console stayed clean."""
    with serving(db_url) as url:
        tab = Page(browser, url)
        yield tab
        tab.close()
