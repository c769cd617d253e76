"""Views of a tuning over candidates recorded through the queue as a worker records them, on
every backend: the parameter importance (/api/sessions/ID/importance: TFlops that one
perf-config field drives; that field ranks first; sklearn stays out of the CLI's import) and
rocMLIR E4's dropped candidates (apart from the invalid ones)."""

from __future__ import annotations

import itertools
import subprocess
import sys

import pytest
from fastapi.testclient import TestClient
from support.e4tuning import e4_tuning

from mlirtuna import catalog, queue, sessions
from mlirtuna.db import Database
from mlirtuna.history import perffields
from mlirtuna.problems import ExpandOptions
from mlirtuna.queue import jobs
from mlirtuna.sessions import SessionSpec
from mlirtuna.tuners.base import Candidate, TuneOutcome
from mlirtuna.web import explore, importance
from mlirtuna.web.app import create_app, open_read_only

GEMMS = "".join(
    f"-t {t} -out_datatype {t} -transA false -transB false -g 1 -m {m} -n 64 -k 64\n"
    for t, m in (("f32", 32), ("f32", 64), ("f16", 32))
)
SIZES = (16, 32, 64, 128)


def tflops(m: int, n: int, k: int, scale: float) -> float:
    """kPerBlock drives it (x8 from the smallest to the largest); m and n barely move it."""
    return scale * (k / 16) * (1 + 0.01 * (m % 3) + 0.01 * (n % 5))


@pytest.fixture
def tuned(db: Database, tmp_path) -> int:
    path = tmp_path / "gemms"
    path.write_text(GEMMS)
    catalog.import_files(db, "gemm", [str(path)], ExpandOptions(expand=False), tag="imp")
    sid = sessions.create(db, SessionSpec(tuner="cpu", tuning_space="full")).id
    jobs.load(db, sid, tag="imp")
    who = queue.Claimant("h", -1, 1)
    for scale in (1.0, 3.0, 0.5):  # the problems' best differ: the score is over each one's best
        lease = queue.claim(db, sid, who, 60)
        assert lease is not None
        found = [
            Candidate(f"cpu:v1:{m},{n},{k}", 1e6 / tflops(m, n, k, scale), tflops(m, n, k, scale))
            for m, n, k in itertools.product(SIZES, SIZES, SIZES)
        ]
        found.append(Candidate("cpu:v1:8,8,8", error="out of registers"))
        best = max((c for c in found if c.valid), key=lambda c: c.tflops or 0.0)
        assert queue.record(db, lease, TuneOutcome(found, best))
    assert queue.claim(db, sid, who, 60) is None
    return sid


@pytest.fixture
def client(db_url, tuned) -> TestClient:
    ro = open_read_only(db_url)
    yield TestClient(create_app(ro), base_url="http://127.0.0.1")
    ro.dispose()


def test_the_field_that_drives_tflops_ranks_first(client, db, tuned):
    res = client.get(f"/api/sessions/{tuned}/importance?op=gemm")
    assert res.status_code == 200, res.text
    imp = res.json()
    every = len(SIZES) ** 3 * 3
    assert imp["total"] == imp["rows"] == every == explore.parallel(db, tuned, "gemm").total
    assert imp["fields"][0] == "kPerBlock"
    assert sorted(imp["fields"]) == ["kPerBlock", "mPerBlock", "nPerBlock"]
    assert imp["importance"][0] > 0.9 and sum(imp["importance"]) == pytest.approx(1.0)
    assert imp["importance"] == sorted(imp["importance"], reverse=True)
    assert imp["r2"] > 0.9 and "impurity" in imp["method"]
    # One data type: the same selection as the parallel coordinates.
    f16 = client.get(f"/api/sessions/{tuned}/importance?op=gemm&data_type=f16").json()
    assert f16["rows"] == len(SIZES) ** 3 and f16["fields"][0] == "kPerBlock"
    # Fixed seed: the same answer twice.
    assert importance.importance(db, tuned, "gemm").importance == imp["importance"]


def test_nothing_to_fit_and_bad_input(client, tuned):
    none = client.get(f"/api/sessions/{tuned}/importance?op=conv").json()
    assert none["rows"] == 0 and none["fields"] == [] and none["r2"] is None
    res = client.get(f"/api/sessions/{tuned}/importance?op=nope")
    assert res.status_code == 400 and "unknown op" in res.json()["error"]
    assert client.get("/api/sessions/999999/importance?op=gemm").status_code == 404


def test_the_cli_does_not_import_sklearn():
    code = "import sys, mlirtuna.cli, mlirtuna.web.routes; print('sklearn' in sys.modules)"
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, check=True)
    assert out.stdout.strip() == "False"


