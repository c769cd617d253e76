"""Hostile strings in the database are shown as text in a real Chromium (issue 23): a farm whose
text fields, and integer columns SQLite lets hold text, carry markup. On every page: no element
the data injected, no dialog, no script run, no link in a plot's legend or hover.

On all three backends (tests/conftest.py's module_db_url): the text columns everywhere, cut to
each column's length on the servers; text in the integer columns on SQLite only (the one backend
that stores it). The fixtures follow tests/test_web_browser.py; the farm page polls every
POLL_MS, so that a poll's re-rendering is seen without waiting long."""

from __future__ import annotations

import sqlite3

import pytest
import sqlalchemy as sa
from support import webroutes
from support.browser import Page, fixture_browser  # noqa: F401 (the browser fixture)
from support.webfarm import make, run_folder
from support.webserve import serving

from mlirtuna.db import Database
from mlirtuna.db.models import Base

pytestmark = pytest.mark.slow

IMG = '<img src=x id=pwned-img onerror="window.__pwned=1;alert(1)">'
SCRIPT = "<script id=pwned-script>window.__pwned=2;alert(2)</script>"
LINK = '<a id=pwned-link href="https://evil.example/">click</a>'
HOSTILE = f"{IMG}{SCRIPT}{LINK}"
POLL_MS = 200


def poison(path) -> dict[str, int]:
    """Hostile text in every field a page shows; one job made to look held by a worker."""
    with sqlite3.connect(path) as conn:
        conn.execute(
            "UPDATE session SET reason = ?, ticket = ?, arch_full = ?, rocm_v = ?, mlir_v = ?, "
            "num_cu = ?, num_chiplets = ?",
            (HOSTILE, HOSTILE[:64], HOSTILE, HOSTILE[:64], HOSTILE[:64], IMG, SCRIPT),
        )
        conn.execute("UPDATE result SET perf_config = ?", (HOSTILE,))
        conn.execute("UPDATE candidate SET perf_config = perf_config || ?", (HOSTILE,))
        conn.execute("UPDATE candidate SET error = ? WHERE error IS NOT NULL", (HOSTILE,))
        conn.execute("UPDATE attempt SET pid = ?, message = ?", (IMG, HOSTILE))
        job, session, problem = conn.execute(
            "SELECT id, session_id, problem_id FROM job ORDER BY id DESC LIMIT 1"
        ).fetchone()
        conn.execute(
            "UPDATE job SET state = 'running', gpu_id = ?, machine_name = ?, "
            "heartbeat_at = claimed_at, lease_expires_at = claimed_at WHERE id = ?",
            (SCRIPT, HOSTILE, job),
        )
        conn.execute("UPDATE job SET result = ?, reason = ?", (HOSTILE, HOSTILE))
    return {"job": job, "session": session, "problem": problem}


# The text columns a page shows, per table, on a database server (each cut to its length).
SERVER_TEXT = {
    "session": ("reason", "ticket", "arch_full", "rocm_v", "mlir_v"),
    "result": ("perf_config",),
    "attempt": ("message",),
    "job": ("result", "reason"),
}


def poison_server(db: Database) -> dict[str, int]:
    """poison() where columns have types: hostile text in every text column a page shows."""

    def fit(table: str, column: str) -> str:
        length = Base.metadata.tables[table].c[column].type.length
        return HOSTILE[:length] if length else HOSTILE

    joined = "CONCAT(perf_config, :h)" if db.backend == "mysql" else "perf_config || :h"
    concat = f"SUBSTR({joined}, 1, 255)"  # candidate.perf_config is VARCHAR(255)
    with db.engine.begin() as conn:
        for table, columns in SERVER_TEXT.items():
            sets = ", ".join(f"{c} = :{c}" for c in columns)
            conn.execute(sa.text(f"UPDATE {table} SET {sets}"), {c: fit(table, c) for c in columns})
        conn.execute(sa.text(f"UPDATE candidate SET perf_config = {concat}"), {"h": HOSTILE})
        conn.execute(
            sa.text("UPDATE candidate SET error = :h WHERE error IS NOT NULL"), {"h": HOSTILE}
        )
        job, session, problem = conn.execute(
            sa.text("SELECT id, session_id, problem_id FROM job ORDER BY id DESC LIMIT 1")
        ).one()
        conn.execute(
            sa.text(
                "UPDATE job SET state = 'running', machine_name = :m, heartbeat_at = claimed_at, "
                "lease_expires_at = claimed_at WHERE id = :j"
            ),
            {"m": fit("job", "machine_name"), "j": job},
        )
    return {"job": job, "session": session, "problem": problem}


@pytest.fixture(scope="module")
def hostile(browser, module_db_url, tmp_path_factory):
    tmp = tmp_path_factory.mktemp("hostile")
    db_url = module_db_url
    db = Database(db_url)
    farm = make(db, tmp, run_folder(tmp_path_factory))
    if db.is_sqlite:
        db.dispose()
        ids = poison(db_url.removeprefix("sqlite:///"))
    else:
        ids = poison_server(db)
        db.dispose()
    with serving(db_url, poll_ms=POLL_MS) as url:
        yield browser, url, farm, ids


# The pages that draw no plot, and those that need not show the farm's text (the API's own
# description; the compare page's tables hold numbers and ids, its winners' configs at most).
# A page added later is walked too (tests/support/webroutes.py) and fails until it is placed.
NO_PLOTS = {"/", "/sessions", "/workers", "/api", "/jobs/{job_id}"}  # the first three: the farm
NO_FARM_TEXT = {"/api", "/compare"}


def test_every_page_shows_hostile_data_as_text(hostile, module_db_url):
    browser, url, farm, ids = hostile
    values = {
        "session_id": [str(farm.gpu), str(farm.failed), str(ids["session"])],
        "problem_id": str(farm.problems[0]), "session": str(farm.gpu),
        "job_id": str(ids["job"]), "a": str(farm.cpu_a), "b": str(farm.gpu),
    }  # fmt: skip
    pages = [(r, path) for r in webroutes.of_dashboard(module_db_url) if r.page
             for path in r.urls(values)]  # fmt: skip
    assert len(pages) >= 10
    for route, path in pages:
        page = Page(browser, url)
        dialogs: list[str] = []
        page.tab.on("dialog", lambda d, seen=dialogs: (seen.append(d.message), d.dismiss()))
        page.open(path)  # every answer the page asked for, drawn, plots too
        if path == "/":
            page.refreshed(3)  # the farm page, drawn again by two polls
        # Where a page has plots, plotly drew them: the hostile text went through its legends
        # and hovers too.
        assert (page.plots_drawn() > 0) != (route.path in NO_PLOTS), path
        # `*|href`: plotly draws a legend's or hover's link in SVG, as xlink:href.
        injected = page.tab.evaluate(
            "() => [...document.querySelectorAll('#pwned-img, #pwned-script, #pwned-link, "
            'img[src=x], a[href^="https://evil"], a[*|href^="https://evil"]\')].length'
        )
        assert injected == 0, path
        assert page.tab.evaluate("() => window.__pwned === undefined"), path
        assert dialogs == [], path
        assert "<img src=x" in page.tab.inner_text("body") or route.path in NO_FARM_TEXT, path
        page.errors = [e for e in page.errors if "Failed to load resource" not in e]
        page.close()  # no console error (a CSP violation is one)
