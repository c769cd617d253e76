"""Fusion with a rocMLIR build (the stand-in in tests/fake_rocmlir): tuning keys from
`rocmlir-gen --emit-tuning-key` in both layouts, and the rocmlir tuner through a worker."""

from __future__ import annotations

from pathlib import Path

import pytest
import sqlalchemy as sa
from support.perfrunner_keys import read_key
from support.rocmlir import ARCH_FULL, quiet_build, work  # noqa: F401 (the build fixture)

from mlirtuna import catalog, sessions
from mlirtuna.db.models import COMPLETED, Candidate, FusionConfig, Job, Result
from mlirtuna.problems import fusion as fusion_problems
from mlirtuna.queue import jobs
from mlirtuna.sessions import SessionSpec
from mlirtuna.tuners.rocmlir import fusionkey

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


@pytest.mark.parametrize("era", ["E2", "E3"])
def test_rocmlir_tuner_tunes_a_fusion_module(db, build, monkeypatch, era):
    monkeypatch.setenv("FAKE_TUNINGRUNNER_ERA", era)
    catalog.import_modules(db, [str(CASE_4), str(DOT_ADD)], tag="fx")
    sess = sessions.create(
        db,
        SessionSpec(
            tuner="rocmlir", arch_full=ARCH_FULL, num_cu=304, num_chiplets=8,
            tuning_space="quick", rocm_v="6.4", mlir_v="abc",
        ),
    )  # fmt: skip
    jobs.load(db, sess.id, tag="fx")
    assert work(db, sess.id, build).stats.completed == 2
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
