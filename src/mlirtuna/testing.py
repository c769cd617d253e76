"""The contract every tuner keeps, for a tuner's own test suite (docs/adding-a-tuner.md).

A tuner's tests subclass `TunerContract` and give it two fixtures, the tuner (`tuner_spec`: what
`--tuner` takes) and a problem it can tune (`problem`); pytest then runs each check of the
contract against that tuner, as Optuna's storages subclass its StorageTestCase:

    import pytest
    from mlirtuna.testing import TunerContract, parse_problem

    GEMM = "-t f32 -transA false -transB false -g 1 -m 64 -n 64 -k 64"

    class TestToyTuner(TunerContract):
        @pytest.fixture
        def tuner_spec(self) -> str:
            return "toy"

        @pytest.fixture
        def problem(self):
            return parse_problem("gemm", GEMM)

Optional fixtures: `mlir_build_dir` (a rocMLIR build, for a tuner that uses one), `tune_context`
(where it tunes: by default the kind's first tuning space, GPU 0 or the CPU, no timeout) and
`unsupported_problem` (one its `TunerKind.unsupported` refuses; the check is skipped without).
mlirtuna's own suite runs the contract over every registered tuner (tests/test_tuner_contract.py).

Testing only: this module imports pytest, which the package does not depend on at run time.
No check bounds wall-clock time: a timeout is checked against the same tuner's untimed run.
"""

from __future__ import annotations

import math
import threading
import time
from dataclasses import replace
from pathlib import Path

import pytest

from mlirtuna.errors import TunerError, TunerTimeout
from mlirtuna.formats.outcome import Candidate, TuneOutcome
from mlirtuna.problems import Problem, parse
from mlirtuna.tuners import registry
from mlirtuna.tuners.base import BatchTuner, Compiled, SplitTuner, TuneContext, Tuner

#: A tuner stopped at this fraction of its own untimed run must have run past its timeout.
TIMEOUT_FRACTION = 1 / 50
#: Below this untimed run (seconds) a tuner is too quick to be stopped part-way: not checked.
SHORTEST_STOPPABLE_S = 0.02


def parse_problem(op: str, line: str) -> Problem:
    """A problem from one config line of `op`, as written (`mlirtuna import` with --no-expand)."""
    return parse(op, line)


def default_context(kind: registry.TunerKind, mlir_build_dir: str | None = None) -> TuneContext:
    """Where a kind tunes by default: its first tuning space (quick where it has one), GPU 0 of
    a gfx942 for a GPU kind, the CPU (-1) otherwise; no job timeout."""
    spaces = kind.spaces or ("quick",)
    return TuneContext(
        arch="gfx942" if kind.gpu else "cpu",
        arch_full="gfx942:sramecc+:xnack-" if kind.gpu else "cpu",
        num_cu=304 if kind.gpu else 1,
        num_chiplets=8 if kind.gpu else 1,
        tuning_space="quick" if "quick" in spaces else spaces[0],
        gpu_id=0 if kind.gpu else -1,
        mlir_build_dir=mlir_build_dir,
    )


