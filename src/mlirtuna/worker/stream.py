"""A split session's GPU worker with a benchmark stream: the GPU never waits for a tool start-up.

Where the tuner is a StreamingTuner whose build offers the stream (rocMLIR: the proposed
`--benchmark-stream`, docs/formats.md), the GPU worker starts ONE benchmark process for its
GPU before its first claim and keeps it for its whole life. It keeps up to `depth` jobs fed
ahead: each claimed job's bundle is fetched, checked and unpacked (stages.prepare), its lease
renewed, and only then fed; the process benchmarks them one at a time, in order, so while job N
benchmarks, job N+1 waits inside the process and job N+2 is claimed and unpacked here. Each job
is recorded (or failed) as its reply arrives, through the runner as any benchmark job.

Leases: every held job is renewed by the worker's one Heartbeat from its claim. A job whose
lease is lost before it is fed is never fed; one lost after is benchmarked, but its reply is
discarded and nothing recorded (counted as lost). Each request is keyed by its attempt (job id
and lease token), not by its job: a job whose lease was lost (a server restart outlasting the
lease) and that this worker claimed again is fed again under its new attempt's key, and the
stream answers both; the old attempt's reply is dropped, the new one's recorded (issue 43 §2).

No job is held without progress past its expected time: the request at the head has the job
timeout and its grace from the reply before it (else the stream hung), and since requests are
answered in order, a reply to a later request means the ones fed before it were skipped: they
fail (a retry counted) at once. The stream dying (exit, kill, a feed that fails) or hanging
ends the jobs in flight as a tool crash ends a batch's: the one it was on fails (a retry
counted), the ones fed behind it are given back (no retry counted); then the process is
started again. A stream that exits before answering anything never worked on this host (a GPU
it cannot open, a build without the flag's runtime): the worker benchmarks in calls from then
on, and the jobs it had fed are benchmarked that way, no retry counted. A stopping worker feeds
nothing more, gives back what it claimed but did not feed, and waits for the replies of what it
fed (a second signal gives those back too).
"""

from __future__ import annotations

import collections
import logging
import threading
import time
from collections.abc import Callable
from dataclasses import dataclass

import mlirtuna.worker.stages as stages
from mlirtuna.errors import DatabaseError, StreamBroken, TunerError, Unsupported
from mlirtuna.queue import Lease
from mlirtuna.tuners.base import BenchmarkStream, StreamingTuner, TuneOutcome
from mlirtuna.worker.runner import RELEASE, GiveBack, Runner, error_text, grace_s

log = logging.getLogger(__name__)

STREAM_DEPTH = 3  # jobs fed ahead at most: the one benchmarking and two waiting in the process
REPLY_WAIT_S = 0.1  # how long one wait for a reply lasts while more could be claimed
RESTART_PAUSE_S = 1.0  # before a stream that died is started again


@dataclass
class Fed:
    """A job fed to the stream: its lease, that lease's lost event, its unpacked bundle."""

    lease: Lease
    lost: threading.Event
    prepared: stages.Prepared
    key: str


