"""The dashboard refuses what it cannot answer (400, never a 500), answers only loopback Host
names, sends its security headers, and leaves a SQLite file as it found it (issue 23)."""

from __future__ import annotations

import hashlib
import re
import sqlite3
from pathlib import Path

import pytest
from fastapi.testclient import TestClient
from support import webroutes
from support.clitools import cli
from support.webfarm import Farm, make, run_folder

from mlirtuna.db import Database
from mlirtuna.web.app import MAX_INT, create_app, open_read_only

# The farm is tuned for real once per test run and backend, then copied (tests/support/webfarm.py):
# cheap enough for the quick loop on SQLite (it cost the quick loop 34 s when each of its
# processes tuned one).
pytestmark = pytest.mark.backends(fast=("sqlite",))

TEMPLATES = Path(__file__).parent.parent / "src" / "mlirtuna" / "web" / "templates"


@pytest.fixture
def farm(db: Database, tmp_path, tmp_path_factory) -> Farm:
    return make(db, tmp_path, run_folder(tmp_path_factory))


@pytest.fixture
def client(db_url, farm):
    ro = open_read_only(db_url)
    yield TestClient(create_app(ro), base_url="http://127.0.0.1")
    ro.dispose()


# Past what any column holds: an integer beyond 64 bits, one of exactly 2**63, and text longer
# than any text column (httpx's own limit on a URL: 64 KiB).
OUT_OF_RANGE = {
    "integer": ("99999999999999999999", str(2**63), f"-{2**63}"),
    "text": ("x" * 60_000,),
}


def test_every_parameter_of_every_route_out_of_range_is_400(client, farm, db):
    """Each integer parameter of each route (ids, offsets, limits) and each text one, out of
    range with the others real: 400 with an error, never a 500 (tests/support/webroutes.py:
    a route added later is covered too)."""
    values = webroutes.farm_values(farm, webroutes.first_job(db, farm.cpu_a))
    answered, asked = [], 0
    for route in webroutes.routes(client.app):
        for p in route.params:
            for bad in OUT_OF_RANGE["integer" if p.integer else "text"]:
                url = route.url(values, **{p.name: bad})
                res, asked = client.get(url), asked + 1
                if res.status_code != 400 or (not route.page and "error" not in res.json()):
                    answered.append((url[:100], res.status_code, res.text[:200]))
    assert answered == []
    assert asked > 100  # every route's parameters were walked


def test_large_numbers_within_range_are_answered_not_crashed(client, farm):
    # Up to MAX_INT: every backend compares them with its own (32-bit on servers) columns.
    big = MAX_INT
    assert client.get(f"/api/sessions/{big}").status_code == 404
    assert client.get(f"/api/jobs/{big}").status_code == 404
    assert client.get(f"/api/sessions/{big + 1}").status_code == 400
    # The compare page takes its ids as text (it explains a bad one): out of range, still 400.
    assert client.get(f"/compare?a=99999999999999999999&b={farm.cpu_a}").status_code == 400
    res = client.get(f"/api/sessions?offset={big}&limit={big}")
    assert res.status_code == 200 and res.json()["sessions"] == []
    res = client.get(f"/api/sessions/{farm.cpu_a}/winners?offset={big}&q={'x' * 900}")
    assert res.status_code == 200 and res.json()["rows"] == []


def test_security_headers_on_every_answer(client, farm, db):
    values = webroutes.farm_values(farm, webroutes.first_job(db, farm.cpu_a))
    paths = [route.url(values) for route in webroutes.routes(client.app)]
    for path in [*paths, "/static/app.js", "/nowhere"]:
        res = client.get(path)
        csp = res.headers["content-security-policy"]
        script = re.search(r"script-src ([^;]*)", csp).group(1)
        assert script == "'self'" and "frame-ancestors 'none'" in csp, path
        assert res.headers["x-frame-options"] == "DENY"
        assert res.headers["x-content-type-options"] == "nosniff"


def test_no_inline_script_in_any_template():
    for page in TEMPLATES.glob("*.html"):
        text = page.read_text()
        for tag in re.findall(r"<script[^>]*>", text):
            assert "src=" in tag, (page.name, tag)
        assert not re.search(r"\son[a-z]+\s*=", text), page.name  # no inline handlers
        assert "|safe" not in text.replace(" ", ""), page.name


def test_only_loopback_hosts_unless_allowed(db_url, farm):
    ro = open_read_only(db_url)
    try:
        app = create_app(ro)
        for host, status in [("127.0.0.1:8765", 200), ("localhost", 200), ("[::1]:8765", 200),
                             ("evil.example", 400), ("evil.example:8765", 400),
                             ("127.0.0.1.evil.example", 400), ("", 400)]:  # fmt: skip
            res = TestClient(app).get("/api/sessions", headers={"host": host})
            assert res.status_code == status, host
        allowed = TestClient(create_app(ro, allow_hosts=["Farm.Example"]))
        assert allowed.get("/api/sessions", headers={"host": "farm.example:80"}).status_code == 200
    finally:
        ro.dispose()


def test_api_docs_are_off(client):
    assert client.get("/api/docs").status_code == 404
    assert client.get("/api/openapi.json").status_code == 200  # local JSON, no script


def test_a_public_host_needs_an_explicit_flag(db_url, farm):
    run = cli(db_url, "serve", "--host", "0.0.0.0", "--port", "1")
    assert run.code == 2 and "--public" in run.stderr and len(run.stderr.splitlines()) == 1


def test_serving_a_sqlite_file_changes_nothing(tmp_path):
    path = tmp_path / "t.db"
    Database(f"sqlite:///{path}").dispose()  # a schema, in WAL mode
    with sqlite3.connect(path) as conn:
        assert conn.execute("PRAGMA journal_mode=DELETE").fetchone()[0] == "delete"
    before = hashlib.sha256(path.read_bytes()).hexdigest()
    ro = open_read_only(f"sqlite:///{path}")
    try:
        assert (
            TestClient(create_app(ro), base_url="http://localhost").get("/api/sessions").is_success
        )
    finally:
        ro.dispose()
    with sqlite3.connect(path) as conn:
        assert conn.execute("PRAGMA journal_mode").fetchone()[0] == "delete"
    assert hashlib.sha256(path.read_bytes()).hexdigest() == before
    assert sorted(p.name for p in tmp_path.iterdir()) == ["t.db"]  # no -wal, no -shm
