"""A batch: one tool call for several configs of one op (`worker --batch K`, E3 and E4).

The configs go on stdin (`-c -`); each problem's outcome is yielded as its row and `.debug`
rows appear (BatchTail), read with the same functions as one call per problem (outcome.py).
Which of a config's candidates E4's driver Discarded is read from that config's own driver lines
in the batch's stderr, never from another config's (driver_segment); each file and stderr is read
once, as it grows (a poll costs what the tool wrote since the last one).
"""

from __future__ import annotations

import collections
import datetime as dt
import json
import subprocess
import time
from collections.abc import Iterator, Sequence
from pathlib import Path

import mlirtuna.tuners.process as process
from mlirtuna import problems
from mlirtuna.errors import BatchRefused, InputError, NotRun, TunerError, TunerTimeout
from mlirtuna.formats import tuningdb
from mlirtuna.problems import CONFIG_LIST_OPS, Problem
from mlirtuna.tuners.base import BatchItem, TuneContext
from mlirtuna.tuners.process import Run, TailReader, last_error_line, now, stop, tail
from mlirtuna.tuners.rocmlir.debugfile import DebugRow, matches, parse_debug_lines
from mlirtuna.tuners.rocmlir.outcome import (
    GPU_TIMED_OUT,
    STATE_CAP_BYTES,
    failure,
    row_outcome,
    usage_error,
)

# Ops whose configs are config-list lines (fusion is a module file per call).
BATCH_OPS = CONFIG_LIST_OPS
POLL_READ_BYTES = 8 << 20  # of a batch's output file at one poll: thousands of rows
BATCH_POLL_S = 0.05  # how often a batch's output files are looked at while the tool runs
# How long a batch's ready row waits for its driver lines on stderr (a pipe lags the files).
DRIVER_LINES_GRACE_S = 1.0

# One ready row: its problem's index, the row, its .debug block, its Discarded perf configs.
ReadyRow = tuple[int, tuningdb.TuningRow, list[DebugRow] | None, set[str]]


def follow(
    proc: subprocess.Popen[bytes],
    batch_tail: BatchTail,
    ctx: TuneContext,
    readers: tuple[TailReader, TailReader],
    start: dt.datetime,
    total: float | None,
    *,
    two_stage: bool,
    kill_grace_s: float,
) -> Iterator[BatchItem]:
    """Yield each config's outcome while the tool runs; stop it past `total` seconds."""
    deadline = None if total is None else time.monotonic() + total
    stderr = readers[1]
    while True:
        exited = proc.poll() is not None
        if not exited and deadline is not None and time.monotonic() > deadline:
            stop(proc, readers, kill_grace_s)
            batch_tail.timed_out = total
            exited = True  # rows written before the stop still count
        if exited:
            stderr.join(kill_grace_s)  # every driver line read before the last rows
        ready = batch_tail.poll(exited)
        if ready:
            run = Run(0, "", stderr.text(), start, now())
            for index, row, debug_rows, discarded in ready:
                try:
                    yield index, row_outcome(
                        batch_tail.problems[index], ctx, row, debug_rows, run, _row_text(row),
                        batch_tail.notes(index), two_stage, discarded,
                    )  # fmt: skip
                except TunerError as exc:
                    yield index, exc
        if exited:
            return
        time.sleep(BATCH_POLL_S)


