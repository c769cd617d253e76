"""The rocmlir tuner: runs rocMLIR's own `bin/tuningRunner.py` on one problem, on one GPU.

One subprocess per job, as an argument list (never a shell: config strings are data), in a new
session so that a timeout kills the whole pipeline it starts (rocmlir-gen | rocmlir-tuning-driver,
verification). Results are read from the files the tool writes into a fresh temporary directory,
never scraped from stdout: the result row (`--output`, read with mlirtuna.tuningdb) and the
per-candidate `.debug` file (`--debug`). A fresh directory also keeps E3 from skipping the config
as "already tuned" (it reads the existing output file) or as failed earlier (its `.state` file).

Two eras of tuningRunner.py are in use and take different flags (reference: rocmlir-interfaces
§1, §5). The era is read once from `--help`:

- E2 (late 2023 to 2025, what MITuna drives): `--tflops` makes it write TFlops; the GPU is
  chosen through the environment. Its `--rocmlir_gen_flags=--device=N` only reaches rocmlir-gen
  (the generated host code, i.e. verification); rocmlir-tuning-driver has no device option and
  benchmarks on HIP device 0. So the worker pins the GPU with ROCR_VISIBLE_DEVICES and we pass
  `--device=0`, the pinned GPU's index inside the process. (MITuna passed `--device=<gpu>`
  without pinning: its tuning loops all ran on GPU 0.) If nothing pins it, we set
  ROCR_VISIBLE_DEVICES=<gpu_id> ourselves, since E2 has no other way to choose the GPU.
- E3 (2026): it ignores ROCR_VISIBLE_DEVICES/HIP_VISIBLE_DEVICES (it overwrites them with a
  warning) and takes physical GPU ids (rocm-smi card numbers) in `--gpus`. So we pass
  `--gpus <ctx.gpu_id>`, the physical id the worker was given, not 0: `--gpus 0` would tune on
  card 0 whatever the worker pinned. It also gets a per-config `--timeout` and
  `--abort-on-error` (with one config it only makes failure explicit).

Fusion modules travel in the database: the module is written into the job's temporary directory
under its file name and tuned with `--op fusion --config FILE.mlir` (E3 and later), or, for E2,
which only reads fusion tests from a directory, `--test_dir` naming a directory holding just that
module. The result row is keyed by the module's tuning key.

E2.5 (rocMLIR, late 2025) is driven as E2 (its flags are E2's plus the greedy space); it writes a
`# commit:` line per run and a failed config as a `### ` line, which becomes the job's error.
E4 (rocmlirTriton's "rocmlirTriton tuning runner", parts being ported back to rocMLIR) is driven
as E3, plus the session settings that change its results: `--rep`, `--warmup`,
`--gpu-run-timeout`, `--lfbo-effort`. Its driver's exit status 3 is recorded by the tool as
state `gpu_timed_out` in `<output>.state`: the job's error then says "GPU run timed out". A
candidate the driver printed as `Discarded` is invalid with that reason. E4 writes keys with
`-supportsSplitK`: they are matched to the problem by their plain part (mlirtuna.keys).

Noise (issue 17). Where the tool has E4's `--two-stage-topk` (rocmlirTriton's tuningRunner, and
rocMLIR once PRs #2407/#2464 land), we pass `--two-stage-topk=<session topk>`: it benchmarks every
candidate at a coarse budget, then the K fastest again at the precise budget, and picks the
winner from those; their candidates are recorded as `remeasured`. E2 and E3 have no such flag;
re-running chosen perf configs there would mean rebuilding the rocmlir-gen command line for
`rocmlir-gen --perf_config=X | rocmlir-tuning-driver` (perfRunner's job), which we do not do, so
their winner is the tool's single-pass choice. E3's `.debug` has each candidate's measurements
(`MeasurementsMs`); they become the candidate's statistics (median, min, IQR, count), and with
them the winner's margin over the runner-up and its noise. E2 records no spread.

Batches (`worker --batch K`, E3 and E4): `tune_many` tunes several problems of one op in one
call, the configs on stdin (`-c -`), and yields each problem's outcome as its row and `.debug`
rows appear (_BatchTail), reading them with the same functions as one call per problem. Which of
a config's candidates E4's driver Discarded is read from that config's own driver lines in the
batch's stderr, never from another config's (_driver_segment); each file and stderr is read once,
as it grows (a poll costs what the tool wrote since the last one).

Attention is tuned with `--verify-mode none`, as MITuna and rocMLIR's weekly CI do: there is no
GPU verifier for attention (E3 falls back to a slow CPU reference with relaxed thresholds), and
an E2 verification failure exits 0 having written nothing.
"""

from __future__ import annotations

import collections
import contextlib
import csv
import dataclasses
import datetime as dt
import json
import math
import os
import re
import shutil
import signal
import subprocess
import tempfile
import threading
import time
from collections.abc import Iterable, Iterator, Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import IO

from mlirtuna import keys, stats
from mlirtuna.errors import (
    InputError,
    NotRun,
    TunerError,
    TunerTimeout,
    Unsupported,
    UserError,
)
from mlirtuna.history import tuningdb
from mlirtuna.problems import Problem
from mlirtuna.problems.fusion import parse_key
from mlirtuna.tuners.base import Candidate, Compiled, TuneContext, TuneOutcome

BUILD_DIR_ENV = "MLIRTUNA_ROCMLIR_BUILD"
PYTHON_ENV = "MLIRTUNA_ROCMLIR_PYTHON"
STDERR_TAIL_LINES = 40
# A tool's output is read as it comes and only its tail kept: a tool printing gigabytes (a
# runaway log, a crash loop) costs a bounded amount of worker memory, never the worker.
STDOUT_KEEP_BYTES = 1 << 20  # --help and the banner lines are far smaller
STDERR_KEEP_BYTES = 256 << 10
# Environment variables a tool never gets: the database URL and password reach only mlirtuna.
SECRET_ENV = ("MLIRTUNA_DB", "MLIRTUNA_DB_PASSWORD", "PGPASSWORD", "MYSQL_PWD")
HELP_TIMEOUT_S = 120.0
# The tool's own per-config --timeout fires first, so it can stop its pipeline and say so;
# our kill of the whole process group at ctx.timeout_s is the backstop.
TOOL_TIMEOUT_FRACTION = 0.9

