"""One worker per GPU, always (issue 34): two workers on one GPU never benchmark at the same
time, on every backend. This host's lock file refuses a second worker on a GPU at once (it says
who holds it and exits 2, or waits with --wait-for-gpu); the claim refuses a GPU on which
another worker has a live attempt (containers with a /tmp of their own, or another host name,
on one GPU), and two claims in the same instant end with at most one keeping its jobs."""

from __future__ import annotations

import logging
import re
import signal
import subprocess
import threading

import pytest
import sqlalchemy as sa
from support.clitools import cli, mlirtuna_argv
from support.gpuspans import Timed, overlaps
from support.workers import env_for, job_states, make_session, wait_for

from mlirtuna import machine, queue
from mlirtuna.db.models import Attempt, Job
from mlirtuna.queue import Claimant
from mlirtuna.tuners.sleep import SleepTuner
from mlirtuna.worker import Worker, WorkerSettings, gpulock, supervisor
from mlirtuna.worker.supervisor import Slot


@pytest.mark.parametrize("batch", [1, 2])
def test_two_workers_on_one_gpu_never_benchmark_at_once(db, tmp_path, batch, monkeypatch):
    """Two workers of two 'containers' (no shared lock file, other host names) on one GPU (one
    unique id), started in the same instant: every job completes once, and neither the
    benchmarks nor the completed attempts of the two ever overlap."""
    monkeypatch.setattr(machine, "gpu_identity", lambda i: machine.GpuIdentity("uid:0xfeed"))
    sid = make_session(db, tmp_path, 8, tuner="sleep")
    runs: list[tuple[str, float, float]] = []
    start = threading.Barrier(2)
    workers = []
    for name in ("c1", "c2"):
        settings = WorkerSettings(session_id=sid, tuner="sleep", gpu_id=0, until_empty=True,
                                  machine_name=name, batch=batch, wait_for_gpu=True,
                                  lease_s=30)  # fmt: skip
        workers.append(Worker(db, settings, tuner=Timed(0.05, runs, name)))

    def run(w: Worker) -> None:
        start.wait()
        w.run()

    threads = [threading.Thread(target=run, args=(w,)) for w in workers]
    for t in threads:
        t.start()
    for t in threads:
        t.join(60)
    assert not any(t.is_alive() for t in threads)
    assert job_states(db, sid) == {"completed": 8}
    assert len(runs) == 8
    assert overlaps(runs) == []
    with db.session() as s:
        attempts = s.execute(
            sa.select(Attempt.worker, Attempt.claimed_at, Attempt.ended_at).where(
                Attempt.outcome == "completed"
            )
        ).all()
    assert {w.claimant.gpu for w in workers} == {"uid:0xfeed"}
    assert len(attempts) == 8 and {a.worker for a in attempts} <= {
        w.claimant.worker for w in workers
    }
    assert overlaps([tuple(a) for a in attempts]) == []


def test_the_claim_refuses_a_gpu_another_worker_holds(db, tmp_path):
    """The same GPU named by its unique id from two host names (containers): the second
    claim takes nothing while the first's attempt is live; once recorded, it may."""
    sid = make_session(db, tmp_path, 3, tuner="sleep")
    first = Claimant("c1", 0, 11, gpu="uid:0xfeed", gpu_perf="determinism")
    second = Claimant("c2", 0, 22, gpu="uid:0xfeed")
    elsewhere = Claimant("c2", 1, 33, gpu="uid:0xbeef")
    lease = queue.claim(db, sid, first, 30)
    assert lease is not None
    assert queue.claim(db, sid, second, 30) is None
    assert queue.claim_many(db, sid, second, 30, 2) == []
    assert str(queue.gpu_holder(db, second)) == f"worker pid 11 (session {sid}) on c1"
    assert (
        queue.claim(db, sid, Claimant("c1", 0, 11, gpu="uid:0xfeed", worker=first.worker), 30)
        is not None
    )  # fmt: skip  (its own worker: prefetch, batches)
    other = queue.claim(db, sid, elsewhere, 30)  # another GPU: free
    assert other is not None
    with db.session() as s:
        recorded = s.execute(sa.select(Attempt.gpu, Attempt.gpu_perf).where(
            Attempt.lease_token == lease.token)).one()  # fmt: skip
    assert tuple(recorded) == ("uid:0xfeed", "determinism")


