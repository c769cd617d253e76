"""The GPU lock directory is shared with every local user (issue 42 §5): nothing planted there
makes a worker (root included) write anywhere but its own lock file. A link is never followed,
a file that is not a regular one is refused, a foreign directory others can rearrange is
refused, another user's read-only lock file still locks and is never written, and no more than
HOLDER_BYTES of a lock file is ever read. Each refusal is one line and exit 2."""

from __future__ import annotations

import os
import stat

import pytest
from support.clitools import run_cli
from support.workers import make_session

from mlirtuna.errors import UserError
from mlirtuna.worker import gpulock

NOBODY = 65534
as_root = pytest.mark.skipif(os.geteuid() != 0, reason="another user's files: made with chown")

pytestmark = pytest.mark.backends("sqlite")  # no database behaviour here


def locks(tmp_path):
    directory = tmp_path / "locks"
    directory.mkdir(mode=0o700)
    return directory


def test_a_planted_lock_link_is_refused_and_its_target_untouched(tmp_path):
    directory, target = locks(tmp_path), tmp_path / "precious"
    target.write_text("precious\n")
    (directory / "gpu0.lock").symlink_to(target)
    with pytest.raises(UserError, match=r"gpu0.lock is a symbolic link: not followed; remove it"):
        gpulock.acquire(0, "worker pid 1 (session 1) on here", directory)
    with pytest.raises(UserError, match="symbolic link"):
        gpulock.is_free(0, directory)
    assert target.read_text() == "precious\n"


def test_a_hard_link_to_another_file_is_locked_but_never_written(tmp_path):
    directory, target = locks(tmp_path), tmp_path / "precious"
    target.write_text("precious\n")
    os.link(target, directory / "gpu0.lock")
    held = gpulock.acquire(0, "worker pid 1 (session 1) on here", directory)
    assert held is not None
    held.release()
    assert target.read_text() == "precious\n"


@pytest.mark.parametrize("kind", ["fifo", "directory"])
def test_a_lock_file_that_is_not_a_regular_file_is_refused(tmp_path, kind):
    directory = locks(tmp_path)
    path = directory / "gpu0.lock"
    os.mkfifo(path) if kind == "fifo" else path.mkdir()
    with pytest.raises(UserError, match=r"gpu0.lock is not a regular file: remove it"):
        gpulock.acquire(0, "worker pid 1 (session 1) on here", directory)


@as_root
def test_a_foreign_lock_dir_that_is_not_sticky_is_refused(tmp_path):
    directory = locks(tmp_path)
    os.chown(directory, NOBODY, NOBODY)
    os.chmod(directory, 0o755)  # its owner may swap gpu0.lock for a link at any time
    with pytest.raises(UserError, match=r"owned by uid 65534 and not sticky \(chmod \+t it\)"):
        gpulock.acquire(0, "worker pid 1 (session 1) on here", directory)
    assert not (directory / "gpu0.lock").exists()
    os.chmod(directory, 0o1777)  # sticky, like /tmp: a file's owner alone may replace it
    held = gpulock.acquire(0, "worker pid 1 (session 1) on here", directory)
    assert held is not None
    held.release()


def test_a_lock_dir_others_may_write_without_the_sticky_bit_is_refused(tmp_path):
    directory = locks(tmp_path)
    os.chmod(directory, 0o777)
    with pytest.raises(UserError, match=r"writable by others and not sticky \(chmod \+t it\)"):
        gpulock.acquire(0, "worker pid 1 (session 1) on here", directory)


@as_root
def test_another_users_read_only_lock_file_still_locks_and_is_not_written(tmp_path):
    directory = locks(tmp_path)
    os.chmod(directory, 0o1777)
    path = directory / "gpu0.lock"
    path.write_text("worker pid 7 (session 3) on elsewhere\n")
    os.chown(path, NOBODY, NOBODY)
    os.chmod(path, 0o444)
    held = gpulock.acquire(0, "worker pid 1 (session 1) on here", directory)
    assert held is not None
    try:
        assert not gpulock.is_free(0, directory)  # locked through it
        assert held.previous == "worker pid 7 (session 3) on elsewhere"
    finally:
        held.release()
    assert path.read_text() == "worker pid 7 (session 3) on elsewhere\n"
    assert stat.S_IMODE(path.stat().st_mode) == 0o444 and path.stat().st_uid == NOBODY


def test_a_huge_sparse_lock_file_is_read_only_to_its_first_bytes(tmp_path, monkeypatch):
    directory = locks(tmp_path)
    holder = gpulock.acquire(0, "x", directory)  # another descriptor of this process holds it
    assert holder is not None
    os.truncate(directory / "gpu0.lock", 4 << 30)  # "x\n", then 4 GiB of holes
    reads: list[int] = []
    pread = os.pread

    def counted(fd: int, n: int, offset: int) -> bytes:
        reads.append(n)
        return pread(fd, n, offset)

    monkeypatch.setattr(os, "pread", counted)
    try:
        with pytest.raises(gpulock.GpuHeld, match=r"^GPU 0 is held by x: one worker per GPU"):
            gpulock.acquire(0, "worker pid 1 (session 1) on here", directory)
    finally:
        holder.release()
    assert reads and max(reads) <= gpulock.HOLDER_BYTES


@pytest.mark.parametrize(
    ("what", "args", "said"),
    [
        ("a file", ["--gpus", "0"], "GPU lock dir {locks}: not a directory"),
        ("a planted link", ["--gpus", "0"], "GPU lock file {locks}/gpu0.lock is a symbolic link"),
        ("under /proc", ["--gpus", "0"], "GPU lock dir /proc/mlirtuna-locks: cannot create it"),
        (
            "huge id",
            ["--gpus", "99999999999999999999"],
            "bad --gpus '99999999999999999999': expected auto or a list like 0,1,2 "
            "(each once, each 0 to 65535)",
        ),
    ],
)
def test_a_bad_lock_dir_or_gpu_is_one_line_and_exit_2(db, db_url, tmp_path, what, args, said):
    sid = make_session(db, tmp_path, 1, tuner="sleep")
    lock_dir = str(tmp_path / "locks")
    if what == "a file":
        (tmp_path / "locks").write_text("")
    if what == "a planted link":
        (tmp_path / "locks").mkdir(mode=0o700)
        (tmp_path / "locks" / "gpu0.lock").symlink_to(tmp_path / "target")
        (tmp_path / "target").write_text("kept\n")
    if what == "under /proc":
        lock_dir = "/proc/mlirtuna-locks"
    run = run_cli(
        db_url, "worker", "--session", str(sid), "--tuner", "sleep", "--until-empty",
        "--gpu-lock-dir", lock_dir, *args,
    )  # fmt: skip
    assert run.code == 2, run.stderr
    assert said.format(locks=lock_dir) in run.stderr
    # One error line; a sleep session's worker also warns that its tuner uses no GPU.
    errors = [x for x in run.stderr.splitlines() if not x.startswith("warning:")]
    assert len(errors) == 1 and "Traceback" not in run.stderr, run.stderr
    if what == "a planted link":
        assert (tmp_path / "target").read_text() == "kept\n"
