"""What an operator meets on the command line: read commands that never create a database, the
database named in verbose mode, uncut tables, paging, guarded cancel, exit codes, --json."""

from __future__ import annotations

import csv
import io
import subprocess
import sys

import pytest
from support.clitools import cli, subprocess_env
from support.queueing import two_job_session
from support.results import gemm, new_session, tune

from mlirtuna import catalog, queue
from mlirtuna.defaults import ENV_MAX_RETRIES, ENV_RETRY_BACKOFF
from mlirtuna.problems import ExpandOptions
from mlirtuna.queue import jobs
from mlirtuna.tuners.base import Candidate, TuneOutcome

READ_COMMANDS = [
    ["status"],
    ["session", "list"],
    ["session", "show", "1"],
    ["jobs", "list", "--session", "1"],
    ["jobs", "show", "1"],
    ["wait", "--session", "1"],
    ["results", "--session", "1"],
    ["export", "--arch", "gfx942", "-o", "out.tsv"],
    ["compare", "1", "2"],
    ["db", "current"],
]


@pytest.mark.parametrize("args", READ_COMMANDS, ids=" ".join)
def test_read_commands_never_create_a_database(tmp_path, args):
    path = tmp_path / "missing.db"
    run = cli(f"sqlite:///{path}", *args)
    assert run.code == 2 and not path.exists()
    assert run.stderr.count("\n") == 1 and str(path) in run.stderr, run.stderr
    assert not list(tmp_path.iterdir())  # nothing else either (-wal, -shm, out.tsv)


def test_commands_that_write_still_create_one(tmp_path):
    path = tmp_path / "new.db"
    configs = tmp_path / "configs"
    configs.write_text("-t f32 -transA false -transB false -g 1 -m 16 -n 16 -k 16\n")
    run = cli(f"sqlite:///{path}", "import", "--op", "gemm", "--no-expand", str(configs))
    assert run.code == 0 and path.exists(), run.stderr
    assert cli(f"sqlite:///{path}", "status").code == 0


def test_verbose_and_debug_name_the_database_first(db_url):
    for flag in ("--verbose", "-v", "--debug"):
        run = cli(db_url, flag, "session", "list", "--json")
        assert run.code == 0
        first = run.stderr.splitlines()[0]
        assert first.startswith("database: ") and db_url.split("://")[1].split("@")[-1] in first
    assert "database" not in cli(db_url, "session", "list", "--json").stderr


def test_the_database_line_masks_the_password():
    url = "postgresql://tuna:hunter2@127.0.0.1:1/x?connect_timeout=2"
    run = cli(url, "-v", "db", "current")
    assert run.code == 2 and "hunter2" not in run.stderr
    assert (
        run.stderr.splitlines()[0]
        == "database: postgresql+psycopg://tuna:***@127.0.0.1:1/x"  # never the query string
    )


def test_wait_exit_codes_and_json(db, db_url, tmp_path):
    """0: all completed; 1: some in error; 3: timed out (a script can tell them apart)."""
    sid = two_job_session(db, tmp_path)
    run = cli(db_url, "wait", "--session", str(sid), "--timeout", "0.2", "--poll", "0.05")
    assert run.code == 3 and "timed out" in run.stderr and "2 jobs" in run.stderr
    got = cli(db_url, "wait", "--session", str(sid), "--timeout", "0", "--json")
    assert got.code == 3 and got.json()["timed_out"] is True and got.json()["counts"]["new"] == 2
    who = queue.Claimant("h", 0, 1)
    win = Candidate("pc", 10.0, 1.0)
    queue.record(db, queue.claim(db, sid, who, 60), TuneOutcome([win], win))
    lease = queue.claim(db, sid, who, 60)
    queue.fail(db, lease, "tool crashed", max_retries=1, backoff_s=0)
    got = cli(db_url, "wait", "--session", str(sid), "--json")
    assert got.code == 1
    assert got.json()["errors"] == [
        {"id": lease.job_id, "message": "attempt 1/1 failed: tool crashed"}
    ]
    assert got.json()["exit_code"] == 1 and got.json()["counts"]["completed"] == 1
    requeued = cli(db_url, "jobs", "requeue", "--session", str(sid), "--json")
    assert requeued.json() == {"requeued": 1}
    queue.record(db, queue.claim(db, sid, who, 60), TuneOutcome([win], win))
    done = cli(db_url, "wait", "--session", str(sid), "--json")
    assert done.code == 0 and done.json()["counts"]["completed"] == 2


