"""The right compiler commit (issue 42 §4): a session's rocMLIR commit is the commit its build
was built from (the source checkout its CMakeCache.txt names, or the stand-in's marker), never
the commit of a git tree the build dir merely lies in (the Jenkinsfile's layout: the pipeline's
own repository holds the build). A build that cannot be tied to a rocMLIR commit is refused with
one line naming --mlir-v; the tool is told the build's checkout (GIT_DIR), and a worker never
runs a build of another commit than its session's."""

from __future__ import annotations

import json
import os
import shutil
import subprocess
from pathlib import Path

import pytest
import sqlalchemy as sa
from support.clitools import cli, run_cli
from support.rocmlir import GEMM, context, tuner, work
from support.standin import standin_build

from mlirtuna import catalog, machine, sessions, standin
from mlirtuna.db.models import Attempt, Job
from mlirtuna.defaults import STANDIN_MARKER
from mlirtuna.problems import ExpandOptions, parse
from mlirtuna.queue import jobs

# Reading a build's commit is the same on every backend: SQLite only.
pytestmark = pytest.mark.backends("sqlite")

GPU = ["--arch-full", standin.ARCH_FULL, "--num-cu", "304", "--num-chiplets", "8"]
OTHER_COMMIT = "f" * 40


def git(repo: Path, *args: str) -> str:
    identity = ["-c", "user.email=t@example.com", "-c", "user.name=t"]
    done = subprocess.run(
        ["git", "-C", str(repo), *identity, *args], capture_output=True, text=True, check=True
    )
    return done.stdout.strip()


def commit_all(repo: Path, message: str) -> str:
    git(repo, "init", "-q")
    git(repo, "add", "-A")
    git(repo, "commit", "-qm", message)
    return git(repo, "rev-parse", "HEAD")


def rocmlir_checkout(path: Path) -> str:
    """A rocMLIR source tree (its top CMakeLists.txt and tuning script) committed; its commit."""
    (path / "mlir" / "utils" / "performance").mkdir(parents=True)
    (path / "CMakeLists.txt").write_text("project(rocMLIR VERSION 2.0.0 LANGUAGES CXX C)\n")
    (path / "mlir" / "utils" / "performance" / "tuningRunner.py").write_text("# rocMLIR\n")
    return commit_all(path, "rocMLIR")


def cmake_cache(build: Path, source: Path) -> None:
    """The lines of a CMakeCache.txt that say where the build's source is, as CMake writes them."""
    (build / "CMakeCache.txt").write_text(
        "# This is the CMakeCache file.\n"
        f"# For build in directory: {build}\n"
        "//Value Computed by CMake\n"
        "CMAKE_PROJECT_NAME:STATIC=rocMLIR\n"
        "//Value Computed by CMake\n"
        f"rocMLIR_BINARY_DIR:STATIC={build}\n"
        "//Value Computed by CMake\n"
        f"rocMLIR_SOURCE_DIR:STATIC={source}\n"
        "//Source directory with the top level CMakeLists.txt file for this\n"
        "// project\n"
        f"CMAKE_HOME_DIRECTORY:INTERNAL={source}\n"
    )


