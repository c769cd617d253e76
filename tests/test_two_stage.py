"""Two-stage jobs (issue 16 §1) on every backend: a split session's compile jobs on a worker
without a GPU, bundles in the database or an artifact store, benchmark jobs on a GPU worker,
recorded exactly as one-stage jobs; failures, commits, half-written bundles, chaos."""

from __future__ import annotations

import collections
import json
import random
import signal
import subprocess
import sys
import time
from pathlib import Path

import pytest
import sqlalchemy as sa
from support.clitools import cli, mlirtuna_argv, run_cli, subprocess_env
from support.rocmlir import ARCH_FULL, work
from support.standin import standin_build
from support.twostage import COMMIT, SPLIT, count, gemm, problems, recorded, session, states

from mlirtuna import queue, sessions
from mlirtuna.db.models import Attempt, Bundle, BundleChunk, Candidate, Job, Result
from mlirtuna.queue import Claimant, bundles, jobs

# The flow over whole workers: each backend in .ci/run, SQLite in the quick loop (the
# queue, claim and settle SQL it runs is tested on all three there too).
pytestmark = pytest.mark.backends(fast=("sqlite",))


@pytest.fixture
def build(tmp_path, monkeypatch):
    return standin_build(tmp_path, monkeypatch, era="E4")


@pytest.mark.parametrize("store", ["db", "files"])
def test_compile_then_benchmark_records_what_one_stage_records(
    db, tmp_path, build, monkeypatch, store
):
    problems(db, tmp_path, 3)
    artifacts = tmp_path / "artifacts"
    artifacts.mkdir()
    sid = session(db, build, artifact_store=str(artifacts) if store == "files" else None)
    assert states(db, sid) == {("compile", "new"): 3, ("benchmark", "waiting"): 3}
    log = tmp_path / "tool.log"
    monkeypatch.setenv("FAKE_TUNINGRUNNER_LOG", str(log))
    assert work(db, sid, build, "compile").stats.completed == 3
    assert states(db, sid) == {("compile", "completed"): 3, ("benchmark", "new"): 3}
    assert count(db, Bundle, Bundle.complete.is_(True)) == 3
    if store == "files":
        assert len(list(artifacts.glob("*.tar.gz"))) == 3
        assert count(db, BundleChunk) == 0
    else:
        assert count(db, BundleChunk) >= 3
    assert work(db, sid, build, "gpu").stats.completed == 3
    assert states(db, sid) == {("compile", "completed"): 3, ("benchmark", "completed"): 3}
    # Bundles go with their benchmark's record: no row, no chunk, no file left.
    assert count(db, Bundle) == count(db, BundleChunk) == 0
    assert list(artifacts.iterdir()) == []
    # The tool was asked exactly as the issue says: compile for the session's target, no GPU.
    calls = [json.loads(line)["argv"] for line in log.read_text().splitlines()]
    compiles = [a for a in calls if any(x.startswith("--compile-only=") for x in a)]
    benches = [a for a in calls if any(x.startswith("--benchmark-artifacts=") for x in a)]
    assert len(compiles) == len(benches) == 3
    # Both stages name the same target (E4 checks the bundle's index against what the
    # benchmark call resolves: without --target-arch it would resolve HIP's name and refuse).
    target = {f"--target-arch={ARCH_FULL}", "--target-num-cu=304", "--target-num-chiplets=8"}
    assert target <= set(compiles[0]) and target <= set(benches[0])
    assert not any(x.startswith("--gpus") for x in compiles[0])
    assert "--gpus=0" in benches[0] and "--debug" in benches[0]
    # E4 benchmarks a bundle in one pass (--two-stage-topk does nothing there): not passed,
    # and no candidate is marked re-measured although the session's topk is 3.
    assert not any(x.startswith("--two-stage-topk") for x in benches[0])
    assert count(db, Candidate, Candidate.remeasured.is_(True)) == 0
    # A one-stage session without re-measurement records the same winners and candidates.
    one = session(db, build, split=None, topk=1)
    assert work(db, one, build, "gpu").stats.completed == 3
    two_stage, one_stage = recorded(db, sid), recorded(db, one)
    assert len(two_stage) == 3 and two_stage == one_stage
    # One-stage with topk 3: the tool re-measures, and those candidates say so.
    remeasured = session(db, build, split=None)
    assert work(db, remeasured, build, "gpu").stats.completed == 3
    marked = (Candidate.session_id == remeasured, Candidate.remeasured.is_(True))
    assert count(db, Candidate, *marked) == 3 * 3


