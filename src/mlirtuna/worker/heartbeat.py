"""The lease renewal of a worker: one long-lived thread extends every lease it holds."""

from __future__ import annotations

import contextlib
import logging
import threading
from collections.abc import Callable, Iterator

from mlirtuna import queue
from mlirtuna.db import Database
from mlirtuna.db.faults import first_line
from mlirtuna.queue import Lease

log = logging.getLogger(__name__)


class Heartbeat:
    """Extends the leases the worker holds every `interval` seconds, from one long-lived thread.

    `hold(lease)` (one job) or `hold_many(leases)` (a batch) makes leases current; `drop(lease)`
    ends one of them once its job is recorded. Each lease has its own `lost` event, set when a
    renewal finds that lease taken away (requeued, cancelled, or expired and claimed by another
    worker): a lost lease marks only its own job. One thread per worker, not one per job:
    starting a thread per job cost more than the job's own queue work.
    """

    def __init__(
        self,
        db: Database,
        lease_s: float,
        interval: float,
        on_lost: Callable[[Lease], None] | None = None,
    ) -> None:
        """`on_lost(lease)`: called from the heartbeat thread once a lease is found lost (the
        runner stops that job's tool)."""
        self.db, self.lease_s, self.interval = db, lease_s, interval
        self.on_lost = on_lost
        self._cv = threading.Condition()
        self._held: dict[int, tuple[Lease, threading.Event]] = {}
        self._claims = 0  # counts holds: a fresh claim restarts the interval, a drop does not
        threading.Thread(target=self._loop, daemon=True, name="heartbeat").start()

    def _loop(self) -> None:
        while True:
            with self._cv:
                self._cv.wait_for(lambda: bool(self._held))
                claims = self._claims

                def woken(claims: int = claims) -> bool:
                    return not self._held or self._claims != claims

                # Sleep one interval unless every job ends or a new claim arrives first.
                if self._cv.wait_for(woken, self.interval):
                    continue
                held = list(self._held.values())
            for lease, lost in held:
                if not lost.is_set():
                    self.renew(lease, lost)

    def renew(self, lease: Lease, lost: threading.Event) -> None:
        """Extend one lease now; set `lost` when it was taken away while its job still runs."""
        try:
            if not queue.heartbeat(self.db, lease, self.lease_s):
                with self._cv:
                    if not self._holds(lease):
                        return  # the job ended (and recorded) meanwhile
                log.warning("job %s: lease lost (taken over, requeued or cancelled)", lease.job_id)
                lost.set()
                if self.on_lost is not None:
                    self.on_lost(lease)
        except Exception as exc:  # the database may come back before the lease runs out
            log.warning("job %s: heartbeat failed: %s", lease.job_id, first_line(exc))

    @contextlib.contextmanager
    def hold(self, lease: Lease) -> Iterator[threading.Event]:
        with self.hold_many([lease]) as lost:
            yield lost[lease.job_id]

    @contextlib.contextmanager
    def hold_many(self, leases: list[Lease]) -> Iterator[dict[int, threading.Event]]:
        """Renew all these leases until the block ends (or `drop` ends one earlier); yields
        each job's `lost` event by job id. A lease already held (`add`: claimed ahead, e.g.
        prefetched) keeps its event, so a loss seen before the block still counts."""
        lost = self.add(leases)
        try:
            yield lost
        finally:
            with self._cv:
                for lease in leases:
                    self.drop_locked(lease)
                self._cv.notify_all()

    def add(self, leases: list[Lease]) -> dict[int, threading.Event]:
        """Start renewing these leases now, until `drop` (or a `hold_many` of them ends); each
        job's `lost` event by job id (the existing one for a lease already held)."""
        with self._cv:
            for lease in leases:
                if not self._holds(lease):
                    self._supersede(lease.job_id)
                    self._held[lease.job_id] = (lease, threading.Event())
            self._claims += 1
            self._cv.notify_all()
            return {lease.job_id: self._held[lease.job_id][1] for lease in leases}

    def _supersede(self, job_id: int) -> None:
        """Under _cv: the job is claimed again (its earlier lease ran out and was swept back,
        e.g. over a server restart): the earlier attempt's lease is lost, whoever still waits
        on it (a stream request fed under it) learns so now, not from a refused record."""
        if (earlier := self._held.get(job_id)) is not None:
            earlier[1].set()

    def renew_now(self, leases: list[Lease]) -> None:
        """Renew these held leases at once (not at the next interval): a lease lost meanwhile
        has its `lost` event set on return."""
        with self._cv:
            held = [self._held[lease.job_id] for lease in leases if self._holds(lease)]
        for lease, lost in held:
            if not lost.is_set():
                self.renew(lease, lost)

    def drop(self, lease: Lease) -> None:
        """Stop renewing one lease (its job is recorded, failed or given back)."""
        with self._cv:
            self.drop_locked(lease)
            self._cv.notify_all()

    def drop_locked(self, lease: Lease) -> None:
        if self._holds(lease):
            del self._held[lease.job_id]

    def _holds(self, lease: Lease) -> bool:
        held = self._held.get(lease.job_id)
        return held is not None and held[0].token == lease.token
