"""gemm_gemm, conv_gemm and fusion through the database: migration in place, import, the queue
with the CPU tuner, results, export, import-tsv and compare (every backend)."""

from __future__ import annotations

from pathlib import Path

import numpy as np
import pytest
import sqlalchemy as sa
from support.perfrunner_reader import read_tuning_db

from mlirtuna import catalog, migrations, sessions
from mlirtuna.db import Database
from mlirtuna.db.models import COMPLETED, Candidate, FusionConfig, Job, Problem
from mlirtuna.errors import UserError
from mlirtuna.history import compare, export, tsvimport, winners
from mlirtuna.problems import parse
from mlirtuna.queue import jobs
from mlirtuna.sessions import SessionSpec
from mlirtuna.tuners.base import TuneContext
from mlirtuna.tuners.cpu import CpuTuner
from mlirtuna.worker import Worker, WorkerSettings

# The flow over whole workers: each backend in .ci/run, SQLite in the quick loop (the
# queue, claim and settle SQL it runs is tested on all three there too).
pytestmark = pytest.mark.backends(fast=("sqlite",))

DATA = Path(__file__).parent / "data"
FUSION = DATA / "fusion"
MODULES = sorted(FUSION.glob("*/*.mlir"))


def drain(db: Database, sid: int) -> None:
    """One in-process CPU worker until the session is empty (few repeats: this is no benchmark)."""
    settings = WorkerSettings(session_id=sid, tuner="cpu", until_empty=True)
    Worker(db, settings, tuner=CpuTuner(repeats=1)).run()


def test_migration_upgrades_an_old_database_in_place(empty_db_url):
    db = Database(empty_db_url, check_schema=False)
    migrations.upgrade(db.engine, "0001")
    with db.engine.begin() as conn:
        conn.execute(
            sa.text(
                "INSERT INTO problem (op, test_vector, created_at) "
                "VALUES ('gemm', '-t f32', '2026-01-01 00:00:00')"
            )
        )
    before, after = migrations.upgrade(db.engine)
    assert before == "0001" and after == migrations.head_revision()
    db.dispose()
    db = Database(empty_db_url)
    with db.session() as s:
        assert s.scalars(sa.select(Problem.test_vector)).all() == ["-t f32"]
    report = catalog.import_files(db, "gemm_gemm", [str(DATA / "tier1-gemmgemm-configs")])
    assert report.new == 14
    db.dispose()


@pytest.mark.slow  # twelve modules tuned for real: minutes on a loaded machine
def test_every_fusion_module_tunes_on_the_queue(db, tmp_path):
    report = catalog.import_modules(db, [str(FUSION / "resnet50"), str(FUSION / "mixr-gemm")])
    assert (report.lines, report.new) == (len(MODULES), len(MODULES))
    again = catalog.import_modules(db, [str(FUSION / "resnet50")])
    assert again.new == 0  # unique by module hash
    sid = sessions.create(db, SessionSpec(tuner="cpu", tuning_space="quick")).id
    assert jobs.load(db, sid, op="fusion", all_problems=True).added == len(MODULES)
    drain(db, sid)
    with db.session() as s:
        states = s.execute(sa.select(Job.state, sa.func.count()).group_by(Job.state)).all()
        tried = s.execute(
            sa.select(Candidate.job_id, sa.func.count(), sa.func.count(Candidate.tflops)).group_by(
                Candidate.job_id
            )
        ).all()
    assert dict(states) == {COMPLETED: len(MODULES)}
    assert len(tried) == len(MODULES) and all(n == valid > 0 for _, n, valid in tried)
    best = winners.winners(db, sid, "fusion")
    assert len(best) == len(MODULES)
    assert all(" @" in w.test_vector and ": " in w.test_vector for w in best)  # file @fn: key
    shown = jobs.list_jobs(db, sid)
    assert all(j.test_vector.split(" @")[0].endswith(".mlir") for j in shown)

    # Export: under the tuning key; the three mixr-gemm modules share one key: one row.
    done = export.render(db, export.ExportQuery(sessions=(sid,), op="fusion"))
    assert done.rows == len(MODULES) - 2
    assert len(done.key_notes) == 2 and all("writing fusion problem" in n for n in done.key_notes)
    out = tmp_path / "tuning_fusion.tsv"
    out.write_text(done.text)
    with db.session() as s:
        keys = set(s.scalars(sa.select(FusionConfig.tuning_key)))
    assert {key[-1] for key in read_tuning_db(str(out))} == keys
    assert export.fusion_file_name(db, [sid]) == f"tuning_fusion_{sessions.get(db, sid).arch}.tsv"


