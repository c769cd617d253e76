"""Export to perfRunner's tuning DB, checked with an independent perfRunner-style reader."""

from __future__ import annotations

import json
import re

import sqlalchemy as sa
from support.clitools import cli
from support.perfrunner_reader import read_tuning_db
from support.results import FULL, gemm, m_of, new_session, put_results, tune

from mlirtuna.db.models import NEW, Job, Result
from mlirtuna.formats import tuningdb
from mlirtuna.history import export
from mlirtuna.history.export import ExportQuery
from mlirtuna.problems import parse

# Literal from rocMLIR's tests/test_tuningRunner.py (rocmlir-interfaces §1d).
V3_HEADER = (
    "# arch\tnumCUs\tnumChiplets\ttestVector\tperfConfig\tTFlops\ttuningSpace\tcommitId"
    "\ttimestamp\tdurationSec"
)
VECTORS = [gemm(m) for m in (16, 32, 64, 128)]


def perfrunner_key(config_line: str) -> str:
    """What perfRunner looks up: from_command_line(...).to_command_line() of a config line."""
    return parse("gemm", config_line).canonical()


def test_v3_round_trips_through_perfrunner_reader(db, db_url, tmp_path):
    sid = new_session(db)
    tune(db, tmp_path, sid, VECTORS, perf=m_of)
    out = tmp_path / "mlir_tuning_gfx942.tsv"
    run = cli(db_url, "export", "--arch", "gfx942", "-o", str(out))
    assert run.code == 0, run.stderr
    lines = out.read_text().splitlines()
    assert lines[0] == V3_HEADER and len(lines) == 1 + len(VECTORS)
    # Config lines as a user writes them (other flag order): perfRunner canonicalizes them.
    asked = [
        f"-transA false -transB false -t f32 -g 1 -m {m} -n 64 -k 32" for m in (16, 32, 64, 128)
    ]
    for version in ("2219", "00267dbf"):
        found = read_tuning_db(str(out), version=version)
        if version == "00267dbf":
            assert found == {}  # E2's reader knows 3-5 fields only: a v3 file is not for it
            continue
        for line in asked:
            assert found[FULL, perfrunner_key(line)] == m_of(perfrunner_key(line))
    keyed = read_tuning_db(str(out), version="2248")
    for line in asked:
        assert keyed[FULL, 304, 8, perfrunner_key(line)] == m_of(perfrunner_key(line))
    for row in tuningdb.read_tuning_db(out).rows:
        assert row.tuning_space == "full" and row.commit_id == "abc123"
        assert re.fullmatch(r"\d{4}-\d\d-\d\dT\d\d:\d\d:\d\dZ", row.timestamp)
        assert row.duration_s is not None and row.duration_s >= 0 and row.tflops > 0


def test_v2_is_read_by_the_e2_reader(db, db_url, tmp_path):
    sid = new_session(db, space="exhaustive")
    tune(db, tmp_path, sid, VECTORS, perf=m_of)
    out = tmp_path / "v2.tsv"
    assert cli(db_url, "export", "--arch", FULL, "--format", "v2", "-o", str(out)).code == 0
    lines = out.read_text().splitlines()
    assert lines[0] == "# arch\tnumCUs\ttestVector\tperfConfig\tTFlops (exhaustive)"
    for version in ("00267dbf", "2219"):
        found = read_tuning_db(str(out), version=version)
        assert {k[-1]: v for k, v in found.items()} == {v: m_of(v) for v in VECTORS}
        assert {k[0] for k in found} == {FULL}
    keyed = read_tuning_db(str(out), version="2248", fallback_num_chiplets=8)
    assert keyed[FULL, 304, 8, VECTORS[0]] == m_of(VECTORS[0])


def test_newest_matching_session_wins_per_problem(db, db_url, tmp_path):
    old = new_session(db)
    tune(db, tmp_path, old, VECTORS, perf=lambda tv: "old")
    new = new_session(db)
    tune(db, tmp_path, new, VECTORS[:2], perf=lambda tv: "new")
    out = tmp_path / "db.tsv"
    run = cli(db_url, "export", "--arch", "gfx942", "--json", "-o", str(out))
    assert run.code == 0 and run.json() == {"rows": 4, "sessions": [old, new], "format": "v3"}
    found = read_tuning_db(str(out), version="2219")
    assert [found[FULL, v] for v in VECTORS] == ["new", "new", "old", "old"]
    # Named sessions: only those; with several, the newest wins again.
    assert cli(db_url, "export", "--session", str(old), "-o", str(out)).code == 0
    assert set(read_tuning_db(str(out), version="2219").values()) == {"old"}
    run = cli(db_url, "export", "--session", str(new), "--session", str(old), "-o", str(out))
    assert run.code == 0
    found = read_tuning_db(str(out), version="2219")
    assert [found[FULL, v] for v in VECTORS] == ["new", "new", "old", "old"]