def test_keep_artifacts_keeps_every_bundle(db, tmp_path, build):
    problems(db, tmp_path, 2)
    artifacts = tmp_path / "artifacts"
    artifacts.mkdir()
    sid = session(db, build, artifact_store=str(artifacts), keep_artifacts=True)
    work(db, sid, build, "compile")
    work(db, sid, build, "gpu")
    assert states(db, sid) == {("compile", "completed"): 2, ("benchmark", "completed"): 2}
    assert count(db, Bundle, Bundle.complete.is_(True)) == 2
    kept = sorted(artifacts.glob("*.tar.gz"))
    assert len(kept) == 2
    bundles.unpack(kept[0], tmp_path / "unpacked")  # a whole bundle: index and problems
    assert (tmp_path / "unpacked" / "index.json").is_file()
    # Deleting the session takes its bundles, rows and files alike.
    jobs.delete_session(db, sid)
    assert count(db, Bundle) == 0 and list(artifacts.iterdir()) == []


def test_a_bundle_of_another_commit_is_refused_without_retry(db, tmp_path, build, monkeypatch):
    problems(db, tmp_path, 2)
    sid = session(db, build)
    work(db, sid, build, "compile")
    with db.session() as s:  # one bundle made by another rocMLIR commit
        first = s.scalars(sa.select(Bundle.id).order_by(Bundle.id)).first()
        s.execute(sa.update(Bundle).where(Bundle.id == first).values(commit_id="feedbeef"))
    # The GPU host's own build is of yet another commit: the tool refuses the other bundle too.
    work(db, sid, build, "gpu", max_retries=5)
    with db.session() as s:
        failed = (
            s.execute(sa.select(Job).where(Job.session_id == sid, Job.state == "error"))
            .scalars()
            .all()
        )
    assert len(failed) == 1 and failed[0].stage == "benchmark" and failed[0].retries == 1
    assert "compiled by rocMLIR commit feedbeef" in failed[0].result
    assert "failed, not retried" in failed[0].result
    assert count(db, Bundle, Bundle.id == first) == 0  # removed: a requeue compiles it again
    assert states(db, sid)[("benchmark", "completed")] == 1


def test_the_gpu_hosts_build_of_another_commit_refuses_the_bundle(db, tmp_path, build, monkeypatch):
    problems(db, tmp_path, 1)
    sid = session(db, build)
    work(db, sid, build, "compile")
    monkeypatch.setenv("FAKE_TUNINGRUNNER_COMMIT", "feedbeef" * 5)
    work(db, sid, build, "gpu", max_retries=5)
    (job,) = jobs.list_jobs(db, sid, "error")
    assert job.stage == "benchmark" and job.retries == 1
    assert "tuningRunner refused the bundle" in job.result and "build-commit mismatch" in job.result
    assert count(db, Bundle, Bundle.complete.is_(True)) == 1  # kept: the right build may run it


def test_a_compile_worker_of_another_commit_fails_its_job_and_the_benchmark(
    db, tmp_path, build, monkeypatch
):
    problems(db, tmp_path, 1)
    sid = session(db, build)
    monkeypatch.setenv("FAKE_TUNINGRUNNER_COMMIT", "feedbeef" * 5)
    work(db, sid, build, "compile", max_retries=5)
    assert states(db, sid) == {("compile", "error"): 1, ("benchmark", "error"): 1}
    assert count(db, Bundle) == 0


