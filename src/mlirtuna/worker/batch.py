"""A claimed batch's run (`worker --batch K`): the jobs the tuner can batch (rocmlir on E3/E4
builds) in one tool call per op, every other job alone, each job settled as its outcome arrives
(docs/architecture.md, "Batches").

Built on the runner's public API (runner.py: the heartbeat, the job timeout, settling):
- `work(runner, leases, run)`: run a batch's work under the heartbeat, settle each job;
- `tune(runner, leases)`: a one-stage batch's work (the loop hands it to `work`);
- `tune_many(runner, group, call, alone)`: one tool call for a group, each job's Settled as the
  tool writes it (also a split session's benchmark call, stages.py);
- `batchable(runner, problem)`: whether the tuner takes a problem in a call with others.
"""

from __future__ import annotations

import contextlib
import dataclasses
import logging
import time
from collections.abc import Callable, Generator, Iterator, Sequence
from typing import TypeVar

from mlirtuna.db.faults import first_line
from mlirtuna.errors import BatchRefused, DatabaseError, NotRun, TunerError, Unsupported
from mlirtuna.problems import Problem
from mlirtuna.queue import Lease
from mlirtuna.tuners.base import BatchItem, TuneContext, TuneOutcome
from mlirtuna.worker.runner import (
    RELEASE,
    Final,
    GiveBack,
    JobTimedOut,
    Runner,
    Settled,
    alarm,
    error_text,
    grace_s,
)

log = logging.getLogger(__name__)
T = TypeVar("T")
#: A batch's work by its stage (batch.tune, stages.benchmark): each job's Settled as it is known.
BatchWork = Callable[[list[Lease]], Generator[Settled, None, None]]


def work(runner: Runner, leases: list[Lease], run: BatchWork) -> None:
    """Run a claimed batch (`run`: its stage's work), settling each job (record, fail or
    give back) as its outcome arrives; a second stop signal gives back every job not
    settled yet."""
    runner.current = leases[0]
    pending = {lease.job_id: lease for lease in leases}
    try:
        # closing: a give-back stops the tool before the jobs are given back.
        with (
            runner.heartbeat.hold_many(leases) as lost,
            runner.tools_for(leases),
            contextlib.closing(run(leases)) as outcomes,
        ):
            for lease, outcome, error, final in outcomes:
                runner.heartbeat.drop(lease)
                runner.tool_done(lease)
                if lost[lease.job_id].is_set():
                    runner.stats.lost += 1  # another worker has it now: record nothing
                else:
                    runner.settle(lease, outcome, error, final)
                pending.pop(lease.job_id)
    except GiveBack:
        runner.stop_requested.set()
        runner.give_back(pending.values(), "given back by a stopping worker")
    except DatabaseError:
        runner.give_back(pending.values(), "the worker stopped on a database error")
        raise
    finally:
        runner.current = None


def tune(runner: Runner, leases: list[Lease]) -> Generator[Settled, None, None]:
    """(lease, outcome, error, final) for each job, as each is known: the jobs the tuner
    can batch in one call per op, every other one alone."""
    groups: dict[str, list[Lease]] = {}
    alone: list[Lease] = []
    for lease in leases:
        problem = runner.problem(lease)
        lease = dataclasses.replace(lease, problem=problem)
        if batchable(runner, problem):
            groups.setdefault(problem.op, []).append(lease)
        else:
            alone.append(lease)
    for group in groups.values():
        if len(group) > 1 and runner.batch_tuner is not None:  # always, when batchable
            yield from tune_many(runner, group, runner.batch_tuner.tune_many)
        else:
            alone.extend(group)
    for lease in alone:
        yield runner.tune(lease)


def batchable(runner: Runner, problem: Problem) -> bool:
    """Whether the runner's tuner tunes (or compiles) this problem in a call with others."""
    if runner.batch_tuner is None or runner.session.search is not None:
        return False  # a searched job measures in rounds of its own (worker/search.py)
    try:
        return bool(runner.batch_tuner.batchable(problem))
    except TunerError:
        return False  # tuned alone, where the failure is the job's own