def pids(db) -> set[int]:
    with db.session() as s:
        return set(s.scalars(sa.select(Attempt.pid).distinct()))


@pytest.mark.slow
def test_a_second_worker_on_a_held_gpu_says_who_and_exits_2(db_url, db, tmp_path, monkeypatch):
    """This host's lock: one line naming the holder (pid, session), exit 2; --wait-for-gpu
    waits and takes the GPU when the holder stops. A worker with a lock directory of its own
    (a container) is refused by the database's live attempt instead."""
    import subprocess

    monkeypatch.setenv("ROCR_VISIBLE_DEVICES", "0")  # the in-process workers set it
    sid = make_session(db, tmp_path, 3, tuner="sleep")
    log = tmp_path / "claims.log"
    argv = mlirtuna_argv("worker", "--session", str(sid), "--gpus", "0", "--tuner", "sleep:8")
    holder = subprocess.Popen(argv, env=env_for(db_url, log), stderr=subprocess.DEVNULL)
    try:
        wait_for(lambda: job_states(db, sid).get("running") == 1)
        second = cli(db_url, "worker", "--session", str(sid), "--gpus", "0")
        assert second.code == 2
        line = second.stderr.strip().splitlines()[-1]
        assert f"GPU 0 is held by worker pid {holder.pid} (session {sid})" in line, line
        container = cli(db_url, "worker", "--session", str(sid), "--gpus", "0",
                        "--gpu-lock-dir", str(tmp_path / "own-tmp"))  # fmt: skip
        assert container.code == 2
        assert f"held by worker pid {holder.pid} (session {sid}) on" in container.stderr
        assert pids(db) == {holder.pid}  # nothing taken by either

        errors = tmp_path / "waiter.err"
        with open(errors, "w") as err:
            waiter = subprocess.Popen(
                [*argv[:-2], "--tuner", "sleep:0", "--wait-for-gpu", "--until-empty"],
                env=env_for(db_url, log), stderr=err,
            )  # fmt: skip
        waiting = "waiting for GPU 0: its lock on this host is held by"
        wait_for(lambda: waiting in errors.read_text(), 30)
        assert pids(db) == {holder.pid}
        holder.send_signal(signal.SIGINT)
        holder.send_signal(signal.SIGINT)  # the second: its job given back now
        assert holder.wait(30) is not None
        assert waiter.wait(60) == 0
        assert job_states(db, sid) == {"completed": 3}
    finally:
        for p in (holder, locals().get("waiter")):
            if p is not None and p.poll() is None:
                p.kill()
                p.wait()


def test_gpus_auto_takes_only_free_gpus(db, tmp_path, monkeypatch):
    sid = make_session(db, tmp_path, 2, tuner="sleep")
    slots = [Slot(0), Slot(1), Slot(2)]
    settings = WorkerSettings(session_id=sid, machine_name=machine.machine_name())
    said: list[str] = []
    held = gpulock.acquire(0, "worker pid 1 (session 1) on here", gpulock.lock_dir())
    try:
        # GPU 1: a live attempt of a worker of this machine in another container
        assert queue.claim(db, sid, Claimant(settings.machine_name, 1, 77,
                                             gpu=f"{settings.machine_name}:1"), 30)  # fmt: skip
        taken, locks = supervisor.free(db, settings, slots, said.append)
        assert taken == [Slot(2)] and sorted(locks) == [2]  # its lock kept, for its worker
        supervisor.release(locks)
        assert said[0] == "GPU 0 skipped: held by a worker here"
        assert said[1].startswith("GPU 1 skipped: held by worker pid 77")
    finally:
        held.release()
    taken, locks = supervisor.free(db, settings, [Slot(0)], said.append)
    supervisor.release(locks)
    assert taken == [Slot(0)]


def test_one_worker_per_gpu_in_the_plan():
    with pytest.raises(Exception, match="one worker per GPU"):
        supervisor.plan("0,1", "rocmlir", workers=2)
    with pytest.raises(Exception, match="each once"):
        supervisor.plan("0,0", "rocmlir")