def test_arch_bare_or_full_and_context_filters(db, db_url, tmp_path):
    mi300x = new_session(db, num_cu=304)
    tune(db, tmp_path, mi300x, VECTORS[:1], perf=lambda tv: "x")
    mi308 = new_session(db, num_cu=80)
    put_results(db, mi308, {VECTORS[0]: ("y", 1.0)})
    out = tmp_path / "db.tsv"
    # Two contexts of gfx942 match: refusing beats mixing MI300X and MI308 rows in one file.
    mixed = cli(db_url, "export", "--arch", "gfx942", "-o", str(out))
    assert mixed.code == 2 and "--num-cu" in mixed.stderr and not out.exists()
    for arch in ("gfx942", FULL):
        assert cli(db_url, "export", "--arch", arch, "--num-cu", "80", "-o", str(out)).code == 0
        assert read_tuning_db(str(out)) == {(FULL, 80, 8, VECTORS[0]): "y"}
    none = cli(db_url, "export", "--arch", "gfx90a", "-o", str(out))
    assert none.code == 2 and "no session matches arch gfx90a" in none.stderr
    assert none.stderr.count("\n") == 1
    wrong = cli(db_url, "export", "--arch", "gfx90a", "--session", str(mi300x), "-o", str(out))
    assert wrong.code == 2 and f"session {mi300x}" in wrong.stderr


def test_quick_tuning_db_exports_the_same_way(db, db_url, tmp_path):
    full = new_session(db)
    tune(db, tmp_path, full, VECTORS, perf=lambda tv: "full")
    quick = new_session(db, space="quick")
    tune(db, tmp_path, quick, VECTORS, perf=lambda tv: "quick")
    out = tmp_path / "mlir_quick_tuning_gfx942.tsv"
    run = cli(db_url, "export", "--arch", "gfx942", "--tuning-space", "quick", "-o", str(out))
    assert run.code == 0
    assert set(read_tuning_db(str(out), version="2219").values()) == {"quick"}
    assert {r.tuning_space for r in tuningdb.read_tuning_db(out).rows} == {"quick"}
    run = cli(db_url, "export", "--arch", "gfx942", "--tuning-space", "full", "-o", str(out))
    assert set(read_tuning_db(str(out), version="2219").values()) == {"full"}


def test_stdout_and_atomic_file(db, db_url, tmp_path):
    sid = new_session(db, mlir_v="")
    tune(db, tmp_path, sid, VECTORS)
    run = cli(db_url, "export", "--arch", "gfx942", "-o", "-")
    assert run.code == 0 and run.stdout.splitlines()[0] == V3_HEADER
    assert len(run.stdout.splitlines()) == 5 and "4 rows" in run.stderr
    assert {r.commit_id for r in tuningdb.parse_tuning_db(run.stdout.splitlines(True)).rows} == {
        "unknown"
    }
    out = tmp_path / "keep.tsv"
    out.write_text("old content\n")
    failed = cli(db_url, "export", "--arch", "gfx942", "--op", "conv", "-o", str(out))
    assert failed.code == 2 and "no completed results" in failed.stderr
    assert out.read_text() == "old content\n"
    assert sorted(p.name for p in tmp_path.iterdir() if p.name.startswith(".mlirtuna")) == []
    assert cli(db_url, "export", "--arch", "gfx942", "-o", str(out)).code == 0
    assert out.read_text() == run.stdout


def test_only_completed_jobs_count(db, tmp_path):
    sid = new_session(db)
    tune(db, tmp_path, sid, VECTORS)
    with db.session() as s:  # a result whose job is not completed must not be exported
        job_id = s.scalar(
            sa.select(Job.id)
            .join(Result, Result.job_id == Job.id)
            .where(Job.session_id == sid)
            .order_by(Job.id)
            .limit(1)
        )
        s.execute(sa.update(Job).where(Job.id == job_id).values(state=NEW))
    done = export.render(db, ExportQuery(arch="gfx942"))
    assert done.rows == len(VECTORS) - 1


def test_t4_has_every_candidate_with_times_and_validity(db, db_url, tmp_path):
    sid = new_session(db)
    tune(db, tmp_path, sid, VECTORS[:2])
    out = tmp_path / "t4.json"
    assert cli(db_url, "export", "--session", str(sid), "--format", "t4", "-o", str(out)).code == 0
    doc = json.loads(out.read_text())
    assert doc["schema_version"] == "1.0.0" and len(doc["results"]) == 4
    enum = {"timeout", "compile", "runtime", "correctness", "constraints", "correct"}
    for r in doc["results"]:
        assert {"configuration", "times", "invalidity", "correctness"} <= set(r)
        assert r["invalidity"] in enum and isinstance(r["times"]["runtimes"], list)
        assert r["configuration"]["test_vector"] in VECTORS[:2]
        for m in r["measurements"]:
            assert set(m) == {"name", "value", "unit"}
    valid = [r for r in doc["results"] if r["invalidity"] == "correct"]
    invalid = [r for r in doc["results"] if r["invalidity"] != "correct"]
    assert len(valid) == 2 and all(r["times"]["runtimes"] == [0.1] for r in valid)  # 1e5 ns
    assert {r["invalidity"] for r in invalid} == {"constraints"}
    assert all(r["correctness"] == 0 and r["times"]["runtimes"] == [] for r in invalid)
    two = cli(
        db_url,
        "export",
        "--session",
        str(sid),
        "--session",
        str(sid + 1),
        "--format",
        "t4",
        "-o",
        str(out),
    )
    assert two.code == 2


def test_t4_invalidity_mapping():
    assert export.t4_invalidity("not applicable (rocmlir-tuning-driver: N/A)") == "constraints"
    assert export.t4_invalidity("wrong result: max rel err 1 > tol 0.1") == "correctness"
    assert export.t4_invalidity("compilation failed") == "compile"
    assert export.t4_invalidity("timed out after 30 s") == "timeout"
    assert export.t4_invalidity("kernel failed: ValueError") == "runtime"
