"""A SIGKILLed worker leaves its temp dirs; the next worker on the host removes those whose
owner process is gone (its pid and start time are in the name) and never a live one's
(issue 23 item 15)."""

from __future__ import annotations

import os
import subprocess
import tempfile

import pytest
from support.rocmlir import work
from support.standin import standin_build
from support.twostage import problems, session

from mlirtuna import machine

# The backend changes nothing here (the queue, records and SQL of their own are tested on every
# backend in their own files): SQLite only, to keep the suite quick.
pytestmark = pytest.mark.backends("sqlite")


@pytest.fixture
def tmpdir_root(tmp_path, monkeypatch):
    root = tmp_path / "tmp"
    root.mkdir()
    monkeypatch.setattr(tempfile, "tempdir", str(root))
    return root


def dead_owner() -> str:
    proc = subprocess.Popen(["sleep", "30"])
    owner = machine.temp_owner(proc.pid)
    proc.kill()
    proc.wait()
    return owner


def test_only_dirs_of_gone_owners_are_swept(tmpdir_root, tmp_path):
    victim = tmp_path / "victim"
    victim.mkdir()
    (victim / "keep").write_text("precious")
    live = machine.make_temp_dir("benchmark")  # this process: alive
    (live / "x").write_text("in use")
    gone = tmpdir_root / f"mlirtuna-benchmark-{dead_owner()}-abc123"
    (gone / "artifacts").mkdir(parents=True)
    compile_gone = tmpdir_root / f"mlirtuna-compile-{dead_owner()}-q1"
    compile_gone.mkdir()
    reused = tmpdir_root / f"mlirtuna-rocmlir-{os.getpid()}.1-zz"  # our pid, another start
    reused.mkdir()
    link = tmpdir_root / f"mlirtuna-benchmark-{dead_owner()}-link"
    link.symlink_to(victim)
    old = tmpdir_root / "mlirtuna-benchmark-k3j4h5"  # the old unnamed form: owner unknown
    old.mkdir()
    plain = tmpdir_root / f"mlirtuna-compile-{dead_owner()}-file"
    plain.write_text("not a dir")
    other = tmpdir_root / "something-else"
    other.mkdir()

    removed = machine.sweep_stale_temp()
    assert sorted(removed) == sorted([gone, compile_gone, reused])
    assert live.is_dir() and (live / "x").read_text() == "in use"
    assert link.is_symlink() and (victim / "keep").read_text() == "precious"
    assert old.is_dir() and plain.is_file() and other.is_dir()
    assert machine.sweep_stale_temp() == []


def test_temp_dirs_are_named_for_their_owner(tmpdir_root):
    made = machine.make_temp_dir("compile")
    assert made.parent == tmpdir_root
    assert made.name.startswith(f"mlirtuna-compile-{os.getpid()}.")
    assert machine.sweep_stale_temp() == []


def test_a_worker_sweeps_at_start_and_leaves_none_of_its_own(db, tmp_path, monkeypatch,
                                                              tmpdir_root):  # fmt: skip
    build = standin_build(tmp_path, monkeypatch)
    monkeypatch.setenv("FAKE_TUNINGRUNNER_ERA", "E4")  # the era that splits
    problems(db, tmp_path, 2)
    sid = session(db, build)
    gone = tmpdir_root / f"mlirtuna-benchmark-{dead_owner()}-abc"
    (gone / "job-1").mkdir(parents=True)
    live = machine.make_temp_dir("benchmark")  # another worker's (this process: alive)
    work(db, sid, build, "compile")
    work(db, sid, build, "gpu")
    assert not gone.exists() and live.is_dir()
    assert sorted(p.name for p in tmpdir_root.iterdir()) == [live.name]