def test_compile_error_fails_the_benchmark_and_requeue_brings_both_back(
    db, tmp_path, build, monkeypatch
):
    problems(db, tmp_path, 2)
    sid = session(db, build)
    monkeypatch.setenv("FAKE_TUNINGRUNNER_FAULT", "fail")
    work(db, sid, build, "compile", max_retries=2)
    assert states(db, sid) == {("compile", "error"): 2, ("benchmark", "error"): 2}
    bench = [j for j in jobs.list_jobs(db, sid) if j.stage == "benchmark"]
    compile_ids = {j.id for j in jobs.list_jobs(db, sid) if j.stage == "compile"}
    for j in bench:
        assert j.first_line.startswith("compile job ") and int(j.first_line.split()[2]) in (
            compile_ids
        )
        assert "Compilation failed" in j.result
    monkeypatch.delenv("FAKE_TUNINGRUNNER_FAULT")
    assert jobs.requeue(db, sid, "error") == 4
    assert states(db, sid) == {("compile", "new"): 2, ("benchmark", "waiting"): 2}
    work(db, sid, build, "compile")
    work(db, sid, build, "gpu")
    assert states(db, sid) == {("compile", "completed"): 2, ("benchmark", "completed"): 2}


def test_requeue_of_a_benchmark_whose_bundle_is_gone_compiles_again(db, tmp_path, build):
    problems(db, tmp_path, 1)
    sid = session(db, build)
    work(db, sid, build, "compile")
    with db.session() as s:
        bundles.delete(db, s.scalar(sa.select(Bundle.id)))
    work(db, sid, build, "gpu")
    (failed,) = jobs.list_jobs(db, sid, "error")
    assert failed.stage == "benchmark" and "no bundle" in failed.first_line
    assert jobs.requeue(db, sid, "error", failed.id) == 2
    assert states(db, sid) == {("compile", "new"): 1, ("benchmark", "waiting"): 1}
    work(db, sid, build, "compile")
    work(db, sid, build, "gpu")
    assert states(db, sid) == {("compile", "completed"): 1, ("benchmark", "completed"): 1}


def test_a_damaged_bundle_is_refused(db, tmp_path, build):
    problems(db, tmp_path, 1)
    sid = session(db, build)
    work(db, sid, build, "compile")
    with db.session() as s:
        s.execute(sa.update(BundleChunk).where(BundleChunk.seq == 0).values(data=b"x" * 10))
    work(db, sid, build, "gpu", max_retries=5)
    (failed,) = jobs.list_jobs(db, sid, "error")
    assert "is damaged" in failed.first_line and failed.retries == 1
    assert count(db, Bundle) == 0


def _packed(tmp_path: Path, size: int) -> bundles.Packed:
    src = tmp_path / "src"
    (src / "problems").mkdir(parents=True)
    (src / "index.json").write_text('{"problems": {}}')
    (src / "problems" / "blob").write_bytes(random.Random(1).randbytes(size))
    return bundles.pack(src, tmp_path / "b.tar.gz", COMMIT)