def test_worker_retries_come_from_the_environment_and_a_flag_beats_it(
    db, db_url, tmp_path, monkeypatch
):
    """MLIRTUNA_MAX_RETRIES and MLIRTUNA_RETRY_BACKOFF set `worker`'s --max-retries and
    --retry-backoff, and so its worker processes' argv; a flag given beats them."""
    from mlirtuna.worker import supervisor

    sid = two_job_session(db, tmp_path)
    started = []  # the settings each `worker --gpus 0,1` would start its processes with

    def start(_url, settings, _slots, quiet=False, **_more):
        started.append(settings)
        return []

    monkeypatch.setattr(supervisor, "start", start)
    env = {ENV_MAX_RETRIES: "7", ENV_RETRY_BACKOFF: "0.25"}
    two_gpus = ("worker", "--session", str(sid), "--gpus", "0,1")
    assert cli(db_url, *two_gpus, env=env).code == 0
    assert cli(db_url, *two_gpus, "--max-retries", "2", "--retry-backoff", "4", env=env).code == 0
    assert [(s.max_retries, s.backoff_s) for s in started] == [(7, 0.25), (2, 4.0)]
    argv = supervisor.worker_argv(started[0], supervisor.Slot(0))
    assert argv[argv.index("--max-retries") + 1] == "7"
    assert argv[argv.index("--retry-backoff") + 1] == "0.25"


def test_cancel_of_a_whole_session_needs_all(db, db_url, tmp_path):
    sid = two_job_session(db, tmp_path)
    run = cli(db_url, "jobs", "cancel", "--session", str(sid))
    assert run.code == 2 and "--all" in run.stderr and run.stderr.count("\n") == 1
    assert jobs.counts(db, sid)[sid]["new"] == 2  # nothing cancelled
    first = jobs.list_jobs(db, sid)[0].id
    both = cli(db_url, "jobs", "cancel", "--session", str(sid), "--job", str(first), "--all")
    assert both.code == 2
    one = cli(db_url, "jobs", "cancel", "--session", str(sid), "--job", str(first), "--json")
    assert one.code == 0 and one.json() == {"cancelled": 1}
    rest = cli(db_url, "jobs", "cancel", "--session", str(sid), "--all")
    assert rest.code == 0 and rest.stdout == "1 jobs cancelled\n"


LONG_PERF = "cpu:v1:" + ",".join(str(2**i) for i in range(24))


def test_tables_to_a_pipe_never_cut_a_cell(db, db_url, tmp_path):
    sid = new_session(db)
    vectors = [gemm(m, n=4096, k=8192, t="bf16") for m in (1024, 2048)]
    tune(db, tmp_path, sid, vectors, perf=lambda tv: LONG_PERF)
    for args in (
        ["results", "--session", str(sid)],
        ["jobs", "list", "--session", str(sid)],
    ):
        run = cli(db_url, *args)
        assert run.code == 0
        lines = run.stdout.splitlines()
        for vector in vectors:
            assert any(vector in line for line in lines), f"{args}: {vector} cut"
        if args[0] == "results":
            assert sum(LONG_PERF in line for line in lines) == 2
        assert "…" not in run.stdout


@pytest.mark.parametrize(
    "args",
    [
        ["status"],
        ["session", "list"],
        ["jobs", "list", "--session", "{sid}"],
        ["results", "--session", "{sid}"],
        ["compare", "{sid}", "{sid}"],
    ],
    ids=" ".join,
)
def test_every_table_has_csv_and_json(db, db_url, tmp_path, args):
    sid = new_session(db)
    tune(db, tmp_path, sid, [gemm(16), gemm(32)], perf=lambda tv: LONG_PERF)
    args = [a.format(sid=sid) for a in args]
    as_csv = cli(db_url, *args, "--csv")
    assert as_csv.code == 0, as_csv.stderr
    parsed = list(csv.reader(io.StringIO(as_csv.stdout)))
    assert len({len(row) for row in parsed}) == 1  # a header, rows of its width
    as_json = cli(db_url, *args, "--json")
    assert as_json.code == 0 and as_json.json() is not None
    both = cli(db_url, *args, "--csv", "--json")
    assert both.code == 2 and both.stdout == ""


