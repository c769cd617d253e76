"""What a tuner hands the queue: every candidate it tried and the winner (`TuneOutcome`).

A neutral leaf: the tuners write these, the queue records them (queue/settle.py) and neither
names the other. Plugins import them from `mlirtuna.tuners.base`, which re-exports them.
"""

from __future__ import annotations

import datetime as dt
from dataclasses import dataclass, field

from mlirtuna.stats import Margin, Spread


@dataclass(frozen=True)
class Candidate:
    """One perf config tried. `kernel_time_ns`/`tflops` are None when it was invalid (`error`)."""

    perf_config: str
    kernel_time_ns: float | None = None
    tflops: float | None = None
    error: str | None = None
    # The samples' statistics in ns where the tuner has them (kernel_time_ns is their median).
    spread: Spread | None = None
    remeasured: bool = False  # measured again in the top-k pass; these numbers are from it
    # The search pass's time (ns) of a re-measured candidate, which kernel_time_ns no longer
    # is; None: kernel_time_ns is the only time (stored as the candidate's search_time).
    search_time_ns: float | None = None
    # The round of a searched session's search that measured it (worker/search.py); None:
    # the tuner chose it (the whole space, not searched).
    search_round: int | None = None

    @property
    def valid(self) -> bool:
        return self.error is None and self.tflops is not None


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
    # Winner vs runner-up (relative times, and their noise); None with a single valid candidate.
    margin: Margin | None = None
