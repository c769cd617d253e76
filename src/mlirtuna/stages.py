"""The two stages of a split session's jobs, as a worker runs them (docs/architecture.md).

- compile (`mlirtuna worker --role compile`, any host with the build, no GPU): the tool's
  `--compile-only` for the session's target, the directory packed and stored as a bundle, then
  one fenced transaction completes the job, marks the bundle complete and makes the benchmark
  job claimable (bundles.finish_compile);
- benchmark (a GPU worker): the bundle fetched (size and hash checked), its commit checked
  against the session's, unpacked, the tool's `--benchmark-artifacts` run on this GPU, and the
  outcome recorded exactly as a one-stage job's, the bundle deleted in the same transaction
  (unless the session keeps artifacts).

Each function does the work while the worker's heartbeat holds the lease and returns what
finishes the job, which the worker calls once the heartbeat let go (as for one-stage jobs).
"""

from __future__ import annotations

import logging
import shutil
import tempfile
from collections.abc import Callable
from pathlib import Path
from typing import TYPE_CHECKING

from mlirtuna import bundles
from mlirtuna.models import COMPILE
from mlirtuna.queue import Lease
from mlirtuna.tuners.rocmlir import index_commits

if TYPE_CHECKING:
    from mlirtuna.worker import Worker

log = logging.getLogger(__name__)
Finish = Callable[[], None]


def run(worker: Worker, lease: Lease) -> Finish:
    """A compile or benchmark job's work; returns how to finish it."""
    if lease.stage == COMPILE:
        return compile_job(worker, lease)
    return benchmark_jobs(worker, [lease])


def compile_job(worker: Worker, lease: Lease) -> Finish:
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


def benchmark_jobs(worker: Worker, leases: list[Lease]) -> Finish:
    """Benchmark the bundles of these jobs on this worker's GPU; each job is finished on its
    own (recorded, or failed) by what this returns."""
    finishes = [_benchmark_one(worker, lease) for lease in leases]

    def finish() -> None:
        for f in finishes:
            f()

    return finish


def _benchmark_one(worker: Worker, lease: Lease) -> Finish:
    problem = lease.problem or worker._retrying(lambda: worker._problem(lease.problem_id))
    session = worker.session
    tmp = Path(tempfile.mkdtemp(prefix="mlirtuna-benchmark-"))
    fetched = None
    try:
        try:
            fetched = worker._retrying(
                lambda: bundles.fetch(worker.db, lease.session_id, lease.problem_id)
            )
        except bundles.BundleMissing as exc:
            outcome, error, final = None, str(exc), True
        else:

            def measure():
                artifacts = tmp / "artifacts"
                bundles.unpack(fetched.data, artifacts)
                for commit in index_commits(artifacts) | {fetched.commit_id}:
                    bundles.check_commit(commit, session.mlir_v, f"bundle {fetched.bundle_id}")
                return worker.tuner.benchmark(problem, worker._context(problem), artifacts)

            log.info("job %s: benchmarking %s", lease.job_id, problem.canonical())
            outcome, error, final = worker._guarded(lease, measure)
    finally:
        shutil.rmtree(tmp, ignore_errors=True)

    def finish() -> None:
        if fetched is None or outcome is None:
            if fetched is not None and final:
                # Another commit's bundle (or one the tool refuses) can never be benchmarked
                # here: remove it, so that `jobs requeue` compiles it again.
                worker._retrying(lambda: bundles.delete(worker.db, fetched.bundle_id))
            worker._fail(lease, error, final)
            return
        removed: list[str | None] = []
        also = None
        if not session.keep_artifacts:
            also = bundles.delete_with([fetched.bundle_id], removed)
        before = worker.stats.completed
        worker._finish(lease, outcome, None, False, also=also)
        if worker.stats.completed > before:  # recorded: a file store's bundle goes last
            bundles.remove_files(removed)

    return finish


__all__ = ["benchmark_jobs", "compile_job", "run"]
