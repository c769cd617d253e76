"""What one run of the tool wrote, read into a TuneOutcome or the TunerError that says why not.

Results are read from the files the tool writes, never scraped from stdout: the result row
(`--output`, read with mlirtuna.formats.tuningdb) and the per-candidate `.debug` file (`--debug`,
debugfile.py). The same functions read one call per problem and each config of a batch.
"""

from __future__ import annotations

import contextlib
import datetime as dt
import json
import math
import re
from collections.abc import Set
from pathlib import Path

from mlirtuna import keys, machine, stats, textinput
from mlirtuna.errors import InputError, TunerError, TunerTimeout, Unsupported, UserError
from mlirtuna.formats import tuningdb
from mlirtuna.problems import Problem
from mlirtuna.problems import parse as parse_problem
from mlirtuna.problems.fusion import FusionProblem, parse_key
from mlirtuna.tuners.base import Candidate, TuneContext, TuneOutcome
from mlirtuna.tuners.process import (
    STDOUT_KEEP_BYTES,
    Run,
    capped_lines,
    check_outputs,
    last_error_line,
    open_output,
    read_output,
    read_tail,
    stderr_block,
    tail,
)
from mlirtuna.tuners.rocmlir.debugfile import DebugRow, read_debug_file

STATE_CAP_BYTES = 1 << 20  # a `.state` names the failed configs of one call: a few KiB
GPU_TIMED_OUT = "gpu_timed_out"  # E4's state for a driver that exited 3 (--gpu-run-timeout)
DISCARDED = "Discarded by rocmlir-tuning-driver (E4: over its time budget)"
_TIMED_OUT_RE = re.compile(r"Tuning timed out after")
# argparse's usage error: "<prog>: error: <message>" (exit status 2).
_USAGE_RE = re.compile(r"^\S[^\n]*?: error: [^\n]*$", re.MULTILINE)
USAGE_EXIT = 2
# One line of rocmlir-tuning-driver's output as E4 logs it with --debug: "<perfConfig>\tDiscarded".
# (?<!\S): a match starts only where a word does; without it every position inside a long perf
# config is tried again, quadratic in its length (0.3 s for a batch's stderr).
_DISCARDED_RE = re.compile(r"(?<!\S)(\S+)\tDiscarded\s*$", re.MULTILINE)


def read_outcome(
    problem: Problem, ctx: TuneContext, out: Path, run: Run, two_stage: bool = False
) -> TuneOutcome:
    """The outcome of one call for one problem, from its output file and `.debug` file."""
    check_outputs(out)
    check_written_errors(out, run)
    if run.returncode != 0:
        raise failure(run, out)
    row, notes = result_row(problem, out, run)
    debug = out.with_name(out.name + ".debug")
    debug_rows = read_debug_file(debug) if debug.is_file() else None
    output = read_tail(out, STDOUT_KEEP_BYTES) + stderr_block(run.stderr)
    return row_outcome(problem, ctx, row, debug_rows, run, output, notes, two_stage)


def check_written_errors(out: Path, run: Run) -> None:
    """E2.5 writes a failed config as a `### ` line (and may exit 0): that text is the error."""
    if not out.is_file():
        return
    try:
        errors = tuningdb.read_tuning_db(out).errors
    except InputError:
        return  # a malformed file is reported by result_row, with its line
    if errors:
        raise TunerError(f"tuningRunner: {errors[-1].text}", detail=tail(run.stderr))


def _failed_states(out: Path) -> set[str]:
    """The states E3/E4 recorded in `<output>.state` for the configs that failed."""
    raw = read_output(out.with_name(out.name + ".state"), STATE_CAP_BYTES)
    try:
        data = json.loads(raw or b"{}")
        return {
            state
            for context in data.get("contexts", {}).values()
            for state in context.values()
            if isinstance(state, str)
        }
    except (ValueError, AttributeError, RecursionError):
        return set()


def failure(run: Run, out: Path | None = None) -> TunerError:
    """The error of a call that failed: its own verdict in `.state`, else its exit status."""
    if out is not None and GPU_TIMED_OUT in _failed_states(out):
        # E4: rocmlir-tuning-driver exited 3, the GPU run passed --gpu-run-timeout.
        return TunerError(
            "GPU run timed out (tuningRunner state gpu_timed_out, driver exit status 3)",
            detail=tail(run.stderr),
        )
    usage = usage_error(run)
    if usage is not None:
        return usage
    if run.returncode < 0:
        what = f"was killed by signal {-run.returncode}"
    else:
        what = f"exited with status {run.returncode}"
    last = last_error_line(run.stderr)
    message = f"tuningRunner {what}" + (f": {last}" if last else "")
    if _TIMED_OUT_RE.search(run.stderr):  # E3's own --timeout fired
        return TunerTimeout(message, detail=tail(run.stderr))
    return TunerError(message, detail=tail(run.stderr))


