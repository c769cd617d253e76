"""Measuring the perf configs a search or a quick list chose (issue 45 §2), the way rocMLIR's own
perfRunner measures one config, never through tuningRunner.py: no era of tuningRunner takes a
list of perf configs (rocMLIR 3fc5be9e and rocmlirTriton 520c8752 hand the driver a whole
--tuning-space; docs/quick-tuning.md, "Measuring chosen configs on rocMLIR", has the evidence).

- The problem's rocmlir-gen line is the build's own: perfRunner's configuration class for the op
  (`from_command_line`, then `generate_mlir_driver_commandline`, as tuningRunner's tune_config
  builds its pipeline), asked through the tool's python (LINE_PROBE). mlirtuna never spells a
  rocmlir-gen flag itself.
- `rocmlir-gen LINE` prints the problem's module once; each chosen config is one
  `rocmlir-tuning-driver --benchmark-config=PC <timing> -` fed that module (the driver sets the
  perf config on the module's ops itself), with the timing tuningRunner gives the driver in that
  era: rocmlirTriton's --rep/--warmup/--sleep-us budgets (the build's TUNE_REP_MS, TUNE_WARMUP_MS,
  SLEEP_US, or the session's --rep/--warmup), else E3's legacy counts; always --use-median.
- The driver prints `PC\\t<ns>` or `PC\\tN/A` (perfRunner: `_, time = outs.split()`, a time in
  ns, "to match rocprof"); with --show-all-measurements `PC\\t[<ms>,…]\\t<ns>` (every run's
  hipEventElapsedTime), with --show-stats `PC\\t{…}\\t<ns>` (ms). A config that is not
  applicable is N/A and the driver exits 1 ("no valid configs"): an invalid candidate, as in a
  tuning run; exit 3 is a hung GPU run (--gpu-run-timeout), the job's error.
- A problem's space is `rocmlir-gen LINE --emit-tuning-space=KIND`, one perf config a line, for
  the kinds its --help lists (quick, full, exhaustive). greedy and lfbo are searches the driver
  runs round by round: they have no list.

What a build offers is read once from the two tools' --help (Tools); a build without the
driver's --benchmark-config cannot measure chosen configs (eras.lacks_chosen says so in one line).
"""

from __future__ import annotations

import functools
import json
import math
import time
from collections.abc import Sequence
from dataclasses import dataclass
from pathlib import Path

import mlirtuna.tuners.process as process
from mlirtuna import stats
from mlirtuna.errors import TunerError, TunerTimeout, Unsupported
from mlirtuna.problems import Problem
from mlirtuna.problems.fusion import FusionProblem
from mlirtuna.tuners.base import Candidate, TuneContext, TuneOutcome
from mlirtuna.tuners.rocmlir.debugfile import parse_stats
from mlirtuna.tuners.rocmlir.eras import (
    CHOSEN_DRIVER_FLAG,
    LIST_SPACE_FLAG,
    listed_kinds,
    tool_flags,
)

DRIVER = "rocmlir-tuning-driver"
GEN = "rocmlir-gen"
HELP_TIMEOUT_S = 60.0
NS_PER_MS = 1e6
EXIT_GPU_TIMEOUT = 3  # rock::kExitGpuTimeout: a GPU run passed --gpu-run-timeout
# E3's tuningRunner (rocMLIR 3fc5be9e: MLIR_N_REPEATS, WARMUP_ITERATIONS, LEGACY_SLEEP_US) runs
# its driver in the legacy mode with these counts: a chosen config is timed as a tuned one is.
LEGACY_TIMING = ("--num-iterations=10", "--warmup-iterations=1", "--sleep-us=100")


def config_class(op: str) -> str:
    """perfRunner's configuration class of an op, by its naming (gemm_gemm: GemmGemmConfiguration;
    tuningRunner imports them under the same names)."""
    return "".join(word.capitalize() for word in op.split("_")) + "Configuration"


# Run by the tool's python: the build's perfRunner (else the names tuningRunner imported from
# it) turns a config line into rocmlir-gen's arguments; older classes take no chiplet count and
# no kernel_repeats. Prints one JSON line: the arguments and the build's timing constants.
LINE_PROBE = r"""
import json, os, sys
scripts, class_name, arch, num_cu, chiplets, line = sys.argv[1:7]
sys.path.insert(0, scripts)
if os.path.exists(os.path.join(scripts, "perfRunner.py")):
    import perfRunner as tool
else:
    import tuningRunner as tool
cls = getattr(tool, class_name)
tokens = line.split(" ")
try:
    config = cls.from_command_line(tokens, arch, int(num_cu), int(chiplets))
except TypeError:
    config = cls.from_command_line(tokens, arch, int(num_cu))
try:
    flags = config.generate_mlir_driver_commandline("", kernel_repeats=None)
except TypeError:
    flags = config.generate_mlir_driver_commandline("")
names = ("TUNE_REP_MS", "TUNE_WARMUP_MS", "SLEEP_US")
print(json.dumps({"argv": flags.split(), **{n: getattr(tool, n, None) for n in names}}))
"""


