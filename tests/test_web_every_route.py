"""Every route of the dashboard answers over rows SQLite let through of the wrong type (issue 43
§3): text in every timestamp column (`session.created_at = 'yesterday'`) and in the TFlops and
time columns. The routes are read from the FastAPI app itself, so a route added later is tested
too (tests/support/webroutes.py); path and query parameters are filled with the farm's real
ids. SQLite only: the servers refuse text in a DATETIME or REAL column when it is written."""

from __future__ import annotations

import sqlite3

import pytest
from fastapi.testclient import TestClient
from support import webroutes
from support.webfarm import make, run_folder

from mlirtuna.web.app import create_app, open_read_only

pytestmark = pytest.mark.backends("sqlite")

TIMESTAMPS = {
    "session": ("created_at", "retired_at"),
    "problem": ("created_at",),
    "job": ("compile_start", "compile_end", "lease_expires_at", "heartbeat_at", "claimed_at",
            "finished_at", "not_before"),
    "attempt": ("claimed_at", "ended_at"),
    "result": ("tuned_at",),
}  # fmt: skip
NUMBERS = {
    "result": ("tflops", "kernel_time"),
    "candidate": ("tflops", "kernel_time", "time_min", "time_iqr"),
}


def poison(path: str) -> None:
    """Text in every timestamp and number column the pages read; one job looks held."""
    with sqlite3.connect(path) as conn:
        conn.execute(  # a worker holds it: /api/workers and the farm page read its times
            "UPDATE job SET state = 'running', lease_token = 'tok' "
            "WHERE id = (SELECT min(id) FROM job)"
        )
        for table, columns in TIMESTAMPS.items():
            conn.execute(f"UPDATE {table} SET {', '.join(f'{c} = ?' for c in columns)}",
                         ("yesterday",) * len(columns))  # fmt: skip
        for table, columns in NUMBERS.items():
            conn.execute(f"UPDATE {table} SET {', '.join(f'{c} = ?' for c in columns)}",
                         ("fast",) * len(columns))  # fmt: skip


@pytest.fixture
def hostile(db, db_url, tmp_path, tmp_path_factory):
    farm = make(db, tmp_path, run_folder(tmp_path_factory))
    path = db_url.removeprefix("sqlite:///")
    with sqlite3.connect(path) as conn:
        job = conn.execute("SELECT min(id) FROM job WHERE session_id = ?", (farm.cpu_a,))
        job_id = job.fetchone()[0]
    poison(path)
    ro = open_read_only(db_url)
    app = create_app(ro)
    yield (
        app,
        webroutes.farm_values(farm, job_id),
        TestClient(app, base_url="http://127.0.0.1", raise_server_exceptions=False),
    )
    ro.dispose()


def test_every_route_answers_over_text_in_timestamp_and_number_columns(hostile):
    app, values, client = hostile
    failed = []
    for route in webroutes.routes(app):
        res = client.get(route.url(values))
        if res.status_code != 200:
            failed.append((route.path, res.status_code, res.text[:200]))
    assert not failed