def usage_error(run: Run) -> Unsupported | None:
    """The tool refused its command line (argparse: exit 2 and its `error:` line): the same
    call fails the same way every time, so it is an error at once, never retried."""
    if run.returncode != USAGE_EXIT:
        return None
    lines = _USAGE_RE.findall(run.stderr)
    if not lines:
        return None
    return Unsupported(
        f"tuningRunner refused its command line (exit 2, not retried): {lines[-1].strip()}",
        detail=tail(run.stderr),
    )


def result_row(problem: Problem, out: Path, run: Run) -> tuple[tuningdb.TuningRow, list[str]]:
    """The tool's winner row (the last one written); raises TunerError if there is none."""
    no_result = TunerError(
        "tuningRunner exited 0 but wrote no result (E2 does this when verification fails)",
        detail=tail(run.stderr),
    )
    if not out.is_file() or out.stat().st_size == 0:
        raise no_result
    try:
        rows = tuningdb.read_tuning_db(out).rows
    except InputError as e:
        raise TunerError(
            f"tuningRunner wrote a malformed result file: {e}",
            detail=_file_line(out, e.line) + stderr_block(run.stderr),
        ) from None
    if not rows:
        raise no_result
    row, notes = rows[-1], []
    expected, written = problem.canonical(), keys.stored_vector(row.test_vector, problem.op)
    if isinstance(problem, FusionProblem):  # the row is keyed by the module's tuning key
        expected = problem.tuning_key
        with contextlib.suppress(InputError):
            written = parse_key(row.test_vector)[1]
    if written != expected and _another_problem(problem, written):
        raise TunerError(
            f"tuningRunner wrote a row for another problem: {textinput.quote(row.test_vector)}, "
            f"not {expected!r}; not recorded"
        )
    if written != expected:
        notes.append(
            f"tuningRunner recorded the config as {row.test_vector!r}; "
            f"mlirtuna's canonical form is {expected!r}"
        )
    return row, notes


def _another_problem(problem: Problem, written: str) -> bool:
    """Whether a row's key is a config of the problem's op that names another problem (its
    canonical form differs); a form this reader cannot parse is not called another."""
    if isinstance(problem, FusionProblem):
        return False
    try:
        return parse_problem(problem.op, written).canonical() != problem.canonical()
    except (InputError, UserError, ValueError):
        return False


def row_outcome(
    problem: Problem,
    ctx: TuneContext,
    row: tuningdb.TuningRow,
    debug_rows: list[DebugRow] | None,
    run: Run,
    output: str,
    notes: list[str],
    two_stage: bool,
    discarded: Set[str] | None = None,
) -> TuneOutcome:
    """One config's outcome from its result row and its `.debug` rows (None: no .debug file).
    `discarded`: its perf configs the driver printed as Discarded; None: all of `run.stderr`
    is this config's (one call per config)."""
    _check_gpu(row, ctx)
    if not row.has_perf_config or not row.has_valid_tflops:
        raise TunerError(
            f"no valid perf config: tuningRunner reports perfConfig {row.perf_config} with "
            f"{row.tflops} TFlops for {row.test_vector!r}",
            detail=tail(run.stderr),
        )
    if (row.tflops or 0.0) > stats.MAX_TFLOPS:
        raise TunerError(
            f"tuningRunner reports {row.tflops:g} TFlops for {row.test_vector!r}, past any "
            f"GPU ({stats.MAX_TFLOPS:g}): not recorded",
            detail=tail(run.stderr),
        )
    flops = float(problem.flops())
    if debug_rows is not None:
        if discarded is None:
            discarded = set(_DISCARDED_RE.findall(run.stderr))
        candidates = debug_candidates(debug_rows, flops, discarded, two_stage)
        notes.extend(dropped_statistics(debug_rows))
    else:
        candidates = []
        notes.append("tuningRunner wrote no .debug file; only its winner is recorded")
    candidates, winner = reconcile(candidates, row, flops, notes)
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


def dropped_statistics(rows: list[DebugRow]) -> list[str]:
    """One note for the rows whose statistics were dropped (a time no kernel run can take):
    the first one's reason at FILE:LINE and how many more (a file of such rows is one note)."""
    dropped = [row.dropped for row in rows if row.dropped]
    if not dropped:
        return []
    more = f" (and {len(dropped) - 1} more rows)" if len(dropped) > 1 else ""
    return [f"{dropped[0]}{more}; their candidates keep the tool's TFlops"]


def _row_phase(row: tuningdb.TuningRow) -> tuple[dt.datetime, dt.datetime] | None:
    """When the tool tuned a batch's config: E3's row has its start and its duration."""
    if row.timestamp is None or row.duration_s is None:
        return None
    try:
        start = dt.datetime.strptime(row.timestamp, "%Y-%m-%dT%H:%M:%SZ").replace(tzinfo=dt.UTC)
    except ValueError:
        return None
    return start, start + dt.timedelta(seconds=row.duration_s)