_FLAG_RE = re.compile(r"(?<![\w-])--[A-Za-z][\w-]*")
_SPACES_RE = re.compile(r"--tuning-space\s*\{([^}]*)\}")
_TIMED_OUT_RE = re.compile(r"Tuning timed out after")
# One line of rocmlir-tuning-driver's output as E4 logs it with --debug: "<perfConfig>\tDiscarded".
# (?<!\S): a match starts only where a word does; without it every position inside a long perf
# config is tried again, quadratic in its length (0.3 s for a batch's stderr).
_DISCARDED_RE = re.compile(r"(?<!\S)(\S+)\tDiscarded\s*$", re.MULTILINE)
# Any such line, "<perfConfig>\t<ns|N/A|Discarded>" (read from a batch's stderr as it arrives).
_DRIVER_RE = re.compile(
    rb"(?<!\S)(\S+)\t(Discarded|N/A|[-+0-9.eE]+|nan|inf)[ \t\r]*$", re.MULTILINE
)
# How long a batch's ready row waits for its driver lines on stderr (a pipe lags the files).
DRIVER_LINES_GRACE_S = 1.0
GPU_TIMED_OUT = "gpu_timed_out"
# Session settings -> (E4 flag, TuneContext field).
E4_SETTINGS = (
    ("--rep", "rep_ms"),
    ("--warmup", "warmup_ms"),
    ("--gpu-run-timeout", "gpu_run_timeout_s"),
    ("--lfbo-effort", "lfbo_effort"),
)
# Eras driven like E2 (device through the environment, --tflops) and like E3 (--gpus).
E2_LIKE = ("E2", "E2.5")
# What a build needs for two-stage jobs (E4, rocmlir-newest.md §2).
SPLIT_FLAGS = ("--compile-only", "--benchmark-artifacts", "--target-arch")
INDEX = "index.json"  # a --compile-only directory's table of contents
# What the tool says when it refuses a bundle of another commit (no retry can help).
_COMMIT_MISMATCH_RE = re.compile(r"commit.*mismatch|mismatch.*commit", re.IGNORECASE)
# Batches (`-c -`): eras that write each config's row as it finishes, and ops whose configs are
# config-list lines (fusion is a module file per call).
BATCH_ERAS = ("E3", "E4")
BATCH_OPS = ("conv", "gemm", "attention", "gemm_gemm", "conv_gemm")
BATCH_POLL_S = 0.05  # how often a batch's output files are looked at while the tool runs
# .debug columns that describe the candidate, not the problem: the rest tell blocks apart.
_CANDIDATE_COLUMNS = ("PerfConfig", "TFlops", "MeasurementsMs", "LDSBankConflict")


@dataclass(frozen=True)
class Era:
    """What one tuningRunner.py accepts, as read from its --help."""

    name: str  # E2 | E2.5 | E3 | E4
    flags: frozenset[str]
    tuning_spaces: tuple[str, ...]


@dataclass(frozen=True)
class _Run:
    returncode: int
    stdout: str
    stderr: str
    start: dt.datetime
    end: dt.datetime


def detect_era(help_text: str) -> Era:
    """E4 if it is rocmlirTriton's runner (its prog name, or --gpu-run-timeout); E3 if it has
    --gpus; E2.5 if it has E2's flags and the greedy space; E2 if --rocmlir_gen_flags or
    --tflops but no --gpus."""
    flags = frozenset(_FLAG_RE.findall(help_text))
    match = _SPACES_RE.search(help_text)
    spaces = tuple(s.strip() for s in match.group(1).split(",")) if match else ()
    if "rocmlirTriton" in help_text or "--gpu-run-timeout" in flags:
        return Era("E4", flags, spaces)
    if "--gpus" in flags:
        return Era("E3", flags, spaces)
    if "--rocmlir_gen_flags" in flags or "--tflops" in flags:
        return Era("E2.5" if "greedy" in spaces else "E2", flags, spaces)
    raise TunerError(
        "tuningRunner.py --help shows no known era's flags (E2, E2.5, E3, E4)", detail=help_text
    )


def build_key_form(build_dir: Path, era: Era) -> str:
    """The key form the build's perfRunner reads: split-k where its perfRunner.py knows
    -supportsSplitK (or, without one to read, for E4, whose keys carry it), else plain."""
    perf_runner = build_dir / "bin" / "perfRunner.py"
    if perf_runner.is_file():
        text = perf_runner.read_text(encoding="utf-8", errors="replace")
        return keys.SPLIT_K if keys.SPLIT_K_FLAG in text else keys.PLAIN
    return keys.SPLIT_K if era.name == "E4" else keys.PLAIN


def setting_flags(ctx: TuneContext, era: Era) -> list[str]:
    """The session settings as flags; TunerError for one this era lacks (never dropped)."""
    argv = []
    for flag, name in E4_SETTINGS:
        value = getattr(ctx, name)
        if value is None:
            continue
        if flag not in era.flags:
            raise TunerError(f"this tuningRunner.py ({era.name}) has no {flag} (session setting)")
        argv.append(f"{flag}={value}")
    return argv


def can_split(era: Era) -> bool:
    """Whether this tuningRunner can compile on one host and benchmark on another."""
    return all(flag in era.flags for flag in SPLIT_FLAGS)


def read_index(directory: Path) -> dict:
    """A --compile-only directory's index.json; TunerError when it is missing or unreadable."""
    path = directory / INDEX
    try:
        index = json.loads(path.read_text(encoding="utf-8"))
        problems = index["problems"]
        if not isinstance(problems, dict):
            raise TypeError("problems is not an object")
    except (OSError, ValueError, KeyError, TypeError) as e:
        raise TunerError(f"{path}: not a tuningRunner --compile-only index: {e}") from None
    return index


def index_commits(directory: Path) -> set[str]:
    """The rocMLIR commits that compiled the problems of a --compile-only directory."""
    return {str(p.get("commitId", "")) for p in read_index(directory)["problems"].values()}


# What every bundle of one --benchmark-artifacts call must share: they were compiled for the
# same target, space and flags (their problem hashes are computed from these).
_INDEX_HEADER = ("arch", "numCUs", "numChiplets", "tuningSpace", "rocmlirGenFlags")


def merge_artifacts(sources: list[Path], dest: Path) -> None:
    """Several --compile-only directories moved into one, whose index.json lists every problem:
    one --benchmark-artifacts call then benchmarks them all (one tool start-up, not K)."""
    indexes = [read_index(src) for src in sources]
    header = {k: indexes[0].get(k) for k in _INDEX_HEADER}
    for src, index in zip(sources, indexes, strict=True):
        other = {k: index.get(k) for k in _INDEX_HEADER}
        if other != header:
            raise TunerError(f"{src / INDEX} was compiled for {other}, not {header}")
    (dest / "problems").mkdir(parents=True, exist_ok=True)
    merged = {**header, "lastRunId": max(i.get("lastRunId", 0) for i in indexes), "problems": {}}
    for src, index in zip(sources, indexes, strict=True):
        for digest, entry in index["problems"].items():
            shutil.move(src / "problems" / digest, dest / "problems" / digest)
            merged["problems"][digest] = entry
    (dest / INDEX).write_text(json.dumps(merged, indent=2), encoding="utf-8")


def tool_space(ctx: TuneContext) -> str:
    """The --tuning-space tuningRunner.py gets. A `list:NAME` session runs the tool's `quick`
    space: rocMLIR compiles its quick list in (QuickTuningPerfconfigs.inc), so a list becomes
    rocMLIR's own by writing it with `quick-list --format inc` into the source and rebuilding."""
    return "quick" if ctx.tuning_space.startswith("list:") else ctx.tuning_space


