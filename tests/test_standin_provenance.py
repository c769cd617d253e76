"""Issue 42 §3: no stand-in result reaches a real export. A session tuned on mlirtuna's stand-in
build (session.standin, from the build) is shown as such, never picked by a context (`export
--arch`, `run`'s export, `--skip-tuned`/`--reuse`, `--changed-since`'s family rule) unless named,
and never tuned on a build of the other kind; `try-rocmlir` works in a database of its own and
never replaces a directory it did not make (§5)."""

from __future__ import annotations

import os
import shutil

import pytest
import sqlalchemy as sa
from support.clitools import cli, run_cli
from support.results import FULL, gemm, mark_standin, new_session, tune
from support.standin import standin_build

from mlirtuna import sessions, standin
from mlirtuna.db import Database
from mlirtuna.db.models import Result, TuningSession
from mlirtuna.errors import UserError
from mlirtuna.worker import Worker, WorkerSettings

SHARED = gemm(64)  # tuned by the real and by the stand-in session


def real_and_standin(db, tmp_path) -> tuple[int, int]:
    """A real session (older) and a stand-in one (newer) of one context, both tuning SHARED:
    by the newest-wins rule alone, the stand-in's made-up winner would be exported."""
    real = new_session(db)
    tune(db, tmp_path, real, [SHARED], perf=lambda tv: "v4:real")
    made_up = mark_standin(db, new_session(db))
    tune(db, tmp_path, made_up, [SHARED, gemm(128)], perf=lambda tv: "v4:made-up")
    return real, made_up


# -- export ------------------------------------------------------------------------------------


def test_export_by_arch_leaves_a_stand_in_session_out_and_says_so(db, db_url, tmp_path):
    real, made_up = real_and_standin(db, tmp_path)
    run = cli(db_url, "export", "--arch", FULL, "-o", "-")
    assert run.code == 0, run.stderr
    assert "v4:real" in run.stdout and "v4:made-up" not in run.stdout
    assert "-m 128 " not in run.stdout  # the stand-in's alone
    left_out = [line for line in run.stderr.splitlines() if "stand-in" in line]
    assert len(left_out) == 1 and f"left out stand-in session(s) {made_up} " in left_out[0]
    assert f"rows from session(s) {real} " in run.stderr


def test_export_names_a_stand_in_session_when_asked_by_id(db, db_url, tmp_path):
    _, made_up = real_and_standin(db, tmp_path)
    run = cli(db_url, "export", "--session", str(made_up), "-o", "-")
    assert run.code == 0, run.stderr
    assert run.stdout.count("v4:made-up") == 2
    assert f"session {made_up} is a stand-in session" in run.stderr


def test_an_arch_with_only_stand_in_sessions_exports_nothing(db, db_url, tmp_path):
    made_up = mark_standin(db, new_session(db))
    tune(db, tmp_path, made_up, [SHARED])
    out = tmp_path / "db.tsv"
    run = cli(db_url, "export", "--arch", FULL, "-o", str(out))
    assert run.code == 2 and run.stderr.count("\n") == 1, run.stderr
    assert f"stand-in session(s) {made_up} " in run.stderr and "--session" in run.stderr
    assert not out.exists()


def test_runs_own_export_leaves_a_stand_in_session_of_its_context_out(db, db_url, tmp_path):
    both = tmp_path / "both"
    both.write_text(f"{SHARED}\n{gemm(128)}\n")
    one = tmp_path / "one"
    one.write_text(f"{SHARED}\n")
    args = ["run", "--op", "gemm", "--tuner", "sleep:0", "--json"]
    first = cli(db_url, *args, "-o", str(tmp_path / "first.tsv"), str(both))
    assert first.code == 0, first.stderr
    made_up = mark_standin(db, first.json()["session"])  # as if tuned on the stand-in
    second = cli(db_url, *args, "-o", str(tmp_path / "second.tsv"), str(one))
    assert second.code == 0, second.stderr
    summary = second.json()
    assert summary["exported"] == 1  # its own winner; not the stand-in's other problem
    assert f"left out stand-in session(s) {made_up} " in second.stderr
    assert "-m 128 " not in (tmp_path / "second.tsv").read_text()