def test_jobs_list_pages(db, db_url, tmp_path):
    sid = new_session(db)
    (tmp_path / "many").write_text("".join(gemm(m) + "\n" for m in range(1, 61)))
    catalog.import_files(db, "gemm", [str(tmp_path / "many")], ExpandOptions(expand=False), "m")
    jobs.load(db, sid, tag="m")
    first = cli(db_url, "jobs", "list", "--session", str(sid), "--json")
    ids = [j["id"] for j in first.json()]
    assert len(ids) == 50 and ids == sorted(ids)
    assert "the first 50 of 60 jobs" in first.stderr
    assert len(cli(db_url, "jobs", "list", "--session", str(sid), "--all", "--json").json()) == 60
    few = cli(db_url, "jobs", "list", "--session", str(sid), "--limit", "5", "--csv")
    assert len(few.stdout.splitlines()) == 6 and "the first 5 of 60" in few.stderr
    whole = cli(db_url, "jobs", "list", "--session", str(sid), "--limit", "60")
    assert whole.stderr == "" and whole.stdout.count(" new ") == 60


HEAVY = ("numpy", "alembic", "sqlalchemy", "rich", "mlirtuna.tuners", "mlirtuna.worker")
_LOADED = """
import sys
from mlirtuna.cli import main
try:
    main(sys.argv[1:])
except SystemExit:
    pass
heavy = sorted({m for m in sys.modules if m.startswith(%r)})
print("loaded:", *heavy, file=sys.stderr)
"""


def _heavy_modules_loaded(tmp_path, *args: str) -> set[str]:
    proc = subprocess.run(
        [sys.executable, "-c", _LOADED % (HEAVY,), *args],
        env=subprocess_env(f"sqlite:///{tmp_path / 'mlirtuna.db'}"),
        capture_output=True,
        text=True,
        timeout=120,
        check=False,
    )
    assert proc.returncode == 0, proc.stderr
    loaded = set(proc.stderr.splitlines()[-1].split()[1:])
    return {h for h in HEAVY if any(m == h or m.startswith(h + ".") for m in loaded)}


def test_start_up_imports_only_what_the_command_uses(tmp_path):
    """`--help` needs no database layer and no Rich; `status` no Alembic, tuners or NumPy."""
    assert _heavy_modules_loaded(tmp_path, "--help") == set()
    assert _heavy_modules_loaded(tmp_path, "session", "new", "--help") == set()
    assert cli(f"sqlite:///{tmp_path / 'mlirtuna.db'}", "db", "upgrade").code == 0
    assert _heavy_modules_loaded(tmp_path, "status") == {"sqlalchemy"}


def test_a_worker_of_a_session_that_is_not_searched_loads_no_numpy(tmp_path):
    """NumPy (60 ms of a start-up) comes with a searched session's rounds only: every worker
    the farm starts pays for its imports, and most sessions are not searched."""
    url = f"sqlite:///{tmp_path / 'mlirtuna.db'}"
    assert cli(url, "session", "new", "--tuner", "sleep:0").code == 0
    loaded = _heavy_modules_loaded(tmp_path, "worker", "--session", "1", "--until-empty")
    assert "mlirtuna.worker" in loaded and "numpy" not in loaded, loaded


def test_run_prints_its_winners_as_csv(tmp_path):
    url = f"sqlite:///{tmp_path / 'run.db'}"
    configs_file = tmp_path / "g"
    configs_file.write_text("-t f32 -transA false -transB false -g 1 -m 16 -n 16 -k 16\n")
    args = ["run", "--op", "gemm", str(configs_file), "-o", str(tmp_path / "out.tsv")]
    assert cli(url, *args, "--csv", "--json").code == 2
    run = cli(url, *args, "--csv", "-q")
    assert run.code == 0, run.stderr
    rows = list(csv.reader(io.StringIO(run.stdout)))
    assert len(rows) == 2, (run.stdout, run.stderr)
    header, row = rows
    assert header[:3] == ["op", "test_vector", "perf_config"]
    assert row[0] == "gemm" and row[2].startswith("cpu:")


def test_a_page_of_jobs_walks_the_index_instead_of_sorting_them_all(tmp_path):
    """What keeps `jobs list` fast on 100,000 jobs (bench_bulk.py times it): on SQLite the
    plan reads the session's jobs in id order from ix_job_session_list and stops at the limit."""
    from mlirtuna.db import Database

    db = Database(f"sqlite:///{tmp_path / 'plan.db'}")
    sid = two_job_session(db, tmp_path)
    stmt, _ = jobs.page_query(sid, None, 50)
    compiled = stmt.compile(db.engine, compile_kwargs={"literal_binds": True})
    with db.engine.connect() as conn:
        plan = " ".join(r[-1] for r in conn.exec_driver_sql(f"EXPLAIN QUERY PLAN {compiled}"))
    db.dispose()
    assert "ix_job_session_list" in plan and "TEMP B-TREE" not in plan, plan