class RocmlirTuner:
    """Tunes with rocMLIR's tuningRunner.py from a build dir (arg, or $MLIRTUNA_ROCMLIR_BUILD)."""

    name = "rocmlir"

    def __init__(
        self, build_dir: str | None = None, *, python: str | None = None, kill_grace_s: float = 5.0
    ) -> None:
        build = build_dir or os.environ.get(BUILD_DIR_ENV)
        if not build:
            raise UserError(
                f"no rocMLIR build dir: pass --mlir-build-dir DIR or set {BUILD_DIR_ENV}"
            )
        self.build_dir = Path(build).resolve()
        self.script = self.build_dir / "bin" / "tuningRunner.py"
        if not self.script.is_file():
            raise UserError(
                f"{self.script} not found: point --mlir-build-dir or {BUILD_DIR_ENV} "
                "at a rocMLIR build directory"
            )
        # The real script needs numpy/pandas/tqdm from the ROCm image's python, which is not
        # necessarily the one running mlirtuna; MITuna runs `python3` too.
        self.python = python or os.environ.get(PYTHON_ENV) or "python3"
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
            run = self._run(
                [self.python, str(self.script), "--help"], scrubbed_env(), HELP_TIMEOUT_S
            )
            if run.returncode != 0:
                raise TunerError(
                    f"{self.script} --help failed with status {run.returncode}",
                    detail=_tail(run.stderr),
                )
            self._era = detect_era(run.stdout)
        return self._era

    # -- tuning ---------------------------------------------------------------------------

    def tune(self, problem: Problem, ctx: TuneContext) -> TuneOutcome:
        era = self.era
        self._check_context(ctx, era)
        with tempfile.TemporaryDirectory(prefix="mlirtuna-rocmlir-") as tmp:
            out = Path(tmp) / "tuning.tsv"
            _write_module(out, problem)
            argv = self.command(problem, ctx, out)
            run = self._run(argv, self._env(ctx, era), ctx.timeout_s)
            return self._outcome(problem, ctx, out, run, self.two_stage(ctx))

    def command(
        self, problem: Problem, ctx: TuneContext, out: Path, *, batch: bool = False
    ) -> list[str]:
        """The argument list for one config, or with `batch` for a list of configs of the
        problem's op read from stdin (`-c -`). Values are joined with `=` so that a config that
        starts with `-` (every gemm one) and `--device=0` are never taken for flags."""
        era = self.era
        argv = [
            *self._base_argv(problem, ctx, out, batch=batch),
            f"--output={out}",
            "--debug",
        ]
        if problem.op == "attention":
            argv.append("--verify-mode=none")  # see the module docstring
        if era.name in E2_LIKE:
            argv += ["--tflops", "--rocmlir_gen_flags=--device=0"]
        else:
            argv.append(f"--gpus={ctx.gpu_id}")
        argv += setting_flags(ctx, era)
        if "--timeout" in era.flags and ctx.timeout_s:
            argv.append(f"--timeout={max(1, math.floor(ctx.timeout_s * TOOL_TIMEOUT_FRACTION))}")
        if "--abort-on-error" in era.flags and not batch:  # a batch goes on past a failure
            argv.append("--abort-on-error")
        if self.two_stage(ctx):
            argv.append(f"--two-stage-topk={ctx.topk}")
        return argv

    def _base_argv(
        self, problem: Problem, ctx: TuneContext, out: Path, *, batch: bool = False
    ) -> list[str]:
        """The tool, the op, the config (with `batch`: a list on stdin) and the space: what
        every mode's command starts with."""
        if batch:
            config = "--configs-file=-"
        elif problem.op != "fusion":
            config = f"--config={problem.canonical()}"
        elif self.era.name == "E2":  # E2 reads fusion modules from a directory only
            config = f"--test_dir={_module_path(out, problem).parent}"
        else:
            config = f"--config={_module_path(out, problem)}"
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
        if not can_split(self.era):
            raise Unsupported(
                f"{self.script} ({self.era.name}) has no --compile-only/--benchmark-artifacts: "
                "two-stage jobs need an E4 tuningRunner"
            )

    def compile(self, problem: Problem, ctx: TuneContext, dest: Path) -> Compiled:
        """`--compile-only DEST` for the session's target (no GPU here): the bundle directory
        and the commit that built it. The target comes from the context, i.e. the session."""
        self.check_split()
        self._check_space(ctx, self.era)
        if problem.op == "fusion":
            module = _module_path(dest.parent / "tuning.tsv", problem)
            module.parent.mkdir(exist_ok=True)
            module.write_text(problem.module_text, encoding="utf-8")
        argv = [
            *self._base_argv(problem, ctx, dest.parent / "tuning.tsv"),
            f"--compile-only={dest}",
            f"--target-arch={ctx.arch}",
            f"--target-num-cu={ctx.num_cu}",
            f"--target-num-chiplets={ctx.num_chiplets}",
        ]
        run = self._run(argv, scrubbed_env(), ctx.timeout_s)
        if run.returncode != 0:
            raise _failure(run)
        commits = index_commits(dest)
        if len(commits) != 1:
            raise TunerError(f"{dest / INDEX}: expected one commitId, found {sorted(commits)}")
        return Compiled(dest, commits.pop(), _stderr_block(run.stderr))

    def benchmark(self, problem: Problem, ctx: TuneContext, artifacts: Path) -> TuneOutcome:
        """`--benchmark-artifacts ARTIFACTS` on this worker's GPU, with the same flags (session
        settings, top-k, timeouts) and the same reading of the output as a one-stage run."""
        era = self.era
        self.check_split()
        self._check_context(ctx, era)
        with tempfile.TemporaryDirectory(prefix="mlirtuna-rocmlir-") as tmp:
            out = Path(tmp) / "tuning.tsv"
            _write_module(out, problem)
            argv = [*self.command(problem, ctx, out), f"--benchmark-artifacts={artifacts}"]
            run = self._run(argv, self._env(ctx, era), ctx.timeout_s)
            if run.returncode != 0 and _commit_refused(run.stderr):
                raise Unsupported(
                    f"tuningRunner refused the bundle: {_last_error_line(run.stderr)}"
                )
            return self._outcome(problem, ctx, out, run, self.two_stage(ctx))

    def benchmark_many(
        self, problems: Sequence[Problem], ctx: TuneContext, artifacts: Path
    ) -> Iterator[tuple[int, TuneOutcome | TunerError]]:
        """Several problems' bundles, merged into `artifacts` (merge_artifacts), benchmarked in
        one `--benchmark-artifacts` call: each outcome as its row appears (as tune_many)."""
        self.check_split()
        for index, got in self.tune_many(problems, ctx, (f"--benchmark-artifacts={artifacts}",)):
            if isinstance(got, TunerError) and _commit_refused(f"{got}\n{got.detail or ''}"):
                why = _last_error_line(got.detail or str(got))
                raise Unsupported(f"tuningRunner refused the bundles: {why}")
            yield index, got

    def two_stage(self, ctx: TuneContext) -> bool:
        """Whether the tool re-measures the top k itself (E4's --two-stage-topk)."""
        return ctx.topk > 1 and "--two-stage-topk" in self.era.flags

    def _check_context(self, ctx: TuneContext, era: Era) -> None:
        if ctx.gpu_id < 0:
            raise TunerError("the rocmlir tuner needs a GPU; this worker has none (gpu_id -1)")
        self._check_space(ctx, era)

    def _check_space(self, ctx: TuneContext, era: Era) -> None:
        if era.tuning_spaces and tool_space(ctx) not in era.tuning_spaces:
            raise Unsupported(  # the same for every job of the session: no retry
                f"this tuningRunner.py ({era.name}) has no tuning space {tool_space(ctx)!r} "
                f"(it has: {', '.join(era.tuning_spaces)})"
            )

    def _env(self, ctx: TuneContext, era: Era) -> dict[str, str]:
        env = scrubbed_env()
        pinned = env.get("ROCR_VISIBLE_DEVICES") or env.get("HIP_VISIBLE_DEVICES")
        if era.name in E2_LIKE and not pinned:
            env["ROCR_VISIBLE_DEVICES"] = str(ctx.gpu_id)
        return env

    # -- the subprocess -------------------------------------------------------------------

    def _start(
        self, argv: list[str], env: dict[str, str], stdin: str | None = None, driver: bool = False
    ) -> tuple[subprocess.Popen[bytes], _TailReader, _TailReader]:
        """Start the tool, its stdout and stderr read by threads; `stdin`: text fed to it;
        `driver`: keep stderr's driver lines (_TailReader)."""
        try:
            proc = subprocess.Popen(
                argv,
                cwd=self.build_dir,
                env=env,
                stdin=subprocess.DEVNULL if stdin is None else subprocess.PIPE,
                stdout=subprocess.PIPE,
                stderr=subprocess.PIPE,
                start_new_session=True,  # its own process group: a timeout kills all of it
            )
        except OSError as e:
            raise TunerError(f"cannot run {argv[0]} {argv[1]}: {e}") from e
        if proc.stdin is not None:
            # The tool reads all of stdin before it starts (load_configs_from_stdin); a few
            # configs fit in the pipe's buffer, so this write does not wait for the tool.
            with contextlib.suppress(BrokenPipeError), proc.stdin:
                proc.stdin.write((stdin or "").encode())
        return (
            proc,
            _TailReader(proc.stdout, STDOUT_KEEP_BYTES),
            _TailReader(proc.stderr, STDERR_KEEP_BYTES, driver),
        )

    def _run(self, argv: list[str], env: dict[str, str], timeout: float | None) -> _Run:
        start = _now()
        proc, out, err = self._start(argv, env)
        try:
            proc.wait(timeout=timeout)
            out.join(), err.join()
        except subprocess.TimeoutExpired:
            self._stop(proc, out, err)
            raise TunerTimeout(
                f"tuningRunner ran past the job timeout of {timeout:g} s; "
                "killed its whole process group",
                detail=_tail(err.text()),
            ) from None
        except BaseException:
            self._stop(proc, out, err)  # e.g. KeyboardInterrupt: never leave a pipeline behind
            raise
        return _Run(proc.returncode, out.text(), err.text(), start, _now())

    def _stop(self, proc: subprocess.Popen[bytes], *readers: _TailReader) -> None:
        """SIGTERM the process group, SIGKILL it after the grace period."""
        _signal_group(proc.pid, signal.SIGTERM)
        with contextlib.suppress(subprocess.TimeoutExpired):
            proc.wait(timeout=self.kill_grace_s)
        _signal_group(proc.pid, signal.SIGKILL)  # also children that outlived their parent
        proc.wait()
        for reader in readers:
            # Something outside the group may still hold a pipe; do not wait for it forever.
            reader.join(self.kill_grace_s)

    # -- reading what it wrote ------------------------------------------------------------

    def _outcome(
        self, problem: Problem, ctx: TuneContext, out: Path, run: _Run, two_stage: bool = False
    ) -> TuneOutcome:
        _check_written_errors(out, run)
        if run.returncode != 0:
            raise _failure(run, out)
        row, notes = _result_row(problem, out, run)
        debug = out.with_name(out.name + ".debug")
        debug_rows = read_debug_file(debug) if debug.is_file() else None
        output = _read_tail(out, STDOUT_KEEP_BYTES) + _stderr_block(run.stderr)
        return _row_outcome(problem, ctx, row, debug_rows, run, output, notes, two_stage)

    # -- a batch: one tool call for several configs (E3, E4) ------------------------------

    def can_batch(self) -> bool:
        """Whether this build tunes a list of configs in one call, writing each config's row
        as it finishes (E3, E4; E2 writes its file only at the end)."""
        return self.era.name in BATCH_ERAS

    def batchable(self, problem: Problem) -> bool:
        """Whether this problem can be one config of a batch (fusion: a module file per call)."""
        return problem.op in BATCH_OPS and self.can_batch()

    def tune_many(
        self, problems: Sequence[Problem], ctx: TuneContext, extra: Sequence[str] = ()
    ) -> Iterator[tuple[int, TuneOutcome | TunerError]]:
        """Tune problems of one op in one tool call (`-c -`, the configs on stdin): yields
        (index, outcome or error) for each problem as its row and `.debug` rows appear, while
        the tool runs. Each config keeps the per-config `--timeout`; the call as a whole may run
        `ctx.timeout_s` per config. A config the tool failed (`.state`) gets its error; when the
        tool stops early (killed, crashed, timed out), the config it was on gets the failure and
        the ones it never started a NotRun error: nothing is wrong with them. `extra`: flags
        added to the call (benchmark_many's --benchmark-artifacts)."""
        era = self.era
        self._check_context(ctx, era)
        ops = {p.op for p in problems}
        if len(ops) != 1 or not all(self.batchable(p) for p in problems):
            raise TunerError(f"tune_many: one batchable op per call, not {sorted(ops)}")
        total = ctx.timeout_s * len(problems) if ctx.timeout_s else None
        with tempfile.TemporaryDirectory(prefix="mlirtuna-rocmlir-") as tmp:
            out = Path(tmp) / "tuning.tsv"
            argv = [*self.command(problems[0], ctx, out, batch=True), *extra]
            configs = "".join(f"{p.canonical()}\n" for p in problems)
            start = _now()
            # Only E4's driver prints Discarded; its lines are matched to each config's rows.
            driver = era.name == "E4"
            proc, stdout, stderr = self._start(argv, self._env(ctx, era), configs, driver)
            tail = _BatchTail(out, problems, stderr.driver)
            try:
                yield from self._follow(proc, tail, ctx, (stdout, stderr), start, total)
                stdout.join(self.kill_grace_s), stderr.join(self.kill_grace_s)
            finally:
                if proc.poll() is None:  # stopped early: the caller gave up, or an alarm
                    self._stop(proc, stdout, stderr)
            run = _Run(proc.returncode, stdout.text(), stderr.text(), start, _now())
            yield from self._unfinished(tail, run, out)

    def _follow(
        self,
        proc: subprocess.Popen[bytes],
        tail: _BatchTail,
        ctx: TuneContext,
        readers: tuple[_TailReader, _TailReader],
        start: dt.datetime,
        total: float | None,
    ) -> Iterator[tuple[int, TuneOutcome | TunerError]]:
        """Yield each config's outcome while the tool runs; stop it past `total` seconds."""
        deadline = None if total is None else time.monotonic() + total
        stderr = readers[1]
        while True:
            exited = proc.poll() is not None
            if not exited and deadline is not None and time.monotonic() > deadline:
                self._stop(proc, *readers)
                tail.timed_out = total
                exited = True  # rows written before the stop still count
            if exited:
                stderr.join(self.kill_grace_s)  # every driver line read before the last rows
            ready = tail.poll(exited)
            run = _Run(0, "", stderr.text(), start, _now()) if ready else None
            for index, row, debug_rows, discarded in ready:
                try:
                    yield index, _row_outcome(
                        tail.problems[index], ctx, row, debug_rows, run, _row_text(row),
                        tail.notes(index), self.two_stage(ctx), discarded,
                    )  # fmt: skip
                except TunerError as exc:
                    yield index, exc
            if exited:
                return
            time.sleep(BATCH_POLL_S)

    def _unfinished(
        self, tail: _BatchTail, run: _Run, out: Path
    ) -> Iterator[tuple[int, TunerError]]:
        """The configs that got no row: the tool's own verdict from `.state`, else the failure
        for the first (it was running when the tool stopped), NotRun for the rest."""
        states = _config_states(out)
        blamed = False
        for index in tail.missing():
            problem = tail.problems[index]
            state = states.get(problem.canonical())
            if state is not None:
                yield index, _state_error(state, run)
            elif not blamed:
                blamed = True
                yield index, _batch_failure(run, out, tail.timed_out)
            else:
                yield (
                    index,
                    NotRun(
                        "the batch's tuningRunner stopped before it tuned this config",
                        detail=_tail(run.stderr),
                    ),
                )


