"""--batch K: one tuningRunner.py call for up to K jobs (E3, E4), each job recorded as its row
appears, on every backend, against the stand-in tool."""

from __future__ import annotations

import collections
import datetime as dt
import json
import signal
import subprocess
import sys
import threading
import time
from pathlib import Path

import pytest
import sqlalchemy as sa
from support.clitools import cli, mlirtuna_argv, run_cli, subprocess_env
from support.rocmlir import mark_standin
from support.workers import wait_for

from mlirtuna import catalog, queue, sessions
from mlirtuna.db.models import Attempt, Candidate, Job, Problem, Result
from mlirtuna.errors import BatchRefused, Unsupported
from mlirtuna.problems import ExpandOptions
from mlirtuna.queue import Claimant, jobs
from mlirtuna.sessions import SessionSpec
from mlirtuna.tuners.process import Run
from mlirtuna.tuners.rocmlir import outcome, parse_debug_lines
from mlirtuna.tuners.rocmlir.batch import driver_segment
from mlirtuna.worker import Worker, WorkerSettings

# The flow over whole workers: each backend in .ci/run, SQLite in the quick loop (the
# queue, claim and settle SQL it runs is tested on all three there too).
pytestmark = pytest.mark.backends(fast=("sqlite",))

ARCH_FULL = "gfx942:sramecc+:xnack-"


def op_lines(op: str, n: int) -> list[str]:
    """n distinct problems of an op."""
    if op == "gemm":
        return gemm_lines(n)
    if op == "conv":
        return [
            f"convfp16 -F 1 -f NCHW -I NCHW -O NCHW -n {16 * (i + 1)} -c 64 -H 28 -W 28 -k 64 "
            "-y 3 -x 3 -p 1 -q 1 -u 1 -v 1 -l 1 -j 1 -m conv -g 1 -t 1"
            for i in range(n)
        ]
    return [
        "-t f16 -transQ false -transK true -transV false -transO false -g 12 "
        f"-seq_len_q {128 * (i + 1)} -seq_len_k 384 -head_dim_qk 64 -head_dim_v 64"
        for i in range(n)
    ]


def gemm_lines(n: int) -> list[str]:
    return [
        f"-t f16 -out_datatype f16 -transA false -transB false -g 1 -m {64 * (i + 1)} -n 512 -k 768"
        for i in range(n)
    ]


def session_of(db, tmp_path, lines: list[str], op: str = "gemm", tag: str = "b") -> int:
    path = tmp_path / f"{tag}-configs"
    path.write_text("".join(f"{line}\n" for line in lines))
    catalog.import_files(db, op, [str(path)], ExpandOptions(expand=False), tag=tag)
    spec = SessionSpec(
        tuner="rocmlir", arch_full=ARCH_FULL, num_cu=304, num_chiplets=8, tuning_space="quick",
        rocm_v="6.4", mlir_v="abc",
    )  # fmt: skip
    sess = sessions.create(db, spec)
    jobs.load(db, sess.id, tag=tag)
    return mark_standin(db, sess.id)


def worker(db, sid, build, **changes) -> Worker:
    settings = WorkerSettings(
        session_id=sid, tuner="rocmlir", gpu_id=0, until_empty=True, mlir_build_dir=str(build),
        max_retries=3, backoff_s=0, job_timeout_s=60,
    )  # fmt: skip
    for key, value in changes.items():
        setattr(settings, key, value)
    return Worker(db, settings)


def tool_calls(log) -> list[dict]:
    if not log.exists():
        return []
    calls = [json.loads(line) for line in log.read_text().splitlines()]
    return [c for c in calls if "--help" not in c["argv"]]


def states(db, sid) -> dict[str, int]:
    with db.session() as s:
        return dict(
            collections.Counter(s.scalars(sa.select(Job.state).where(Job.session_id == sid)))
        )


def winners(db, sid) -> dict[int, tuple[str, list[tuple[str, float | None]]]]:
    """problem id -> (winning perf config, every candidate with its time)."""
    with db.session() as s:
        won = dict(
            s.execute(
                sa.select(Result.problem_id, Result.perf_config).where(Result.session_id == sid)
            ).all()
        )
        tried = collections.defaultdict(list)
        for problem_id, perf_config, ns in s.execute(
            sa.select(Candidate.problem_id, Candidate.perf_config, Candidate.kernel_time).where(
                Candidate.session_id == sid
            )
        ):
            tried[problem_id].append((perf_config, ns and round(ns, 3)))
    return {p: (w, sorted(tried[p], key=str)) for p, w in won.items()}


