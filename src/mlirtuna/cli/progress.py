"""What a person sees while workers run: a live bar with rate, ETA, errors and one line per worker.

`snapshot()` reads the state from the database (the workers are other processes); `render()` turns
a snapshot into Rich renderables, so both can be tested without a terminal.
"""

from __future__ import annotations

import time
from dataclasses import dataclass, field

import sqlalchemy as sa
from rich.console import Console, Group, RenderableType
from rich.live import Live
from rich.progress_bar import ProgressBar
from rich.table import Table
from rich.text import Text

import mlirtuna.cli.common as common
from mlirtuna.db import Database
from mlirtuna.db.models import RUNNING, TUNE, Attempt, Job, Problem
from mlirtuna.queue import jobs


@dataclass(frozen=True)
class Busy:
    """One worker and the problem it is on."""

    label: str
    test_vector: str


@dataclass(frozen=True)
class Snapshot:
    total: int
    done: int  # completed + error + cancelled: nothing more will happen to them
    completed: int
    errors: int
    elapsed_s: float
    busy: list[Busy] = field(default_factory=list)
    # A two-stage session: {stage: (done, total)} of its compile and benchmark jobs.
    stages: dict[str, tuple[int, int]] = field(default_factory=dict)

    @property
    def per_minute(self) -> float:
        return 60.0 * self.done_here / self.elapsed_s if self.elapsed_s > 0 else 0.0

    done_here: int = 0  # finished since this view started (the rate ignores earlier work)

    @property
    def eta_s(self) -> float | None:
        rate = self.per_minute / 60.0
        return (self.total - self.done) / rate if rate > 0 else None


def snapshot(db: Database, session_id: int, started: float, done_before: int) -> Snapshot:
    counts = jobs.counts(db, session_id)[session_id]
    done = _done(counts)
    by_stage = jobs.stage_counts(db, session_id)
    stages = {}
    if set(by_stage) - {TUNE}:
        stages = {stage: (_done(c), sum(c.values())) for stage, c in by_stage.items()}
    with db.session() as s:
        rows = s.execute(
            sa.select(Job.machine_name, Job.gpu_id, Attempt.pid, Problem.test_vector, Job.stage)
            .join(Problem, Problem.id == Job.problem_id)
            .join(Attempt, Attempt.lease_token == Job.lease_token)
            .where(Job.session_id == session_id, Job.state == RUNNING)
            .order_by(Job.gpu_id, Attempt.pid)
        ).all()
    busy = [Busy(_label(r.gpu_id, r.pid, r.stage), r.test_vector) for r in rows]
    return Snapshot(
        total=sum(counts.values()),
        done=done,
        completed=counts["completed"],
        errors=counts["error"],
        elapsed_s=time.monotonic() - started,
        busy=busy,
        done_here=max(done - done_before, 0),
        stages=stages,
    )


def _done(counts: dict[str, int]) -> int:
    return counts["completed"] + counts["error"] + counts["cancelled"]


def _label(gpu_id: int, pid: int, stage: str = TUNE) -> str:
    where = f"GPU {gpu_id}" if gpu_id >= 0 else f"cpu worker {pid}"
    return where if stage == TUNE else f"{where} ({stage})"


def render(snap: Snapshot) -> RenderableType:
    head = Table.grid(padding=(0, 1))
    head.add_row(
        ProgressBar(total=max(snap.total, 1), completed=snap.done, width=30),
        Text(f"{snap.done}/{snap.total} jobs"),
        Text(f"{snap.per_minute:.1f}/min"),
        Text(f"ETA {common.clock(snap.eta_s)}"),
        Text(f"{snap.errors} errors", style="red" if snap.errors else ""),
    )
    lines: list[RenderableType] = [head]
    if snap.stages:
        lines.append(Text("  " + ", ".join(f"{k} {d}/{t}" for k, (d, t) in snap.stages.items())))
    for b in snap.busy:
        lines.append(Text(f"  {b.label}: {b.test_vector}", overflow="ellipsis", no_wrap=True))
    return Group(*lines)


class LiveView:
    """A Rich Live display refreshed by `tick()`; off (silent) when `enabled` is False."""

    def __init__(self, db: Database, session_id: int, console: Console, enabled: bool) -> None:
        self.db, self.session_id, self.console, self.enabled = db, session_id, console, enabled
        self.started = time.monotonic()
        self.done_before = snapshot(db, session_id, self.started, 0).done
        self.last: Snapshot | None = None
        self._live = Live(console=console, auto_refresh=False, transient=False) if enabled else None

    def __enter__(self) -> LiveView:
        if self._live is not None:
            self._live.__enter__()
        return self

    def __exit__(self, *exc: object) -> None:
        if self._live is not None:
            self._live.__exit__(None, None, None)

    def tick(self) -> None:
        try:
            self.last = snapshot(self.db, self.session_id, self.started, self.done_before)
        except Exception:  # a display must never stop the run (the database may be restarting)
            return
        if self._live is not None:
            self._live.update(render(self.last), refresh=True)