# ---------------------------------------------------------------------------------------------
# Helpers (module level: pure functions of the files and the run)
# ---------------------------------------------------------------------------------------------


def _check_written_errors(out: Path, run: _Run) -> None:
    """E2.5 writes a failed config as a `### ` line (and may exit 0): that text is the error."""
    if not out.is_file():
        return
    try:
        errors = tuningdb.read_tuning_db(out).errors
    except InputError:
        return  # a malformed file is reported by _result_row, with its line
    if errors:
        raise TunerError(f"tuningRunner: {errors[-1].text}", detail=_tail(run.stderr))


def _failed_states(out: Path) -> set[str]:
    """The states E3/E4 recorded in `<output>.state` for the configs that failed."""
    path = out.with_name(out.name + ".state")
    try:
        data = json.loads(path.read_text(encoding="utf-8"))
        return {
            state
            for context in data.get("contexts", {}).values()
            for state in context.values()
            if isinstance(state, str)
        }
    except (OSError, ValueError, AttributeError):
        return set()


def _failure(run: _Run, out: Path | None = None) -> TunerError:
    if out is not None and GPU_TIMED_OUT in _failed_states(out):
        # E4: rocmlir-tuning-driver exited 3, the GPU run passed --gpu-run-timeout.
        return TunerError(
            "GPU run timed out (tuningRunner state gpu_timed_out, driver exit status 3)",
            detail=_tail(run.stderr),
        )
    if run.returncode < 0:
        what = f"was killed by signal {-run.returncode}"
    else:
        what = f"exited with status {run.returncode}"
    last = _last_error_line(run.stderr)
    message = f"tuningRunner {what}" + (f": {last}" if last else "")
    if _TIMED_OUT_RE.search(run.stderr):  # E3's own --timeout fired
        return TunerTimeout(message, detail=_tail(run.stderr))
    return TunerError(message, detail=_tail(run.stderr))