@pytest.mark.parametrize(
    ("era", "op"), [("E3", "gemm"), ("E4", "gemm"), ("E3", "conv"), ("E4", "attention")]
)
def test_a_batch_of_four_is_one_tool_call_with_the_results_of_four(
    db, tmp_path, build, monkeypatch, era, op
):
    monkeypatch.setenv("FAKE_TUNINGRUNNER_ERA", era)
    log = tmp_path / "calls.jsonl"
    monkeypatch.setenv("FAKE_TUNINGRUNNER_LOG", str(log))
    lines = op_lines(op, 4)
    batched = session_of(db, tmp_path, lines, op, tag="k4")
    w = worker(db, batched, build, batch=4)
    w.run()
    assert w.stats.completed == 4 and states(db, batched) == {"completed": 4}
    calls = tool_calls(log)
    assert len(calls) == 1 and "--configs-file=-" in calls[0]["argv"]
    assert "--abort-on-error" not in calls[0]["argv"]  # one failed config must not stop the rest

    log.unlink()
    single = session_of(db, tmp_path, lines, op, tag="k1")
    worker(db, single, build).run()
    assert len(tool_calls(log)) == 4
    # The same winners and candidates (each with its own time) as one call per job.
    assert winners(db, batched) == winners(db, single)
    assert all(len(tried) > 1 for _, tried in winners(db, batched).values())
    with db.session() as s:
        outputs = s.scalars(sa.select(Job.result).where(Job.session_id == batched)).all()
    assert all(out.count("\n") == 1 for out in outputs)  # each job keeps its own row


def candidate_errors(db, sid) -> dict[int, list[tuple[str, str | None]]]:
    """problem id -> every candidate's perf config with its error text."""
    with db.session() as s:
        rows = s.execute(
            sa.select(Candidate.problem_id, Candidate.perf_config, Candidate.error).where(
                Candidate.session_id == sid
            )
        ).all()
    errors = collections.defaultdict(list)
    for problem_id, perf_config, error in rows:
        errors[problem_id].append((perf_config, error))
    return {p: sorted(e, key=str) for p, e in errors.items()}


def test_a_discarded_candidate_is_discarded_only_for_its_own_config(
    db, tmp_path, build, monkeypatch
):
    # The stand-in's E4 driver discards a perf config of the first problem that is N/A for
    # the second (fake e4_discarded): in one call, the second's must stay N/A.
    monkeypatch.setenv("FAKE_TUNINGRUNNER_ERA", "E4")
    lines = gemm_lines(3)[1:]
    batched = session_of(db, tmp_path, lines, tag="k2")
    assert worker(db, batched, build, batch=2).run().completed == 2
    single = session_of(db, tmp_path, lines, tag="k1")
    assert worker(db, single, build).run().completed == 2
    assert candidate_errors(db, batched) == candidate_errors(db, single)
    texts = [e for errs in candidate_errors(db, batched).values() for _, e in errs]
    assert any(e and "Discarded by" in e for e in texts) and any(e and "N/A" in e for e in texts)


def test_each_job_is_recorded_while_the_tool_still_runs(db, tmp_path, build, monkeypatch):
    monkeypatch.setenv("FAKE_TUNINGRUNNER_ERA", "E3")
    monkeypatch.setenv("FAKE_TUNINGRUNNER_DELAY", "0.6")
    sid = session_of(db, tmp_path, gemm_lines(4))
    seen: list[tuple[float, int]] = []
    done = threading.Event()

    def watch() -> None:
        while not done.is_set():
            seen.append((time.monotonic(), states(db, sid).get("completed", 0)))
            time.sleep(0.05)

    watcher = threading.Thread(target=watch)
    watcher.start()
    try:
        w = worker(db, sid, build, batch=4)
        w.run()
        end = time.monotonic()
    finally:
        done.set()
        watcher.join()
    assert w.stats.completed == 4
    # Jobs complete one by one while the call runs, not all four at its end: the database's
    # own clock stamps each as it is recorded, 0.6 s of the tool apart (read from the rows: a
    # watcher thread sampling every 50 ms can be starved on a loaded host), …
    with db.session() as s:
        finished = sorted(s.scalars(sa.select(Job.finished_at).where(Job.session_id == sid)))
    assert len(finished) == 4 and (finished[-1] - finished[0]).total_seconds() >= 0.9
    # … and a reader sees them committed one by one, before the call ended.
    assert any(0 < c < 4 for t, c in seen if t < end)


