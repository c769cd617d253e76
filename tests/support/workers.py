"""Real worker processes for the tests: a session of small gemm jobs, `python -m mlirtuna worker`
started as a subprocess (its stderr kept in a file), and what the tests check of them."""

from __future__ import annotations

import collections
import itertools
import os
import re
import subprocess
import time
from pathlib import Path

import sqlalchemy as sa

from mlirtuna import catalog, sessions
from mlirtuna.db import Database
from mlirtuna.db.clock import db_now
from mlirtuna.db.models import Attempt, Candidate, Job, Result
from mlirtuna.queue import jobs
from mlirtuna.sessions import SessionSpec
from support.clitools import mlirtuna_argv, subprocess_env

TESTS = str(Path(__file__).parent.parent)


def make_session(
    db: Database, tmp_path: Path, n: int, tuner: str = "plugins.claimlog:Logging"
) -> int:
    path = tmp_path / "gemm"
    path.write_text(
        "".join(
            f"-t f32 -out_datatype f32 -transA false -transB false -g 1 -m {i + 1} -n 8 -k 8\n"
            for i in range(n)
        )
    )
    catalog.import_files(db, "gemm", [str(path)], tag="w")
    sess = sessions.create(db, SessionSpec(tuner=tuner))  # its workers run this tuner
    jobs.load(db, sess.id, tag="w")
    return sess.id


def env_for(db_url: str, log: Path, sleep_s: float = 0.0, barrier: int = 0) -> dict[str, str]:
    env = subprocess_env(
        db_url, CLAIM_LOG=str(log), SLEEP_S=str(sleep_s), CLAIM_BARRIER=str(barrier)
    )
    env["PYTHONPATH"] = TESTS + os.pathsep + env["PYTHONPATH"]
    return env


def start_worker(db_url, sid, log, *extra, sleep_s=0.0, barrier=0):
    """A worker process running the session's tuner; its stderr goes to a file next to the log
    (`stderr_of(proc)`). barrier=N: its first job waits until N workers hold one."""
    argv = mlirtuna_argv("worker", "--session", str(sid), *extra)
    errlog = log.with_name(f"worker-{time.monotonic_ns()}.err")
    with open(errlog, "w") as err:
        proc = subprocess.Popen(
            argv, env=env_for(db_url, log, sleep_s, barrier), stdout=subprocess.DEVNULL, stderr=err
        )
    proc.errlog = errlog
    return proc


def stderr_of(proc) -> str:
    return proc.errlog.read_text()


def claimed_with_record(procs) -> int:
    """Jobs these workers claimed in the commit of their previous job's record, from each
    finished worker's closing line."""
    found = (
        re.search(r"(\d+) of its jobs claimed in the same commit that recorded", stderr_of(p))
        for p in procs
    )
    return sum(int(m.group(1)) for m in found if m)


def finish(procs, timeout=180):
    for p in procs:
        p.wait(timeout=timeout)


def assert_done_exactly_once(db: Database, sid: int, n: int) -> None:
    with db.session() as s:
        states = collections.Counter(s.scalars(sa.select(Job.state).where(Job.session_id == sid)))
        assert states == {"completed": n}
        per_job = s.execute(
            sa.select(Result.job_id, sa.func.count())
            .where(Result.session_id == sid)
            .group_by(Result.job_id)
        ).all()
        assert len(per_job) == n and all(c == 1 for _, c in per_job)
        assert (
            s.scalar(
                sa.select(sa.func.count()).select_from(Candidate).where(Candidate.session_id == sid)
            )
            == n
        )  # one per completed job
        completed = s.scalar(
            sa.select(sa.func.count()).select_from(Attempt).where(Attempt.outcome == "completed")
        )
        assert completed == n


def assert_never_held_twice(log_rows) -> None:
    """From the test's own log: for each problem, tuning intervals of different pids never
    overlap, and no pid starts a problem another pid is still on."""
    spans = collections.defaultdict(list)
    open_spans = {}
    for kind, pid, when, key in log_rows:
        if kind == "start":
            open_spans[(pid, key)] = when
        else:
            spans[key].append((open_spans.pop((pid, key)), when, pid))
    for key, items in spans.items():
        items.sort()
        for (_s1, e1, p1), (s2, _e2, p2) in itertools.pairwise(items):
            assert e1 <= s2, f"{key} held by {p1} and {p2} at once"


def job_states(db: Database, sid: int) -> dict[str, int]:
    return {k: v for k, v in jobs.counts(db, sid)[sid].items() if v}


def wait_for(cond, timeout: float = 30.0) -> None:
    deadline = time.monotonic() + timeout
    while not cond():
        if time.monotonic() > deadline:
            raise AssertionError("condition not reached in time")
        time.sleep(0.05)


def wait_past_lease(db: Database, job_id: int, timeout: float = 30.0) -> None:
    """Until the database's clock (the one leases are judged by) is past the job's lease: a
    worker paused that long can no longer renew it."""

    def past() -> bool:
        with db.session() as s:
            expired = sa.select(Job.lease_expires_at < db_now()).where(Job.id == job_id)
            return bool(s.scalar(expired))

    wait_for(past, timeout)


def running_job(db: Database, session_id: int) -> int:
    """The id of the session's one running job."""
    with db.session() as s:
        return s.scalars(
            sa.select(Job.id).where(Job.session_id == session_id, Job.state == "running")
        ).one()