ROCM_SMI = """{"card0": {"Unique ID": "0x18f68e602b8a790f", "PCI Bus": "0000:05:00.0",
"Performance Level": "determinism"}, "card1": {"Unique ID": "N/A", "PCI Bus": "0000:26:00.0",
"Performance Level": "N/A"}}"""


def test_the_performance_level_is_read_from_rocm_smi():
    """Only the performance level: which GPU it is comes from the kernel (test_gpu_identity)."""
    assert machine.rocm_smi_perf_level(ROCM_SMI, 0) == "determinism"
    assert machine.rocm_smi_perf_level(ROCM_SMI, 1) == ""
    assert machine.rocm_smi_perf_level(ROCM_SMI, 2) == ""
    assert machine.rocm_smi_perf_level("not json", 0) == ""


def test_a_workers_attempts_carry_its_gpu_identity(db, tmp_path, monkeypatch):
    def identity(i: int) -> machine.GpuIdentity:
        return machine.GpuIdentity(f"pci:0000:0{i}:00.0", "stable_std")

    monkeypatch.setattr(machine, "gpu_identity", identity)
    sid = make_session(db, tmp_path, 2, tuner="sleep")
    w = Worker(db, WorkerSettings(session_id=sid, tuner="sleep", gpu_id=3, until_empty=True),
               tuner=SleepTuner(0))  # fmt: skip
    assert w.run().completed == 2
    with db.session() as s:
        rows = s.execute(sa.select(Attempt.gpu, Attempt.gpu_perf)).all()
    assert {tuple(r) for r in rows} == {("pci:0000:03:00.0", "stable_std")}


@pytest.mark.parametrize("holder", ["gone", "live"])
def test_a_worker_waiting_for_its_gpu_says_for_what_and_until_when(
    db, tmp_path, monkeypatch, caplog, holder
):
    """Its GPU held in the database by a worker gone from this host (no lock proves it gone
    with its tools), or by a live one (--wait-for-gpu): one line naming the holder, the job
    and the time its lease ends, by the database's clock, and the seconds to it."""
    monkeypatch.setattr(machine, "gpu_identity", lambda i: machine.GpuIdentity("uid:0xfeed"))
    sid = make_session(db, tmp_path, 2, tuner="sleep")
    here = machine.machine_name()
    ended = subprocess.Popen(["true"])
    ended.wait()  # a pid no process has now
    who = Claimant(here, 0, ended.pid, gpu="uid:0xfeed") if holder == "gone" else (
        Claimant("c1", 0, 4242, gpu="uid:0xfeed"))  # fmt: skip
    lease = queue.claim(db, sid, who, 90)
    assert lease is not None
    settings = WorkerSettings(session_id=sid, tuner="sleep", gpu_id=0, until_empty=True,
                              machine_name=here, wait_for_gpu=holder == "live")  # fmt: skip
    worker = Worker(db, settings, tuner=SleepTuner(0))
    with caplog.at_level(logging.WARNING, logger="mlirtuna.worker.loop"):
        thread = threading.Thread(target=worker.run)
        thread.start()
        try:
            wait_for(lambda: any("waiting for GPU" in r.getMessage() for r in caplog.records))
        finally:
            worker.stop_requested.set()
            thread.join(30)
    [line] = [r.getMessage() for r in caplog.records if "waiting for GPU" in r.getMessage()]
    with db.session() as s:
        ends = s.scalar(sa.select(Job.lease_expires_at).where(Job.id == lease.job_id))
    lease_line = f"its lease on job {lease.job_id} ends at {ends:%Y-%m-%d %H:%M:%S} UTC (in "
    if holder == "gone":
        assert line.startswith(
            f"waiting for GPU uid:0xfeed: its holder, worker pid {ended.pid} "
            f"(session {sid}) on {here}, is gone, and {lease_line}"
        ), line
        assert line.endswith(" s); then its jobs are taken back and this worker starts")
    else:
        assert line.startswith(
            f"waiting for GPU uid:0xfeed (--wait-for-gpu): held by worker pid 4242 (session "
            f"{sid}) on c1; {lease_line}"
        ), line
        assert "at the earliest (each heartbeat renews it" in line
    seconds = int(re.search(r"\(in (\d+) s\)", line).group(1))
    assert 0 < seconds <= 90
    assert "--wait-for-gpu waits for it" not in line and "gone: its leases expire" not in line