# -- jobs load --skip-tuned / --reuse / --changed-since ------------------------------------------


def test_skip_tuned_and_reuse_never_take_a_stand_in_sessions_results(db, db_url, tmp_path):
    made_up = mark_standin(db, new_session(db))
    tune(db, tmp_path, made_up, [SHARED])
    real = new_session(db)
    run = cli(db_url, "jobs", "load", "--session", str(real), "--all", "--skip-tuned", "--reuse")
    assert run.code == 0, run.stderr
    assert run.stdout.startswith("1 jobs added") and "0 reused" in run.stdout
    assert f"left out stand-in session(s) {made_up} " in run.stderr
    with db.session() as s:
        assert s.scalar(sa.select(sa.func.count()).where(Result.session_id == real)) == 0
    # Another stand-in session of the context is equivalent: made-up into made-up.
    twin = mark_standin(db, new_session(db))
    run = cli(db_url, "jobs", "load", "--session", str(twin), "--all", "--skip-tuned", "--reuse",
              "--json")  # fmt: skip
    assert run.code == 0, run.stderr
    assert run.json()["reused"] == 1 and run.json()["standin_left_out"] == []


def test_changed_since_a_named_stand_in_session_is_taken(db, db_url, tmp_path):
    made_up = mark_standin(db, new_session(db))
    tune(db, tmp_path, made_up, [SHARED])
    real = new_session(db, mlir_v="def456")
    run = cli(db_url, "jobs", "load", "--session", str(real), "--all",
              "--changed-since", str(made_up), "--json")  # fmt: skip
    assert run.code == 0, run.stderr
    assert run.json()["added"] == 1  # every problem of the named session is stale by `all`


def test_the_family_rule_reads_no_stand_in_winners(db, tmp_path):
    from mlirtuna.history import reuse

    old = new_session(db, mlir_v="old")
    tune(db, tmp_path, old, [SHARED], perf=lambda tv: "v2:old")
    # The new commit's real winners are of family v4, so the old v2 winner is stale; a stand-in
    # session of the new commit with a made-up v2 winner, read as the commit's, would hide that.
    new_real = new_session(db, mlir_v="new")
    tune(db, tmp_path, new_real, [gemm(256)], perf=lambda tv: "v4:real")
    made_up = mark_standin(db, new_session(db, mlir_v="new"))
    tune(db, tmp_path, made_up, [gemm(512)], perf=lambda tv: "v2:made-up")
    target = new_session(db, mlir_v="new")
    report = reuse.load(
        db, target, changed_since=old, rule="family-changed", op="gemm", tag=f"s{old}"
    )
    assert report.added == 1 and report.skipped == 0


# -- shown as such -----------------------------------------------------------------------------


def test_session_list_show_and_results_say_stand_in(db, db_url, tmp_path):
    real, made_up = real_and_standin(db, tmp_path)
    listed = cli(db_url, "session", "list")
    assert listed.code == 0, listed.stderr
    rows = {line.split()[0]: line for line in listed.stdout.splitlines()[1:]}
    assert "(stand-in)" in rows[str(made_up)] and "(stand-in)" not in rows[str(real)]
    as_json = {x["id"]: x["standin"] for x in cli(db_url, "session", "list", "--json").json()}
    assert as_json == {real: False, made_up: True}
    shown = cli(db_url, "session", "show", str(made_up), "--json").json()
    assert shown["standin"] is True
    said = cli(db_url, "results", "--session", str(made_up))
    assert f"session {made_up} is a stand-in session" in said.stderr
    assert "stand-in" not in cli(db_url, "results", "--session", str(real)).stderr


