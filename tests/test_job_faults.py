"""A job-level fault fails that job, never the worker (issue 34, M1): a bundle whose index.json
names its problem out of bounds, on the call path, a batch and the stream, on every backend;
and the compile side refuses such a name before it stores a bundle."""

from __future__ import annotations

import hashlib
import io
import json
import tarfile

import pytest
import sqlalchemy as sa
from support.rocmlir import work
from support.standin import standin_build
from support.twostage import count, problems, session, states

from mlirtuna.db.models import Bundle, BundleChunk
from mlirtuna.queue import bundles, jobs
from mlirtuna.tuners.rocmlir.tuner import RocmlirTuner

# The flow over whole workers: each backend in .ci/run, SQLite in the quick loop (the
# queue, claim and settle SQL it runs is tested on all three there too).
pytestmark = pytest.mark.backends(fast=("sqlite",))

HOSTILE_NAMES = ["../../escape", "/etc", "x" * 300, "h\u202eabc", "a\nb"]


@pytest.fixture
def build(tmp_path, monkeypatch):
    return standin_build(tmp_path, monkeypatch, era="E4")


def _renamed(index: dict, name: str) -> dict:
    """index.json with its (only) problem listed under `name`."""
    (entry,) = index["problems"].values()
    return {**index, "problems": {name: entry}}


def forge_first_bundle(db, name: str, nth: int = 0, move: bool = False) -> int:
    """The first (`nth`) stored bundle rewritten as a worker role could: its index.json names
    its problem `name` (`move`: its folder renamed too), its size and hash made to match.
    Returns its problem id."""
    with db.session() as s:
        row = s.execute(sa.select(Bundle).order_by(Bundle.id).offset(nth).limit(1)).scalars().one()
        bundle_id, problem_id = row.id, row.problem_id
        data = b"".join(
            s.scalars(sa.select(BundleChunk.data).where(BundleChunk.bundle_id == bundle_id))
        )
    out = io.BytesIO()
    with (
        tarfile.open(fileobj=io.BytesIO(data), mode="r:gz") as src,
        tarfile.open(fileobj=out, mode="w:gz") as dst,
    ):
        for member in src.getmembers():
            body = src.extractfile(member) if member.isfile() else None
            content = body.read() if body is not None else b""
            if member.name == "index.json":
                content = json.dumps(_renamed(json.loads(content), name)).encode()
                member.size = len(content)
            parts = member.name.split("/")
            if move and len(parts) > 1 and parts[0] == "problems" and parts[1] != name:
                member.name = "/".join(["problems", name, *parts[2:]])
            dst.addfile(member, io.BytesIO(content) if member.isfile() else None)
    forged = out.getvalue()
    with db.session() as s:
        s.execute(sa.delete(BundleChunk).where(BundleChunk.bundle_id == bundle_id))
        s.execute(sa.insert(BundleChunk).values(bundle_id=bundle_id, seq=0, data=forged))
        s.execute(
            sa.update(Bundle)
            .where(Bundle.id == bundle_id)
            .values(size=len(forged), sha256=hashlib.sha256(forged).hexdigest())
        )
    return problem_id


def _benchmark_errors(db, sid) -> list:
    return [j for j in jobs.list_jobs(db, sid, "error") if j.stage == "benchmark"]


NAME_IDS = ["dotdot", "abs", "long", "bidi", "newline"]
# Every name on the call path; the batch and the stream share its check (stages.prepare).
CASES = [("call", n) for n in HOSTILE_NAMES] + [("batch", "/etc"), ("stream", "../../escape")]


@pytest.mark.parametrize(
    ("path", "name"), CASES, ids=[f"call-{i}" for i in NAME_IDS] + ["batch", "stream"]
)
def test_a_bundle_naming_its_problem_out_of_bounds_fails_only_its_job(
    db, tmp_path, build, monkeypatch, name, path
):
    if path == "stream":
        monkeypatch.setenv("FAKE_TUNINGRUNNER_STREAM", "1")
    problems(db, tmp_path, 2)
    sid = session(db, build)
    work(db, sid, build, "compile")
    forge_first_bundle(db, name)
    victim = tmp_path / "escape"
    worker = work(db, sid, build, "gpu", batch=2 if path == "batch" else 1, max_retries=5)
    assert worker.stats.completed == 1  # the other job: the worker went on
    (failed,) = _benchmark_errors(db, sid)
    assert "is not a plain name" in failed.first_line and failed.retries == 1
    assert "\n" not in failed.first_line and "\u202e" not in failed.first_line
    assert not victim.exists()
    assert count(db, Bundle) == 0  # the forged one removed: a requeue compiles it again