def unfinished(batch_tail: BatchTail, run: Run, out: Path) -> Iterator[tuple[int, TunerError]]:
    """The configs that got no row: the tool's own verdict from `.state`, else the failure
    for the first (it was running when the tool stopped), NotRun for the rest."""
    states = _config_states(out)
    usage = usage_error(run)
    if usage is not None:  # the call's own fault, the same for every config: none retried
        for index in batch_tail.missing():
            yield index, usage
        return
    if _refused(batch_tail, run, states):
        last = last_error_line(run.stderr)
        refused = BatchRefused(
            f"tuningRunner failed its batch of {len(batch_tail.problems)} before tuning any "
            f"config (exit status {run.returncode}" + (f": {last}" if last else "") + ")",
            detail=tail(run.stderr),
        )
        for index in batch_tail.missing():
            yield index, refused
        return
    blamed = False
    for index in batch_tail.missing():
        problem = batch_tail.problems[index]
        state = states.get(problem.canonical())
        if state is not None:
            yield index, _state_error(state, run)
        elif not blamed:
            blamed = True
            yield index, _batch_failure(run, out, batch_tail.timed_out)
        else:
            yield (
                index,
                NotRun(
                    "the batch's tuningRunner stopped before it tuned this config",
                    detail=tail(run.stderr),
                ),
            )


def _refused(batch_tail: BatchTail, run: Run, states: dict[str, str]) -> bool:
    """Whether the tool failed a batch as a whole before tuning any of it: it exited with an
    error of its own (not a signal, not our timeout) and wrote no row and no config's state,
    as rocMLIR's tuningRunner does for a config line its parser rejects."""
    return (
        len(batch_tail.problems) > 1
        and run.returncode > 0
        and batch_tail.timed_out is None
        and not batch_tail.wrote_rows
        and not states
    )


def _row_text(row: tuningdb.TuningRow) -> str:
    """What a batch's job keeps as the tool's output: its own row."""
    fields = (
        *(row.arch, row.num_cu, row.num_chiplets, row.test_vector, row.perf_config),
        *(row.tflops, row.tuning_space, row.commit_id, row.timestamp, row.duration_s),
    )
    return "\t".join("" if f is None else str(f) for f in fields) + "\n"