def _commit_refused(stderr: str) -> bool:
    """Whether the tool's error is a bundle of another commit (E4 without
    --allow-commit-mismatch)."""
    return bool(_COMMIT_MISMATCH_RE.search(_last_error_line(stderr)))


def _last_error_line(stderr: str) -> str:
    """The line that says what went wrong: E3's first "ERROR:" line (later ones only summarise),
    else the last line naming an error (a Python traceback ends with it), else the last line."""
    lines = [line.strip() for line in stderr.splitlines() if line.strip()]
    logged = [line for line in lines if line.startswith("ERROR:")]
    if logged:
        return logged[0]
    errors = [line for line in lines if "Error" in line or "ERROR" in line]
    return (errors or lines or [""])[-1]


def _result_row(problem: Problem, out: Path, run: _Run) -> tuple[tuningdb.TuningRow, list[str]]:
    """The tool's winner row (the last one written); raises TunerError if there is none."""
    no_result = TunerError(
        "tuningRunner exited 0 but wrote no result (E2 does this when verification fails)",
        detail=_tail(run.stderr),
    )
    if not out.is_file() or out.stat().st_size == 0:
        raise no_result
    try:
        rows = tuningdb.read_tuning_db(out).rows
    except InputError as e:
        raise TunerError(
            f"tuningRunner wrote a malformed result file: {e}",
            detail=_file_line(out, e.line) + _stderr_block(run.stderr),
        ) from None
    if not rows:
        raise no_result
    row, notes = rows[-1], []
    expected, written = problem.canonical(), keys.split_key(row.test_vector).plain
    if problem.op == "fusion":  # the row is keyed by the module's tuning key
        expected = problem.tuning_key
        with contextlib.suppress(InputError):
            written = parse_key(row.test_vector)[1]
    if written != expected:
        notes.append(
            f"tuningRunner recorded the config as {row.test_vector!r}; "
            f"mlirtuna's canonical form is {expected!r}"
        )
    return row, notes


def _row_outcome(
    problem: Problem,
    ctx: TuneContext,
    row: tuningdb.TuningRow,
    debug_rows: list[DebugRow] | None,
    run: _Run,
    output: str,
    notes: list[str],
    two_stage: bool,
    discarded: set[str] | None = None,
) -> TuneOutcome:
    """One config's outcome from its result row and its `.debug` rows (None: no .debug file).
    `discarded`: its perf configs the driver printed as Discarded; None: all of `run.stderr`
    is this config's (one call per config)."""
    _check_gpu(row, ctx)
    if not row.has_perf_config or not row.has_valid_tflops:
        raise TunerError(
            f"no valid perf config: tuningRunner reports perfConfig {row.perf_config} with "
            f"{row.tflops} TFlops for {row.test_vector!r}",
            detail=_tail(run.stderr),
        )
    flops = float(problem.flops())
    if debug_rows is not None:
        if discarded is None:
            discarded = set(_DISCARDED_RE.findall(run.stderr))
        candidates = _candidates(debug_rows, flops, discarded, two_stage)
    else:
        candidates = []
        notes.append("tuningRunner wrote no .debug file; only its winner is recorded")
    candidates, winner = _reconcile(candidates, row, flops, notes)
    start, end = _row_phase(row) or (run.start, run.end)
    return TuneOutcome(
        margin=_margin(winner, candidates),
        candidates=candidates,
        winner=winner,
        output=output,
        compile_start=start,  # neither era reports phases: compile and benchmark
        compile_end=end,  # are interleaved inside rocmlir-tuning-driver
        notes=notes,
    )


