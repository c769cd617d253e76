"""The dashboard's browser tests: Debian's Chromium driven by Playwright's Python API (no browser
download). Importing this skips the importing test module when either is missing.

Two fixtures a test module imports when it wants them: `browser` (fixture_browser), one
Chromium for the module; `page` (served_page), a tab on `mlirtuna serve` over the test's database
once the module's own `farm` fixture has filled it."""

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
        assert self.errors == [], self.errors
        self.tab.close()


@pytest.fixture(scope="module", name="browser")
def fixture_browser():
    """One Chromium for the test module; each test opens its own tabs (Page)."""
    with sync_api.sync_playwright() as p:
        chromium = p.chromium.launch(executable_path=CHROMIUM, args=["--no-sandbox"])
        yield chromium
        chromium.close()


@pytest.fixture(name="page")
def served_page(browser, db_url, farm) -> Iterator[Page]:
    """A tab on `mlirtuna serve` over the test's database, started after the test module's
    `farm` fixture has filled it; closing it checks the console stayed clean."""
    with serving(db_url) as url:
        tab = Page(browser, url)
        yield tab
        tab.close()