def test_dropped_candidates_are_not_invalid(client, db, tmp_path):
    sid, pid, dropped = e4_tuning(db, tmp_path)
    c = client.get(f"/api/problems/{pid}/candidates?session={sid}").json()
    assert len(c["valid"]) == 3 and len(c["dropped"]) == 2 and len(c["invalid"]) == 1
    assert c["invalid_reasons"] == {"not applicable (N/A)": 1}
    table = f"/api/problems/{pid}/table?session={sid}"
    assert client.get(f"{table}&show=invalid").json()["total"] == 1
    rows = client.get(f"{table}&show=dropped").json()["rows"]
    assert {r["perf_config"] for r in rows} == {d.perf_config for d in dropped}
    assert all(r["dropped"] and not r["remeasured"] for r in rows)
    every = client.get(table).json()
    assert every["total"] == 6 and sum(r["dropped"] for r in every["rows"]) == 2


def test_the_history_tells_dropped_candidates_from_failed_ones(client, db, tmp_path):
    """Issue 44 §3: E4's "Discarded" candidates were counted as failed under the history plot."""
    sid, pid, dropped = e4_tuning(db, tmp_path)
    h = client.get(f"/api/problems/{pid}/history?session={sid}").json()
    assert h["total"] == 6 and len(h["dropped"]) == len(h["index"]) == 6
    gone = [c for c, d in zip(h["perf_configs"], h["dropped"], strict=True) if d]
    assert gone == [d.perf_config for d in dropped]
    failed = [c for c, t, d in zip(h["perf_configs"], h["tflops"], h["dropped"], strict=True)
              if t is None and not d]  # fmt: skip
    assert failed == ["v4:8,8,4,16,16,16,4,1,1,0,1,1,1,1"]


def test_constant_fields_are_left_out_and_named(client, db, tuned, tmp_path):
    """Issue 44 §3: a field with one value in every candidate was drawn as an axis over an
    invented range; the parallel coordinates and the importance leave it out and name it."""
    sid, _, _ = e4_tuning(db, tmp_path)
    every = perffields.columns(["v4:16,16,4,16,16,16,4,1,1,0,1,1,1,1"])
    p = client.get(f"/api/sessions/{sid}/parallel?op=gemm").json()
    assert list(p["axes"]) == every[:1]  # only the first field varies (16, 32, 64)
    assert p["constant"] == every[1:] and len(every) > 10
    imp = client.get(f"/api/sessions/{sid}/importance?op=gemm").json()
    assert imp["fields"] == every[:1] and imp["constant"] == every[1:]
    # The CPU tuning: every field varies, none is left out.
    assert client.get(f"/api/sessions/{tuned}/parallel?op=gemm").json()["constant"] == []


def test_farm_ops_follow_a_second_load(client, db, tmp_path):
    """The farm page keeps each session's ops while its job count stays (web/farm.py): a load
    of another op changes the count and the row."""
    for op, line in (
        ("gemm", "-t f32 -out_datatype f32 -transA false -transB false -g 1 -m 8 -n 8 -k 8"),
        ("conv", "conv -F 1 -f NCHW -I NCHW -O NCHW -n 1 -c 8 -H 8 -W 8 -k 8 -y 1 -x 1"),
    ):
        path = tmp_path / op
        path.write_text(line + "\n")
        catalog.import_files(db, op, [str(path)], ExpandOptions(expand=False), tag=f"ops-{op}")
    sid = sessions.create(db, SessionSpec(tuner="cpu")).id

    def ops() -> list[str]:
        rows = client.get("/api/farm").json()["sessions"]
        (row,) = [r for r in rows if r["session"]["id"] == sid]
        assert client.get(f"/api/sessions/{sid}").json()["ops"] == row["ops"]
        return row["ops"]

    assert ops() == []
    jobs.load(db, sid, tag="ops-gemm")
    assert ops() == ops() == ["gemm"]
    jobs.load(db, sid, tag="ops-conv")
    assert ops() == ["conv", "gemm"]


def test_farm_ops_of_a_database_made_again_at_the_same_url(tmp_path):
    """The ops the farm page keeps belong to one dashboard's database handle: a database made
    again at the same URL numbers its sessions from 1 again, with other ops."""
    url = f"sqlite:///{tmp_path / 'again.db'}"
    for op, line in (
        ("gemm", "-t f32 -out_datatype f32 -transA false -transB false -g 1 -m 8 -n 8 -k 8"),
        ("conv", "conv -F 1 -f NCHW -I NCHW -O NCHW -n 1 -c 8 -H 8 -W 8 -k 8 -y 1 -x 1"),
    ):
        (tmp_path / "again.db").unlink(missing_ok=True)
        db = Database(url, create=True)
        (tmp_path / op).write_text(line + "\n")
        catalog.import_files(db, op, [str(tmp_path / op)], ExpandOptions(expand=False), tag=op)
        sid = sessions.create(db, SessionSpec(tuner="cpu")).id
        jobs.load(db, sid, tag=op)
        db.dispose()
        ro = open_read_only(url)
        (row,) = (
            TestClient(create_app(ro), base_url="http://127.0.0.1")
            .get("/api/farm")
            .json()["sessions"]
        )
        assert (row["session"]["id"], row["ops"]) == (1, [op])
        ro.dispose()