def tune_many(
    runner: Runner,
    group: list[Lease],
    call: Callable[[Sequence[Problem], TuneContext], Iterator[BatchItem]],
    alone: Callable[[Lease], Settled] | None = None,
) -> Generator[Settled, None, None]:
    """One tool call for the group (`call(problems, ctx)`: a BatchTuner's tune_many, or a
    split session's benchmark_many, stages.py): each job's outcome as the tool writes it.
    The worker's alarm for the call is the job timeout times the batch size; when it fires,
    or the tuner fails as a whole, the job the tool was on fails and the ones not begun are
    given back. When the tool refused the whole call before tuning any of it (BatchRefused:
    one config it cannot parse), each job is tuned alone (`alone`, by default `runner.tune`) in
    the same attempt: no retry is counted against the innocent ones."""
    refused: list[Lease] = []
    yield from _tune_group(runner, group, call, refused)
    if refused:
        log.warning("jobs %s: the batch's tool refused the call; tuning each alone",
                    _ids(refused))  # fmt: skip
    for lease in refused:
        yield (alone or runner.tune)(lease)


def _tune_group(
    runner: Runner,
    group: list[Lease],
    call: Callable[[Sequence[Problem], TuneContext], Iterator[BatchItem]],
    refused: list[Lease],
) -> Generator[Settled, None, None]:
    """tune_many's one call; the jobs of a call refused as a whole go to `refused`."""
    try:
        ctx = runner.context(group[0].problem)
    except TunerError as exc:
        for lease in group:
            yield lease, None, error_text(exc), False
        return
    timeout = runner.job_timeout_s * len(group)
    deadline = time.monotonic() + timeout + grace_s(timeout)
    log.info("jobs %s: tuning %d problems in one call", _ids(group), len(group))
    left = list(group)
    with _closing(call([runner.problem(lease) for lease in group], ctx)) as outcomes:
        while left:
            try:
                with alarm(max(deadline - time.monotonic(), 0.001)):
                    item = next(outcomes, None)
            except JobTimedOut:
                why = f"timed out after {timeout:g} s (the worker stopped the tuner)"
                yield from _unfinished(left, why)
                return
            except TunerError as exc:  # the call as a whole: each job, as K=1 would
                for lease in left:
                    yield lease, None, error_text(exc), isinstance(exc, Unsupported)
                return
            except Exception as exc:  # a tuner bug must cost one attempt, not the jobs
                log.exception("jobs %s: tuner crashed", _ids(left))
                for lease in left:
                    yield lease, None, f"tuner crashed: {type(exc).__name__}: {exc}", False
                return
            if item is None:
                for lease in left:
                    yield lease, None, "the tuner gave no outcome for it", False
                return
            lease = group[item[0]]
            left.remove(lease)
            if isinstance(item[1], BatchRefused):
                refused.append(lease)
            else:
                yield (lease, *_batch_outcome(item[1]))


def _batch_outcome(
    result: TuneOutcome | TunerError,
) -> tuple[TuneOutcome | None, str | None, Final]:
    """(outcome, error, final) of one job of a batch; final RELEASE for a job not tuned."""
    if isinstance(result, NotRun):
        return None, error_text(result), RELEASE
    if isinstance(result, TunerError):
        return None, error_text(result), isinstance(result, Unsupported)
    return result, None, False


def _unfinished(left: list[Lease], why: str) -> Iterator[Settled]:
    """A batch stopped by the worker's alarm: the job the tool was on (the first not settled:
    it tunes in order) fails, the others go back."""
    for i, lease in enumerate(left):
        if i == 0:
            yield lease, None, why, False
        else:
            yield lease, None, f"not tuned: its batch stopped ({first_line(why)})", RELEASE


def _ids(leases: list[Lease]) -> str:
    return ",".join(str(lease.job_id) for lease in leases)


@contextlib.contextmanager
def _closing(items: Iterator[T]) -> Iterator[Iterator[T]]:
    """Close the tuner's outcomes when the batch ends early: a generator stops its tool then."""
    try:
        yield items
    finally:
        if isinstance(items, Generator):
            items.close()
