"""What every tuner takes and returns.

A tuner turns one problem into a list of candidates (every perf config it tried, with its kernel
time or the reason it was invalid) and a winner. It never touches the database: the worker records
the outcome through the queue's fenced record, so a tuner cannot half-write a job.
"""

from __future__ import annotations

from collections.abc import Iterator, Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Protocol, runtime_checkable

from mlirtuna.errors import TunerError

# What a tuner returns lives in a neutral leaf (the queue records it without naming a tuner);
# re-exported here, where tuners and plugins import it from.
from mlirtuna.formats.outcome import Candidate as Candidate
from mlirtuna.formats.outcome import TuneOutcome as TuneOutcome
from mlirtuna.problems import Problem


@dataclass(frozen=True)
class TuneContext:
    """Everything about where and how a job runs that a tuner may need."""

    arch: str  # bare chip name, e.g. gfx942
    arch_full: str  # with feature flags, e.g. gfx942:sramecc+:xnack-
    num_cu: int
    num_chiplets: int
    tuning_space: str  # quick | full | greedy | exhaustive | lfbo | smart | list:NAME
    gpu_id: int = 0  # -1 for a CPU worker
    timeout_s: float | None = None  # the job timeout; the tuner must stop by then
    mlir_build_dir: str | None = None
    cpu_mem_limit: int = 4 << 30  # bytes; cpu tuner refuses larger problems up front
    # Session settings tuningRunner E4 takes (None: not passed, the tool's default).
    rep_ms: int | None = None
    warmup_ms: int | None = None
    gpu_run_timeout_s: int | None = None
    lfbo_effort: str | None = None
    # For a `list:NAME` space: the stored quick list for this problem's (arch, op, data type);
    # for a searched session's round (SearchableTuner): exactly the configs to measure.
    perf_configs: tuple[str, ...] | None = None
    topk: int = 3  # candidates re-measured after the search to pick the winner (session.topk)


@dataclass(frozen=True)
class Compiled:
    """What one compile-only run left: its directory and the commit that compiled it."""

    directory: Path
    commit_id: str
    output: str  # the tool's stderr tail, kept as the compile job's text


# One tuned problem of a batch: its index in the batch and its outcome, or why it failed.
BatchItem = tuple[int, "TuneOutcome | TunerError"]
# One reply of a benchmark stream: the key its request was fed with, and its outcome or error.
StreamItem = tuple[str, "TuneOutcome | TunerError"]


@runtime_checkable
class Tuner(Protocol):
    """Turns a problem into candidates and a winner; raises TunerError on failure.

    Every tuner is one; the worker finds the others below by `isinstance`, never by `getattr`.
    """

    name: str

    def tune(self, problem: Problem, ctx: TuneContext) -> TuneOutcome: ...


@runtime_checkable
class SearchableTuner(Tuner, Protocol):
    """A tuner that can list a problem's candidates and measure the ones it is given: the
    worker can then run a search strategy (mlirtuna.search) over it, one round a `tune` call
    with `ctx.perf_configs` set to the round's configs (issue 45)."""

    def search_space(self, problem: Problem, ctx: TuneContext) -> list[str]:
        """Every perf config of `ctx.tuning_space` for this problem, in a stable order."""
        ...


@runtime_checkable
class BatchTuner(Tuner, Protocol):
    """A tuner that can tune several problems in one tool call (`worker --batch K`).

    `tune_many` yields each problem's (index, outcome or error) as soon as it is known, so the
    worker records a finished problem while the rest of the batch still runs.
    """

    def can_batch(self) -> bool:
        """Whether this build batches at all (rocMLIR: E3 and E4; E2 writes only at the end)."""
        ...

    def batchable(self, problem: Problem) -> bool:
        """Whether this problem can share a call with others of its op."""
        ...

    def tune_many(self, problems: Sequence[Problem], ctx: TuneContext) -> Iterator[BatchItem]: ...


@runtime_checkable
class SplitTuner(BatchTuner, Protocol):
    """A tuner whose work splits into compile (any host) and benchmark (the GPU) stages."""

    def check_split(self) -> None:
        """Raise Unsupported when this build cannot split (no compile-only mode)."""
        ...

    def compile(self, problem: Problem, ctx: TuneContext, dest: Path) -> Compiled: ...

    def compile_many(
        self, problems: Sequence[Problem], ctx: TuneContext, dest: Path
    ) -> list[Compiled | None]:
        """One compile call for several problems of one op (batchable), split into one
        Compiled per problem (None: not in the call's output). TunerError: the call failed;
        the worker then compiles each alone."""
        ...

    def benchmark(self, problem: Problem, ctx: TuneContext, artifacts: Path) -> TuneOutcome: ...

    def benchmark_many(
        self, problems: Sequence[Problem], ctx: TuneContext, artifacts: Path
    ) -> Iterator[BatchItem]: ...


@runtime_checkable
class BenchmarkStream(Protocol):
    """A long-lived benchmark process on one GPU (StreamingTuner.open_stream), started once and
    fed one bundle at a time; it benchmarks them one after the other, in the order fed.

    `feed` hands it a problem's unpacked bundle under a key (the caller's; one per attempt);
    `reply` waits up to `timeout` seconds for the next finished request: (key, outcome or
    error), or None when none finished yet. Both raise StreamBroken when the process is gone
    (exited, killed): what was fed and not replied to is lost with it. `close` stops the
    process (a hung one is killed) and removes its files.
    """

    def feed(self, key: str, problem: Problem, artifacts: Path) -> None: ...

    def reply(self, timeout: float) -> StreamItem | None: ...

    def close(self) -> None: ...


@runtime_checkable
class StreamingTuner(SplitTuner, Protocol):
    """A split tuner that can also keep one benchmark process per GPU alive and feed it bundles
    as they arrive (docs/architecture.md, "The benchmark stream"): no tool start-up per call."""

    def can_stream(self) -> bool:
        """Whether this build offers the stream at all (rocMLIR: a proposed --benchmark-stream)."""
        ...

    def streamable(self, problem: Problem) -> bool:
        """Whether this problem can go through the stream (else it is benchmarked alone)."""
        ...

    def open_stream(self, ctx: TuneContext) -> BenchmarkStream: ...