def _row_phase(row: tuningdb.TuningRow) -> tuple[dt.datetime, dt.datetime] | None:
    """When the tool tuned a batch's config: E3's row has its start and its duration."""
    if row.timestamp is None or row.duration_s is None:
        return None
    try:
        start = dt.datetime.strptime(row.timestamp, "%Y-%m-%dT%H:%M:%SZ").replace(tzinfo=dt.UTC)
    except ValueError:
        return None
    return start, start + dt.timedelta(seconds=row.duration_s)


def _row_text(row: tuningdb.TuningRow) -> str:
    """What a batch's job keeps as the tool's output: its own row."""
    fields = (row.arch, row.num_cu, row.num_chiplets, row.test_vector, row.perf_config)
    fields += (row.tflops, row.tuning_space, row.commit_id, row.timestamp, row.duration_s)
    return "\t".join("" if f is None else str(f) for f in fields) + "\n"


class _BatchTail:
    """Follows a batch's output and `.debug` files while the tool writes them.

    The tool tunes the configs one after the other and, for each, writes its result row and
    then its `.debug` rows (a failed config writes neither). So the k-th row's candidates are
    the k-th block of `.debug` rows, a block being a run of rows with the same problem columns;
    block k is complete once row k+1 was seen before the `.debug` file was read, a block k+1
    has begun, or the tool has exited. Rows are matched to problems by their key (the plain
    part: E4 appends -supportsSplitK). Each file is read from where the last poll stopped,
    whole lines only: a poll costs what the tool wrote since, not the file so far.

    `driver`: E4's driver lines from stderr, in order (_TailReader). Which candidates were
    Discarded is read from the lines of the block's own config: the first run of lines, after
    the previous block's, with the block's perf configs (_driver_segment). A failed config's
    lines (no row, no block) are skipped by that search: none of them has a time, while a
    block's measured candidates must have one.
    """

    def __init__(
        self,
        out: Path,
        problems: Sequence[Problem],
        driver: list[tuple[str, str]] | None = None,
    ) -> None:
        self.out, self.debug = out, out.with_name(out.name + ".debug")
        self.problems = problems
        self._index = {p.canonical(): i for i, p in enumerate(problems)}
        self._rows: list[tuple[int | None, tuningdb.TuningRow]] = []
        self._blocks: list[list[DebugRow]] = []
        self._offsets = {self.out: 0, self.debug: 0}
        self._out_lines: list[str] = []
        self._debug_header: str | None = None
        self._debug_lines = 0  # how many lines of .debug were parsed (for line numbers)
        self._next = 0  # the first row not yet handed out (they go in the tool's order)
        self._driver, self._driver_at = driver, 0
        self._waiting_since: float | None = None  # row _next is complete, its driver lines not
        self._notes: dict[int, list[str]] = {}
        self.done: set[int] = set()
        self.timed_out: float | None = None

    def poll(
        self, exited: bool
    ) -> list[tuple[int, tuningdb.TuningRow, list[DebugRow] | None, set[str]]]:
        """The rows now complete with their candidates and their Discarded perf configs, each
        once. `exited`: the tool had exited before this call (so everything it wrote is
        there)."""
        if new := self._new_lines(self.out):
            self._out_lines += new
            self._read_rows()
        if new := self._new_lines(self.debug):
            self._read_debug(new)
        ready = []
        while self._next < len(self._rows):
            k = self._next
            if not (exited or k + 1 < len(self._rows) or k + 1 < len(self._blocks)):
                break  # its .debug block may still be growing
            block = self._blocks[k] if k < len(self._blocks) else None
            discarded = self._discarded(block, exited)
            if discarded is None:
                break  # its driver lines are still in the pipe
            self._next += 1
            index, row = self._rows[k]
            if index is None or index in self.done:
                continue
            self.done.add(index)
            ready.append((index, row, block, discarded))
        return ready

    def missing(self) -> list[int]:
        """The problems that got no row, in the order the tool was given them."""
        return [i for i in range(len(self.problems)) if i not in self.done]

    def notes(self, index: int) -> list[str]:
        return self._notes.pop(index, [])

    def _discarded(self, block: list[DebugRow] | None, exited: bool) -> set[str] | None:
        """The block's Discarded perf configs; None: wait, its driver lines may be on the way."""
        if self._driver is None or not block:
            return set()
        at = _driver_segment(self._driver, self._driver_at, block)
        if at is None:
            now = time.monotonic()
            self._waiting_since = self._waiting_since or now
            if not exited and now - self._waiting_since < DRIVER_LINES_GRACE_S:
                return None
            # Not there: this tool's stderr cannot be matched to its configs. No candidate
            # is called Discarded from then on rather than one from another config's lines.
            self._driver, self._waiting_since = None, None
            return set()
        self._waiting_since = None
        segment = self._driver[at : at + len(block)]
        self._driver_at = at + len(block)
        return {pc for pc, verdict in segment if verdict == "Discarded"}

    def _new_lines(self, path: Path) -> list[str]:
        """The whole lines written to `path` since the last call (the tool may be in the
        middle of writing the last one)."""
        try:
            if path.stat().st_size == self._offsets[path]:
                return []
            with open(path, "rb") as f:
                f.seek(self._offsets[path])
                data = f.read()
        except OSError:
            return []
        end = data.rfind(b"\n") + 1
        self._offsets[path] += end
        return data[:end].decode("utf-8", errors="replace").splitlines(keepends=True)

    def _read_rows(self) -> None:
        try:
            rows = tuningdb.parse_tuning_db(self._out_lines, str(self.out)).rows
        except InputError:
            return  # a malformed file: its configs end as unfinished, with the tool's status
        for row in rows[len(self._rows) :]:
            index = self._index.get(keys.split_key(row.test_vector).plain)
            if index is None:
                for i in self.missing():  # noted on every job that may have been meant
                    self._notes.setdefault(i, []).append(
                        f"tuningRunner wrote a row for {row.test_vector!r}, which matches no "
                        "config of its batch"
                    )
            self._rows.append((index, row))

    def _read_debug(self, new: list[str]) -> None:
        """Parse only the new lines (under the header), extending the blocks."""
        skip = self._debug_lines
        if self._debug_header is None:
            self._debug_header, new, skip = new[0], new[1:], 1
        self._debug_lines = skip + len(new)
        rows = parse_debug_lines([self._debug_header, *new], self.debug, skip - 1)
        for row in rows:
            if self._blocks and self._blocks[-1][0].problem == row.problem:
                self._blocks[-1].append(row)
            else:
                self._blocks.append([row])


def _driver_segment(lines: list[tuple[str, str]], start: int, block: list[DebugRow]) -> int | None:
    """Where `block`'s driver lines begin in `lines[start:]`: len(block) consecutive lines with
    the block's perf configs (in any order), every candidate with TFlops printed with a time."""
    n = len(block)
    want = collections.Counter(r.perf_config for r in block)
    timed = {r.perf_config for r in block if r.tflops is not None}
    window = collections.Counter(pc for pc, _ in lines[start : start + n])
    for i in range(start, len(lines) - n + 1):
        if i > start:  # slide the window by one line
            window[lines[i - 1][0]] -= 1
            window[lines[i + n - 1][0]] += 1
        if +window == want and timed <= {pc for pc, v in lines[i : i + n] if _has_time(v)}:
            return i
    return None


