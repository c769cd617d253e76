"""The GPU worker's next batch, made ready while the current call benchmarks (issue 24 §1).

A split session's GPU worker with `--batch K` starts a `Prefetch` just before it runs batch N:
one thread claims batch N+1 (with the loop's full-batch wait) and fetches, checks and unpacks
its bundles (stages.prepare), so that call N+1 starts as soon as call N ends. Only the
claiming, the database reads and the unpacking overlap the GPU's work; the tool itself runs one
call at a time, so one GPU never runs two benchmarks.

The prefetched leases are held by the worker's one Heartbeat from the moment they are claimed
(the claim adds them). `take` hands the batch over: every lease is renewed at once, and a job
whose lease is lost (expired and taken over, requeued, cancelled) is dropped before it runs. A
stopping worker gives the prefetched jobs back (`give_back`: state new, no retry counted).

The tool's start-up is not overlapped: the stand-in and rocMLIR's E4 start the tool with its
bundle directory on the command line, so call N+1 cannot start before its bundles are chosen,
and a started tool cannot be told to wait for the GPU until call N ends (it would need a
streaming mode: docs/architecture.md, "Batches").
"""

from __future__ import annotations

import logging
import threading
import time
from collections.abc import Callable

import mlirtuna.worker.stages as stages
from mlirtuna.queue import Lease
from mlirtuna.worker.runner import Runner

log = logging.getLogger(__name__)


class Prefetch:
    """Batch N+1, claimed (`claim`) and prepared in a thread; `take` waits for it."""

    def __init__(
        self, runner: Runner, claim: Callable[[], list[Lease]], stop: threading.Event
    ) -> None:
        self.runner, self._claim, self._stop = runner, claim, stop
        self.leases: list[Lease] = []
        self.prepared: stages.Prepared | None = None
        self.error: BaseException | None = None
        self.ready_at: float | None = None  # time.time() when its bundles were unpacked
        self._thread = threading.Thread(target=self._run, daemon=True, name="prefetch")
        self._thread.start()

    def _run(self) -> None:
        try:
            self.leases = self._claim()
            if self.leases and not self._stop.is_set():
                self.prepared = stages.prepare(self.runner, self.leases)
                self.ready_at = time.time()
                log.info(
                    "jobs %s: prefetched (%d bundles unpacked while the current call runs)",
                    ",".join(str(lease.job_id) for lease in self.leases),
                    len(self.prepared.ready),
                )
        except BaseException as exc:  # handed to the loop by take()
            self.error = exc

    def take(self) -> tuple[list[Lease], stages.Prepared | None]:
        """The batch, once the thread is done: its live leases and their prepared bundles.
        Leases lost meanwhile are dropped (counted as lost); an error of the thread is raised
        after its leases were given back."""
        self._thread.join()
        if self.error is not None:
            self.give_back("the worker stopped on an error while prefetching")
            raise self.error
        if not self.leases:
            return [], None
        heartbeat = self.runner.heartbeat
        heartbeat.renew_now(self.leases)
        lost = heartbeat.add(self.leases)
        gone = {job for job, event in lost.items() if event.is_set()}
        for lease in self.leases:
            if lease.job_id in gone:
                heartbeat.drop(lease)
                self.runner.stats.lost += 1
                log.warning(
                    "job %s: lease lost while prefetched; dropped before it ran", lease.job_id
                )
        live = [lease for lease in self.leases if lease.job_id not in gone]
        if self.prepared is None:
            return live, None
        self.runner.stats.prefetched += 1
        return live, self.prepared.without(gone)

    def give_back(self, why: str = "given back by a stopping worker") -> None:
        """A stopping worker: release the prefetched jobs (state new, no retry counted)."""
        self._thread.join()
        for lease in self.leases:
            self.runner.heartbeat.drop(lease)
        self.runner.give_back(self.leases, why)
        if self.prepared is not None:
            self.prepared.discard()
        self.leases, self.prepared = [], None


__all__ = ["Prefetch"]
