"""What the operator reads says what a person means (issue 44 §2): a worker's closing line,
workers without a GPU named by their role and number, the worker of an attempt on the job page
(never GPU -1), key notes of fusion modules only on a run that tuned fusion modules, and no path
of the host that opened a session in what the dashboard sends any reader."""

from __future__ import annotations

import json
from collections.abc import Iterator
from pathlib import Path

import pytest
import sqlalchemy as sa
from fastapi.testclient import TestClient
from support.clitools import cli, run_cli
from support.workers import job_states, make_session

from mlirtuna import sessions
from mlirtuna.db.models import Job, TuningSession
from mlirtuna.flow import RunPlan
from mlirtuna.sessions import SessionSpec
from mlirtuna.web.app import create_app, open_read_only
from mlirtuna.worker import WorkerSettings, WorkerStats, supervisor

FUSION = Path(__file__).parent / "data" / "fusion" / "mixr-gemm"
# The three mixr-gemm modules' tuning key: a plain gemm's test vector.
KEY = "-t f32 -out_datatype f32 -transA false -transB false -g 1 -m 5 -n 3 -k 4"


@pytest.fixture
def client(db_url) -> Iterator[TestClient]:
    ro = open_read_only(db_url)
    try:
        yield TestClient(create_app(ro), base_url="http://127.0.0.1")
    finally:
        ro.dispose()


def test_a_workers_closing_line_says_what_it_did():
    from mlirtuna.cli.workercmd import summary

    plain = summary(WorkerStats(completed=5, failed=1, released=2))
    assert plain == "5 completed, 1 failed, 0 lost leases, 2 given back"
    chained = summary(WorkerStats(completed=5, claimed_with_record=4))
    assert "with a record" not in chained
    assert chained.endswith(
        "; 4 of its jobs claimed in the same commit that recorded the job before (no round trip "
        "of their own)"
    )


def test_workers_without_a_gpu_are_named_by_role_and_number():
    compilers = supervisor.cpu_slots(2, compile=True)
    assert [s.label for s in compilers] == ["compile worker 1", "compile worker 2"]
    assert [s.label for s in supervisor.plan("auto", "cpu", 2)] == ["CPU worker 1", "CPU worker 2"]
    assert supervisor.Slot(3).label == "GPU 3" and supervisor.Slot(3).worker_name == "worker GPU 3"
    # The supervisor hands each worker its number: its own lines name it alike.
    argv = supervisor.worker_argv(WorkerSettings(session_id=1, role="compile"), compilers[1])
    assert argv[argv.index("--worker-number") + 1] == "2"


def test_cpu_workers_say_their_names_and_the_job_page_names_the_worker(db, db_url, tmp_path):
    sid = make_session(db, tmp_path, 4, tuner="sleep:0.01")
    run = run_cli(db_url, "worker", "--session", str(sid), "--workers", "2", "--until-empty")
    assert run.code == 0, run.stderr
    assert job_states(db, sid) == {"completed": 4}
    assert "starting 2 workers: CPU worker 1, CPU worker 2" in run.stderr
    for name in ("CPU worker 1: ", "CPU worker 2: "):
        assert name in run.stderr, run.stderr
    assert "worker cpu" not in run.stderr and "with a record" not in run.stderr
    with db.session() as s:
        job_id = s.scalar(sa.select(sa.func.min(Job.id)).where(Job.session_id == sid))
    ro = open_read_only(db_url)
    try:
        client = TestClient(create_app(ro), base_url="http://127.0.0.1")
        page = client.get(f"/jobs/{job_id}")
        shown = client.get(f"/api/jobs/{job_id}").json()
    finally:
        ro.dispose()
    assert page.status_code == 200
    assert "<th>worker</th>" in page.text and "<td>CPU worker</td>" in page.text
    assert "<td>-1</td>" not in page.text
    assert [a["worker"] for a in shown["attempts"]] == ["CPU worker"]
    assert shown["worker"] == "CPU worker"
    text = cli(db_url, "jobs", "show", str(job_id)).stdout
    assert " CPU worker pid " in text and "gpu -1" not in text


