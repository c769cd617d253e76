"""A session's bundle cap (`session new --split … --bundle-cap-mib N`): the GPU worker's
extractor refuses a bundle that would unpack past it, before writing anything (issue 23)."""

from __future__ import annotations

import random

import pytest
from support.rocmlir import work
from support.standin import standin_build
from support.twostage import COMMIT, problems, session

from mlirtuna import queue, sessions
from mlirtuna.defaults import DEFAULT_BUNDLE_CAP_BYTES
from mlirtuna.errors import UserError
from mlirtuna.queue import Claimant, bundles, jobs


@pytest.fixture
def build(tmp_path, monkeypatch):
    return standin_build(tmp_path, monkeypatch, era="E4")


def test_a_bundle_over_the_sessions_cap_is_refused_unwritten(db, tmp_path, build, monkeypatch):
    problems(db, tmp_path, 1)
    sid = session(db, build, bundle_cap_mib=1)
    assert sessions.get(db, sid).bundle_cap_bytes == 1 << 20
    src = tmp_path / "src"
    (src / "problems").mkdir(parents=True)
    (src / "index.json").write_text('{"problems": {}}')
    (src / "problems" / "blob").write_bytes(random.Random(1).randbytes(2 << 20))
    packed = bundles.pack(src, tmp_path / "b.tar.gz", COMMIT)
    lease = queue.claim(db, sid, Claimant("h", -1), 30, stage="compile")
    bundle_id = bundles.store(db, lease, packed, None)
    assert bundles.finish_compile(db, lease, bundle_id, "ok")
    unpacked = tmp_path / "tmp"
    unpacked.mkdir()
    monkeypatch.setenv("TMPDIR", str(unpacked))
    import tempfile

    monkeypatch.setattr(tempfile, "tempdir", str(unpacked))
    work(db, sid, build, "gpu", max_retries=1)
    (failed,) = jobs.list_jobs(db, sid, "error")
    assert "over the cap of 1048576 bytes" in failed.first_line
    assert list(unpacked.iterdir()) == []  # nothing unpacked, the temp dir removed


def test_the_default_cap_and_the_refusals(db, tmp_path, build):
    problems(db, tmp_path, 1)
    sid = session(db, build)
    assert sessions.get(db, sid).bundle_cap_bytes == DEFAULT_BUNDLE_CAP_BYTES
    with pytest.raises(UserError, match="go with --split"):
        session(db, build, split=None, bundle_cap_mib=5)
    for bad in (0, -1, 1 << 30):
        with pytest.raises(UserError, match="--bundle-cap-mib"):
            session(db, build, bundle_cap_mib=bad)