def test_a_half_written_bundle_is_never_claimable(db, tmp_path, build, monkeypatch):
    problems(db, tmp_path, 1)
    sid = session(db, build)
    who = Claimant("host", -1)
    monkeypatch.setattr(bundles, "CHUNK_BYTES", 4096)
    monkeypatch.setattr(bundles, "CHUNKS_PER_TRANSACTION", 1)
    packed = _packed(tmp_path, 40_000)  # random bytes: ~10 chunks of 4 KiB

    # 1. The lease is lost while the chunks are written: the writer stops, nothing is left.
    lease = queue.claim(db, sid, who, 30, stage="compile")
    real, calls = bundles.still_held, []

    def lost_after_three(conn, held):
        calls.append(1)
        return len(calls) <= 3 and real(conn, held)

    monkeypatch.setattr(bundles, "still_held", lost_after_three)
    assert bundles.store(db, lease, packed, None) is None
    assert count(db, Bundle) == count(db, BundleChunk) == 0
    monkeypatch.setattr(bundles, "still_held", real)

    # 2. The compile worker dies after storing, before completing: the bundle stays invisible,
    # the benchmark job waiting and unclaimable; once the lease is gone its chunks are swept.
    bundle_id = bundles.store(db, lease, packed, None)
    assert bundle_id is not None and count(db, BundleChunk) >= 10
    assert queue.claim(db, sid, Claimant("gpu", 0), 30, stage="benchmark") is None
    assert states(db, sid) == {("compile", "running"): 1, ("benchmark", "waiting"): 1}
    with pytest.raises(bundles.BundleMissing):
        bundles.fetch(db, sid, lease.problem_id)
    jobs.requeue(db, sid, "running")  # the operator knows its worker is dead
    assert bundles.sweep_orphans(db, sid) == 1
    assert count(db, Bundle) == count(db, BundleChunk) == 0
    # Its late completion is fenced off: nothing becomes visible.
    assert not bundles.finish_compile(db, lease, bundle_id, "late")
    assert states(db, sid) == {("compile", "new"): 1, ("benchmark", "waiting"): 1}

    # 3. A whole attempt: stored, completed, then the benchmark is claimable and reads it back.
    again = queue.claim(db, sid, who, 30, stage="compile")
    third = bundles.store(db, again, packed, None)
    assert bundles.finish_compile(db, again, third, "ok")
    bench = queue.claim(db, sid, Claimant("gpu", 0), 30, stage="benchmark")
    assert bench is not None and bench.stage == "benchmark"
    assert bundles.fetch(db, sid, bench.problem_id).data == packed.path.read_bytes()


def test_a_compile_worker_claims_only_compile_jobs_and_a_gpu_worker_never(db, tmp_path, build):
    problems(db, tmp_path, 1)
    sid = session(db, build)
    one = session(db, build, split=None)
    assert queue.claim(db, one, Claimant("h", -1), 30, stage="compile") is None
    assert queue.claim(db, sid, Claimant("h", 0), 30) is None  # no tune job in a split session
    assert queue.claim(db, sid, Claimant("h", 0), 30, stage="benchmark") is None  # waiting
    got = queue.claim(db, sid, Claimant("h", -1), 30, stage="compile")
    assert got is not None and got.stage == "compile"
    tuned = queue.claim(db, one, Claimant("h", 0), 30)
    assert tuned is not None and tuned.stage == "tune"


def test_split_is_refused_where_it_cannot_work(db, db_url, tmp_path, build, monkeypatch):
    args = ["session", "new", "--tuner", "rocmlir", "--arch-full", ARCH_FULL, "--num-cu", "304",
            "--num-chiplets", "8", "--mlir-v", COMMIT, "--mlir-build-dir", str(build)]  # fmt: skip
    monkeypatch.setenv("FAKE_TUNINGRUNNER_ERA", "E3")
    for extra, why in (
        (["--split", SPLIT], "lacks the two-stage capability (no --compile-only, "),
        (["--split", "benchmark"], "the one split is compile,benchmark"),
        (["--artifact-store", str(tmp_path)], "go with --split"),
    ):
        run = cli(db_url, *args, *extra)
        assert run.code == 2, run.stderr
        assert why in run.stderr and len(run.stderr.strip().splitlines()) == 1, run.stderr
    run = cli(db_url, "session", "new", "--tuner", "cpu", "--split", SPLIT)
    assert run.code == 2 and "--split needs --tuner rocmlir" in run.stderr
    monkeypatch.setenv("FAKE_TUNINGRUNNER_ERA", "E4")
    # The build states its commit (the stand-in's marker); an empty --mlir-v leaves none.
    run = cli(db_url, *args[:-4], "--mlir-v", "", "--mlir-build-dir", str(build), "--split", SPLIT)
    assert run.code == 2 and "--split needs the rocMLIR commit" in run.stderr
    assert sessions.list_all(db) == []  # nothing half-written
    problems(db, tmp_path, 1)
    one = session(db, build, split=None)
    run = cli(db_url, "worker", "--session", str(one), "--role", "compile", "--until-empty")
    assert run.code == 2 and "open it with --split" in run.stderr


