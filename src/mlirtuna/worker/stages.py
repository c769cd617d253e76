"""The two stages of a split session's jobs, as a worker runs them (docs/architecture.md).

- compile (`mlirtuna worker --role compile`, any host with the build, no GPU): the tool's
  `--compile-only` for the session's target, the directory packed and stored as a bundle, then
  one fenced transaction completes the job, marks the bundle complete and makes the benchmark
  job claimable (bundles.finish_compile);
- benchmark (a GPU worker): the bundle fetched (size and hash checked), its commit checked
  against the session's, unpacked, the tool's `--benchmark-artifacts` run on this GPU, and the
  outcome recorded exactly as a one-stage job's, the bundle deleted in the same transaction
  (unless the session keeps artifacts).

The work runs while the worker's heartbeat holds the leases. `run` (one job) returns what
finishes the job, which the worker calls once the heartbeat let go, as for one-stage jobs;
`benchmark` yields each job's (lease, outcome, error, final) as it is known, which a batch
worker (`--batch K`: K bundles, one tool call) settles job by job.
"""

from __future__ import annotations

import dataclasses
import logging
import shutil
import tarfile
import tempfile
from collections.abc import Callable, Iterator
from pathlib import Path
from typing import TYPE_CHECKING

from mlirtuna.db.models import BENCHMARK, COMPILE
from mlirtuna.errors import TunerError
from mlirtuna.problems import Problem
from mlirtuna.queue import AlsoInTransaction, Lease, bundles
from mlirtuna.sessions import Session
from mlirtuna.tuners.base import TuneOutcome
from mlirtuna.tuners.rocmlir import index_commits, merge_artifacts

if TYPE_CHECKING:
    from mlirtuna.worker import Worker

log = logging.getLogger(__name__)
Finish = Callable[[], None]
# A job as the tool left it: (lease, outcome, error, final), what Worker._finish takes.
Settled = tuple[Lease, TuneOutcome | None, str | None, bool]


def run(worker: Worker, lease: Lease) -> Finish:
    """A compile or benchmark job's work; returns how to finish it."""
    if lease.stage == COMPILE:
        return compile_job(worker, lease)
    settled = list(benchmark(worker, [lease]))

    def finish() -> None:
        for done in settled:
            worker._finish(*done)  # recorded as a one-stage job's, or failed

    return finish


def compile_job(worker: Worker, lease: Lease) -> Finish:
    """Compile, pack and store (still invisible) while the lease is held; the returned finish
    makes the bundle visible with the job's completion, or fails the job."""
    problem = lease.problem or worker._retrying(lambda: worker._problem(lease.problem_id))
    session = worker.session
    tmp = Path(tempfile.mkdtemp(prefix="mlirtuna-compile-"))
    try:

        def build() -> bundles.Packed:
            compiled = worker.tuner.compile(problem, worker._context(problem), tmp / "bundle")
            bundles.check_commit(compiled.commit_id, session.mlir_v, f"job {lease.job_id}'s bundle")
            packed = bundles.pack(compiled.directory, tmp / "bundle.tar.gz", compiled.commit_id)
            log.info(
                "job %s: compiled %s (%d bytes)", lease.job_id, problem.canonical(), packed.size
            )
            return packed

        packed, error, final = worker._guarded(lease, build)
        bundle_id = None
        if packed is not None:
            bundle_id = worker._retrying(
                lambda: bundles.store(worker.db, lease, packed, session.artifact_store)
            )
    finally:
        shutil.rmtree(tmp, ignore_errors=True)

    def finish() -> None:
        if error is not None:
            worker._fail(lease, error, final)
        elif bundle_id is None:
            worker.stats.lost += 1  # the lease went while the bundle was stored
        elif worker._retrying(
            lambda: bundles.finish_compile(worker.db, lease, bundle_id, "compiled; bundle stored")
        ):
            worker.stats.completed += 1
            log.info(
                "job %s: completed, bundle %s ready for its benchmark", lease.job_id, bundle_id
            )
        else:
            worker.stats.lost += 1

    return finish


def benchmark(worker: Worker, leases: list[Lease]) -> Iterator[Settled]:
    """(lease, outcome, error, final) for each of these benchmark jobs, as each is known: their
    bundles fetched, checked and unpacked into one artifacts directory, then benchmarked on this
    worker's GPU. A job whose bundle is missing, damaged or of another commit fails at once."""
    tmp = Path(tempfile.mkdtemp(prefix="mlirtuna-benchmark-"))
    try:
        ready: list[tuple[Lease, Problem, Path]] = []
        for lease in leases:
            problem = lease.problem or worker._retrying(
                lambda le=lease: worker._problem(le.problem_id)
            )
            got = _unpacked(worker, lease, tmp / f"job-{lease.job_id}")
            if isinstance(got, str):
                yield lease, None, got, True
            else:
                ready.append((lease, problem, got))
        if not ready:
            return
        artifacts = tmp / "artifacts"
        merge_artifacts([directory for _, _, directory in ready], artifacts)
        if len(ready) == 1:
            lease, problem, _ = ready[0]
            log.info("job %s: benchmarking %s", lease.job_id, problem.canonical())
            yield (
                lease,
                *worker._guarded(
                    lease,
                    lambda: worker.tuner.benchmark(problem, worker._context(problem), artifacts),
                ),
            )
            return
        # One tool call for every bundle (one start-up, the GPU busy meanwhile), each job
        # settled as its row appears, through the worker's batch code.
        group = [dataclasses.replace(lease, problem=problem) for lease, problem, _ in ready]
        yield from worker._tune_many(
            group, lambda problems, ctx: worker.tuner.benchmark_many(problems, ctx, artifacts)
        )
    finally:
        shutil.rmtree(tmp, ignore_errors=True)


def _unpacked(worker: Worker, lease: Lease, dest: Path) -> Path | str:
    """The job's bundle unpacked at `dest`, or why it cannot be benchmarked (a bundle that is
    damaged or of another commit is removed, so that `jobs requeue` compiles it again)."""
    try:
        fetched = worker._retrying(
            lambda: bundles.fetch(worker.db, lease.session_id, lease.problem_id)
        )
    except bundles.BundleMissing as exc:
        return str(exc)
    try:
        bundles.unpack(fetched.data, dest)
        for commit in index_commits(dest) | {fetched.commit_id}:
            bundles.check_commit(commit, worker.session.mlir_v, f"bundle {fetched.bundle_id}")
    except (TunerError, tarfile.TarError) as exc:
        worker._retrying(lambda: bundles.delete(worker.db, fetched.bundle_id))
        return f"{exc}"
    return dest


def record_with(session: Session, lease: Lease) -> tuple[AlsoInTransaction | None, Callable]:
    """What a job's record also does, and what follows its commit: a benchmark job deletes its
    bundle in the same transaction (its file, if any, once committed), unless the session keeps
    artifacts."""
    if lease.stage != BENCHMARK or session.keep_artifacts:
        return None, _nothing
    removed: list[str | None] = []
    also = bundles.delete_with(lease.session_id, lease.problem_id, removed)
    return also, lambda: bundles.remove_files(removed)


def _nothing() -> None:
    return None


__all__ = ["benchmark", "compile_job", "record_with", "run"]
