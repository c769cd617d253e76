"""RocmlirTuner: builds the tool's command line per era and mode, and runs it (see the package
docstring for what each era gets and why)."""

from __future__ import annotations

import functools
import math
import os
import tempfile
from collections.abc import Iterator, Sequence
from pathlib import Path
from typing import TYPE_CHECKING

import mlirtuna.tuners.process as process
import mlirtuna.tuners.rocmlir.batch as batch
import mlirtuna.tuners.rocmlir.chosen as chosen
import mlirtuna.tuners.rocmlir.eras as eras
import mlirtuna.tuners.rocmlir.stream as stream
from mlirtuna import machine
from mlirtuna.defaults import (
    ENV_ROCMLIR_BUILD,
    ENV_ROCMLIR_PYTHON,
    ENV_ROCMLIR_SCRIPT_DIR,
    KILL_GRACE_S,
)
from mlirtuna.errors import BatchRefused, TunerError, Unsupported, UserError
from mlirtuna.problems import Problem
from mlirtuna.problems.fusion import FusionProblem
from mlirtuna.tuners.base import BatchItem, Compiled, TuneContext, TuneOutcome
from mlirtuna.tuners.rocmlir.artifacts import (
    INDEX,
    commit_refused,
    index_commits,
    split_artifacts,
)
from mlirtuna.tuners.rocmlir.eras import GPUS, TOPK, Era, detect_era, tool_space
from mlirtuna.tuners.rocmlir.fusionkey import module_path, write_module
from mlirtuna.tuners.rocmlir.outcome import failure, read_outcome

if TYPE_CHECKING:
    from mlirtuna.tuners.base import SearchableTuner, StreamingTuner

HELP_TIMEOUT_S = 120.0
# The tool's own per-config --timeout fires first, so it can stop its pipeline and say so;
# our kill of the whole process group at ctx.timeout_s is the backstop.
TOOL_TIMEOUT_FRACTION = 0.9