def job_rows(db, sid) -> list[Job]:
    with db.session() as s:
        rows = s.scalars(sa.select(Job).where(Job.session_id == sid).order_by(Job.id)).all()
        s.expunge_all()
        return rows


def attempts_of(db, job_id: int) -> list[str | None]:
    with db.session() as s:
        return s.scalars(
            sa.select(Attempt.outcome).where(Attempt.job_id == job_id).order_by(Attempt.id)
        ).all()


@pytest.mark.parametrize(
    ("era", "fault", "message"),
    [
        ("E3", "fail", "state failed"),
        ("E4", "fail", "state failed"),
        ("E4", "gpu_timeout", "GPU run timed out"),
    ],
)
def test_a_config_the_tool_fails_fails_only_its_job(
    db, tmp_path, build, monkeypatch, era, fault, message
):
    monkeypatch.setenv("FAKE_TUNINGRUNNER_ERA", era)
    monkeypatch.setenv("FAKE_TUNINGRUNNER_FAULT", fault)
    monkeypatch.setenv("FAKE_TUNINGRUNNER_FAULT_CONFIG", "-m 128 ")  # the second of four
    log = tmp_path / "calls.jsonl"
    monkeypatch.setenv("FAKE_TUNINGRUNNER_LOG", str(log))
    sid = session_of(db, tmp_path, gemm_lines(4))
    w = worker(db, sid, build, batch=4, max_retries=1)
    w.run()
    assert len(tool_calls(log)) == 1  # the tool went on past the failed config
    rows = job_rows(db, sid)
    assert [j.state for j in rows] == ["completed", "error", "completed", "completed"]
    assert message in rows[1].result
    assert w.stats.completed == 3 and w.stats.failed == 1


@pytest.mark.parametrize(
    ("fault", "message"),
    [("hang", "timeout"), ("crash_partial", "exited with status 139")],
)
@pytest.mark.slow  # signals and timeouts
def test_a_tool_stopped_mid_batch_keeps_what_it_recorded(
    db, tmp_path, build, monkeypatch, fault, message
):
    """The tool hangs (killed at the batch's timeout) or crashes on the second config of four:
    the first stays recorded, the second fails, the two never begun go back untouched."""
    monkeypatch.setenv("FAKE_TUNINGRUNNER_ERA", "E3")
    monkeypatch.setenv("FAKE_TUNINGRUNNER_FAULT", fault)
    monkeypatch.setenv("FAKE_TUNINGRUNNER_FAULT_CONFIG", "-m 128 ")
    log = tmp_path / "calls.jsonl"
    monkeypatch.setenv("FAKE_TUNINGRUNNER_LOG", str(log))
    sid = session_of(db, tmp_path, gemm_lines(4))
    w = worker(db, sid, build, batch=4, max_retries=1, job_timeout_s=1.0)
    w.tuner.kill_grace_s = 0.5
    w.run()
    rows = job_rows(db, sid)
    assert [j.state for j in rows] == ["completed", "error", "completed", "completed"]
    assert message in rows[1].result
    assert [j.retries for j in rows] == [0, 1, 0, 0]
    assert attempts_of(db, rows[0].id) == ["completed"]
    assert attempts_of(db, rows[1].id) == ["failed"]
    for job in rows[2:]:  # given back, then tuned by the next call
        assert attempts_of(db, job.id) == ["released", "completed"]
    assert len(tool_calls(log)) == 2
    assert w.stats.released == 2


def test_a_lost_lease_loses_only_its_own_job(db, tmp_path, build, monkeypatch):
    monkeypatch.setenv("FAKE_TUNINGRUNNER_ERA", "E3")
    monkeypatch.setenv("FAKE_TUNINGRUNNER_DELAY", "0.4")
    sid = session_of(db, tmp_path, gemm_lines(4))
    last = job_rows(db, sid)[-1].id

    def take_the_last_away() -> None:  # as an operator's requeue would, mid-batch
        deadline = time.monotonic() + 30
        while time.monotonic() < deadline:
            with db.session() as s:
                done = s.execute(
                    sa.update(Job)
                    .where(Job.id == last, Job.state == "running")
                    .values(state="new", lease_token=None, lease_expires_at=None)
                ).rowcount
            if done:
                return
            time.sleep(0.02)

    thief = threading.Thread(target=take_the_last_away)
    thief.start()
    w = worker(db, sid, build, batch=4, max_jobs=4, lease_s=0.9)
    w.run()
    thief.join()
    assert (w.stats.completed, w.stats.lost) == (3, 1)
    rows = job_rows(db, sid)
    assert [j.state for j in rows] == ["completed", "completed", "completed", "new"]
    with db.session() as s:
        for table in (Result, Candidate):
            n = s.scalar(sa.select(sa.func.count()).select_from(table).where(table.job_id == last))
            assert n == 0


