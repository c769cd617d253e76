"""What the two conformance tiers share (tests/test_conformance.py: rocMLIR's real E3 scripts;
tests/test_conformance_e4.py: rocmlirTriton's E4 set): the skip when the scripts or the modules
they need are missing, the fakes' build, the rocmlir session over it and the comparison of what
mlirtuna recorded with the tool's own files.

As in the tier modules, mlirtuna's catalog, sessions, queue and models are imported inside the
helpers that use them, not when a skipped tier is collected."""

from __future__ import annotations

import os
import subprocess
import sys
from pathlib import Path

import pytest

from mlirtuna import standin

PYTHON = os.environ.get("MLIRTUNA_ROCMLIR_PYTHON", sys.executable)
BELOW = standin.BUILD / "below"  # the fakes where the GPU stack would be
# The fakes' GPU, named as an operator names a GPU the kernel does not show (--gpu-identity).
FAKE_GPU = "conformance-fake-gpu0"


def _missing_modules(modules: tuple[str, ...]) -> str:
    probe = f"import {', '.join(modules)}"
    run = subprocess.run([PYTHON, "-c", probe], capture_output=True, text=True, check=False)
    return "" if run.returncode == 0 else run.stderr.strip().splitlines()[-1]


def tier_marks(scripts: str, how: str, tool: str, modules: tuple[str, ...]) -> list:
    """A tier's `pytestmark`: the conformance mark; skipped without its `scripts` (`how` says
    where to get them), or when PYTHON cannot import the `modules` the real `tool` needs."""
    needs = f"{', '.join(modules[:-1])} and {modules[-1]}"
    return [
        pytest.mark.conformance,
        pytest.mark.skipif(not scripts, reason=how),
        pytest.mark.skipif(
            bool(scripts) and bool(_missing_modules(modules)),
            reason=f"{tool} needs {needs}: install them or set MLIRTUNA_ROCMLIR_PYTHON to an "
            "interpreter that has them",
        ),
    ]


def open_session(db, tmp_path: Path, op: str, lines: list[str], tag: str, **spec) -> int:
    """Import `lines` under `tag` and open a rocmlir session of the full space on the fakes'
    build (`spec`: the rest of its SessionSpec, the commit first), its jobs loaded."""
    from mlirtuna import catalog, sessions
    from mlirtuna.problems import ExpandOptions
    from mlirtuna.queue import jobs

    if op == "fusion":
        catalog.import_modules(db, lines, tag=tag)
    else:
        path = tmp_path / f"{tag}-configs"
        path.write_text("".join(f"{line}\n" for line in lines))
        catalog.import_files(db, op, [str(path)], ExpandOptions(expand=False), tag=tag)
    made = sessions.create(
        db,
        sessions.SessionSpec(
            tuner="rocmlir", tuning_space="full", rocm_v="6.4", mlir_build_dir=str(BELOW), **spec
        ),
    )
    jobs.load(db, made.id, tag=tag)
    return made.id


def recorded(db, sid) -> dict[str, tuple[str, float, dict[str, tuple]]]:
    """{tuned key: (winner, TFlops, {perf config: (TFlops, median ns)})} of a session."""
    import sqlalchemy as sa

    from mlirtuna.db.models import Candidate, Problem, Result

    out: dict[str, tuple[str, float, dict[str, tuple]]] = {}
    with db.session() as s:
        pairs = s.execute(
            sa.select(Result, Problem).join(Problem, Problem.id == Result.problem_id)
            .where(Result.session_id == sid)
        ).all()  # fmt: skip
        for result, problem in pairs:
            cands = s.execute(
                sa.select(Candidate).where(
                    Candidate.session_id == sid, Candidate.problem_id == problem.id
                )
            ).scalars()
            out[problem.test_vector] = (
                result.perf_config,
                result.tflops,
                {c.perf_config: (c.tflops, c.kernel_time) for c in cands},
            )
    return out


def assert_same_row(got: tuple, want: tuple, median_rel: float) -> None:
    """One tuned key as recorded (`got`) and as the tool wrote it (`want`), both as `recorded`
    gives them: the winner, its TFlops and every candidate equal (float noise of a text round
    trip aside: the median ns within `median_rel`)."""
    winner, tflops, cands = want
    got_winner, got_tflops, got_cands = got
    assert got_winner == winner and got_tflops == pytest.approx(tflops, rel=1e-9)
    assert set(got_cands) == set(cands)
    for pc, (want_tflops, want_median) in cands.items():
        have_tflops, have_median = got_cands[pc]
        assert (have_tflops is None) == (want_tflops is None), pc
        if want_tflops is not None:
            assert have_tflops == pytest.approx(want_tflops, rel=1e-6), pc
            assert have_median == pytest.approx(want_median, rel=median_rel), pc