@dataclass(frozen=True)
class Tools:
    """What a build's rocmlir-gen and rocmlir-tuning-driver offer here, from their --help."""

    gen: Path
    driver: Path
    driver_flags: frozenset[str]
    kinds: tuple[str, ...]  # the spaces `rocmlir-gen --emit-tuning-space` lists
    trouble: str = ""  # why a --help could not be read ("" when both were)

    def lack(self) -> str | None:
        """What this build lacks to measure chosen configs; None when it has it all."""
        if self.trouble:
            return self.trouble
        if CHOSEN_DRIVER_FLAG not in self.driver_flags:
            return f"{self.driver} has no {CHOSEN_DRIVER_FLAG} (it can only tune a whole space)"
        return None

    def list_lack(self, kind: str) -> str | None:
        """What this build lacks to list the `kind` space; None when it lists it."""
        if self.trouble:
            return self.trouble
        if kind not in self.kinds:
            listed = ", ".join(self.kinds) or "no kind"
            return f"{self.gen} {LIST_SPACE_FLAG} lists {listed}, not {kind!r}"
        return None


@dataclass(frozen=True)
class GenLine:
    """A problem's rocmlir-gen arguments (no perf config) and the build's tuning budgets
    (perfRunner's TUNE_REP_MS, TUNE_WARMUP_MS, SLEEP_US; None where it names none)."""

    argv: tuple[str, ...]
    rep_ms: int | None = None
    warmup_ms: int | None = None
    sleep_us: int | None = None