class BatchTail:
    """Follows a batch's output and `.debug` files while the tool writes them.

    The tool tunes the configs one after the other and, for each, writes its result row and
    then its `.debug` rows (a failed config writes neither). A block is a run of `.debug` rows
    with the same problem columns; a row's candidates are the block whose columns name the row's
    problem (debugfile.matches: the rows name no test vector), never merely the k-th. Row k's
    block is complete once row k+1 was seen before the `.debug` file was read, a block k+1
    has begun, or the tool has exited. Rows are matched to problems by their key in the stored
    form (problems.stored_vector: the plain part, E4's gemm `-transO false` dropped); a row that
    names no problem of the batch is never recorded. Each file is read from where the last
    poll stopped, whole lines only: a poll costs what the tool wrote since, not the file so far.

    `driver`: E4's driver lines from stderr, in order (TailReader). Which candidates were
    Discarded is read from the lines of the block's own config: the first run of lines, after
    the previous block's, with the block's perf configs (driver_segment). A failed config's
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
        self._index = {p.canonical(): i for i, p in enumerate(problems)}  # stored form
        self._rows: list[tuple[int | None, tuningdb.TuningRow]] = []
        self._blocks: list[list[DebugRow]] = []
        self._owners: list[int | None] = []  # per block: the problem its columns name
        self._used: set[int] = set()  # blocks handed out
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

    def poll(self, exited: bool) -> list[ReadyRow]:
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
            index, row = self._rows[k]
            b = self._block_of(index, k)
            block = None if b is None else self._blocks[b]
            discarded = self._discarded(block, exited)
            if discarded is None:
                break  # its driver lines are still in the pipe
            self._next += 1
            if b is not None:
                self._used.add(b)
            if index is None or index in self.done:
                continue
            self.done.add(index)
            ready.append((index, row, block, discarded))
        return ready

    def _block_of(self, index: int | None, k: int) -> int | None:
        """Which block holds row k's candidates: the one whose problem columns name the row's
        problem; the k-th only where the columns cannot tell (no column this reader compares).
        It is marked used only once the row is handed out."""
        if index is not None:
            for b, owner in enumerate(self._owners):
                if owner == index and b not in self._used:
                    return b
        if k < len(self._blocks) and self._owners[k] is None and k not in self._used:
            return k
        return None

    def _owner(self, block: list[DebugRow]) -> int | None:
        """The problem of the batch a block's columns name, when exactly one does."""
        named = [i for i, p in enumerate(self.problems) if matches(p, block[0].problem)]
        return named[0] if len(named) == 1 else None

    @property
    def wrote_rows(self) -> bool:
        """Whether the tool wrote any result row (a problem of the batch's or not)."""
        lines = self._out_lines
        return bool(self._rows) or any(line.strip() and line[0] != "#" for line in lines)

    def missing(self) -> list[int]:
        """The problems that got no row, in the order the tool was given them."""
        return [i for i in range(len(self.problems)) if i not in self.done]

    def notes(self, index: int) -> list[str]:
        return self._notes.pop(index, [])

    def _discarded(self, block: list[DebugRow] | None, exited: bool) -> set[str] | None:
        """The block's Discarded perf configs; None: wait, its driver lines may be on the way."""
        if self._driver is None or not block or block[0].status is not None:
            return set()  # E4's Status column says it per candidate (debug_candidates)
        at = driver_segment(self._driver, self._driver_at, block)
        if at is None:
            moment = time.monotonic()
            self._waiting_since = self._waiting_since or moment
            if not exited and moment - self._waiting_since < DRIVER_LINES_GRACE_S:
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
            with process.open_output(path) as f:  # never through a link
                f.seek(self._offsets[path])
                data = f.read(POLL_READ_BYTES)
        except (OSError, TunerError):
            return []
        end = data.rfind(b"\n") + 1
        if not end and len(data) == POLL_READ_BYTES:  # a line past any row's length: skipped
            end = len(data)
        self._offsets[path] += end
        return data[:end].decode("utf-8", errors="replace").splitlines(keepends=True)

    def _read_rows(self) -> None:
        try:
            rows = tuningdb.parse_tuning_db(self._out_lines, str(self.out)).rows
        except InputError:
            return  # a malformed file: its configs end as unfinished, with the tool's status
        for row in rows[len(self._rows) :]:
            # The row's key as the tool canonicalized it, back in the stored form: a row for a
            # config the batch did not ask for (E4's `-transO true` twin) matches no job.
            index = self._index.get(problems.stored_vector(row.test_vector))
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
                self._owners.append(self._owner([row]))


def driver_segment(lines: list[tuple[str, str]], start: int, block: list[DebugRow]) -> int | None:
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
    raw = process.read_output(out.with_name(out.name + ".state"), STATE_CAP_BYTES)
    try:
        data = json.loads(raw or b"{}")
        return {
            problems.stored_vector(vector): state
            for context in data.get("contexts", {}).values()
            for vector, state in context.items()
            if isinstance(state, str)
        }
    except (ValueError, AttributeError, InputError, RecursionError):
        return {}


def _state_error(state: str, run: Run) -> TunerError:
    """A batch's config the tool recorded as failed in `.state`."""
    if state == GPU_TIMED_OUT:
        return TunerError(
            "GPU run timed out (tuningRunner state gpu_timed_out, driver exit status 3)",
            detail=tail(run.stderr),
        )
    if state == "timed_out":
        return TunerTimeout(
            "tuningRunner's per-config --timeout fired (state timed_out)", detail=tail(run.stderr)
        )
    return TunerError(f"tuningRunner failed this config (state {state})", detail=tail(run.stderr))


def _batch_failure(run: Run, out: Path, timed_out: float | None) -> TunerError:
    """The config a batch's tool was on when it stopped early (killed, crashed, timed out)."""
    if timed_out is not None:
        return TunerTimeout(
            f"tuningRunner ran past the batch's timeout of {timed_out:g} s; killed its whole "
            "process group",
            detail=tail(run.stderr),
        )
    if run.returncode == 0:
        return TunerError(
            "tuningRunner exited 0 but wrote no result for this config", detail=tail(run.stderr)
        )
    return failure(run, out)