def test_claim_many_takes_each_job_with_its_own_lease(db, tmp_path):
    sid = session_of(db, tmp_path, gemm_lines(5))
    who = Claimant("host", 0)
    tokens = [queue.new_token() for _ in range(3)]
    taken = queue.claim_many(db, sid, who, 30, 3, tokens)
    assert [lease.token for lease in taken] == tokens
    assert [lease.job_id for lease in taken] == [j.id for j in job_rows(db, sid)[:3]]
    assert all(lease.problem is not None for lease in taken)
    # A retried claim finds what the lost reply took, and claims nothing twice.
    assert [lease.job_id for lease in queue.claimed_with_any(db, tokens)] == [
        lease.job_id for lease in taken
    ]
    rest = queue.claim_many(db, sid, who, 30, 3)
    assert len(rest) == 2 and not {r.job_id for r in rest} & {t.job_id for t in taken}
    assert queue.claim_many(db, sid, who, 30, 3) == []
    # Each job is settled on its own.
    assert queue.release(db, taken[1])
    assert not queue.heartbeat(db, taken[1], 30) and queue.heartbeat(db, taken[0], 30)
    with db.session() as s:
        outcomes = s.scalars(sa.select(Attempt.outcome).order_by(Attempt.id)).all()
    assert outcomes.count("released") == 1 and len(outcomes) == 5


def test_batch_must_be_at_least_one(db_url):
    run = cli(db_url, "worker", "--session", "1", "--batch", "0")
    assert run.code == 2
    assert run.stderr.strip().splitlines() == ["error: --batch 0: give 1 or more jobs"]


def test_a_batch_claim_whose_reply_was_lost_counts_once(db, tmp_path, monkeypatch):
    """The first batch claim commits, then loses its reply (a server restart between the commit
    and the answer): the retry finds the jobs its tokens took; none is held unowned."""
    import pymysql

    from mlirtuna.db import faults
    from mlirtuna.tuners.sleep import SleepTuner

    lost = {"claim_many": 1}
    real = queue.claim_many

    def lossy(*args, **kw):
        taken = real(*args, **kw)
        if lost["claim_many"]:
            lost["claim_many"] -= 1
            orig = pymysql.err.OperationalError(2013, "Lost connection to server")
            raise sa.exc.OperationalError("UPDATE job …", {}, orig)
        return taken

    monkeypatch.setattr(queue, "claim_many", lossy)
    monkeypatch.setattr(faults, "DB_RETRY_S", 0.05)
    path = tmp_path / "gemm"
    path.write_text("".join(f"{line}\n" for line in gemm_lines(6)))
    catalog.import_files(db, "gemm", [str(path)], tag="s")
    sid = sessions.create(db, SessionSpec(tuner="sleep")).id
    jobs.load(db, sid, tag="s")
    settings = WorkerSettings(session_id=sid, tuner="sleep", until_empty=True, batch=4)
    w = Worker(db, settings, tuner=SleepTuner(0.0))
    w.run()
    assert lost == {"claim_many": 0}
    assert (w.stats.completed, w.stats.lost, w.stats.failed) == (6, 0, 0)
    with db.session() as s:
        assert s.scalars(sa.select(Attempt.outcome)).all() == ["completed"] * 6
        assert s.scalars(sa.select(Job.retries)).all() == [0] * 6


def test_cli_workers_pass_batch_on(db, db_url, tmp_path, build, monkeypatch):
    """`worker --gpus 0,1 --batch 4` starts two workers that each tune four jobs in one call."""
    log = tmp_path / "calls.jsonl"
    sid = session_of(db, tmp_path, gemm_lines(8))
    run = run_cli(
        db_url, "worker", "--session", str(sid), "--gpus", "0,1", "--batch", "4",
        "--mlir-build-dir", str(build), "--until-empty",
        MLIRTUNA_ROCMLIR_PYTHON=sys.executable, FAKE_TUNINGRUNNER_LOG=str(log),
    )  # fmt: skip
    assert run.code == 0, run.stderr
    assert states(db, sid) == {"completed": 8}
    calls = tool_calls(log)
    assert len(calls) == 2 and all("--configs-file=-" in c["argv"] for c in calls)