class Chosen:
    """Measures chosen perf configs and lists spaces through one build's tools."""

    def __init__(
        self, build_dir: Path, script_dir: Path, python: str, env: dict[str, str], grace_s: float
    ) -> None:
        self.bin = build_dir / "bin"
        self.cwd = build_dir
        self.script_dir = script_dir
        self.python = python
        self.env = env  # the tools' environment (the caller pins the GPU for measuring)
        self.grace_s = grace_s

    @functools.cached_property
    def tools(self) -> Tools:
        """Read once: both tools' --help (an LLVM tool prints it without a GPU)."""
        gen, driver = self.bin / GEN, self.bin / DRIVER
        helps = []
        for tool in (driver, gen):
            if not tool.is_file():
                return Tools(gen, driver, frozenset(), (), f"{tool} not found")
            run = self._run([str(tool), "--help"], HELP_TIMEOUT_S)
            if run.returncode != 0:
                why = f"{tool} --help failed with status {run.returncode}"
                return Tools(gen, driver, frozenset(), (), why)
            helps.append(run.stdout)
        return Tools(gen, driver, tool_flags(helps[0]), listed_kinds(helps[1]))

    def lack(self, problem: Problem) -> str | None:
        """Why this build cannot measure chosen configs of `problem`; None when it can."""
        return no_line(problem) or self.tools.lack()

    def measure(
        self, problem: Problem, line: str, ctx: TuneContext, env: dict[str, str]
    ) -> TuneOutcome:
        """Each of ctx.perf_configs (once, in order) timed by the driver; `env` pins the GPU."""
        chosen = list(dict.fromkeys(ctx.perf_configs or ()))
        if not chosen:
            raise TunerError("no perf configs were chosen to measure")
        deadline = Deadline(ctx.timeout_s)
        gen = self.gen_line(problem, line, ctx, deadline)
        module = self._module(gen, deadline)
        timing = timing_flags(self.tools.driver_flags, gen, ctx)
        candidates: list[Candidate] = []
        log: list[str] = []
        for pc in chosen:
            left = deadline.left(f"measured {len(candidates)} of {len(chosen)} chosen configs")
            argv = [str(self.tools.driver), f"{CHOSEN_DRIVER_FLAG}={pc}", *timing, "-"]
            run = process.run(argv, self.cwd, env, left, self.grace_s, module)
            if run.returncode == EXIT_GPU_TIMEOUT:
                raise TunerError(
                    f"GPU run timed out measuring {pc} ({DRIVER} exit status 3, --gpu-run-timeout)",
                    detail=process.tail(run.stderr),
                )
            cand = driver_candidate(run, pc, problem.flops())
            candidates.append(cand)
            log.append(driver_line(run, pc) or f"{pc}\t{cand.error}")
        header = [
            f"# {GEN} {' '.join(gen.argv)} | {DRIVER} {' '.join(timing)} "
            f"{CHOSEN_DRIVER_FLAG}=PC -: one call for each of {len(chosen)} chosen perf configs",
        ]
        return outcome(candidates, "\n".join(header + log) + "\n")

    def space(self, problem: Problem, line: str, ctx: TuneContext, kind: str) -> list[str]:
        """`rocmlir-gen LINE --emit-tuning-space=KIND`: the space's perf configs, in order."""
        why = no_line(problem) or self.tools.list_lack(kind)
        if why:
            raise Unsupported(f"cannot list the {kind} space of this problem: {why}")
        deadline = Deadline(ctx.timeout_s)
        gen = self.gen_line(problem, line, ctx, deadline)
        argv = [str(self.tools.gen), *gen.argv, f"{LIST_SPACE_FLAG}={kind}"]
        run = process.run(argv, self.cwd, self.env, deadline.left("listed nothing"), self.grace_s)
        if run.returncode != 0:
            raise TunerError(
                f"{GEN} {LIST_SPACE_FLAG}={kind} failed with status {run.returncode}",
                detail=process.tail(run.stderr),
            )
        configs = list(dict.fromkeys(s for s in (x.strip() for x in run.stdout.splitlines()) if s))
        if not configs:
            raise TunerError(f"{GEN} {LIST_SPACE_FLAG}={kind} listed no perf config")
        return configs

    def gen_line(
        self, problem: Problem, line: str, ctx: TuneContext, deadline: Deadline
    ) -> GenLine:
        """The problem's rocmlir-gen arguments, from the build's perfRunner (LINE_PROBE)."""
        argv = [
            self.python, "-c", LINE_PROBE, str(self.script_dir), config_class(problem.op),
            ctx.arch_full or ctx.arch, str(ctx.num_cu), str(ctx.num_chiplets), line,
        ]  # fmt: skip
        run = self._run(argv, deadline.left(f"had no {GEN} line"))
        last = (run.stdout.strip().splitlines() or [""])[-1]
        try:
            got = json.loads(last) if run.returncode == 0 else None
        except ValueError:
            got = None
        if not isinstance(got, dict) or not isinstance(got.get("argv"), list):
            raise TunerError(
                f"the build's perfRunner gave no {GEN} line for {line!r} (status {run.returncode})",
                detail=process.tail(run.stderr),
            )
        return GenLine(
            tuple(str(a) for a in got["argv"]),
            _whole(got.get("TUNE_REP_MS")),
            _whole(got.get("TUNE_WARMUP_MS")),
            _whole(got.get("SLEEP_US")),
        )

    def _module(self, gen: GenLine, deadline: Deadline) -> str:
        """`rocmlir-gen LINE`: the problem's module, as the driver reads it on stdin."""
        run = self._run([str(self.tools.gen), *gen.argv], deadline.left("had no module"))
        if run.returncode != 0:
            raise TunerError(f"{GEN} failed with status {run.returncode}", process.tail(run.stderr))
        if len(run.stdout.encode()) >= process.STDOUT_KEEP_BYTES:  # kept only its tail
            raise TunerError(f"{GEN} printed a module over {process.STDOUT_KEEP_BYTES} bytes")
        return run.stdout

    def _run(self, argv: list[str], timeout: float | None) -> process.Run:
        return process.run(argv, self.cwd, self.env, timeout, self.grace_s)


def no_line(problem: Problem) -> str | None:
    """Why `problem` has no perfRunner line to hand rocmlir-gen; None when it has one."""
    if isinstance(problem, FusionProblem):
        return (
            f"a {problem.op} problem has no perfRunner configuration line (the tool tunes a "
            "fusion module as the conv or gemm its tuning key names)"
        )
    return None


class Deadline:
    """The job timeout shared by every tool call of one measurement."""

    def __init__(self, timeout_s: float | None) -> None:
        self.timeout_s = timeout_s
        self.end = None if timeout_s is None else time.monotonic() + timeout_s

    def left(self, done: str) -> float | None:
        """Seconds left; TunerTimeout (saying what was `done`) when none are."""
        if self.end is None:
            return None
        left = self.end - time.monotonic()
        if left <= 0:
            raise TunerTimeout(f"{done} before the job timeout of {self.timeout_s:g} s")
        return left