class RocmlirTuner:
    """Tunes with rocMLIR's tuningRunner.py from a build dir (arg, or $MLIRTUNA_ROCMLIR_BUILD):
    `<build>/bin/tuningRunner.py`, or the one in `script_dir` ($MLIRTUNA_ROCMLIR_SCRIPT_DIR),
    run by `python` ($MLIRTUNA_ROCMLIR_PYTHON) over the build's binaries."""

    name = "rocmlir"

    def __init__(
        self,
        build_dir: str | None = None,
        *,
        python: str | None = None,
        script_dir: str | None = None,
        kill_grace_s: float = KILL_GRACE_S,
    ) -> None:
        build = build_dir or os.environ.get(ENV_ROCMLIR_BUILD)
        if not build:
            raise UserError(
                f"no rocMLIR build dir: pass --mlir-build-dir DIR or set {ENV_ROCMLIR_BUILD}"
            )
        self.build_dir = Path(build).resolve()
        scripts = script_dir or os.environ.get(ENV_ROCMLIR_SCRIPT_DIR)
        self.script = (Path(scripts).resolve() if scripts else self.build_dir / "bin") / (
            "tuningRunner.py"
        )
        if not self.script.is_file():
            raise UserError(
                f"{self.script} not found: point "
                + (f"{ENV_ROCMLIR_SCRIPT_DIR} at rocMLIR's scripts" if scripts else
                   f"--mlir-build-dir or {ENV_ROCMLIR_BUILD} at a rocMLIR build directory")
            )  # fmt: skip
        # The real script needs numpy/pandas/tqdm from the ROCm image's python, which is not
        # necessarily the one running mlirtuna; MITuna runs `python3` too.
        self.python = python or os.environ.get(ENV_ROCMLIR_PYTHON) or "python3"
        self.kill_grace_s = kill_grace_s
        self._era: Era | None = None

    # -- era ------------------------------------------------------------------------------

    @property
    def era(self) -> Era:
        """Read once per instance from `tuningRunner.py --help`.

        Both eras probe the machine before parsing arguments (E2: rocm_agent_enumerator and
        `git rev-parse` in the cwd; E3: rocm-smi), so even --help fails where no GPU is visible.
        """
        if self._era is None:
            argv = [self.python, str(self.script), "--help"]
            run = self._run(argv, self._tool_env(), HELP_TIMEOUT_S)
            if run.returncode != 0:
                raise TunerError(
                    f"{self.script} --help failed with status {run.returncode}",
                    detail=process.tail(run.stderr),
                )
            self._era = detect_era(run.stdout)
        return self._era

    @functools.cached_property
    def key_form(self) -> str:
        """How this build's perfRunner spells a key (eras.build_key_form)."""
        return eras.build_key_form(self.script.parent, self.era)

    def line(self, problem: Problem) -> str:
        """A problem's config line as this build canonicalizes it (eras.tool_vector)."""
        return eras.tool_vector(problem, self.key_form)

    # -- tuning ---------------------------------------------------------------------------

    def tune(self, problem: Problem, ctx: TuneContext) -> TuneOutcome:
        """tuningRunner.py over the session's space; exactly ctx.perf_configs when set (a
        search's round, a `list:` session's list) through the build's tools (chosen.py). A
        build that cannot measure them refuses a search's round (Unsupported) and runs a
        `list:` session's tool `quick` space, as it always did."""
        era = self.era
        self._check_context(ctx, era)
        if ctx.perf_configs is not None:
            why = self.chosen.lack(problem)
            if why is None:
                return self.chosen.measure(problem, self.line(problem), ctx, self._pinned_env(ctx))
            if not ctx.tuning_space.startswith("list:"):
                raise Unsupported(eras.lacks_chosen(why, era))
        with tempfile.TemporaryDirectory(prefix=machine.temp_prefix("rocmlir")) as tmp:
            out = Path(tmp) / "tuning.tsv"
            write_module(out, problem)
            argv = self.command(problem, ctx, out)
            run = self._run(argv, self._env(ctx, era), ctx.timeout_s, self._cwd(problem, out))
            return read_outcome(problem, ctx, out, run, self.two_stage(ctx))

    def search_space(self, problem: Problem, ctx: TuneContext) -> list[str]:
        """Every perf config of the session's space for `problem`: a `list:` session's list,
        else what the build's rocmlir-gen lists for that space (--emit-tuning-space)."""
        if ctx.tuning_space.startswith("list:"):
            if ctx.perf_configs is None:
                raise TunerError("a list: tuning space needs the quick list's perf configs")
            return list(dict.fromkeys(ctx.perf_configs))
        return self.chosen.space(problem, self.line(problem), ctx, tool_space(ctx))

    @functools.cached_property
    def chosen(self) -> chosen.Chosen:
        """The build's rocmlir-gen and rocmlir-tuning-driver, for chosen perf configs."""
        return chosen.Chosen(
            self.build_dir, self.script.parent, self.python, self._tool_env(), self.kill_grace_s
        )

    def _pinned_env(self, ctx: TuneContext) -> dict[str, str]:
        """The tools' environment with the GPU pinned: the driver benchmarks on HIP device 0,
        which is this worker's GPU where the worker pinned it and is made so here otherwise."""
        env = self._tool_env()
        if not (env.get("ROCR_VISIBLE_DEVICES") or env.get("HIP_VISIBLE_DEVICES")):
            env["ROCR_VISIBLE_DEVICES"] = str(ctx.gpu_id)
        return env

    def command(
        self,
        problem: Problem,
        ctx: TuneContext,
        out: Path,
        *,
        batch: bool = False,
        benchmark: bool = False,
    ) -> list[str]:
        """The argument list for one config, or with `batch` for a list of configs of the
        problem's op read from stdin (`-c -`); with `benchmark`, for --benchmark-artifacts
        (the caller adds it). Values are joined with `=` so that a config that starts with `-`
        (every gemm one) and `--device=0` are never taken for flags."""
        era = self.era
        argv = [
            *self._base_argv(problem, ctx, out, batch=batch),
            f"--output={out}",
            "--debug",
        ]
        if problem.op == "attention" and "--verify-mode" in era.flags:
            argv.append("--verify-mode=none")  # see the package docstring (E4 has no such flag)
        if not era.has(GPUS):  # E2's way: the environment pins the GPU
            argv += ["--tflops", "--rocmlir_gen_flags=--device=0"]
        else:
            argv.append(f"--gpus={ctx.gpu_id}")
        argv += eras.setting_flags(ctx, era)
        if "--timeout" in era.flags and ctx.timeout_s:
            argv.append(f"--timeout={max(1, math.floor(ctx.timeout_s * TOOL_TIMEOUT_FRACTION))}")
        if "--abort-on-error" in era.flags and not batch:  # a batch goes on past a failure
            argv.append("--abort-on-error")
        if self.two_stage(ctx, benchmark=benchmark):
            argv.append(f"--two-stage-topk={ctx.topk}")
        if benchmark:  # the target the bundle was compiled for, as at compile time
            argv += target_flags(ctx)
        return argv

    def _base_argv(
        self, problem: Problem, ctx: TuneContext, out: Path, *, batch: bool = False
    ) -> list[str]:
        """The tool, the op, the config (with `batch`: a list on stdin) and the space: what
        every mode's command starts with."""
        if batch:
            config = "--configs-file=-"
        elif not isinstance(problem, FusionProblem):
            config = f"--config={self.line(problem)}"
        else:  # the directory holding only this job's module (E2 spells it --test_dir)
            flag = "--test-dir" if "--test-dir" in self.era.flags else "--test_dir"
            config = f"{flag}={module_path(out, problem).parent}"
        return [
            self.python,
            str(self.script),
            f"--op={problem.op}",
            config,
            f"--tuning-space={tool_space(ctx)}",
            f"--mlir-build-dir={self.build_dir}",
        ]

    # -- two-stage jobs (E4): compile here, benchmark on a GPU host -----------------------

    def check_split(self) -> None:
        """Unsupported unless this build's tuningRunner can split compiling and benchmarking."""
        if not eras.can_split(self.era):
            raise Unsupported(eras.lacks_split(self.script, self.era))

    def compile(self, problem: Problem, ctx: TuneContext, dest: Path) -> Compiled:
        """`--compile-only DEST` for the session's target (no GPU here): the bundle directory
        and the commit that built it. The target comes from the context, i.e. the session."""
        self.check_split()
        refuse_search(ctx)
        eras.check_space(ctx, self.era)
        if isinstance(problem, FusionProblem):
            module = module_path(dest.parent / "tuning.tsv", problem)
            module.parent.mkdir(exist_ok=True)
            module.write_text(problem.module_text, encoding="utf-8")
        argv = [
            *self._base_argv(problem, ctx, dest.parent / "tuning.tsv"),
            f"--compile-only={dest}",
            *target_flags(ctx),
        ]
        cwd = self._cwd(problem, dest.parent / "tuning.tsv")
        run = self._run(argv, self._tool_env(), ctx.timeout_s, cwd)
        if run.returncode != 0:
            raise failure(run)
        commits = index_commits(dest)
        if len(commits) != 1:
            raise TunerError(f"{dest / INDEX}: expected one commitId, found {sorted(commits)}")
        return Compiled(dest, commits.pop(), process.stderr_block(run.stderr))

    def compile_many(
        self, problems: Sequence[Problem], ctx: TuneContext, dest: Path
    ) -> list[Compiled | None]:
        """One `--compile-only` call for several problems of one op (`-c -`, the configs on
        stdin), its directory split into one bundle directory per problem (`dest`-0, -1, ...).
        E4 compiles problem by problem: one that fails is discarded (no folder, no index
        entry), the others stay and the call exits 1. So a failed call still hands out what it
        compiled; None for a problem its index lacks (the caller compiles those alone, and a
        failure there is that problem's own); TunerError only when it wrote no index at all."""
        self.check_split()
        refuse_search(ctx)
        eras.check_space(ctx, self.era)
        ops = {p.op for p in problems}
        if len(ops) != 1 or not all(self.batchable(p) for p in problems):
            raise TunerError(f"compile_many: one batchable op per call, not {sorted(ops)}")
        whole = dest.parent / f"{dest.name}-all"
        argv = [
            *self._base_argv(problems[0], ctx, dest.parent / "tuning.tsv", batch=True),
            f"--compile-only={whole}",
            *target_flags(ctx),
        ]
        configs = "".join(f"{self.line(p)}\n" for p in problems)
        timeout = ctx.timeout_s * len(problems) if ctx.timeout_s else None
        env = self._tool_env()
        run = process.run(argv, self.build_dir, env, timeout, self.kill_grace_s, configs)
        if run.returncode != 0 and not (whole / INDEX).is_file():
            raise failure(run)
        dests = [dest.parent / f"{dest.name}-{i}" for i in range(len(problems))]
        found = split_artifacts(whole, [self.line(p) for p in problems], dests)
        out: list[Compiled | None] = []
        for directory, ok in zip(dests, found, strict=True):
            commits = index_commits(directory) if ok else set()
            if len(commits) != 1:
                out.append(None)
                continue
            out.append(Compiled(directory, commits.pop(), process.stderr_block(run.stderr)))
        return out

    def benchmark(self, problem: Problem, ctx: TuneContext, artifacts: Path) -> TuneOutcome:
        """`--benchmark-artifacts ARTIFACTS` on this worker's GPU, with the same flags (session
        settings, top-k, timeouts) and the same reading of the output as a one-stage run."""
        era = self.era
        self.check_split()
        refuse_search(ctx)
        self._check_context(ctx, era)
        with tempfile.TemporaryDirectory(prefix=machine.temp_prefix("rocmlir")) as tmp:
            out = Path(tmp) / "tuning.tsv"
            write_module(out, problem)
            argv = self.command(problem, ctx, out, benchmark=True)
            argv.append(f"--benchmark-artifacts={artifacts}")
            run = self._run(argv, self._env(ctx, era), ctx.timeout_s, self._cwd(problem, out))
            if run.returncode != 0 and commit_refused(run.stderr):
                why = process.last_error_line(run.stderr)
                raise Unsupported(f"tuningRunner refused the bundle: {why}")
            return read_outcome(problem, ctx, out, run, self.two_stage(ctx, benchmark=True))

    def benchmark_many(
        self, problems: Sequence[Problem], ctx: TuneContext, artifacts: Path
    ) -> Iterator[BatchItem]:
        """Several problems' bundles, merged into `artifacts` (merge_artifacts), benchmarked in
        one `--benchmark-artifacts` call: each outcome as its row appears (as tune_many)."""
        self.check_split()
        refuse_search(ctx)
        extra = (f"--benchmark-artifacts={artifacts}",)
        for index, got in self.tune_many(problems, ctx, extra, benchmark=True):
            if isinstance(got, TunerError) and commit_refused(f"{got}\n{got.detail or ''}"):
                why = process.last_error_line(got.detail or str(got))
                raise Unsupported(f"tuningRunner refused the bundles: {why}")
            yield index, got

    # -- the benchmark stream (a proposed extension: stream.py) ---------------------------

    def can_stream(self) -> bool:
        """Whether this build's tuningRunner offers --benchmark-stream (read from --help)."""
        return eras.can_stream(self.era)

    def streamable(self, problem: Problem) -> bool:
        return problem.op in stream.STREAM_OPS and self.can_stream()

    def open_stream(self, ctx: TuneContext) -> stream.Stream:
        """Start `--benchmark-stream` on this worker's GPU with the flags a
        `--benchmark-artifacts` call gets (session settings, top-k, per-config timeout): the
        process pays its start-up once and then benchmarks what it is fed."""
        era = self.era
        self.check_split()
        refuse_search(ctx)
        self._check_context(ctx, era)
        argv = [
            self.python,
            str(self.script),
            stream.STREAM_FLAG,
            f"--tuning-space={tool_space(ctx)}",
            f"--mlir-build-dir={self.build_dir}",
            "--debug",
            f"--gpus={ctx.gpu_id}",
            *eras.setting_flags(ctx, era),
            *target_flags(ctx),
        ]
        if "--timeout" in era.flags and ctx.timeout_s:
            argv.append(f"--timeout={max(1, math.floor(ctx.timeout_s * TOOL_TIMEOUT_FRACTION))}")
        env = self._env(ctx, era)
        # A stream is benchmark mode: one pass, nothing re-measured (as --benchmark-artifacts).
        remeasured = self.two_stage(ctx, benchmark=True)
        return stream.Stream(
            argv, self.build_dir, env, ctx, remeasured, self.kill_grace_s, self.key_form
        )

    def two_stage(self, ctx: TuneContext, *, benchmark: bool = False) -> bool:
        """Whether the tool re-measures the top k itself (E4's --two-stage-topk). Never in a
        --benchmark-artifacts call: E4 benchmarks a bundle in one pass at the precise budget
        and ignores --two-stage-topk there, so nothing is marked re-measured."""
        return ctx.topk > 1 and self.era.has(TOPK) and not benchmark

    def _check_context(self, ctx: TuneContext, era: Era) -> None:
        if ctx.gpu_id < 0:
            raise TunerError("the rocmlir tuner needs a GPU; this worker has none (gpu_id -1)")
        eras.check_space(ctx, era)

    def _env(self, ctx: TuneContext, era: Era) -> dict[str, str]:
        env = self._tool_env()
        pinned = env.get("ROCR_VISIBLE_DEVICES") or env.get("HIP_VISIBLE_DEVICES")
        if not era.has(GPUS) and not pinned:
            env["ROCR_VISIBLE_DEVICES"] = str(ctx.gpu_id)
        return env

    def _tool_env(self) -> dict[str, str]:
        """The tool's allowlisted environment, GIT_DIR naming the build's source checkout: the
        tool writes `git rev-parse HEAD` as commitId (E3: of its working directory, E4: of its
        script's directory), and a build dir inside another repository (a pipeline's) would
        answer with that repository's commit."""
        env = process.scrubbed_env()
        if self._git_dir:
            env["GIT_DIR"] = self._git_dir
        return env

    def _run(
        self, argv: list[str], env: dict[str, str], timeout: float | None, cwd: Path | None = None
    ) -> process.Run:
        """The tool in the build directory, or in `cwd` (a fusion call's private directory),
        where it still reports the build's commit (GIT_DIR in `env`, _env)."""
        return process.run(argv, cwd or self.build_dir, env, timeout, self.kill_grace_s)

    def _cwd(self, problem: Problem, out: Path) -> Path | None:
        """A fusion call's working directory: the job's own temporary directory, since the tool
        writes `fusion_config_file` into its working directory (a shared one would collide
        between concurrent jobs); None (the build directory) for every other op."""
        return out.parent if isinstance(problem, FusionProblem) else None

    @functools.cached_property
    def _git_dir(self) -> str | None:
        """The git directory of the rocMLIR checkout the build was built from (its
        CMakeCache.txt's source), None where there is none to name (the stand-in)."""
        return machine.build_commit(self.build_dir).git_dir

    # -- a batch: one tool call for several configs (E3, E4) ------------------------------

    def can_batch(self) -> bool:
        """Whether this build tunes a list of configs in one call, writing each config's row
        as it finishes (E3, E4; E2 writes its file only at the end)."""
        return eras.can_batch(self.era)

    def batchable(self, problem: Problem) -> bool:
        """Whether this problem can be one config of a batch (fusion: a module file per call)."""
        return problem.op in batch.BATCH_OPS and self.can_batch()

    def tune_many(
        self,
        problems: Sequence[Problem],
        ctx: TuneContext,
        extra: Sequence[str] = (),
        *,
        benchmark: bool = False,
    ) -> Iterator[BatchItem]:
        """Tune problems of one op in one tool call (`-c -`, the configs on stdin): yields
        (index, outcome or error) for each problem as its row and `.debug` rows appear, while
        the tool runs. Each config keeps the per-config `--timeout`; the call as a whole may run
        `ctx.timeout_s` per config. A config the tool failed (`.state`) gets its error; when the
        tool stops early (killed, crashed, timed out), the config it was on gets the failure and
        the ones it never started a NotRun error: nothing is wrong with them. `extra`: flags
        added to the call (benchmark_many's --benchmark-artifacts, with `benchmark`)."""
        era = self.era
        self._check_context(ctx, era)
        ops = {p.op for p in problems}
        if len(ops) != 1 or not all(self.batchable(p) for p in problems):
            raise TunerError(f"tune_many: one batchable op per call, not {sorted(ops)}")
        if not benchmark and ctx.perf_configs is not None and not self.chosen.lack(problems[0]):
            # Chosen configs are timed one problem at a time, each with its own list (a `list:`
            # session's lists are per data type; the call's ctx holds the first problem's).
            why = "chosen perf configs are measured one problem at a time"
            yield from ((i, BatchRefused(why)) for i in range(len(problems)))
            return
        total = ctx.timeout_s * len(problems) if ctx.timeout_s else None
        with tempfile.TemporaryDirectory(prefix=machine.temp_prefix("rocmlir")) as tmp:
            out = Path(tmp) / "tuning.tsv"
            argv = [*self.command(problems[0], ctx, out, batch=True, benchmark=benchmark)]
            argv += extra
            configs = "".join(f"{self.line(p)}\n" for p in problems)
            start = process.now()
            # Only a driver that re-measures the top k prints Discarded (the candidates left
            # out of it); its lines are matched to each config's rows.
            driver = era.has(TOPK)
            env = self._env(ctx, era)
            proc, stdout, stderr = process.start(argv, self.build_dir, env, configs, driver)
            tail = batch.BatchTail(out, problems, stderr.driver)
            try:
                yield from batch.follow(
                    proc, tail, ctx, (stdout, stderr), start, total,
                    two_stage=self.two_stage(ctx, benchmark=benchmark),
                    kill_grace_s=self.kill_grace_s,
                )  # fmt: skip
                stdout.join(self.kill_grace_s)
                stderr.join(self.kill_grace_s)
            finally:
                if proc.poll() is None:  # stopped early: the caller gave up, or an alarm
                    process.stop(proc, (stdout, stderr), self.kill_grace_s)
            run = process.Run(proc.returncode, stdout.text(), stderr.text(), start, process.now())
            yield from batch.unfinished(tail, run, out)