def test_the_cli_flow_with_real_worker_processes(db, db_url, tmp_path, build):
    problems(db, tmp_path, 2)
    made = cli(
        db_url, "session", "new", "--tuner", "rocmlir", "--arch-full", ARCH_FULL,
        "--num-cu", "304", "--num-chiplets", "8", "--mlir-v", COMMIT, "--tuning-space", "quick",
        "--mlir-build-dir", str(build), "--split", SPLIT, "--json",
    )  # fmt: skip
    assert made.code == 0, made.stderr
    sid = made.json()["id"]
    assert made.json()["split"] == SPLIT
    assert cli(db_url, "jobs", "load", "--session", str(sid), "--tag", "g").code == 0
    common = ["--session", str(sid), "--mlir-build-dir", str(build), "--until-empty"]
    env = {"MLIRTUNA_ROCMLIR_PYTHON": sys.executable, "FAKE_TUNINGRUNNER_ERA": "E4"}
    compiled = run_cli(db_url, "worker", "--role", "compile", "--workers", "2", *common, **env)
    assert compiled.code == 0, compiled.stderr
    # Named by role and number, in the supervisor's line and each one's own (issue 44).
    assert "starting 2 workers: compile worker 1, compile worker 2" in compiled.stderr
    assert "compile worker 1: " in compiled.stderr and "compile worker 2: " in compiled.stderr
    assert "worker cpu" not in compiled.stderr
    status = cli(db_url, "status", "--session", str(sid), "--json").json()["sessions"][0]
    assert status["stages"]["compile"]["completed"] == 2
    assert status["stages"]["benchmark"]["new"] == 2
    benched = run_cli(db_url, "worker", "--gpus", "0", *common, **env)
    assert benched.code == 0, benched.stderr
    listed = cli(db_url, "jobs", "list", "--session", str(sid), "--json").json()
    assert sorted((j["stage"], j["state"]) for j in listed) == [
        ("benchmark", "completed"), ("benchmark", "completed"),
        ("compile", "completed"), ("compile", "completed"),
    ]  # fmt: skip
    table = cli(db_url, "status").stdout
    assert "  compile" in table and "  benchmark" in table
    shown = {j["stage"]: cli(db_url, "jobs", "show", str(j["id"]), "--json").json() for j in listed}
    assert shown["compile"]["attempts"][0]["worker"] == "compile worker"
    assert shown["benchmark"]["attempts"][0]["worker"] == "GPU 0"
    assert len(cli(db_url, "results", "--session", str(sid), "--json").json()) == 2


def test_the_worker_role_can_run_both_stages(db, tmp_path, build):
    if db.is_sqlite:
        pytest.skip("SQLite has no users")
    import uuid

    from mlirtuna.db import Database, roles

    prefix = f"t{uuid.uuid4().hex[:10]}"
    roles.apply_roles(db, prefix)
    try:
        problems(db, tmp_path, 2)
        sid = session(db, build)
        as_worker = Database(db.url.set(username=f"{prefix}_worker", password=None))
        try:
            assert work(as_worker, sid, build, "compile").stats.completed == 2
            assert work(as_worker, sid, build, "gpu").stats.completed == 2
        finally:
            as_worker.dispose()
        assert count(db, Bundle) == 0
    finally:
        roles.drop_roles(db, prefix)


# -- chaos ---------------------------------------------------------------------------------------


def _holders(db, sid) -> dict[int, str]:
    """{pid: stage} of the workers holding a running job of the session now."""
    with db.session() as s:
        rows = s.execute(
            sa.select(Attempt.pid, Job.stage)
            .join(Job, Job.id == Attempt.job_id)
            .where(Job.session_id == sid, Job.state == "running", Attempt.outcome.is_(None))
        ).all()
    return {r.pid: r.stage for r in rows}