@pytest.mark.slow  # signals and timeouts
def test_first_signal_finishes_the_batch_second_gives_it_back(db, db_url, tmp_path, build):
    sid = session_of(db, tmp_path, gemm_lines(8))
    argv = mlirtuna_argv(
        "worker", "--session", str(sid), "--gpus", "0", "--batch", "4",
        "--mlir-build-dir", str(build),
    )  # fmt: skip
    env = subprocess_env(db_url, MLIRTUNA_ROCMLIR_PYTHON=sys.executable)
    env["FAKE_TUNINGRUNNER_DELAY"] = "0.5"

    errlog = tmp_path / "worker.err"

    def start() -> subprocess.Popen:
        with open(errlog, "w") as err:
            proc = subprocess.Popen(argv, env=env, stdout=subprocess.DEVNULL, stderr=err)
        # Begun: four jobs held and the tool called on them (a signal between the claim and the
        # call gives the jobs back, never begun: the worker looks at its GPU in between).
        wait_for(
            lambda: (
                states(db, sid).get("running", 0) >= 4
                and "problems in one call" in errlog.read_text()
            ),
            timeout=60,
        )
        return proc

    w = start()
    w.send_signal(signal.SIGTERM)  # the batch runs to its end, then the worker stops
    assert w.wait(timeout=60) == 0, errlog.read_text()
    assert states(db, sid) == {"completed": 4, "new": 4}

    w = start()
    w.send_signal(signal.SIGINT)
    wait_for(lambda: "signal again" in errlog.read_text())  # the first is handled
    w.send_signal(signal.SIGINT)  # every job of the batch not recorded yet goes back now
    assert w.wait(timeout=60) == 0, errlog.read_text()
    rows = job_rows(db, sid)
    given_back = [j for j in rows if j.state == "new"]
    assert given_back and "running" not in states(db, sid)
    for job in given_back:
        assert job.retries == 0 and attempts_of(db, job.id)[-1] == "released"


def test_driver_lines_of_a_config_that_got_no_row_are_skipped():
    debug = ["PerfConfig\tTFlops\tM\n", "a\t1.5\t64\n", "b\t\t64\n", "c\t\t64\n"]
    block = parse_debug_lines(debug, Path("x.debug"))
    failed = [("a", "N/A"), ("b", "N/A"), ("c", "Discarded")]  # "No valid perf config found"
    own = [("c", "Discarded"), ("a", "12.5"), ("b", "N/A")]  # its own lines, in another order
    assert driver_segment(failed + own, 0, block) == 3
    assert driver_segment(failed + own, 4, block) is None
    assert driver_segment(failed, 0, block) is None  # "a" has a time in the .debug file


# --- batch isolation (issue 22): a line the tool refuses never fails the innocent jobs; a usage
# error is never retried; import refuses what the real perfRunner parser refuses ------------

REAL = Path(__file__).parent / "data" / "rocmlir-real"
BAD = "-t f16 -out_datatype f16 -transA false -transB false -transO true -g 1 -m 64 -n 64 -k 64"