def _has_time(verdict: str) -> bool:
    return verdict not in ("Discarded", "N/A")


def _config_states(out: Path) -> dict[str, str]:
    """E3/E4's `<output>.state`: failed configs (plain key) -> their state."""
    path = out.with_name(out.name + ".state")
    try:
        data = json.loads(path.read_text(encoding="utf-8"))
        return {
            keys.split_key(vector).plain: state
            for context in data.get("contexts", {}).values()
            for vector, state in context.items()
            if isinstance(state, str)
        }
    except (OSError, ValueError, AttributeError, InputError):
        return {}


def _state_error(state: str, run: _Run) -> TunerError:
    """A batch's config the tool recorded as failed in `.state`."""
    if state == GPU_TIMED_OUT:
        return TunerError(
            "GPU run timed out (tuningRunner state gpu_timed_out, driver exit status 3)",
            detail=_tail(run.stderr),
        )
    if state == "timed_out":
        return TunerTimeout(
            "tuningRunner's per-config --timeout fired (state timed_out)", detail=_tail(run.stderr)
        )
    return TunerError(f"tuningRunner failed this config (state {state})", detail=_tail(run.stderr))


def _batch_failure(run: _Run, out: Path, timed_out: float | None) -> TunerError:
    """The config a batch's tool was on when it stopped early (killed, crashed, timed out)."""
    if timed_out is not None:
        return TunerTimeout(
            f"tuningRunner ran past the batch's timeout of {timed_out:g} s; killed its whole "
            "process group",
            detail=_tail(run.stderr),
        )
    if run.returncode == 0:
        return TunerError(
            "tuningRunner exited 0 but wrote no result for this config", detail=_tail(run.stderr)
        )
    return _failure(run, out)


def _write_module(out: Path, problem: Problem) -> None:
    """A fusion problem's module, written where the tool's command line will name it."""
    if problem.op == "fusion":
        module = _module_path(out, problem)
        module.parent.mkdir()
        module.write_text(problem.module_text, encoding="utf-8")


def _module_path(out: Path, problem: Problem) -> Path:
    """Where a fusion module is written for the tool: a directory of its own (E2's --test_dir
    tunes every *.mlir of it). The name ends in .mlir whatever the file was called."""
    name = Path(problem.file_name).name
    return out.parent / "module" / (name if name.endswith(".mlir") else f"{name}.mlir")


def _check_gpu(row: tuningdb.TuningRow, ctx: TuneContext) -> None:
    """Refuse results tuned on another GPU than the session's (a different arch, or the same
    chip with another CU or chiplet count, e.g. MI300X vs MI308X)."""
    # E2 writes ','.join of every agent's name; a full name carries feature flags.
    archs = row.arch.split(",")
    session_arch = ctx.arch_full if ":" in row.arch else ctx.arch
    same_arch = all(a == (ctx.arch_full if ":" in a else ctx.arch) for a in archs)
    same_cu = row.num_cu is None or row.num_cu == ctx.num_cu
    same_chiplets = row.num_chiplets is None or row.num_chiplets == ctx.num_chiplets
    if same_arch and same_cu and same_chiplets:
        return
    tool = f"{row.arch}/{row.num_cu} CUs"
    session = f"{session_arch}/{ctx.num_cu} CUs"
    if row.num_chiplets is not None:
        tool += f"/{row.num_chiplets} chiplets"
        session += f"/{ctx.num_chiplets} chiplets"
    raise TunerError(
        f"tool reports {tool}, session is {session}: refusing to record a result tuned "
        "on a different GPU"
    )


DISCARDED = "Discarded by rocmlir-tuning-driver (E4: over its time budget)"


@dataclass(frozen=True)
class DebugRow:
    """One candidate line of a `.debug` file: its perf config and the tool's TFlops (None for
    N/A: pandas writes NaN as an empty field)."""

    perf_config: str
    tflops: float | None
    lineno: int
    measurements_ms: tuple[float, ...] | None = None  # E3's MeasurementsMs, when written
    # The problem's columns (every column but the candidate's): one config's rows share them.
    problem: tuple[str, ...] = ()

    def _replace_problem(self, problem: tuple[str, ...]) -> DebugRow:
        return dataclasses.replace(self, problem=problem)


def read_debug_file(path: Path) -> list[DebugRow]:
    """Reads a tuningRunner `.debug` file: pandas TSV of perfRunner's table_entry() columns.

    Columns are found by name (they differ per op and era; E2 adds an unnamed index column
    first, E3 a MeasurementsMs column last). There is no time column: the time is derived from
    TFlops by the caller.
    """
    with open(path, encoding="utf-8", newline="") as f:
        return parse_debug_lines(f, path)


def parse_debug_lines(lines: Iterable[str], path: Path, skipped: int = 0) -> list[DebugRow]:
    """read_debug_file on text given as lines (a batch reads the file as the tool writes it:
    the header, then the lines after the first `skipped` data lines)."""
    reader = csv.reader(lines, delimiter="\t")
    header = next(reader, None)
    if not header:
        return []
    try:
        pc_col, tf_col = header.index("PerfConfig"), header.index("TFlops")
    except ValueError:
        raise TunerError(f"{path}:1: .debug header lacks PerfConfig or TFlops") from None
    ms_col = header.index("MeasurementsMs") if "MeasurementsMs" in header else None
    problem_cols = [i for i, name in enumerate(header) if name not in _CANDIDATE_COLUMNS]
    return [
        _debug_row(
            path, reader.line_num + skipped, fields, len(header), pc_col, tf_col, ms_col
        )._replace_problem(tuple(fields[i] for i in problem_cols))
        for fields in reader
        if fields and fields != header
    ]


def _debug_row(
    path: Path,
    lineno: int,
    fields: list[str],
    width: int,
    pc_col: int,
    tf_col: int,
    ms_col: int | None = None,
) -> DebugRow:
    if len(fields) != width:
        raise TunerError(f"{path}:{lineno}: {len(fields)} fields, the .debug header has {width}")
    text = fields[tf_col].strip()
    try:
        tflops = float(text) if text else None
    except ValueError:
        raise TunerError(f"{path}:{lineno}: TFlops {text!r} is not a number") from None
    if not fields[pc_col]:
        raise TunerError(f"{path}:{lineno}: empty PerfConfig")
    ms = _measurements(fields[ms_col]) if ms_col is not None else None
    return DebugRow(fields[pc_col], tflops, lineno, ms)


def _measurements(text: str) -> tuple[float, ...] | None:
    """A MeasurementsMs cell (pandas writes the list's repr); None when empty or unreadable:
    the statistics are extra, a candidate without them is still a candidate."""
    try:
        values = json.loads(text) if text.strip() else None
    except ValueError:
        return None
    if not isinstance(values, list) or not values:
        return None
    try:
        ms = tuple(float(v) for v in values)
    except (TypeError, ValueError):
        return None
    return ms if all(math.isfinite(v) and v > 0 for v in ms) else None


