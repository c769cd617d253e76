"""What an operator running a week is told (issue 44 §2): `jobs load` leaves out what the
session's tuner can never run, as `run` does; a cpu session's worker says which flags it does
not use, and a cpu session takes no GPU arch; `status --watch` ends when the session has, with
`wait`'s exit status, and shows jobs/min and ETA; `run`, `worker` and `session new` share one
definition of each option they have in common."""

from __future__ import annotations

import click
import pytest
import typer
from support.clitools import cli, one_line, run_cli
from support.queueing import two_job_session
from support.results import gemm, new_session, tune

from mlirtuna import queue
from mlirtuna.cli import app
from mlirtuna.queue import Claimant, jobs
from mlirtuna.tuners.base import Candidate, TuneOutcome
from mlirtuna.worker import supervisor

GEMM = "-t {t} -out_datatype {t} -transA false -transB false -g 1 -m {m} -n 16 -k 16\n"


def cpu_session(db_url: str, *more: str) -> int:
    opened = cli(db_url, "session", "new", "--tuner", "cpu", "--tuning-space", "quick", *more)
    assert opened.code == 0, opened.stderr
    return int(opened.stdout)


# -- jobs load: the same check as run's -------------------------------------------------------


def test_jobs_load_leaves_out_what_the_cpu_tuner_cannot_run(db_url, tmp_path):
    lists = tmp_path / "mixed"
    lists.write_text(GEMM.format(t="f32", m=8) + GEMM.format(t="fp8", m=8))
    (tmp_path / "fp8").write_text(GEMM.format(t="fp8", m=16))
    for tag, path in (("mixed", lists), ("fp8", tmp_path / "fp8")):
        imported = cli(db_url, "import", "--op", "gemm", "--no-expand", "--tag", tag, str(path))
        assert imported.code == 0, imported.stderr
    sid = cpu_session(db_url)
    loaded = cli(db_url, "jobs", "load", "--session", str(sid), "--tag", "mixed", "--json")
    assert loaded.code == 0, loaded.stderr
    report = loaded.json()
    assert report["added"] == 1
    [(why, vectors)] = report["cannot_run"].items()
    assert "fp8" in why and len(vectors) == 1 and vectors[0].startswith("-t fp8")
    assert loaded.stderr.splitlines() == [
        f"warning: skipping 1 problem(s): {why} (e.g. {vectors[0]})"
    ]
    listed = cli(db_url, "jobs", "list", "--session", str(sid), "--json").json()
    assert [j["test_vector"][:6] for j in listed] == ["-t f32"]
    # --skip-tuned loads through the same check
    again = cli(db_url, "jobs", "load", "--session", str(sid), "--tag", "mixed", "--skip-tuned")
    assert again.code == 0 and again.stderr.startswith("warning: skipping 1 problem(s): ")
    # nothing it can run: refused, nothing loaded
    one_line(
        cli(db_url, "jobs", "load", "--session", str(sid), "--tag", "fp8"),
        f"session {sid}'s cpu tuner can run none of the 1 selected problem(s)", "fp8",
        "nothing loaded",
    )  # fmt: skip
    assert len(cli(db_url, "jobs", "list", "--session", str(sid), "--json").json()) == 1


# -- a cpu session: flags it does not use, and no GPU arch ------------------------------------


def test_a_cpu_sessions_worker_says_which_flags_it_does_not_use(db_url, monkeypatch):
    sid = cpu_session(db_url)  # no jobs: a worker with --until-empty ends at once
    build = "/opt/rocMLIR/build"
    alone = cli(db_url, "worker", "--session", str(sid), "--until-empty",
                "--mlir-build-dir", build)  # fmt: skip
    assert alone.code == 0, alone.stderr
    assert alone.stderr.splitlines()[0] == (
        f"warning: session {sid}'s tuner cpu runs no rocMLIR build: --mlir-build-dir {build} "
        "is not used"
    )
    from_env = cli(db_url, "worker", "--session", str(sid), "--until-empty",
                   env={"MLIRTUNA_ROCMLIR_BUILD": build})  # fmt: skip
    assert f"MLIRTUNA_ROCMLIR_BUILD={build} is not used" in from_env.stderr.splitlines()[0]
    monkeypatch.setattr(supervisor, "start", lambda *_a, **_k: [])  # two workers: not started
    pinned = cli(db_url, "worker", "--session", str(sid), "--gpus", "0,1")
    assert pinned.code == 0, pinned.stderr
    assert pinned.stderr.splitlines()[0] == (
        f"warning: session {sid}'s tuner cpu uses no GPU: --gpus 0,1 pins one worker to each "
        "of those GPUs anyway, each holding its GPU's lock on this host (a GPU worker there "
        "waits for it); --workers N runs N CPU workers instead"
    )