class Layout:
    """The Jenkinsfile's layout: a pipeline repository (its own commit) holding the build dir,
    which was built from a rocMLIR checkout elsewhere (another commit)."""

    def __init__(self, tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
        self.source = tmp_path / "rocMLIR"
        self.commit = rocmlir_checkout(self.source)
        self.pipeline = tmp_path / "pipeline"
        self.pipeline.mkdir()
        (self.pipeline / "Jenkinsfile").write_text("// the pipeline\n")
        self.pipeline_commit = commit_all(self.pipeline, "pipeline")
        # The stand-in's tools stand for the build's; without its marker it is a plain build.
        self.build = self.pipeline / "rocmlir-build"
        shutil.move(standin_build(tmp_path, monkeypatch, log=True), self.build)
        self.log = tmp_path / "argv.jsonl"  # where the tool logs its calls (standin_build)
        (self.build / STANDIN_MARKER).unlink()
        cmake_cache(self.build, self.source)


@pytest.fixture
def layout(tmp_path, monkeypatch) -> Layout:
    return Layout(tmp_path, monkeypatch)


def session_new(db_url: str, build: Path, *more: str):
    return cli(db_url, "session", "new", "--tuner", "rocmlir", "--mlir-build-dir", str(build),
               "--tuning-space", "quick", *GPU, *more, "--json")  # fmt: skip


def test_a_build_inside_another_repository_gets_the_commit_it_was_built_from(db_url, layout):
    assert layout.commit != layout.pipeline_commit
    # What the old rule (`git -C BUILD rev-parse HEAD`) answered: the pipeline's commit.
    assert git(layout.build, "rev-parse", "HEAD") == layout.pipeline_commit
    made = session_new(db_url, layout.build)
    assert made.code == 0, made.stderr
    assert made.json()["mlir_v"] == layout.commit


def test_the_stand_in_build_reports_its_commit_inside_another_repository(
    db_url, tmp_path, monkeypatch
):
    pipeline = tmp_path / "pipeline"
    pipeline.mkdir()
    (pipeline / "Jenkinsfile").write_text("// the pipeline\n")
    commit_all(pipeline, "pipeline")
    build = pipeline / "rocmlir-build"
    shutil.move(standin_build(tmp_path, monkeypatch), build)
    made = session_new(db_url, build)
    assert made.code == 0, made.stderr
    assert made.json()["mlir_v"] == standin.COMMIT and made.json()["standin"]


def _no_cache(layout: Layout) -> None:
    (layout.build / "CMakeCache.txt").unlink()


def _cache_names_the_pipeline(layout: Layout) -> None:
    cmake_cache(layout.build, layout.pipeline)


def _source_without_a_checkout_of_its_own(layout: Layout) -> None:
    inside = layout.pipeline / "src" / "rocMLIR"
    shutil.copytree(layout.source, inside, ignore=shutil.ignore_patterns(".git"))
    cmake_cache(layout.build, inside)


def _cache_is_a_link(layout: Layout) -> None:
    real = layout.pipeline / "elsewhere.txt"
    (layout.build / "CMakeCache.txt").rename(real)
    (layout.build / "CMakeCache.txt").symlink_to(real)


UNTIED = {
    "no CMakeCache.txt": (_no_cache, "no readable CMakeCache.txt"),
    "the source is not rocMLIR": (_cache_names_the_pipeline, "is not a rocMLIR checkout"),
    "the source has no checkout of its own": (_source_without_a_checkout_of_its_own, "lies in"),
    "CMakeCache.txt is a link": (_cache_is_a_link, "no readable CMakeCache.txt"),
}


@pytest.mark.parametrize("case", sorted(UNTIED))
def test_a_build_that_cannot_be_tied_to_rocmlir_is_refused_with_one_line(db_url, layout, case):
    spoil, why = UNTIED[case]
    spoil(layout)
    made = session_new(db_url, layout.build)
    assert made.code == 2, made.stdout
    line = made.stderr.strip()
    assert "\n" not in line and str(layout.build) in line and why in line, line
    assert "--mlir-v HASH" in line
    assert cli(db_url, "session", "list", "--json").json() == []  # nothing written
    given = session_new(db_url, layout.build, "--mlir-v", OTHER_COMMIT)  # given: it wins
    assert given.code == 0, given.stderr
    assert given.json()["mlir_v"] == OTHER_COMMIT


def test_the_tool_is_told_the_checkout_the_build_was_built_from(layout, monkeypatch):
    """E3's commitId is `git rev-parse HEAD` of its working directory (the build dir, in the
    pipeline's repository); GIT_DIR names the build's source checkout instead."""
    run = tuner(layout.build, "E3", monkeypatch)
    run.tune(parse("gemm", GEMM), context(tuning_space="quick"))
    (call,) = [
        c for c in map(json.loads, layout.log.read_text().splitlines()) if c["argv"][0] != "--help"
    ]
    assert call["cwd"] == str(layout.build.resolve())
    git_dir = call["env"].get("GIT_DIR")
    assert git_dir and os.path.realpath(git_dir) == os.path.realpath(layout.source / ".git")
    told = subprocess.run(
        ["git", "-C", call["cwd"], "rev-parse", "HEAD"], env={**os.environ, "GIT_DIR": git_dir},
        capture_output=True, text=True, check=True,
    )  # fmt: skip
    assert told.stdout.strip() == layout.commit


def open_session(db, layout: Layout, tmp_path: Path, mlir_v: str) -> int:
    path = tmp_path / f"gemm-{mlir_v[:8]}"
    path.write_text(GEMM + "\n")
    catalog.import_files(db, "gemm", [str(path)], ExpandOptions(expand=False), tag=path.name)
    spec = sessions.SessionSpec(
        tuner="rocmlir", tuning_space="quick", arch_full=standin.ARCH_FULL, num_cu=304,
        num_chiplets=8, mlir_v=mlir_v, mlir_build_dir=str(layout.build),
    )  # fmt: skip
    sid = sessions.create(db, spec).id
    jobs.load(db, sid, tag=path.name)
    return sid


def test_a_worker_refuses_a_build_of_another_commit_without_taking_a_job(
    db, db_url, layout, tmp_path
):
    sid = open_session(db, layout, tmp_path, OTHER_COMMIT)
    run = run_cli(db_url, "worker", "--session", str(sid), "--mlir-build-dir", str(layout.build),
                  "--gpus", "0", "--gpu-identity", "GPU-0123456789abcdef",
                  "--until-empty")  # fmt: skip
    assert run.code == 2, run.stderr
    (line,) = [x for x in run.stderr.splitlines() if "rocMLIR" in x]
    assert layout.commit[:12] in line and OTHER_COMMIT[:12] in line and str(sid) in line
    with db.session() as s:
        job = s.scalars(sa.select(Job).where(Job.session_id == sid)).one()
        attempts = s.scalar(sa.select(sa.func.count()).select_from(Attempt))
    assert (job.state, job.retries, attempts) == ("new", 0, 0)  # nothing taken, nothing burnt


def test_a_worker_runs_a_build_of_its_sessions_commit(db, layout, tmp_path):
    sid = open_session(db, layout, tmp_path, layout.commit[:10])  # abbreviated, as git does
    work(db, sid, layout.build, gpu_identity="GPU-0123456789abcdef")  # no GPU here: named
    with db.session() as s:
        assert s.scalars(sa.select(Job.state).where(Job.session_id == sid)).one() == "completed"


def test_the_build_commit_is_read_without_following_links_or_reading_without_bound(layout):
    """A CMakeCache.txt is read up to a bound (a huge or endless file costs nothing), and a
    tuning script that is a link does not make a tree rocMLIR's."""
    cache = layout.build / "CMakeCache.txt"
    with cache.open("a") as f:
        f.truncate(machine.CMAKE_CACHE_MAX_BYTES * 4)  # sparse: the tail is past the bound
    assert machine.build_commit(layout.build).commit == layout.commit
    script = layout.source / machine.ROCMLIR_TUNING_SCRIPT
    script.unlink()
    script.symlink_to(layout.pipeline / "Jenkinsfile")
    (layout.source / "CMakeLists.txt").write_text("project(pipeline)\n")
    assert machine.build_commit(layout.build).commit == ""


def test_run_refuses_an_untied_build_and_takes_mlir_v(db, db_url, layout, tmp_path):
    (layout.build / "CMakeCache.txt").unlink()
    path = tmp_path / "gemm"
    path.write_text(GEMM + "\n")
    args = ["run", "--op", "gemm", "--tuner", "rocmlir", "--mlir-build-dir", str(layout.build),
            "--tuning-space", "quick", "--arch", "gfx942", "--num-cu", "304",
            "--num-chiplets", "8", "--gpus", "0", "--gpu-identity", "GPU-0123456789abcdef",
            "--max-retries", "1", "-q",
            "-o", str(tmp_path / "out.tsv")]  # fmt: skip
    refused = cli(db_url, *args, str(path))
    assert refused.code == 2 and "--mlir-v HASH" in refused.stderr.strip(), refused.stderr
    assert "\n" not in refused.stderr.strip() and sessions.list_all(db) == []
    given = cli(db_url, *args, "--mlir-v", OTHER_COMMIT, str(path))
    assert "--mlir-v" not in given.stderr and "session 1: 0 completed" in given.stderr
    assert [x.mlir_v for x in sessions.list_all(db)] == [OTHER_COMMIT]