@pytest.mark.parametrize("name", HOSTILE_NAMES, ids=NAME_IDS)
def test_a_compile_worker_refuses_a_bundle_naming_its_problem_out_of_bounds(
    db, tmp_path, build, monkeypatch, name
):
    real = RocmlirTuner.compile

    def compile_badly(self, problem, ctx, dest):  # the tool wrote a hostile index.json
        compiled = real(self, problem, ctx, dest)
        index = dest / "index.json"
        index.write_text(json.dumps(_renamed(json.loads(index.read_text()), name)))
        return compiled

    monkeypatch.setattr(RocmlirTuner, "compile", compile_badly)
    problems(db, tmp_path, 1)
    sid = session(db, build)
    work(db, sid, build, "compile", max_retries=5)
    assert states(db, sid) == {("compile", "error"): 1, ("benchmark", "error"): 1}
    (failed,) = [j for j in jobs.list_jobs(db, sid, "error") if j.stage == "compile"]
    assert "is not a plain name" in failed.first_line
    assert count(db, Bundle) == 0


def test_fetch_still_checks_the_forged_bundles_hash(db, tmp_path, build):
    # The forge above keeps size and hash consistent: without that, fetch would refuse it
    # as damaged and the test would prove nothing about the name.
    problems(db, tmp_path, 1)
    sid = session(db, build)
    work(db, sid, build, "compile")
    pid = forge_first_bundle(db, "h1")
    assert bundles.fetch(db, sid, pid).data


def test_a_stream_reply_that_is_no_exit_status_fails_only_its_job(db, tmp_path, build, monkeypatch):
    # M6 through a real worker: the stream path settles the bad reply as that job's failure.
    monkeypatch.setenv("FAKE_TUNINGRUNNER_STREAM", "1")
    problems(db, tmp_path, 2)
    sid = session(db, build)
    work(db, sid, build, "compile")
    monkeypatch.setenv("FAKE_TUNINGRUNNER_FAULT", "stream_bad_reply")
    monkeypatch.setenv("FAKE_TUNINGRUNNER_FAULT_CONFIG", "-m 64 ")
    worker = work(db, sid, build, "gpu", max_retries=2)
    assert worker.stats.completed == 1
    (failed,) = _benchmark_errors(db, sid)
    assert "reply is malformed: status 'zero'" in failed.result
    assert "is not an exit status" in failed.first_line and failed.retries == 2


def test_two_bundles_listing_one_problem_fail_their_jobs_not_the_worker(db, tmp_path, build):
    # Each bundle is plain on its own; merged for one batch call they collide.
    problems(db, tmp_path, 2)
    sid = session(db, build)
    work(db, sid, build, "compile")
    digest = _first_digest(db)
    forge_first_bundle(db, digest, nth=1, move=True)
    worker = work(db, sid, build, "gpu", batch=2, max_retries=1)
    assert worker.stats.completed == 0
    failed = _benchmark_errors(db, sid)
    assert len(failed) == 2
    assert all(f"problem {digest} is in two bundles of one batch" in f.result for f in failed)


def _first_digest(db) -> str:
    with db.session() as s:
        bundle_id = s.scalars(sa.select(Bundle.id).order_by(Bundle.id)).first()
        data = b"".join(
            s.scalars(sa.select(BundleChunk.data).where(BundleChunk.bundle_id == bundle_id))
        )
    with tarfile.open(fileobj=io.BytesIO(data), mode="r:gz") as tar:
        member = tar.extractfile("index.json")
        assert member is not None
        (digest,) = json.loads(member.read())["problems"]
    return digest