def timing_flags(flags: frozenset[str], gen: GenLine, ctx: TuneContext) -> list[str]:
    """The driver's timing flags, as this era's tuningRunner gives them (module docstring)."""
    if "--num-iterations" in flags or "--rep" not in flags:
        # rocMLIR's driver: E3's tuningRunner runs it in the legacy mode by default (its
        # --triton-benchmark-mode is not a session setting), so chosen configs are timed so too.
        argv = list(LEGACY_TIMING)
    else:  # rocmlirTriton's driver, which only has time budgets (Triton's do_bench)
        budgets = (
            ("--rep", ctx.rep_ms if ctx.rep_ms is not None else gen.rep_ms),
            ("--warmup", ctx.warmup_ms if ctx.warmup_ms is not None else gen.warmup_ms),
            ("--sleep-us", gen.sleep_us),
        )
        argv = [f"{flag}={value}" for flag, value in budgets if value is not None]
    argv.append("--use-median")
    if "--show-all-measurements" in flags:
        argv.append("--show-all-measurements=True")
    elif "--show-stats" in flags:
        argv.append("--show-stats=True")
    if ctx.gpu_run_timeout_s is not None and "--gpu-run-timeout" in flags:
        argv.append(f"--gpu-run-timeout={ctx.gpu_run_timeout_s}")
    return argv


def driver_line(run: process.Run, perf_config: str) -> str | None:
    """The driver's line for `perf_config` (its first field), None when it printed none."""
    for line in run.stdout.splitlines():
        if line.split("\t", 1)[0].strip() == perf_config:
            return line.rstrip("\r\n")
    return None


def driver_candidate(run: process.Run, perf_config: str, flops: float) -> Candidate:
    """One driver call read as a candidate: timed, N/A, or failed (its last error line)."""
    line = driver_line(run, perf_config)
    if line is None:
        why = process.last_error_line(run.stderr) or f"exit status {run.returncode}"
        if run.returncode == 0:
            printed = process.tail(run.stdout)
            raise TunerError(f"{DRIVER} printed no line for {perf_config}", printed)
        return Candidate(perf_config, error=f"{DRIVER} failed: {why}")
    fields = line.split("\t")
    if fields[-1].strip() == "N/A" or len(fields) < 2:
        return Candidate(perf_config, error=f"not applicable ({DRIVER}: N/A)")
    try:
        ns = float(fields[-1])
    except ValueError:
        raise TunerError(f"{DRIVER} printed a time that is no number: {line!r}") from None
    fault = stats.kernel_time_fault(ns)
    if fault:
        return Candidate(perf_config, error=f"{DRIVER} time {ns:g} ns is {fault}")
    spread = _spread(fields[1]) if len(fields) == 3 else None
    return Candidate(perf_config, kernel_time_ns=ns, tflops=flops / (ns * 1e3), spread=spread)


def _spread(text: str) -> stats.Spread | None:
    """The middle field: every run in ms (--show-all-measurements) or the --show-stats JSON
    (ms), as a Spread in ns; None when it says nothing usable (the time still stands)."""
    try:
        value = json.loads(text)
    except ValueError:
        return None
    if isinstance(value, dict):
        return parse_stats(text, f"{DRIVER} --show-stats")
    if not isinstance(value, list) or not value:
        return None
    try:
        ns = [float(v) * NS_PER_MS for v in value]
    except (TypeError, ValueError):
        return None
    if not all(math.isfinite(v) and v > 0 for v in ns):
        return None
    return stats.summarize(ns)


def outcome(candidates: Sequence[Candidate], output: str) -> TuneOutcome:
    """The fastest valid candidate wins; its margin over the runner-up (their noise where both
    runs were given)."""
    valid = sorted((c for c in candidates if c.valid), key=lambda c: c.kernel_time_ns or math.inf)
    if not valid:
        first = candidates[0].error if candidates else "none"
        raise TunerError(
            f"none of the {len(candidates)} chosen perf configs ran (first: {first})",
            detail=output,
        )
    winner = valid[0]
    margin = None
    if len(valid) > 1 and winner.kernel_time_ns:
        runner_up = valid[1]
        if winner.spread is not None and runner_up.spread is not None:
            margin = stats.margin(winner.spread, runner_up.spread)
        else:
            ratio = (runner_up.kernel_time_ns or 0.0) / winner.kernel_time_ns
            margin = stats.Margin(ratio - 1.0, None)
    return TuneOutcome(list(candidates), winner, output=output, margin=margin)


def _whole(value: object) -> int | None:
    """A timing constant the probe printed, if it is a whole number."""
    if isinstance(value, bool) or not isinstance(value, int | float) or not math.isfinite(value):
        return None
    return int(value)