def test_a_plain_run_says_nothing_of_fusion_modules_a_fusion_run_does(
    db, db_url, tmp_path, monkeypatch
):
    """An earlier fusion run's module has the plain gemm's key: export writes the plain
    problem's winner. A plain gemm run leaves that note out; a fusion run says it."""
    monkeypatch.chdir(tmp_path)  # run writes its tuning DBs where it runs
    common = ("--tuner", "cpu", "--tuning-space", "quick", "--json")
    fused = cli(db_url, "run", "--op", "fusion", str(FUSION / "mixr-gemm-add.e2e.mlir"),
                "-o", "fusion.tsv", *common)  # fmt: skip
    assert fused.code == 0, fused.stderr
    configs = tmp_path / "gemm-configs"
    configs.write_text(KEY + "\n")
    plain = cli(db_url, "run", "--op", "gemm", str(configs), "-o", "plain.tsv", *common)
    assert plain.code == 0, plain.stderr
    assert "mixr-gemm" not in plain.stderr and plain.json()["notes"] == []
    # Written all the same: the plain problem's winner, one row for the key; `export` of the
    # context, asked for by name, says which (the two did meet).
    assert (tmp_path / "plain.tsv").read_text().count(KEY) == 1
    arch = sessions.get(db, plain.json()["session"]).arch_full
    exported = cli(db_url, "export", "--arch", arch, "-o", "all.tsv")
    assert exported.code == 0 and "not fusion mixr-gemm-add.e2e.mlir's" in exported.stderr
    # A fusion run of a second module with that key says which one was written, and why.
    again = cli(db_url, "run", "--op", "fusion", str(FUSION / "mixr-gemm-bcast-add.e2e.mlir"),
                "-o", "fusion.tsv", *common)  # fmt: skip
    assert again.code == 0, again.stderr
    notes = again.json()["notes"]
    assert any("not fusion mixr-gemm-" in note for note in notes), notes
    assert any("note: key " in line for line in again.stderr.splitlines()), again.stderr


def test_the_dashboard_sends_no_path_of_the_host_that_opened_a_session(db, client, tmp_path):
    lists = tmp_path / "operator-home" / "lists"
    lists.mkdir(parents=True)
    (lists / "gemm-configs").write_text(KEY + "\n")
    build = tmp_path / "operator-home" / "rocMLIR" / "build"
    plan = RunPlan(op="gemm", files=[str(lists / "gemm-configs")], mlir_build_dir=str(build),
                   output=str(tmp_path / "operator-home" / "out.tsv"))  # fmt: skip
    sid = sessions.create(db, SessionSpec(tuner="cpu", tuning_space="quick"), plan.spec("cpu")).id
    store = tmp_path / "operator-home" / "artifacts"
    with db.session() as s:  # a --split session's store: a path of the host that opened it
        s.execute(
            sa.update(TuningSession)
            .where(TuningSession.id == sid)
            .values(artifact_store=str(store))
        )
    home = str(tmp_path / "operator-home")
    for url in ("/api/farm", "/api/sessions", f"/api/sessions/{sid}", f"/sessions/{sid}"):
        answer = client.get(url)
        assert answer.status_code == 200, url
        assert home not in answer.text and json.dumps(home)[1:-1] not in answer.text, url
    (shown,) = [p["session"] for p in client.get("/api/sessions").json()["sessions"]]
    assert shown["run_spec"]["files"] == ["gemm-configs"]
    assert shown["run_spec"]["mlir_build_dir"] == "build"
    assert shown["run_spec"]["output"] == "out.tsv"
    assert shown["artifact_store"] == "artifacts"
    # The CLI, on the operator's own terminal, keeps the full paths (`run --session` resumes).
    assert sessions.get(db, sid).run_spec["files"] == [str(lists / "gemm-configs")]