class Streamer:
    """Runs a GPU worker's benchmark jobs through one long-lived stream (see the module doc).

    `claim(n)`: up to n jobs claimed now, never waiting; `idle()`: called when nothing is in
    flight and nothing was claimable, waits a little and says whether to go on."""

    def __init__(
        self,
        runner: Runner,
        tuner: StreamingTuner,
        claim: Callable[[int], list[Lease]],
        idle: Callable[[], bool],
        depth: int = STREAM_DEPTH,
    ) -> None:
        self.runner, self.tuner, self._claim, self._idle = runner, tuner, claim, idle
        self.depth = max(1, depth)
        self.stream: BenchmarkStream | None = None
        self.inflight: collections.deque[Fed] = collections.deque()
        self.alone: list[Lease] = []  # claimed jobs the stream cannot take (benchmarked alone)
        self.restarts = 0
        self._since = time.monotonic()  # when the job at the head of the stream began
        self._answered = False  # whether the stream now running answered any request of ours
        self.in_calls = False  # the stream exited before answering: benchmark in calls

    @property
    def stopping(self) -> bool:
        return self.runner.stop_requested.is_set()

    def run(self) -> bool:
        """Run until stopped or done; False when the stream could not be started at all, or
        exited before answering anything (what it had been fed is settled by then): the worker
        goes on in the batch path."""
        try:
            self._open()
        except TunerError as exc:
            log.warning("cannot start the benchmark stream (%s); benchmarking in calls",
                        error_text(exc).splitlines()[0])  # fmt: skip
            return False
        try:
            self._loop()
        except GiveBack:
            self.runner.stop_requested.set()
            self._close()
            self._give_back("given back by a stopping worker")
        except DatabaseError:
            self._close()
            self._give_back("the worker stopped on a database error")
            raise
        finally:
            self._close()
            self.runner.current = None
        return not self.in_calls

    def _loop(self) -> None:
        while True:
            if self.stream is None and not self.stopping and not self.in_calls:
                self._reopen()
            if not self.stopping and self.stream is not None:
                self._fill()
            if not self.inflight:
                self.runner.current = None
                if self.alone:
                    self._run_alone()
                    continue
                if self.in_calls or self.stopping or not self._idle():
                    return
                continue
            self.runner.current = self.inflight[0].lease
            self._collect()

    # -- the process --------------------------------------------------------------------------
    def _open(self) -> None:
        """Start the stream (before the first claim, and again after it died)."""
        self.stream = self.tuner.open_stream(self.runner.context())
        self._since = time.monotonic()
        self._answered = False
        log.info("benchmark stream started on GPU %s", self.runner.settings.gpu_id)

    def _reopen(self) -> None:
        """Start it again after it died; where it cannot start, benchmark in calls."""
        try:
            self._open()
        except TunerError as exc:
            log.warning("cannot start the benchmark stream again (%s); benchmarking in calls",
                        error_text(exc).splitlines()[0])  # fmt: skip
            self.in_calls = True

    def _close(self) -> None:
        if self.stream is not None:
            stream, self.stream = self.stream, None
            stream.close()

    # -- feeding ------------------------------------------------------------------------------
    def _fill(self) -> None:
        """Claim, unpack and feed jobs until `depth` are in flight or none is claimable."""
        while len(self.inflight) < self.depth and not self.alone and not self.stopping:
            leases = self._claim(self.depth - len(self.inflight))
            if not leases:
                return
            for i, lease in enumerate(leases):
                if self.stream is None:  # it broke while this claim was fed: the rest go back
                    self.runner.give_back(leases[i:], "not fed: the benchmark stream stopped")
                    return
                self._feed(lease)

    def _feed(self, lease: Lease) -> None:
        runner = self.runner
        lost = runner.heartbeat.add([lease])[lease.job_id]
        prepared = stages.prepare(runner, [lease])
        if prepared.failed:  # bundle missing, damaged or of another commit
            prepared.discard()
            runner.heartbeat.drop(lease)
            runner.settle(*prepared.failed[0])
            return
        _, problem, directory = prepared.ready[0]
        if self.stopping:  # claimed, not fed: back untouched
            self._drop(lease, prepared)
            runner.give_back([lease], "given back by a stopping worker")
            return
        if not self.tuner.streamable(problem):
            prepared.discard()
            self.alone.append(lease)
            return
        runner.heartbeat.renew_now([lease])
        if lost.is_set():
            self._drop(lease, prepared)
            runner.stats.lost += 1
            log.warning("job %s: lease lost before it was fed; not benchmarked", lease.job_id)
            return
        if not self.inflight:
            self._since = time.monotonic()
        fed = Fed(lease, lost, prepared, request_key(lease))
        self.inflight.append(fed)  # before the feed: a broken stream settles it with the rest
        assert self.stream is not None
        try:
            self.stream.feed(fed.key, problem, directory)
        except StreamBroken as exc:  # its stdin is closed: the process is gone
            self._broken(exc, exited=True)
            return
        log.info("job %s: fed to the benchmark stream (%s)", lease.job_id, problem.canonical())

    def _drop(self, lease: Lease, prepared: stages.Prepared) -> None:
        prepared.discard()
        self.runner.heartbeat.drop(lease)

    # -- replies ------------------------------------------------------------------------------
    def _collect(self) -> None:
        """Wait for the next reply (briefly while more could be fed) and settle its job."""
        assert self.stream is not None
        full = len(self.inflight) >= self.depth or self.stopping or bool(self.alone)
        timeout = self.runner.job_timeout_s
        deadline = self._since + timeout + grace_s(timeout)
        wait = min(1.0 if full else REPLY_WAIT_S, max(deadline - time.monotonic(), 0.0))
        try:
            item = self.stream.reply(wait)
        except StreamBroken as exc:
            self._broken(exc, exited=True)
            return
        if item is None:
            if time.monotonic() >= deadline:
                why = f"timed out after {timeout:g} s (the worker stopped the benchmark stream)"
                self._broken(StreamBroken(why))
            return
        key, result = item
        fed = next((f for f in self.inflight if f.key == key), None)
        if fed is None:
            return
        self._answered = True
        self._skipped(fed)
        self.inflight.remove(fed)
        self._since = time.monotonic()
        self._drop(fed.lease, fed.prepared)
        if fed.lost.is_set():
            self.runner.stats.lost += 1
            log.warning(
                "job %s: lease lost while it benchmarked; reply discarded", fed.lease.job_id
            )
            return
        outcome, error, final = _settled(result)
        self.runner.settle(fed.lease, outcome, error, final)

    def _skipped(self, answered: Fed) -> None:
        """Fail the requests fed before the one answered: replies come in order, so theirs
        will never come, and holding them would heartbeat jobs that make no progress."""
        while self.inflight and self.inflight[0] is not answered:
            fed = self.inflight.popleft()
            self._drop(fed.lease, fed.prepared)
            if fed.lost.is_set():
                self.runner.stats.lost += 1
                continue
            why = f"the benchmark stream answered {answered.key} first and never this request"
            self.runner.settle(fed.lease, None, why, False)

    def _broken(self, exc: StreamBroken, exited: bool = False) -> None:
        """The stream died or hung: the job it was on fails (a retry counted, as a tool crash),
        the ones fed behind it go back; the next loop starts it again. `exited`: the process
        is gone; before it answered anything, the worker benchmarks in calls instead."""
        why = error_text(exc)
        log.warning("benchmark stream: %s", why.splitlines()[0])
        self._close()
        if exited and not self._answered and not self.stopping:
            self._to_calls()
            return
        self.restarts += 1
        first = True
        while self.inflight:
            fed = self.inflight.popleft()
            self._drop(fed.lease, fed.prepared)
            if fed.lost.is_set():
                self.runner.stats.lost += 1
            elif first:
                self.runner.settle(fed.lease, None, why, False)
            else:
                self.runner.settle(
                    fed.lease, None, f"not benchmarked: its stream stopped ({why.splitlines()[0]})",
                    RELEASE,
                )  # fmt: skip
            first = False
        if not self.stopping:
            self.runner.stop_requested.wait(RESTART_PAUSE_S)

    def _to_calls(self) -> None:
        """The stream exited before answering anything: what was fed is benchmarked alone (in
        calls, no retry counted: the stream, not the job, failed), and so is everything else."""
        log.warning("the benchmark stream exited before answering any request; benchmarking "
                    "in calls (one --benchmark-artifacts call per job) from now on")  # fmt: skip
        self.in_calls = True
        while self.inflight:
            fed = self.inflight.popleft()
            fed.prepared.discard()
            if fed.lost.is_set():
                self.runner.heartbeat.drop(fed.lease)
                self.runner.stats.lost += 1
            else:
                self.alone.append(fed.lease)  # still held: its call renews the same lease

    def _run_alone(self) -> None:
        """A job the stream cannot take, once nothing is in flight (one benchmark at a time on
        this GPU): its own --benchmark-artifacts call."""
        lease = self.alone.pop(0)
        if self.stopping:
            self.runner.heartbeat.drop(lease)
            self.runner.give_back([lease], "given back by a stopping worker")
            return
        self.runner.work(lease, lambda held: stages.run(self.runner, held))

    def _give_back(self, why: str) -> None:
        leases = [fed.lease for fed in self.inflight] + self.alone
        for fed in self.inflight:
            self._drop(fed.lease, fed.prepared)
        for lease in self.alone:
            self.runner.heartbeat.drop(lease)
        self.inflight.clear()
        self.alone = []
        self.runner.give_back(leases, why)


def request_key(lease: Lease) -> str:
    """A request's key: its attempt (the lease token), not its job, so that a reply to an
    attempt whose lease was lost is never taken for the next attempt's (docs/formats.md)."""
    return f"job-{lease.job_id}-{lease.token}"


def _settled(result: TuneOutcome | TunerError) -> tuple[TuneOutcome | None, str | None, bool]:
    if isinstance(result, TunerError):
        return None, error_text(result), isinstance(result, Unsupported)
    return result, None, False


__all__ = ["STREAM_DEPTH", "Fed", "Streamer", "request_key"]