def test_compare_and_quick_list_take_a_named_stand_in_session_and_say_so(db, db_url, tmp_path):
    real, made_up = real_and_standin(db, tmp_path)
    compared = cli(db_url, "compare", str(real), str(made_up))
    assert compared.code == 0, compared.stderr
    assert f"session {made_up} is a stand-in session" in compared.stderr
    assert f"session {real} is" not in compared.stderr
    listed = cli(db_url, "quick-list", "--session", str(made_up), "-o", str(tmp_path / "q.txt"))
    assert listed.code == 0, listed.stderr
    assert f"session(s) {made_up}: stand-in" in listed.stderr


def test_the_dashboard_shows_a_stand_in_badge(db, db_url, tmp_path):
    from fastapi.testclient import TestClient

    from mlirtuna.web.app import create_app, open_read_only

    real, made_up = real_and_standin(db, tmp_path)
    ro = open_read_only(db_url)
    try:
        client = TestClient(create_app(ro), base_url="http://127.0.0.1")
        assert client.get(f"/api/sessions/{made_up}").json()["session"]["standin"] is True
        assert client.get(f"/api/sessions/{real}").json()["session"]["standin"] is False
        rows = client.get("/api/farm").json()["sessions"]
        assert {p["session"]["id"]: p["session"]["standin"] for p in rows} == {
            real: False,
            made_up: True,
        }
        assert 'id="standin-badge"' in client.get(f"/sessions/{made_up}").text
        assert 'id="standin-badge"' not in client.get(f"/sessions/{real}").text
        assert "standinBadge(s)" in client.get("/static/app.js").text  # the farm page's rows
    finally:
        ro.dispose()


# -- the worker: a build of the session's kind only -----------------------------------------------


def real_build(tmp_path, monkeypatch):
    """A copy of the stand-in without its marker: to mlirtuna, a real rocMLIR build."""
    build = standin_build(tmp_path, monkeypatch)
    (build / "MLIRTUNA_STANDIN.md").unlink()
    return build


def rocmlir_session(db) -> int:
    spec = sessions.SessionSpec(
        tuner="rocmlir", arch_full=FULL, num_cu=304, num_chiplets=8, tuning_space="quick",
        rocm_v="6.4", mlir_v="abc",
    )  # fmt: skip
    return sessions.create(db, spec).id


def test_a_worker_refuses_the_stand_in_build_for_a_real_session(db, db_url, tmp_path):
    sid = rocmlir_session(db)  # opened with flags alone: real
    run = cli(db_url, "worker", "--session", str(sid), "--mlir-build-dir", str(standin.BUILD),
              "--gpus", "0", "--until-empty")  # fmt: skip
    assert run.code == 2 and run.stderr.count("\n") == 1, run.stderr
    assert "stand-in build" in run.stderr and f"session {sid} is a real one" in run.stderr
    settings = WorkerSettings(session_id=sid, mlir_build_dir=str(standin.BUILD), gpu_id=0)
    with pytest.raises(UserError, match="stand-in build"):
        Worker(db, settings)


def test_a_worker_refuses_a_real_build_for_a_stand_in_session(db, db_url, tmp_path, monkeypatch):
    sid = mark_standin(db, rocmlir_session(db))
    build = real_build(tmp_path, monkeypatch)
    monkeypatch.setenv("MLIRTUNA_ROCMLIR_BUILD", str(build))  # the env's build
    run = cli(db_url, "worker", "--session", str(sid), "--gpus", "0", "--until-empty")
    assert run.code == 2 and run.stderr.count("\n") == 1, run.stderr
    assert f"session {sid} is a stand-in session" in run.stderr
    with pytest.raises(UserError, match="is a real rocMLIR build"):
        Worker(db, WorkerSettings(session_id=sid, gpu_id=0))


def test_session_new_marks_the_stand_in_from_the_environments_build(db, db_url, monkeypatch):
    monkeypatch.setenv("MLIRTUNA_ROCMLIR_BUILD", str(standin.BUILD))
    made = cli(db_url, "session", "new", "--tuner", "rocmlir", "--arch-full", FULL,
               "--num-cu", "304", "--num-chiplets", "8", "--mlir-v", "abc", "--json")  # fmt: skip
    assert made.code == 0, made.stderr
    assert made.json()["standin"] is True


