"""Fusion with a rocMLIR build (the stand-in in src/mlirtuna/standin/rocmlir): tuning keys from
`rocmlir-gen --emit-tuning-key` in both layouts, and the rocmlir tuner through a worker."""

from __future__ import annotations

import datetime as dt
import json
import shutil
from pathlib import Path

import pytest
import sqlalchemy as sa
from support.perfrunner_keys import read_key
from support.rocmlir import ARCH_FULL, mark_standin, work

from mlirtuna import catalog, sessions
from mlirtuna.db.models import COMPLETED, Candidate, FusionConfig, Job, Result
from mlirtuna.problems import fusion as fusion_problems
from mlirtuna.queue import jobs
from mlirtuna.sessions import SessionSpec
from mlirtuna.tuners.base import TuneContext
from mlirtuna.tuners.process import Run
from mlirtuna.tuners.rocmlir import fusionkey, outcome

# The backend changes nothing here (the queue, records and SQL of their own are tested on every
# backend in their own files): SQLite only, to keep the suite quick.
pytestmark = pytest.mark.backends("sqlite")

FUSION = Path(__file__).parent / "data" / "fusion"
CASE_4 = FUSION / "resnet50" / "mixr-resnet-fusion-case-4.mlir"
DOT_ADD = FUSION / "mixr-gemm" / "mixr-gemm-add.e2e.mlir"


@pytest.mark.parametrize("layout", ["new", "old"])
def test_keys_from_rocmlir_gen_in_both_layouts(build, monkeypatch, layout):
    monkeypatch.setenv("FAKE_ROCMLIR_KEY_LAYOUT", layout)
    for path in sorted(FUSION.glob("*/*.mlir")):
        emitted = fusionkey.emit_tuning_key(path, path.read_text(), str(build), "gfx942")
        assert len(emitted.strip().split("\t")) == (4 if layout == "new" else 3)
        problem = catalog.read_problem(path, str(build))
        derived = fusion_problems.from_module(path.read_text(), path.name)
        assert problem.key_source == "rocmlir-gen" and derived.key_source == "migraphx"
        kind, _ = read_key(problem.tuning_key)
        if kind == "conv":  # rocmlir-gen's conv key canonicalizes to the derived one
            assert problem.tuning_key == derived.tuning_key
        else:  # its gemm key spells -transO out
            assert problem.tuning_key == derived.tuning_key.replace(
                " -transB false", " -transB false -transO false"
            )


def test_a_failing_key_pipeline_is_one_clear_error(build, tmp_path):
    bad = tmp_path / "bad.mlir"
    bad.write_text("module {\n  func.func @f(%arg0: tensor<2xf32>) -> tensor<2xf32> {\n"
                   "    return %arg0 : tensor<2xf32>\n  }\n}\n")  # fmt: skip
    with pytest.raises(Exception, match=r"bad\.mlir: rocmlir-gen exited 1: .*no convolution"):
        catalog.read_problem(bad, str(build))


def fusion_session(db) -> int:
    """A session over two fusion modules (a conv and a gemm one), its jobs loaded."""
    catalog.import_modules(db, [str(CASE_4), str(DOT_ADD)], tag="fx")
    sess = sessions.create(
        db,
        SessionSpec(
            tuner="rocmlir", arch_full=ARCH_FULL, num_cu=304, num_chiplets=8,
            tuning_space="quick", rocm_v="6.4", mlir_v="abc",
        ),
    )  # fmt: skip
    jobs.load(db, sess.id, tag="fx")
    return mark_standin(db, sess.id)


@pytest.mark.parametrize("era", ["E2", "E3"])
def test_rocmlir_tuner_tunes_a_fusion_module(db, build, monkeypatch, era):
    monkeypatch.setenv("FAKE_TUNINGRUNNER_ERA", era)
    sid = fusion_session(db)
    assert work(db, sid, build).stats.completed == 2
    with db.session() as s:
        assert set(s.scalars(sa.select(Job.state))) == {COMPLETED}
        assert s.scalar(sa.select(sa.func.count()).select_from(Candidate)) >= 2 * 8
        results = s.execute(
            sa.select(FusionConfig.file_name, Result.perf_config).join(
                Result, Result.problem_id == FusionConfig.id
            )
        ).all()
    assert {name for name, _ in results} == {CASE_4.name, DOT_ADD.name}
    assert all(pc for _, pc in results)


@pytest.mark.parametrize("era", ["E2", "E3"])
def test_fusion_runs_as_the_tool_runs_it(db, build, monkeypatch, tmp_path, era):
    # `--test-dir` a private directory holding the one module, in a private working directory
    # per call (the tool writes fusion_config_file there), never --config FILE.mlir (a usage
    # error for the real tool).
    monkeypatch.setenv("FAKE_TUNINGRUNNER_ERA", era)
    log = tmp_path / "calls.jsonl"
    monkeypatch.setenv("FAKE_TUNINGRUNNER_LOG", str(log))
    sid = fusion_session(db)
    assert work(db, sid, build).stats.completed == 2
    calls = [json.loads(line) for line in log.read_text().splitlines()]
    calls = [c for c in calls if "--op=fusion" in c["argv"]]
    assert len(calls) == 2
    flag = "--test_dir=" if era == "E2" else "--test-dir="
    dirs = [next(a[len(flag) :] for a in c["argv"] if a.startswith(flag)) for c in calls]
    assert not any(a.startswith("--config") for c in calls for a in c["argv"])
    cwds = [c["cwd"] for c in calls]
    assert len(set(cwds)) == 2 and str(build) not in cwds  # a private one per call
    assert [str(Path(d).parent) for d in dirs] == cwds
    assert not (build / "fusion_config_file").exists()


def test_the_real_fusion_row_is_read_under_the_key_the_tool_tuned(tmp_path):
    # The real tool's row names the key as perfRunner canonicalizes it (with -m conv ... -t 1),
    # its fusion_config_file without: both are the module's problem.
    real = Path(__file__).parent / "data" / "rocmlir-real" / "fusion-test-dir-conv"
    key = (real / "fusion_config_file").read_text().strip()
    key_op, canonical = fusion_problems.parse_key(key)
    problem = fusion_problems.FusionProblem(
        file_name="m.mlir", function="f", sha256="0" * 64, tuning_key=canonical,
        key_op=key_op, key_source="rocmlir-gen", module_text="",
    )  # fmt: skip
    for name in ("out.tsv", "out.tsv.debug"):
        shutil.copy(real / name, tmp_path / name)
    ctx = TuneContext(arch="gfx942", arch_full=ARCH_FULL, num_cu=304, num_chiplets=8,
                      tuning_space="full")  # fmt: skip
    now = dt.datetime.now(dt.UTC)
    got = outcome.read_outcome(problem, ctx, tmp_path / "out.tsv", Run(0, "", "", now, now))
    row = (real / "out.tsv").read_text().splitlines()[1].split("\t")
    assert got.winner.perf_config == row[4] and len(got.candidates) == 8
    assert got.notes == [] and all(c.spread is not None for c in got.candidates if c.valid)