class TunerContract:
    """What every tuner does, checked; subclass it with `tuner_spec` and `problem` fixtures."""

    # --- the fixtures a subclass gives (the first two) or may change -------------------------

    @pytest.fixture
    def tuner_spec(self) -> str:
        raise NotImplementedError("a TunerContract subclass gives the fixture `tuner_spec`")

    @pytest.fixture
    def problem(self) -> Problem:
        raise NotImplementedError("a TunerContract subclass gives the fixture `problem`")

    @pytest.fixture
    def mlir_build_dir(self) -> str | None:
        return None

    @pytest.fixture
    def unsupported_problem(self) -> Problem | None:
        return None

    @pytest.fixture
    def kind(self, tuner_spec: str) -> registry.TunerKind:
        return registry.kind(tuner_spec)

    @pytest.fixture
    def tuner(self, tuner_spec: str, mlir_build_dir: str | None) -> Tuner:
        return registry.make(tuner_spec, mlir_build_dir=mlir_build_dir)

    @pytest.fixture
    def tune_context(self, kind: registry.TunerKind, mlir_build_dir: str | None) -> TuneContext:
        return default_context(kind, mlir_build_dir)

    @pytest.fixture
    def outcome(self, tuner: Tuner, problem: Problem, tune_context: TuneContext) -> TuneOutcome:
        return tuner.tune(problem, tune_context)

    # --- the contract ------------------------------------------------------------------------

    def test_the_registry_knows_it_by_its_name(self, tuner_spec: str, kind: registry.TunerKind):
        name, _ = registry.split_spec(tuner_spec)
        assert isinstance(kind, registry.TunerKind)
        if "." not in name:  # a registered tuner, not one named by its module path
            assert kind.name == name
            assert name in registry.names()

    def test_it_is_a_tuner(self, tuner: Tuner, kind: registry.TunerKind):
        assert isinstance(tuner, Tuner)
        assert isinstance(tuner.name, str) and tuner.name

    def test_its_context_is_one_it_accepts(
        self, kind: registry.TunerKind, tune_context: TuneContext
    ):
        space = tune_context.tuning_space
        assert kind.spaces is None or space in kind.spaces or space.startswith("list:")
        assert (tune_context.gpu_id >= 0) == kind.gpu

    def test_tune_returns_a_valid_winner_among_its_candidates(
        self, outcome: TuneOutcome, problem: Problem
    ):
        assert isinstance(outcome, TuneOutcome)
        assert outcome.candidates and all(isinstance(c, Candidate) for c in outcome.candidates)
        assert outcome.winner in outcome.candidates
        assert outcome.winner.valid, outcome.winner
        for c in outcome.candidates:
            assert isinstance(c.perf_config, str) and c.perf_config.strip(), c
            if c.valid:
                _assert_measured(c, problem)
            else:  # an invalid candidate says why
                assert isinstance(c.error, str) and c.error.strip(), c
        assert isinstance(outcome.output, str)

    def test_its_candidates_perf_configs_are_its_own(
        self, outcome: TuneOutcome, kind: registry.TunerKind
    ):
        """The worker refuses a result whose perf config another tuner's family owns."""
        foreign = [c.perf_config for c in outcome.candidates if not kind.owns(c.perf_config)]
        assert foreign == []
        if kind.perf_prefix is not None and kind.name in registry.names():
            assert {registry.tuner_of(c.perf_config) for c in outcome.candidates} == {kind.name}

    def test_its_perf_configs_fields_parse(self, outcome: TuneOutcome, kind: registry.TunerKind):
        """A kind that names its perf configs' fields names every valid one's, and the
        dashboard finds them by the perf config alone (registry.perf_fields)."""
        if kind.perf_fields is None:
            pytest.skip(f"the {kind.name} tuner's perf configs use the built-in layouts")
        for c in outcome.candidates:
            fields = kind.perf_fields(c.perf_config)
            assert isinstance(fields, dict)
            assert all(isinstance(k, str) and k for k in fields), fields
            assert all(isinstance(v, int | str) for v in fields.values()), fields
            if c.valid:
                assert fields, f"no fields for {c.perf_config!r}"
            if kind.name in registry.names():
                assert registry.perf_fields(c.perf_config) == fields

    def test_an_unsupported_problem_is_refused_up_front_and_by_tune(
        self,
        kind: registry.TunerKind,
        tuner: Tuner,
        problem: Problem,
        unsupported_problem: Problem | None,
        tune_context: TuneContext,
    ):
        """`run` and `jobs load` leave out what `unsupported` names; one that reaches the tuner
        anyway fails as a TunerError (its job ends in error), never as another exception."""
        if kind.unsupported is None:
            pytest.skip(f"the {kind.name} tuner declares no unsupported problems")
        if unsupported_problem is None:
            pytest.skip("no `unsupported_problem` fixture given")
        assert kind.unsupported(problem, tune_context) is None
        why = kind.unsupported(unsupported_problem, tune_context)
        assert isinstance(why, str) and why.strip()
        with pytest.raises(TunerError):
            tuner.tune(unsupported_problem, tune_context)

    def test_a_timeout_in_its_context_is_honoured(
        self, tuner: Tuner, problem: Problem, tune_context: TuneContext
    ):
        """Given a fraction of its own untimed run as the job timeout, it stops: TunerTimeout
        (the worker retries the job). No wall-clock bound: the run it is held to is its own."""
        started = time.monotonic()
        tuner.tune(problem, tune_context)
        untimed = time.monotonic() - started
        if untimed < SHORTEST_STOPPABLE_S:
            pytest.skip(f"tunes in {untimed:.3f} s: too quick to stop part-way")
        timed = _with(tune_context, timeout_s=untimed * TIMEOUT_FRACTION)
        with pytest.raises(TunerTimeout):
            tuner.tune(problem, timed)

    def test_its_tools_can_be_stopped_when_nothing_runs(self, kind: registry.TunerKind):
        """The worker calls stop_tools on a lost lease; with no tool running it stops none."""
        assert kind.stop_tools(threading.get_ident()) == 0

    def test_a_batch_gives_each_problem_one_outcome(
        self, tuner: Tuner, problem: Problem, tune_context: TuneContext, kind: registry.TunerKind
    ):
        if not isinstance(tuner, BatchTuner):
            pytest.skip(f"the {kind.name} tuner tunes one problem a call")
        assert isinstance(tuner.can_batch(), bool)
        assert isinstance(tuner.batchable(problem), bool)
        if not (tuner.can_batch() and tuner.batchable(problem)):
            pytest.skip("this build or problem does not batch")
        items = list(tuner.tune_many([problem], tune_context))
        assert [i for i, _ in items] == [0]
        (_, got) = items[0]
        assert isinstance(got, TuneOutcome), got
        assert got.winner.valid and got.winner in got.candidates
        assert all(kind.owns(c.perf_config) for c in got.candidates)

    def test_a_two_stage_kind_has_a_split_tuner(
        self, tuner: Tuner, kind: registry.TunerKind, tuner_spec: str
    ):
        """What the kind declares of two-stage sessions (`--split`), the tuner can do."""
        declares = (kind.check_split_build, kind.merge_artifacts, kind.artifact_commits)
        if any(d is not None for d in declares):
            assert isinstance(tuner, SplitTuner), f"{tuner_spec}: declares --split, cannot"
            assert kind.check_split_build is not None and kind.artifact_commits is not None
        if isinstance(tuner, SplitTuner):
            assert kind.check_split_build is not None, f"{tuner_spec}: splits, never asked to"

    def test_compile_then_benchmark_gives_a_valid_winner(
        self,
        tuner: Tuner,
        kind: registry.TunerKind,
        problem: Problem,
        tune_context: TuneContext,
        tmp_path: Path,
    ):
        if not isinstance(tuner, SplitTuner):
            pytest.skip(f"the {kind.name} tuner does not split")
        try:
            tuner.check_split()
        except TunerError as exc:  # Unsupported: this build has no compile-only mode
            pytest.skip(f"this build cannot split: {exc}")
        compiled = tuner.compile(problem, tune_context, tmp_path / "bundle")
        assert isinstance(compiled, Compiled) and compiled.directory.is_dir()
        if kind.artifact_commits is not None:
            assert compiled.commit_id in kind.artifact_commits(compiled.directory)
        got = tuner.benchmark(problem, tune_context, compiled.directory)
        assert got.winner.valid and got.winner in got.candidates
        assert all(kind.owns(c.perf_config) for c in got.candidates)


def _assert_measured(c: Candidate, problem: Problem) -> None:
    """A valid candidate's time and TFlops are positive, finite and say the same thing."""
    assert c.kernel_time_ns is not None and c.tflops is not None, c
    assert math.isfinite(c.kernel_time_ns) and c.kernel_time_ns > 0, c
    assert math.isfinite(c.tflops) and c.tflops > 0, c
    expected = problem.flops() / c.kernel_time_ns / 1e3
    assert math.isclose(c.tflops, expected, rel_tol=0.05), (c, expected)


def _with(ctx: TuneContext, **changes: object) -> TuneContext:
    return replace(ctx, **changes)  # type: ignore[arg-type]