def test_import_takes_trans_o_and_jobs_load_refuses_what_the_build_cannot_tune(
    db, db_url, tmp_path, build, monkeypatch
):
    # Issue 33: import stores -transO (one gemm problem, every key form); a session whose build
    # cannot tune `-transO true` (3fc5be9e's gemm parser has no -transO) refuses those problems
    # at `jobs load`, in one line, loading nothing.
    path = tmp_path / "configs"
    spelled = gemm_lines(1)[0].replace("-transB false", "-transB false -transO false")
    path.write_text(f"{gemm_lines(1)[0]}\n{spelled}\n{BAD}\n")
    report = catalog.import_files(db, "gemm", [str(path)], ExpandOptions(expand=False), tag="x")
    assert (report.lines, report.new) == (3, 2)  # `-transO false` is the line without it
    with db.session() as s:
        vectors = set(s.scalars(sa.select(Problem.test_vector)))
    assert vectors == {gemm_lines(1)[0], BAD}
    args = ["session", "new", "--tuner", "rocmlir", "--arch-full", ARCH_FULL, "--num-cu", "304",
            "--num-chiplets", "8", "--tuning-space", "quick", "--mlir-build-dir", str(build),
            "--json"]  # fmt: skip
    for era, refused in (("E3", True), ("E4", False)):
        made = cli(db_url, *args, env={"FAKE_TUNINGRUNNER_ERA": era})
        assert made.code == 0, made.stderr
        sid = str(made.json()["id"])
        loaded = cli(db_url, "jobs", "load", "--session", sid, "--tag", "x")
        if refused:
            lines = loaded.stderr.strip().splitlines()
            assert loaded.code == 2 and len(lines) == 1, loaded.stderr
            assert "cannot tune gemm -transO true" in lines[0] and BAD in lines[0]
            assert sum(jobs.counts(db, int(sid))[int(sid)].values()) == 0  # nothing loaded
        else:
            assert loaded.code == 0, loaded.stderr
            assert sum(jobs.counts(db, int(sid))[int(sid)].values()) == 2
    # A missing -out_datatype is no error: the canonical form spells it, as the tool's -c does.
    path.write_text("-t f16 -transA false -transB false -g 1 -m 8 -n 8 -k 8\n")
    catalog.import_files(db, "gemm", [str(path)], ExpandOptions(expand=False), tag="y")


def test_a_batch_the_tool_refuses_is_tuned_alone_without_a_retry_counted(
    db, tmp_path, build, monkeypatch
):
    # A -transO true problem in a session whose build was not read when it was opened (so
    # `jobs load` could not refuse it): this tool refuses any -transO, so the batch call fails
    # before tuning anything, as the real one does.
    monkeypatch.setenv("FAKE_TUNINGRUNNER_ERA", "E3")
    log = tmp_path / "calls.jsonl"
    monkeypatch.setenv("FAKE_TUNINGRUNNER_LOG", str(log))
    lines = gemm_lines(3)
    lines[1] = lines[1].replace("-transB false", "-transB false -transO true")
    sid = session_of(db, tmp_path, lines)
    w = worker(db, sid, build, batch=3, max_retries=1)
    w.run()
    rows = job_rows(db, sid)
    assert [j.state for j in rows] == ["completed", "error", "completed"]
    assert "Unknown GEMM config argument -transO" in rows[1].result
    # The innocent ones: completed in their first attempt, no retry counted.
    for job in (rows[0], rows[2]):
        assert job.retries == 0 and attempts_of(db, job.id) == ["completed"]
    calls = tool_calls(log)
    assert "--configs-file=-" in calls[0]["argv"]  # the batch, then each alone
    assert sum("--configs-file=-" not in c["argv"] for c in calls) >= 3


def test_a_usage_error_is_never_retried(db, tmp_path, build, monkeypatch):
    monkeypatch.setenv("FAKE_TUNINGRUNNER_ERA", "E3")
    monkeypatch.setenv("FAKE_TUNINGRUNNER_FAULT", "usage")
    log = tmp_path / "calls.jsonl"
    monkeypatch.setenv("FAKE_TUNINGRUNNER_LOG", str(log))
    for batch, tag in ((1, "one"), (3, "three")):
        sid = session_of(db, tmp_path, gemm_lines(3), tag=tag)
        w = worker(db, sid, build, batch=batch, max_retries=3)
        w.run()
        rows = job_rows(db, sid)
        assert [j.state for j in rows] == ["error"] * 3
        for job in rows:
            assert len(attempts_of(db, job.id)) == 1  # one attempt, no retry
            assert "exit 2, not retried" in job.result
            assert "error: argument --op: refused" in job.result


def tool_run(returncode: int, stderr: str) -> Run:
    now = dt.datetime.now(dt.UTC)
    return Run(returncode, "", stderr, now, now)


def test_the_real_tools_usage_error_and_parse_failure_are_told_apart() -> None:
    usage = (REAL / "fusion-config-usage" / "stderr.txt").read_text()
    err = outcome.failure(tool_run(2, usage))
    assert isinstance(err, Unsupported)
    assert str(err).endswith(
        "tuningRunner.py: error: argument --op=fusion: requires --test-dir to be specified"
    )
    bad = (REAL / "gemm-bad-line" / "stderr.txt").read_text()
    err = outcome.failure(tool_run(1, bad))
    assert not isinstance(err, Unsupported | BatchRefused)
    assert "Unknown GEMM config argument -transO -> true" in str(err)
    assert outcome.usage_error(tool_run(2, "no argparse line here\n")) is None