def _check_gpu(row: tuningdb.TuningRow, ctx: TuneContext) -> None:
    """Refuse results tuned on another GPU than the session's (a different arch, or the same
    chip with another CU or chiplet count, e.g. MI300X vs MI308X). CUs are counted as the tool
    counts them; on a WGP-mode chip rocminfo's doubled count names the same GPU, as the tool's
    own matches_current_num_cu accepts it."""
    # E2 writes ','.join of every agent's name; a full name carries feature flags.
    archs = row.arch.split(",")
    session_arch = ctx.arch_full if ":" in row.arch else ctx.arch
    same_arch = all(a == (ctx.arch_full if ":" in a else ctx.arch) for a in archs)
    same_cu = row.num_cu is None or machine.same_num_cu(ctx.arch, row.num_cu, ctx.num_cu)
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


def tflops_candidate(
    perf_config: str,
    tool_tflops: float | None,
    flops: float,
    spread: stats.Spread | None = None,
    two_stage: bool = False,
    status: str | None = None,
) -> Candidate:
    """The .debug file holds the tool's TFlops, not its time: the driver's ns is recovered
    with the same flop count (perfRunner's formula, which mlirtuna.problems mirrors). `spread`:
    the run's statistics (the Stats column). With two-stage tuning only the top k keep numbers:
    those were measured twice. `status`: E4's Status for the candidate, its reason when N/A."""
    if tool_tflops is None or not math.isfinite(tool_tflops) or tool_tflops <= 0:
        why = "N/A, or Discarded outside the top k" if two_stage else "N/A"
        if status and status.lower() not in ("ok", "success", "n/a"):
            why = status
        return Candidate(perf_config, error=f"not applicable (rocmlir-tuning-driver: {why})")
    ns = flops / (tool_tflops * 1e3)
    if tool_tflops > stats.MAX_TFLOPS or not 0 < ns < math.inf:  # 1e308: ns 0, 1e-300: inf
        return Candidate(perf_config, error=f"TFlops {tool_tflops:g} out of physical limits")
    return Candidate(
        perf_config,
        kernel_time_ns=ns,
        tflops=flops / (ns * 1e3),
        spread=spread,
        remeasured=two_stage,
    )


def debug_candidates(
    rows: list[DebugRow],
    flops: float,
    discarded: Set[str] = frozenset(),
    two_stage: bool = False,
) -> list[Candidate]:
    """One candidate per perf config (greedy spaces may measure one twice: keep the best)."""
    best: dict[str, Candidate] = {}
    for row in rows:
        # E4's Status says it for each row; without it, the driver's lines on stderr do.
        if row.status is not None:
            is_discarded = row.status.lower() == "discarded"
        else:
            is_discarded = row.perf_config in discarded
        if row.tflops is None and is_discarded:
            cand = Candidate(row.perf_config, error=DISCARDED)
        else:
            _check_fastest(row, flops)
            cand = tflops_candidate(
                row.perf_config, row.tflops, flops, row.spread, two_stage, row.status
            )
        prev = best.get(row.perf_config)
        if prev is None or (cand.valid and (not prev.valid or _tflops(cand) > _tflops(prev))):
            best[row.perf_config] = cand
    return list(best.values())


# How far a run may read faster than the row's time: the driver prints both with %e's six digits.
_PRINT_SLACK = 1e-5


def _check_fastest(row: DebugRow, flops: float) -> None:
    """TunerError (FILE:LINE) when the row's fastest run is slower than its time: the time is
    the driver's median of those very runs (E4's --use-median), so it is a malformed file."""
    if row.spread is None or row.spread.min is None or row.tflops is None or row.tflops <= 0:
        return  # no runs to check (N/A, or the driver's one-timer mean of a small kernel)
    ns = flops / (row.tflops * 1e3)
    if row.spread.min > ns * (1 + _PRINT_SLACK):
        raise TunerError(
            f"{row.where}: the fastest run of {row.perf_config} ({row.spread.min:.6g} ns) is "
            f"slower than its time ({ns:.6g} ns, the median of its runs): a malformed .debug file"
        )


def _tflops(c: Candidate) -> float:
    """A candidate's TFlops; only called on valid ones, which have them."""
    return c.tflops or 0.0


def reconcile(
    candidates: list[Candidate], row: tuningdb.TuningRow, flops: float, notes: list[str]
) -> tuple[list[Candidate], Candidate]:
    """The tool's winner, made sure to be among the candidates; a note where the .debug file
    says another candidate was faster."""
    tool = next((c for c in candidates if c.perf_config == row.perf_config and c.valid), None)
    if tool is None:
        tool = tflops_candidate(row.perf_config, row.tflops, flops)
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


def _file_line(path: Path, lineno: int | None) -> str:
    if lineno is None:
        return ""
    with open_output(path) as f:  # the line only, each line read up to its cap
        for i, raw in enumerate(capped_lines(f), 1):
            if i == lineno:
                text = (raw or b"").decode("utf-8", errors="replace").rstrip("\r\n")
                return f"line {lineno}: {textinput.quote(text)}"
    return ""