def _candidate(
    perf_config: str,
    tool_tflops: float | None,
    flops: float,
    measurements_ms: tuple[float, ...] | None = None,
    two_stage: bool = False,
) -> Candidate:
    """The .debug file holds the tool's TFlops, not its time: the driver's ns is recovered
    with the same flop count (perfRunner's formula, which mlirtuna.problems mirrors). With
    two-stage tuning only the top k keep numbers: those were measured twice."""
    if tool_tflops is None or not math.isfinite(tool_tflops) or tool_tflops <= 0:
        why = "N/A, or Discarded outside the top k" if two_stage else "N/A"
        return Candidate(perf_config, error=f"not applicable (rocmlir-tuning-driver: {why})")
    ns = flops / (tool_tflops * 1e3)
    spread = stats.summarize([m * 1e6 for m in measurements_ms]) if measurements_ms else None
    return Candidate(
        perf_config,
        kernel_time_ns=ns,
        tflops=flops / (ns * 1e3),
        spread=spread,
        remeasured=two_stage,
    )


def _candidates(
    rows: list[DebugRow],
    flops: float,
    discarded: set[str] = frozenset(),
    two_stage: bool = False,
) -> list[Candidate]:
    """One candidate per perf config (greedy spaces may measure one twice: keep the best)."""
    best: dict[str, Candidate] = {}
    for row in rows:
        if row.tflops is None and row.perf_config in discarded:
            cand = Candidate(row.perf_config, error=DISCARDED)
        else:
            cand = _candidate(row.perf_config, row.tflops, flops, row.measurements_ms, two_stage)
        prev = best.get(row.perf_config)
        if prev is None or (cand.valid and (not prev.valid or cand.tflops > prev.tflops)):
            best[row.perf_config] = cand
    return list(best.values())


def _reconcile(
    candidates: list[Candidate], row: tuningdb.TuningRow, flops: float, notes: list[str]
) -> tuple[list[Candidate], Candidate]:
    """The tool's winner, made sure to be among the candidates; a note where the .debug file
    says another candidate was faster."""
    tool = next((c for c in candidates if c.perf_config == row.perf_config and c.valid), None)
    if tool is None:
        tool = _candidate(row.perf_config, row.tflops, flops)
        if not tool.valid:
            raise TunerError(f"tuningRunner's winner {row.perf_config} has no TFlops")
        if candidates:
            notes.append(
                f"the .debug file lacks tuningRunner's winner {row.perf_config}; "
                "added it with the TFlops of the result row"
            )
        candidates = [c for c in candidates if c.perf_config != row.perf_config] + [tool]
    best = max((c for c in candidates if c.valid), key=lambda c: c.tflops or 0.0)
    if best.perf_config != tool.perf_config and (best.tflops or 0.0) > (tool.tflops or 0.0):
        notes.append(
            f"tuningRunner chose {tool.perf_config} ({tool.tflops:.6g} TFlops) but its .debug "
            f"file has {best.perf_config} at {best.tflops:.6g} TFlops; recording the tool's choice"
        )
    return candidates, tool


def _margin(winner: Candidate, candidates: list[Candidate]) -> stats.Margin | None:
    """The tool's winner against the fastest other valid candidate; their noise where the
    .debug file gave both measurements (else only the margin is known)."""
    others = [c for c in candidates if c.valid and c.perf_config != winner.perf_config]
    if not others or not winner.kernel_time_ns:
        return None
    runner_up = min(others, key=lambda c: c.kernel_time_ns or math.inf)
    if winner.spread is not None and runner_up.spread is not None:
        return stats.margin(winner.spread, runner_up.spread)
    return stats.Margin((runner_up.kernel_time_ns or 0.0) / winner.kernel_time_ns - 1.0, None)


def _signal_group(pgid: int, sig: int) -> None:
    with contextlib.suppress(ProcessLookupError, PermissionError):  # the group is gone already
        os.killpg(pgid, sig)


def _tail(text: str, lines: int = STDERR_TAIL_LINES) -> str:
    return "\n".join(text.splitlines()[-lines:])


def _stderr_block(stderr: str) -> str:
    tail = _tail(stderr)
    if not tail:
        return ""
    return f"\n--- tuningRunner stderr (last {STDERR_TAIL_LINES} lines) ---\n{tail}\n"


def _file_line(path: Path, lineno: int | None) -> str:
    if lineno is None:
        return ""
    lines = path.read_text(encoding="utf-8", errors="replace").splitlines()
    return f"line {lineno}: {lines[lineno - 1]!r}" if 0 < lineno <= len(lines) else ""


def _read_tail(path: Path, keep: int) -> str:
    """The last `keep` bytes of a file the tool wrote, as text (a cut character becomes U+FFFD)."""
    with open(path, "rb") as f:
        f.seek(0, os.SEEK_END)
        f.seek(max(f.tell() - keep, 0))
        return f.read().decode("utf-8", errors="replace")


def scrubbed_env() -> dict[str, str]:
    """This process's environment without the database's URL and password."""
    return {k: v for k, v in os.environ.items() if k not in SECRET_ENV}


class _TailReader:
    """Reads a pipe to its end in a thread of its own, keeping only the last `keep` bytes.
    With `driver`, it also keeps every driver line (`<perfConfig>\t<verdict>`) in order as it
    reads, so none is lost to the trimming and none is searched for twice."""

    def __init__(self, pipe: IO[bytes] | None, keep: int, driver: bool = False) -> None:
        self.keep, self.data, self.dropped = keep, bytearray(), 0
        self.pipe = pipe
        self.driver: list[tuple[str, str]] | None = [] if driver else None
        self._partial = b""
        self.thread = threading.Thread(target=self._read, daemon=True)
        self.thread.start()

    def _read(self) -> None:
        if self.pipe is None:
            return
        with contextlib.suppress(OSError, ValueError), self.pipe:  # ValueError: closed by a stop
            while chunk := self.pipe.read1(64 << 10):
                self.data += chunk
                if self.driver is not None:
                    self._collect(chunk)
                if len(self.data) > 2 * self.keep:  # trim in bulk, not on every chunk
                    self.dropped += len(self.data) - self.keep
                    del self.data[: len(self.data) - self.keep]

    def _collect(self, chunk: bytes) -> None:
        text = self._partial + chunk
        end = text.rfind(b"\n") + 1  # only whole lines: the rest comes with the next chunk
        self._partial = text[end:]
        self.driver.extend(  # list.extend is atomic: the poller reads it from another thread
            [
                (pc.decode(errors="replace"), v.decode())
                for pc, v in _DRIVER_RE.findall(text, 0, end)
            ]
        )

    def join(self, timeout: float | None = None) -> None:
        self.thread.join(timeout)
        if self.thread.is_alive() and self.pipe is not None:
            with contextlib.suppress(OSError):
                self.pipe.close()

    def text(self) -> str:
        data = bytes(self.data[-self.keep :])
        # A cut may split a character: "replace" turns its stray bytes into U+FFFD.
        return data.decode("utf-8", errors="replace")


def _now() -> dt.datetime:
    return dt.datetime.now(dt.UTC)
