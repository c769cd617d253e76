"""A row whose stored type is wrong never makes a page answer 500 (issue 34 M12/M13).

SQLite keeps what it is given: text in a REAL column (a candidate's or a result's TFlops, a
kernel time), or a perf config with a 400-digit field. /parallel, /importance, the candidates
and /compare read such a database with the rows skipped or flagged, and answer 200. SQLite
only: the servers refuse text in a REAL column when it is written."""

from __future__ import annotations

import sqlite3

import pytest
from fastapi.testclient import TestClient
from support.webfarm import make, run_folder

from mlirtuna.web.app import create_app, open_read_only

HUGE = "9" * 400


@pytest.fixture
def poisoned(db, db_url, tmp_path, tmp_path_factory):
    if db.backend != "sqlite":
        pytest.skip("only SQLite stores text in a REAL column")
    farm = make(db, tmp_path, run_folder(tmp_path_factory))
    path = db_url.removeprefix("sqlite:///")
    with sqlite3.connect(path) as conn:
        first, second = conn.execute(
            "SELECT id FROM candidate WHERE session_id = ? AND error IS NULL ORDER BY id LIMIT 2",
            (farm.cpu_a,),
        ).fetchall()
        conn.execute("UPDATE candidate SET tflops = 'fast', kernel_time = 'x' WHERE id = ?", first)
        conn.execute(  # M13: a field no integer column, nor float(), holds
            "UPDATE candidate SET perf_config = 'cpu:v1:' || ? || ',64,32' WHERE id = ?",
            (HUGE, second[0]),
        )
        conn.execute(
            "UPDATE result SET tflops = 'fast', kernel_time = 'slow' WHERE id = "
            "(SELECT min(id) FROM result WHERE session_id = ?)",
            (farm.cpu_b,),
        )
        problem = conn.execute("SELECT problem_id FROM candidate WHERE id = ?", first).fetchone()[0]
    ro = open_read_only(db_url)
    yield farm, problem, TestClient(create_app(ro), base_url="http://127.0.0.1")
    ro.dispose()


def test_pages_over_rows_of_the_wrong_type_answer(poisoned):
    farm, problem, client = poisoned
    paths = [
        f"/api/sessions/{farm.cpu_a}/parallel?op=gemm",
        f"/api/sessions/{farm.cpu_a}/importance?op=gemm",
        f"/api/problems/{problem}/candidates?session={farm.cpu_a}",
        f"/api/compare?a={farm.cpu_a}&b={farm.cpu_b}",
        f"/compare?a={farm.cpu_a}&b={farm.cpu_b}",
        f"/problems/{problem}?session={farm.cpu_a}",
        f"/api/sessions/{farm.cpu_b}/winners",
        f"/api/sessions/{farm.cpu_b}/tflops",
        f"/sessions/{farm.cpu_b}",
        f"/api/problems/{problem}/table?session={farm.cpu_a}",
        f"/api/problems/{problem}/trend",
    ]
    for path in paths:
        res = client.get(path)
        assert res.status_code == 200, (path, res.text[:500])
    drawn = client.get(f"/api/sessions/{farm.cpu_a}/parallel?op=gemm").json()
    assert not any(HUGE in pc for pc in drawn["perf_configs"])  # skipped, not drawn
    assert all(isinstance(s, float) for s in drawn["score"])
    listed = client.get(f"/api/problems/{problem}/candidates?session={farm.cpu_a}").json()
    assert all(isinstance(c["tflops"], float | None) for c in listed["valid"] + listed["invalid"])