@pytest.mark.slow
def test_chaos_sigkill_workers_of_both_roles(db, db_url, tmp_path, build):
    n = 10
    problems(db, tmp_path, n)
    sid = session(db, build)
    env = subprocess_env(
        db_url,
        MLIRTUNA_ROCMLIR_PYTHON=sys.executable,
        FAKE_TUNINGRUNNER_ERA="E4",
        FAKE_TUNINGRUNNER_DELAY="0.4",
    )
    common = ["--session", str(sid), "--mlir-build-dir", str(build), "--until-empty",
              "--lease", "2", "--max-retries", "1000", "--retry-backoff", "0"]  # fmt: skip
    roles_of = {  # one GPU worker benchmarks a bundle per call, the other up to 4 per call
        "compile": ["--role", "compile"],
        "gpu0": ["--gpus", "0"],
        "gpu1": ["--gpus", "1", "--batch", "4"],
    }
    kinds = ["compile", "compile", "gpu0", "gpu1"]
    stage_of = {"compile": "compile", "gpu0": "benchmark", "gpu1": "benchmark"}

    def start(kind: str) -> subprocess.Popen:
        argv = mlirtuna_argv("worker", *roles_of[kind], *common)
        return subprocess.Popen(argv, env=env, stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL)

    procs = [start(k) for k in kinds]
    rng = random.Random(11)
    killed = collections.Counter()
    deadline = time.monotonic() + 240
    try:
        while sum(killed.values()) < 8 and time.monotonic() < deadline:
            if jobs.is_drained(db, sid):
                break
            time.sleep(rng.uniform(0.2, 0.6))
            alive = {p.pid: i for i, p in enumerate(procs) if p.poll() is None}
            holders = {
                pid: stage
                for pid, stage in _holders(db, sid).items()
                if pid in alive and killed[stage] < 4  # 4 kills of each stage
            }
            if not holders:
                continue
            pid = rng.choice(sorted(holders))
            victim = alive[pid]
            procs[victim].send_signal(signal.SIGKILL)
            procs[victim].wait()
            killed[holders[pid]] += 1
            procs[victim] = start(kinds[victim])
        # A worker that exited while its stage still has open jobs comes back until that stage
        # is done; one whose stage is done stays down (compile workers, once every bundle is
        # made: started again they would only find nothing to do and exit, over and over).
        while not jobs.is_drained(db, sid) and time.monotonic() < deadline:
            for i, p in enumerate(procs):
                if p.poll() is not None and not jobs.is_drained(db, sid, [stage_of[kinds[i]]]):
                    procs[i] = start(kinds[i])
            time.sleep(0.5)
        for p in procs:
            p.wait(timeout=240)
    finally:
        for p in procs:
            if p.poll() is None:
                p.kill()
                p.wait()
    assert killed["compile"] >= 1 and killed["benchmark"] >= 1, killed
    assert states(db, sid) == {("compile", "completed"): n, ("benchmark", "completed"): n}
    with db.session() as s:
        per_problem = s.execute(
            sa.select(Result.problem_id, sa.func.count())
            .where(Result.session_id == sid)
            .group_by(Result.problem_id)
        ).all()
        assert len(per_problem) == n and all(c == 1 for _, c in per_problem)
        dupes = s.execute(
            sa.select(Candidate.problem_id, Candidate.perf_config, sa.func.count())
            .where(Candidate.session_id == sid)
            .group_by(Candidate.problem_id, Candidate.perf_config)
            .having(sa.func.count() > 1)
        ).all()
        assert dupes == []
        assert s.scalar(sa.select(sa.func.count()).where(Attempt.ended_at.is_(None))) == 0
        completed = s.scalar(sa.select(sa.func.count()).where(Attempt.outcome == "completed"))
        assert completed == 2 * n
    assert count(db, Candidate, Candidate.session_id == sid) == n * 8  # quick: 8 per problem
    assert count(db, Bundle) == count(db, BundleChunk) == 0