def test_a_plain_problem_wins_over_a_fusion_with_its_key(db):
    catalog.import_modules(db, [str(FUSION / "resnet50" / "mixr-resnet-fusion-case-4.mlir")])
    with db.session() as s:
        key = s.scalar(sa.select(FusionConfig.tuning_key))
        ids, _ = catalog.ensure_problems(s, "conv", [parse("conv", key)])
    sid = sessions.create(db, SessionSpec(tuner="cpu", tuning_space="quick")).id
    jobs.load(db, sid, all_problems=True)
    drain(db, sid)
    done = export.render(db, export.ExportQuery(sessions=(sid,)))
    assert done.rows == 1
    assert done.key_notes == [
        f"key {key!r}: writing conv problem {ids[key]}'s winner, not fusion "
        "mixr-resnet-fusion-case-4.mlir's (a plain problem is tuned on exactly that kernel)"
    ]


@pytest.mark.parametrize("dtype", ["f32", "f16"])
def test_gemm_gemm_and_conv_gemm_tune_export_and_come_back(db, tmp_path, dtype):
    gg = tmp_path / "gg"
    gg.write_text(
        f"-t {dtype} -transA false -transB true -transC true -g 2 -m 40 -n 24 -k 16 -gemmO 8\n"
    )
    cg = tmp_path / "cg"
    cg.write_text(
        f"-t {dtype} -transC false -transO true -n 1 -c 8 -H 9 -W 9 -k 16 -y 3 -x 3 -p 1 -q 1 "
        "-u 2 -v 2 -l 1 -j 1 -g 2 -gemmO 12\n"
    )
    assert catalog.import_files(db, "gemm_gemm", [str(gg)]).problems == 2  # -transO
    assert catalog.import_files(db, "conv_gemm", [str(cg)]).problems == 4  # -f x -I
    sid = sessions.create(db, SessionSpec(tuner="cpu", tuning_space="quick")).id
    jobs.load(db, sid, all_problems=True)
    drain(db, sid)
    assert jobs.counts(db, sid)[sid][COMPLETED] == 6
    for op, n in (("gemm_gemm", 2), ("conv_gemm", 4)):
        out = tmp_path / f"{op}.tsv"
        done = export.export(db, export.ExportQuery(sessions=(sid,), op=op), "v3", str(out))
        assert done.rows == n
        back = tsvimport.import_tsv(db, op, [str(out)])
        assert (back.results, back.new_problems) == (n, 0)
        same = compare.compare(compare.session_side(db, sid, op), compare.tsv_side(str(out), op))
        assert not same.regressions
    assert len(winners.winners(db, sid, "gemm_gemm")) == 2


def test_fused_kernels_are_verified(monkeypatch):
    """A kernel that skips the epilogue (or rounds wrong) is rejected, not timed."""
    problem = catalog.read_problem(FUSION / "resnet50" / "mixr-resnet-fusion-case-4.mlir")

    def no_relu(op):
        op.run_blocked((64, 64, 64))
        op.result[...] = np.where(op.result == 0, -1.0, op.result)

    tuner = CpuTuner(repeats=1, extra_kernels={"cpu:wrong": no_relu})
    ctx = TuneContext("cpu", "cpu", 1, 1, "quick", gpu_id=-1)
    outcome = tuner.tune(problem, ctx)
    wrong = next(c for c in outcome.candidates if c.perf_config == "cpu:wrong")
    assert not wrong.valid and "wrong result" in (wrong.error or "")
    assert outcome.winner.valid and outcome.winner.perf_config != "cpu:wrong"


BROADCAST_RESULT = """\
func.func @f(%arg0: tensor<1x4x4xf32>, %arg1: tensor<1x4x4xf32>) -> tensor<2x4x4xf32> {
  %0 = migraphx.dot(%arg0, %arg1) : (tensor<1x4x4xf32>, tensor<1x4x4xf32>) -> tensor<1x4x4xf32>
  %1 = migraphx.multibroadcast(%0) {out_lens = [2, 4, 4]} : (tensor<1x4x4xf32>) -> tensor<2x4x4xf32>
  return %1 : tensor<2x4x4xf32>
}
"""


