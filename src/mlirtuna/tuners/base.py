"""What every tuner takes and returns.

A tuner turns one problem into a list of candidates (every perf config it tried, with its kernel
time or the reason it was invalid) and a winner. It never touches the database: the worker records
the outcome through the queue's fenced record, so a tuner cannot half-write a job.
"""

from __future__ import annotations

import datetime as dt
from dataclasses import dataclass, field
from typing import Protocol

from mlirtuna.problems import Problem


@dataclass(frozen=True)
class Candidate:
    """One perf config tried. `kernel_time_ns`/`tflops` are None when it was invalid (`error`)."""

    perf_config: str
    kernel_time_ns: float | None = None
    tflops: float | None = None
    error: str | None = None

    @property
    def valid(self) -> bool:
        return self.error is None and self.tflops is not None


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
    # For a `list:NAME` space: the stored quick list for this problem's (arch, op, data type).
    perf_configs: tuple[str, ...] | None = None


@dataclass
class TuneOutcome:
    """The result of tuning one problem. `winner` is one of `candidates` and is valid."""

    candidates: list[Candidate]
    winner: Candidate
    output: str = ""  # the tool's own output, kept in job.result
    compile_start: dt.datetime | None = None  # UTC; set from the tuner's phases where it has them
    compile_end: dt.datetime | None = None
    notes: list[str] = field(
        default_factory=list
    )  # things worth logging (e.g. winner disagreement)


class Tuner(Protocol):
    """Turns a problem into candidates and a winner; raises TunerError on failure."""

    name: str

    def tune(self, problem: Problem, ctx: TuneContext) -> TuneOutcome: ...