def test_run_into_a_split_session_starts_compile_workers_too(db, db_url, tmp_path, build):
    problems(db, tmp_path, 2)
    sid = session(db, build)
    run = cli(
        db_url, "run", "--session", str(sid), "--op", "gemm", str(tmp_path / "gemm-configs"),
        "--mlir-build-dir", str(build), "--gpus", "0", "--json",
    )  # fmt: skip
    assert run.code == 0, run.stderr
    assert states(db, sid) == {("compile", "completed"): 2, ("benchmark", "completed"): 2}
    assert run.json()["counts"]["completed"] == 4


def test_a_gpu_identity_in_the_environment_names_the_gpu_workers_only(db, db_url, tmp_path, build):
    """MLIRTUNA_GPU_IDENTITY names `run`'s GPU (--gpu-identity): it travels to the GPU worker in
    its argv, and the compile workers, which use no GPU, never see it (they would refuse it)."""
    problems(db, tmp_path, 2)
    sid = session(db, build)
    run = cli(
        db_url, "run", "--session", str(sid), "--op", "gemm", str(tmp_path / "gemm-configs"),
        "--mlir-build-dir", str(build), "--gpus", "0", "--json",
        env={"MLIRTUNA_GPU_IDENTITY": "GPU-00000000000000aa"},
    )  # fmt: skip
    assert run.code == 0, run.stderr
    assert states(db, sid) == {("compile", "completed"): 2, ("benchmark", "completed"): 2}


def test_progress_and_dashboard_show_both_stages(db, db_url, tmp_path, build):
    from fastapi.testclient import TestClient
    from rich.console import Console

    from mlirtuna.cli import progress
    from mlirtuna.web.app import create_app, open_read_only

    problems(db, tmp_path, 2)
    sid = session(db, build)
    ro = open_read_only(db_url)
    try:
        client = TestClient(create_app(ro), base_url="http://127.0.0.1")
        before = client.get(f"/api/sessions/{sid}").json()
        assert before["counts"]["waiting"] == 2 and before["active"]
        work(db, sid, build, "compile")
        after = client.get(f"/api/sessions/{sid}").json()
        assert after["stages"] == {
            "compile": {"done": 2, "total": 2},
            "benchmark": {"done": 0, "total": 2},
        }
    finally:
        ro.dispose()
    snap = progress.snapshot(db, sid, time.monotonic(), 0)
    assert snap.stages == {"compile": (2, 2), "benchmark": (0, 2)}
    console = Console(record=True, width=120)
    console.print(progress.render(snap))
    assert "compile 2/2, benchmark 0/2" in console.export_text()


def test_a_bundle_of_several_megabytes_travels_in_chunks(db, tmp_path, build):
    problems(db, tmp_path, 1)
    sid = session(db, build)
    packed = _packed(tmp_path, 5 << 20)  # random: gzip keeps it ~5 MiB, i.e. 5+ chunks of 1 MiB
    assert packed.size > 5 << 20
    lease = queue.claim(db, sid, Claimant("h", -1), 30, stage="compile")
    bundle_id = bundles.store(db, lease, packed, None)
    assert count(db, BundleChunk, BundleChunk.bundle_id == bundle_id) == 6
    assert bundles.finish_compile(db, lease, bundle_id, "ok")
    fetched = bundles.fetch(db, sid, lease.problem_id)
    assert fetched.data == packed.path.read_bytes()
    bundles.unpack(fetched.data, tmp_path / "out")
    assert (tmp_path / "out" / "problems" / "blob").stat().st_size == 5 << 20