def test_a_module_the_cpu_cannot_run_is_one_error_not_retried(db, tmp_path, monkeypatch):
    """`jobs load` leaves it out (issue 44); one queued anyway (an older `jobs load`) is one
    error at the worker, not retried."""
    module = tmp_path / "bcast.mlir"
    module.write_text(BROADCAST_RESULT)
    catalog.import_modules(db, [str(module)])
    sid = sessions.create(db, SessionSpec(tuner="cpu", tuning_space="quick")).id
    with pytest.raises(UserError, match="can run none of the 1 selected problem"):
        jobs.load(db, sid, all_problems=True)
    monkeypatch.setattr(jobs, "_leave_out_unrunnable", lambda _s, _sess, _selected: {})
    jobs.load(db, sid, all_problems=True)
    settings = WorkerSettings(session_id=sid, tuner="cpu", until_empty=True, max_retries=3)
    Worker(db, settings, tuner=CpuTuner(repeats=1)).run()
    (job,) = jobs.list_jobs(db, sid)
    assert (job.state, job.retries) == ("error", 1)
    assert "cannot fuse migraphx.multibroadcast of the conv/dot result (bcast.mlir:3)" in (
        job.result or ""
    )


def test_cli_bad_input_is_one_line_and_exit_2(db, db_url, tmp_path):
    from support.clitools import cli

    bad = tmp_path / "gg"
    bad.write_text("-t f32 -g 1 -m 4 -k 4 -n 4\n")
    run = cli(db_url, "import", "--op", "gemm_gemm", str(bad))
    assert run.code == 2 and run.stderr.strip() == f"error: {bad}:1: missing required flag -gemmO"
    module = tmp_path / "soft.mlir"
    module.write_text(
        (FUSION / "mixr-gemm" / "mixr-gemm-add.e2e.mlir")
        .read_text()
        .replace('"migraphx.add"', '"migraphx.softmax"')
    )
    run = cli(db_url, "import", "--op", "fusion", str(tmp_path))
    assert run.code == 2 and len(run.stderr.strip().splitlines()) == 1
    assert f"{module}:15: op migraphx.softmax is not one mlirtuna reads" in run.stderr
    assert cli(db_url, "results", "--session", "1").code != 0  # nothing was written
    with db.session() as s:
        assert s.scalar(sa.select(sa.func.count()).select_from(Problem)) == 0


def test_run_op_fusion_on_the_example(db_url, tmp_path, monkeypatch):
    from support.clitools import cli

    monkeypatch.chdir(tmp_path)  # where run writes its tuning DB
    example = Path(__file__).parent.parent / "examples" / "fusion-small"
    run = cli(db_url, "run", "--op", "fusion", "--tuning-space", "quick", "--json", str(example))
    assert run.code == 0, run.stderr
    summary = run.json()
    assert summary["counts"]["completed"] == 4 and summary["exported"] == 3
    assert any(w["test_vector"].startswith("small-conv-bias-relu.mlir @test: conv -F 1")
               for w in summary["winners"])  # fmt: skip
    written = list(tmp_path.glob("tuning_fusion_*.tsv"))
    assert len(written) == 1 and len(summary["notes"]) == 1  # two mixr-gemm modules, one key


@pytest.mark.slow  # four `run`s
def test_the_plain_tuning_db_run_writes_does_not_depend_on_run_order(
    db, db_url, tmp_path, monkeypatch
):
    """gemm, then fusion: run's mlir_tuning_<arch>.tsv ends with the rows `export --arch`
    writes (the fusion winners included), as it would with the runs the other way round."""
    from support.clitools import cli

    monkeypatch.chdir(tmp_path)
    examples = Path(__file__).parent.parent / "examples"

    def rows(path: Path) -> list[str]:
        return [line for line in path.read_text().splitlines() if not line.startswith("#")]

    before = 0
    for op, example in (("gemm", "gemm-small"), ("fusion", "fusion-small")):
        run = cli(db_url, "run", "--op", op, "--tuning-space", "quick", "--json",
                  str(examples / example))  # fmt: skip
        assert run.code == 0, run.stderr
        (plain,) = tmp_path.glob("mlir_tuning_*.tsv")
        before = before or len(rows(plain))
    assert len(rows(plain)) > before  # the fusion winners came in
    assert any(n.startswith(f"{plain.name} written again") for n in run.json()["notes"])
    arch = sessions.get(db, run.json()["session"]).arch_full
    export_run = cli(db_url, "export", "--arch", arch, "-o", str(tmp_path / "export.tsv"))
    assert export_run.code == 0, export_run.stderr
    assert rows(plain) == rows(tmp_path / "export.tsv")


def test_jobs_load_file_takes_modules_and_directories(db):
    sid = sessions.create(db, SessionSpec(tuner="cpu", tuning_space="quick")).id
    loaded = jobs.load(db, sid, op="fusion", file=str(FUSION / "mixr-gemm"))
    assert (loaded.added, loaded.existing) == (3, 0)
    again = jobs.load(
        db, sid, op="fusion", file=str(FUSION / "mixr-gemm" / "mixr-gemm-add.e2e.mlir")
    )
    assert (again.added, again.existing) == (0, 1)