@pytest.mark.parametrize("flag", ["--arch", "--arch-full"])
def test_a_cpu_session_takes_no_gpu_arch(db_url, flag):
    value = "gfx942" if flag == "--arch" else "gfx942:sramecc+:xnack-"
    one_line(
        cli(db_url, "session", "new", "--tuner", "cpu", flag, value),
        f"{flag} {value} with the cpu tuner: it measures this machine's CPU",
        f"exported as {value}'s", f"leave {flag} out", "--tuner rocmlir",
    )  # fmt: skip
    assert cli(db_url, "session", "list", "--json").json() == []
    assert cpu_session(db_url, "--arch", "cpu-test") == 1  # a CPU's arch is taken


# -- status --watch ends, and shows rate and ETA -----------------------------------------------


def _finish(db, sid: int, fail: bool) -> None:
    who = Claimant("h", 0, 1)
    win = Candidate("pc", 10.0, 1.0)
    queue.record(db, queue.claim(db, sid, who, 60), TuneOutcome([win], win))
    lease = queue.claim(db, sid, who, 60)
    if fail:
        queue.fail(db, lease, "tool crashed", max_retries=1, backoff_s=0)
    else:
        queue.record(db, lease, TuneOutcome([win], win))


@pytest.mark.parametrize(("fail", "code"), [(False, 0), (True, 1)])
def test_status_watch_ends_on_a_finished_session_with_waits_exit_status(
    db, db_url, tmp_path, fail, code
):
    sid = two_job_session(db, tmp_path)
    _finish(db, sid, fail)
    run = run_cli(db_url, "status", "--session", str(sid), "--watch", "--json")
    assert run.code == code, run.stderr
    [shown] = run.json()["sessions"]  # one refresh: nothing was open
    assert shown["counts"]["error"] == int(fail) and shown["eta_s"] is None
    assert run.stderr.startswith("status --watch: no job new, waiting or running")
    assert ("jobs in error (session" in run.stderr) == fail


def test_status_shows_jobs_per_minute_and_eta_while_jobs_are_open(db, db_url, tmp_path):
    sid = new_session(db)
    tune(db, tmp_path, sid, [gemm(16), gemm(32)])  # two finished just now
    (tmp_path / "more").write_text(GEMM.format(t="f32", m=64) + GEMM.format(t="f32", m=128))
    assert cli(db_url, "import", "--op", "gemm", "--tag", "more", str(tmp_path / "more")).code == 0
    jobs.load(db, sid, tag="more")
    [shown] = cli(db_url, "status", "--session", str(sid), "--json").json()["sessions"]
    assert shown["per_minute"] > 0 and shown["eta_s"] > 0
    table = cli(db_url, "status", "--session", str(sid)).stdout.splitlines()
    assert table[0].split()[-2:] == ["jobs/min", "ETA"]
    rate, eta = table[-1].split()[-2:]
    assert float(rate) > 0 and eta.count(":") == 2
    as_csv = cli(db_url, "status", "--session", str(sid), "--csv").stdout.splitlines()
    assert as_csv[0].endswith(",total,per_minute,eta_s") and float(as_csv[1].split(",")[-1]) > 0


# -- one definition of each option run, worker and session new share ---------------------------

#: Options of the same name that mean something else per command: a new session's tuner, run's
#: auto or the session's tuner a worker checks; what --session names; what --json prints.
OWN = {"--tuner", "--session", "--json", "--help"}


def _options(path: str) -> dict[str, click.Option]:
    command: click.Command = typer.main.get_command(app)
    for word in path.split():
        assert isinstance(command, click.Group)
        command = command.commands[word]
    return {o.opts[0]: o for o in command.params if isinstance(o, click.Option) and not o.hidden}


def test_run_worker_and_session_new_share_each_common_option():
    pages = {path: _options(path) for path in ("run", "worker", "session new")}
    assert "--name" in pages["run"] and "--mlir-v" in pages["run"]
    for name in set().union(*pages.values()) - OWN:
        having = {path: opts[name] for path, opts in pages.items() if name in opts}
        if len(having) < 2:
            continue
        helps = {(o.help, o.default, o.envvar, o.metavar) for o in having.values()}
        assert len(helps) == 1, f"{name} has {len(helps)} definitions: {helps}"
    for space in ("quick", "full", "greedy", "exhaustive", "lfbo", "smart", "list:NAME"):
        assert space in (pages["run"]["--tuning-space"].help or "")


def test_run_names_its_session_with_name(db_url, tmp_path):
    (tmp_path / "g").write_text(GEMM.format(t="f32", m=8))
    run = cli(db_url, "run", "--op", "gemm", "--tuner", "sleep:0", "--name", "week 49",
              "--quiet", "-o", str(tmp_path / "t.tsv"), str(tmp_path / "g"))  # fmt: skip
    assert run.code == 0, run.stderr
    assert [s["name"] for s in cli(db_url, "session", "list", "--json").json()] == ["week 49"]