def test_bundles_merged_into_one_directory_are_benchmarked_by_one_call(tmp_path, build):
    from mlirtuna.problems import parse
    from mlirtuna.tuners.base import TuneContext
    from mlirtuna.tuners.rocmlir import RocmlirTuner, merge_artifacts, read_index

    tuner = RocmlirTuner(str(build))
    ctx = TuneContext(arch="gfx942", arch_full=ARCH_FULL, num_cu=304, num_chiplets=8,
                      tuning_space="quick", gpu_id=0, timeout_s=60)  # fmt: skip
    problems_ = [parse("gemm", gemm(m)) for m in (64, 128)]
    dirs = []
    for i, p in enumerate(problems_):
        (tmp_path / f"c{i}").mkdir()
        dirs.append(tuner.compile(p, ctx, tmp_path / f"c{i}" / "bundle").directory)
    merged = tmp_path / "merged"
    merge_artifacts(dirs, merged)
    assert len(read_index(merged)["problems"]) == 2
    listed = tmp_path / "configs"
    out = tmp_path / "out.tsv"
    argv = [sys.executable, str(build / "bin" / "tuningRunner.py"), "--op=gemm", "-c", str(listed),
            "--tuning-space=quick", f"--benchmark-artifacts={merged}", f"--output={out}",
            "--debug", "--gpus=0"]  # fmt: skip
    # Lines without -transO: E4's gemm loader adds a -transO true twin of each, not in the
    # bundle (issue 33). Spelled as the build canonicalizes them, each is one config.
    listed.write_text("".join(p.canonical() + "\n" for p in problems_))
    doubled = subprocess.run(argv, capture_output=True, text=True, check=False)
    assert doubled.returncode == 1 and doubled.stderr.count("no artifacts for '") == 2
    assert "-transO true" in doubled.stderr
    out.unlink()
    listed.write_text("".join(tuner.line(p) + "\n" for p in problems_))
    subprocess.run(argv, check=True, capture_output=True)
    rows = [line for line in out.read_text().splitlines() if not line.startswith("#")]
    assert len(rows) == 2  # one start-up, both problems
    # Each problem read back from the merged directory as one-stage would record it.
    for p in problems_:
        outcome = tuner.benchmark(p, ctx, merged)
        assert outcome.winner.valid and len(outcome.candidates) == 8


def test_a_gpu_of_another_kind_records_nothing(db, tmp_path, build, monkeypatch):
    problems(db, tmp_path, 1)
    sid = session(db, build)
    work(db, sid, build, "compile")
    monkeypatch.setenv("FAKE_TUNINGRUNNER_FAULT", "wrong_arch")  # the GPU is a gfx90a/110 CUs
    work(db, sid, build, "gpu", max_retries=2)
    (failed,) = jobs.list_jobs(db, sid, "error")
    assert failed.stage == "benchmark" and failed.retries == 2
    assert "bundle compiled for gfx942/304 CUs/8 chiplets" in failed.result
    assert count(db, Result, Result.session_id == sid) == 0
    assert count(db, Bundle, Bundle.complete.is_(True)) == 1  # kept for a GPU that matches


def test_a_batch_benchmarks_k_bundles_in_one_call(db, tmp_path, build, monkeypatch):
    problems(db, tmp_path, 5)
    sid = session(db, build)
    log = tmp_path / "tool.log"
    monkeypatch.setenv("FAKE_TUNINGRUNNER_LOG", str(log))
    work(db, sid, build, "compile", batch=4)  # compile jobs batch too: 4, then 1
    assert work(db, sid, build, "gpu", batch=4).stats.completed == 5
    assert states(db, sid) == {("compile", "completed"): 5, ("benchmark", "completed"): 5}
    calls = [json.loads(line)["argv"] for line in log.read_text().splitlines()]
    compiles = [a for a in calls if any(x.startswith("--compile-only=") for x in a)]
    benches = [a for a in calls if any(x.startswith("--benchmark-artifacts=") for x in a)]
    assert len(compiles) == 2 and len(benches) == 2  # 4 problems, then the last one
    assert "--configs-file=-" in benches[0]
    assert count(db, Bundle) == 0
    one = session(db, build, split=None, topk=1)  # a bundle's benchmark re-measures nothing
    work(db, one, build, "gpu")  # one call per job: each config's own driver lines
    assert recorded(db, sid) == recorded(db, one)