def refuse_search(ctx: TuneContext) -> None:
    """Unsupported for a search's chosen configs in a two-stage job: `--compile-only` bundles
    every config of the --tuning-space and `--benchmark-artifacts` times every config a bundle
    holds (neither takes a list). A `list:` session's bundle stays the tool's quick space."""
    if ctx.perf_configs is not None and not ctx.tuning_space.startswith("list:"):
        raise Unsupported(
            "a search's chosen perf configs cannot be split into compile and benchmark jobs: "
            "tuningRunner's --compile-only bundles the whole tuning space"
        )


def target_flags(ctx: TuneContext) -> list[str]:
    """The session's GPU as E4's cross-compilation target, given alike to --compile-only and
    --benchmark-artifacts: the benchmark call checks the bundle's index (arch, numCUs,
    numChiplets, tuningSpace) against what it resolves, and without --target-arch it resolves
    HIP's full arch name and refuses a bundle compiled for another spelling. The full
    gcnArchName, as rocmlirTriton's --target-arch help asks for."""
    return [
        f"--target-arch={ctx.arch_full or ctx.arch}",
        f"--target-num-cu={ctx.num_cu}",
        f"--target-num-chiplets={ctx.num_chiplets}",
    ]


if TYPE_CHECKING:
    # mypy proves RocmlirTuner is everything the worker finds by isinstance.
    _STREAMING: type[StreamingTuner] = RocmlirTuner
    _SEARCHABLE: type[SearchableTuner] = RocmlirTuner
