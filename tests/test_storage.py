"""Storage errors (not a database, read-only file system, disk full) are one line naming the
path and exit 2; an export that cannot be written leaves the old file whole."""

from __future__ import annotations

import contextlib
import os
import shutil
import subprocess
from pathlib import Path

import pytest
from support.clitools import cli

from mlirtuna.errors import UserError
from mlirtuna.history.export import write_text

GEMM_LINE = "-t f32 -out_datatype f32 -transA false -transB false -g 1 -m 64 -n 64 -k 64\n"


def _one_line(run, *fragments: str) -> None:
    lines = run.stderr.strip().splitlines()
    assert run.code == 2 and len(lines) == 1, run.stderr
    for fragment in fragments:
        assert fragment in lines[0]


def test_a_file_that_is_not_a_database(tmp_path):
    path = tmp_path / "junk.db"
    path.write_bytes(os.urandom(8192))
    _one_line(cli(f"sqlite:///{path}", "status"), str(path), "not a database")


@contextlib.contextmanager
def _tmpfs(where: Path, size: str):
    if os.geteuid() != 0 or shutil.which("mount") is None:
        pytest.skip("mounting a small tmpfs needs root")
    where.mkdir()
    done = subprocess.run(["mount", "-t", "tmpfs", "-o", f"size={size}", "tmpfs", str(where)],
                          capture_output=True, check=False)  # fmt: skip
    if done.returncode:
        pytest.skip(f"cannot mount a tmpfs here: {done.stderr.decode().strip()}")
    try:
        yield where
    finally:
        subprocess.run(["umount", "-l", str(where)], check=False)


def test_a_full_disk_is_one_line_and_keeps_the_old_export(tmp_path):
    with _tmpfs(tmp_path / "small", "64k") as small:
        target = small / "mlir_tuning_gfx942.tsv"
        target.write_text("the old file\n")
        with pytest.raises(UserError) as info:
            write_text(str(target), "x" * (1 << 20))
        assert str(target) in str(info.value) and "No space left" in str(info.value)
        assert target.read_text() == "the old file\n"
        assert [p.name for p in small.iterdir()] == [target.name]  # no temp file left


def test_a_read_only_database_is_one_line(tmp_path):
    with _tmpfs(tmp_path / "ro", "8m") as ro:
        url = f"sqlite:///{ro / 'm.db'}"
        from mlirtuna.db import Database

        Database(url, create=True).dispose()
        subprocess.run(["mount", "-o", "remount,ro", str(ro)], check=True)
        configs = tmp_path / "gemm"
        configs.write_text(GEMM_LINE)
        _one_line(cli(url, "import", "--op", "gemm", str(configs)), str(ro / "m.db"))


@pytest.mark.slow  # a full disk, waited out
def test_a_worker_whose_disk_fills_keeps_its_result_then_stops_cleanly(tmp_path):
    """The database's disk fills while a job is tuned: the worker keeps the result and retries
    recording until there is room; filled again, two signals stop it at once (the job it held
    comes back through its lease)."""
    import signal
    import time

    from support.workers import job_states, make_session, start_worker, stderr_of, wait_for

    from mlirtuna.db import Database

    with _tmpfs(tmp_path / "disk", "4m") as disk:
        url = f"sqlite:///{disk / 'm.db'}"
        db = Database(url)
        sid = make_session(db, tmp_path, 3)
        w = start_worker(url, sid, tmp_path / "log", "--lease", "600", sleep_s=2.0)
        wait_for(lambda: job_states(db, sid).get("running") == 1, timeout=60)
        filler = disk / "filler"
        subprocess.run(["dd", "if=/dev/zero", f"of={filler}", "bs=64k"], capture_output=True)
        time.sleep(4)  # the tune ends; recording fails on the full disk and is retried
        assert job_states(db, sid).get("completed", 0) == 0
        filler.unlink()
        wait_for(lambda: job_states(db, sid).get("completed", 0) >= 1, timeout=60)
        wait_for(lambda: job_states(db, sid).get("running") == 1, timeout=60)
        subprocess.run(["dd", "if=/dev/zero", f"of={filler}", "bs=64k"], capture_output=True)
        time.sleep(3)
        w.send_signal(signal.SIGTERM)
        time.sleep(0.5)
        w.send_signal(signal.SIGTERM)
        assert w.wait(timeout=30) in (0, 2), stderr_of(w)
        err = stderr_of(w)
        assert "database unavailable" in err and "Traceback" not in err
        filler.unlink()
        assert job_states(db, sid).get("completed", 0) >= 1
        db.dispose()