# -- try-rocmlir DIR: only a directory it made is replaced ----------------------------------------


def test_try_rocmlir_leaves_a_rocmlir_build_untouched(db_url, tmp_path):
    build = tmp_path / "rocmlir-build"
    (build / "bin").mkdir(parents=True)
    (build / "bin" / "tuningRunner.py").write_text("# the real one\n")
    (build / "CMakeCache.txt").write_text("CMAKE_HOME_DIRECTORY:INTERNAL=/src/rocMLIR\n")
    before = sorted(p.relative_to(build) for p in build.rglob("*"))
    run = cli(db_url, "try-rocmlir", str(build))
    assert run.code == 2 and run.stderr.count("\n") == 1, run.stderr
    assert str(build) in run.stderr and "a rocMLIR build" in run.stderr
    assert sorted(p.relative_to(build) for p in build.rglob("*")) == before
    assert (build / "bin" / "tuningRunner.py").read_text() == "# the real one\n"


def test_install_replaces_only_what_it_made(tmp_path):
    made = standin.install(tmp_path / "made")
    (made / "scratch").write_text("left by the last trial")
    again = standin.install(made)  # its own: replaced
    assert not (again / "scratch").exists() and (again / "bin" / "tuningRunner.py").is_file()
    # A copy of it (the marker names another directory) is not its own.
    copy = tmp_path / "copy"
    shutil.copytree(made, copy)
    with pytest.raises(UserError, match="was not made by try-rocmlir"):
        standin.install(copy)
    assert (copy / "bin" / "tuningRunner.py").is_file()
    # A link to its own directory is a link: refused, neither it nor its target touched.
    link = tmp_path / "link"
    link.symlink_to(made)
    with pytest.raises(UserError, match=r"\(a link\)"):
        standin.install(link)
    assert link.is_symlink() and (made / standin.INSTALL_MARKER).is_file()
    # A marker that is a link proves nothing.
    planted = tmp_path / "planted"
    (planted / "bin").mkdir(parents=True)
    (planted / standin.INSTALL_MARKER).symlink_to(made / standin.INSTALL_MARKER)
    with pytest.raises(UserError):
        standin.install(planted)
    assert (planted / "bin").is_dir()
    # An empty directory is used, a file refused.
    empty = tmp_path / "empty"
    empty.mkdir()
    assert (standin.install(empty) / "bin" / "tuningRunner.py").is_file()
    afile = tmp_path / "afile"
    afile.write_text("x")
    with pytest.raises(UserError, match=r"\(a file\)"):
        standin.install(afile)
    assert afile.read_text() == "x"


# -- try-rocmlir: a database of its own ------------------------------------------------------------


def _sessions(url: str) -> list[tuple[int, bool]]:
    farm = Database(url)
    try:
        with farm.session() as s:
            return [tuple(r) for r in s.execute(sa.select(TuningSession.id, TuningSession.standin))]
    finally:
        farm.dispose()


@pytest.mark.slow
@pytest.mark.backends("postgresql")  # a farm's server; try-rocmlir never connects to it at all
def test_try_rocmlir_leaves_the_farm_of_mlirtuna_db_untouched(db, db_url, tmp_path):
    env = {k: "" for k in os.environ if k.startswith("FAKE_") or k == "MLIRTUNA_TOOL_ENV"}
    # run_cli points MLIRTUNA_DB at the farm (db_url), as a farm operator's shell would.
    run = run_cli(db_url, "try-rocmlir", str(tmp_path / "standin"), timeout=600, **env)
    assert run.code == 0, run.stderr
    assert _sessions(db_url) == []  # the farm
    own = f"sqlite:///{tmp_path / 'standin' / standin.TRIAL_DB}"
    assert [made for _, made in _sessions(own)] == [True, True]
    assert f"--db {own} serve" in run.stderr
