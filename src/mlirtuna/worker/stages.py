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
finishes the job, which the runner calls once the heartbeat let go, as for one-stage jobs;
`benchmark` yields each job's Settled as it is known, which a batch worker (`--batch K`: K
bundles, one tool call) settles job by job. Both are built on the runner's public API
(runner.py, batch.py) and call the tuner through the SplitTuner protocol.
"""

from __future__ import annotations

import dataclasses
import functools
import logging
import shutil
import tarfile
import threading
from collections.abc import Callable, Generator
from pathlib import Path

import mlirtuna.worker.batch as batch
from mlirtuna import machine
from mlirtuna.db.models import COMPILE
from mlirtuna.errors import DatabaseError, TunerError, Unsupported
from mlirtuna.problems import Problem
from mlirtuna.queue import Lease, bundles
from mlirtuna.tuners.base import Compiled, SplitTuner
from mlirtuna.worker.runner import Finish, GiveBack, Runner, Settled, error_text

MergeArtifacts = Callable[[list[Path], Path], None]
ArtifactCommits = Callable[[Path], set[str]]
CheckArtifacts = Callable[[Path], None]

log = logging.getLogger(__name__)


def run(runner: Runner, lease: Lease) -> Finish:
    """A compile or benchmark job's work; returns how to finish it."""
    if lease.stage == COMPILE:
        return compile_job(runner, lease)
    settled = list(benchmark(runner, [lease]))

    def finish() -> None:
        for done in settled:
            runner.settle(*done)  # recorded as a one-stage job's, or failed

    return finish


def compile_job(runner: Runner, lease: Lease) -> Finish:
    """Compile, pack and store (still invisible) while the lease is held; the returned finish
    makes the bundle visible with the job's completion, or fails the job."""
    problem = runner.problem(lease)
    tmp = machine.make_temp_dir("compile")
    try:

        def build() -> bundles.Packed:
            tuner = split_tuner(runner)
            compiled = tuner.compile(problem, runner.context(problem), tmp / "bundle")
            return _pack(runner, lease, compiled, tmp / "bundle.tar.gz")

        packed, error, final = runner.guarded(lease, build)
        bundle_id = _store(runner, lease, packed) if packed is not None else None
    finally:
        shutil.rmtree(tmp, ignore_errors=True)
    return lambda: _finish_compile(runner, lease, bundle_id, error, final)


def compile_batch(runner: Runner, leases: list[Lease]) -> None:
    """A compile worker's batch (`--batch K`): the batchable problems of one op in one
    `--compile-only` call (one tool start-up, not K), its output split into one bundle per
    problem, each job finished as compile_job's. When the call fails, or leaves a problem out,
    those problems are compiled alone in the same attempt: one bad problem never fails the
    others, and no retry is counted for the shared call (as benchmark batches, batch.py)."""
    runner.current = leases[0]
    done: set[int] = set()
    try:
        with runner.heartbeat.hold_many(leases) as lost:
            groups: dict[str, list[Lease]] = {}
            alone: list[Lease] = []
            for lease in leases:
                problem = runner.problem(lease)
                lease = dataclasses.replace(lease, problem=problem)
                if (
                    len(leases) > 1
                    and runner.batch_tuner is not None
                    and batch.batchable(runner, problem)
                ):
                    groups.setdefault(problem.op, []).append(lease)
                else:
                    alone.append(lease)
            for group in groups.values():
                if len(group) == 1:
                    alone += group
                    continue
                alone += _compile_group(runner, group, lost, done)
            for lease in alone:
                if lease.job_id in done:
                    continue
                finish = compile_job(runner, lease)
                done.add(lease.job_id)
                runner.heartbeat.drop(lease)
                if lost[lease.job_id].is_set():
                    runner.stats.lost += 1
                else:
                    finish()
    except GiveBack:
        runner.stop_requested.set()
        runner.give_back([lease for lease in leases if lease.job_id not in done],
                         "given back by a stopping worker")  # fmt: skip
    except DatabaseError:
        runner.give_back([lease for lease in leases if lease.job_id not in done],
                         "the worker stopped on a database error")  # fmt: skip
        raise
    finally:
        runner.current = None


def _compile_group(
    runner: Runner, group: list[Lease], lost: dict[int, threading.Event], done: set[int]
) -> list[Lease]:
    """One --compile-only call for `group`; each compiled job finished (added to `done`); the
    ones to compile alone returned (the call failed, or left them out)."""
    problems = [runner.problem(lease) for lease in group]
    tmp = machine.make_temp_dir("compile")
    try:
        log.info("jobs %s: compiling %d problems in one call",
                 ",".join(str(lease.job_id) for lease in group), len(group))  # fmt: skip
        compiled, error, _ = runner.guarded(
            group[0],
            lambda: split_tuner(runner).compile_many(
                problems, runner.context(problems[0]), tmp / "bundle"
            ),
        )
        if compiled is None:
            log.warning("jobs %s: the compile call failed (%s); compiling each alone",
                        ",".join(str(lease.job_id) for lease in group),
                        (error or "").splitlines()[0] if error else "")  # fmt: skip
            return group
        left = []
        for lease, one in zip(group, compiled, strict=True):
            if one is None:
                left.append(lease)
                continue
            packed, err, final = runner.guarded(
                lease, functools.partial(_pack, runner, lease, one, tmp / f"{lease.job_id}.tar.gz")
            )
            bundle_id = _store(runner, lease, packed) if packed is not None else None
            done.add(lease.job_id)
            runner.heartbeat.drop(lease)
            if lost[lease.job_id].is_set():
                runner.stats.lost += 1
            else:
                _finish_compile(runner, lease, bundle_id, err, final)
        return left
    finally:
        shutil.rmtree(tmp, ignore_errors=True)


def _pack(runner: Runner, lease: Lease, compiled: Compiled, dest: Path) -> bundles.Packed:
    """A compiled directory checked (its problem names, its commit) and packed."""
    runner.kind.check_artifacts(compiled.directory)
    bundles.check_commit(compiled.commit_id, runner.session.mlir_v, f"job {lease.job_id}'s bundle")
    packed = bundles.pack(compiled.directory, dest, compiled.commit_id)
    log.info("job %s: compiled %s (%d bytes)", lease.job_id, runner.problem(lease).canonical(),
             packed.size)  # fmt: skip
    return packed


def _store(runner: Runner, lease: Lease, packed: bundles.Packed) -> int | None:
    """The packed bundle stored (still invisible); None when the lease went meanwhile."""
    store = runner.session.artifact_store
    return runner.retrying(lambda: bundles.store(runner.db, lease, packed, store))


def _finish_compile(
    runner: Runner, lease: Lease, bundle_id: int | None, error: str | None, final: bool
) -> None:
    """Make the bundle visible with the job's completion, or fail the job."""
    if error is not None:
        runner.fail(lease, error, final)
    elif bundle_id is None:
        runner.stats.lost += 1  # the lease went while the bundle was stored
    elif runner.retrying(
        lambda: bundles.finish_compile(runner.db, lease, bundle_id, "compiled; bundle stored")
    ):
        runner.stats.completed += 1
        log.info("job %s: completed, bundle %s ready for its benchmark", lease.job_id, bundle_id)
    else:
        runner.stats.lost += 1


@dataclasses.dataclass
class Prepared:
    """A batch of benchmark jobs made ready for the tool: each bundle fetched, checked and
    unpacked under `tmp`, or why it cannot be benchmarked. Made ahead of its call by the GPU
    worker's prefetch (loop.py) while the previous call benchmarks, or just before its call."""

    tmp: Path
    failed: list[Settled]  # (lease, None, why, final True): bundle missing, damaged, foreign
    ready: list[tuple[Lease, Problem, Path]]

    @property
    def leases(self) -> list[Lease]:
        return [s[0] for s in self.failed] + [lease for lease, _, _ in self.ready]

    def without(self, gone: set[int]) -> Prepared:
        """The same batch less the jobs (by id) it no longer holds."""
        return Prepared(
            self.tmp,
            [s for s in self.failed if s[0].job_id not in gone],
            [r for r in self.ready if r[0].job_id not in gone],
        )

    def discard(self) -> None:
        shutil.rmtree(self.tmp, ignore_errors=True)


def prepare(runner: Runner, leases: list[Lease]) -> Prepared:
    """These benchmark jobs' bundles fetched, checked and unpacked (a fresh temporary
    directory; `Prepared.discard` removes it)."""
    prepared = Prepared(machine.make_temp_dir("benchmark"), [], [])
    try:
        for lease in leases:
            problem = runner.problem(lease)
            got = _unpacked(runner, lease, prepared.tmp / f"job-{lease.job_id}")
            if isinstance(got, str):
                prepared.failed.append((lease, None, got, True))
            else:
                prepared.ready.append((lease, problem, got))
    except BaseException:
        prepared.discard()
        raise
    return prepared


def benchmark(
    runner: Runner, leases: list[Lease], prepared: Prepared | None = None
) -> Generator[Settled, None, None]:
    """(lease, outcome, error, final) for each of these benchmark jobs, as each is known: their
    bundles fetched, checked and unpacked into one artifacts directory (`prepared`: done
    ahead, for exactly these leases), then benchmarked on this worker's GPU. A job whose bundle
    is missing, damaged or of another commit fails at once."""
    try:
        if prepared is None:
            prepared = prepare(runner, leases)
        yield from prepared.failed
        ready = prepared.ready
        if not ready:
            return
        artifacts = prepared.tmp / "artifacts"
        merge, _, _ = _bundle_kind(runner)
        try:
            merge([directory for _, _, directory in ready], artifacts)
        except TunerError as exc:  # two bundles list one problem: nothing moved, none run
            yield from ((lease, None, error_text(exc), False) for lease, _, _ in ready)
            return

        def alone(lease: Lease) -> Settled:  # one job, or one of a call the tool refused
            problem = runner.problem(lease)
            log.info("job %s: benchmarking %s", lease.job_id, problem.canonical())
            return (
                lease,
                *runner.guarded(
                    lease,
                    lambda: split_tuner(runner).benchmark(
                        problem, runner.context(problem), artifacts
                    ),
                ),
            )

        if len(ready) == 1:
            yield alone(ready[0][0])
            return
        # One tool call for every bundle (one start-up, the GPU busy meanwhile), each job
        # settled as its row appears, through the runner's batch code.
        group = [dataclasses.replace(lease, problem=problem) for lease, problem, _ in ready]
        yield from batch.tune_many(
            runner,
            group,
            lambda problems, ctx: split_tuner(runner).benchmark_many(problems, ctx, artifacts),
            alone,
        )
    finally:
        if prepared is not None:
            prepared.discard()


def split_tuner(runner: Runner) -> SplitTuner:
    """The runner's tuner as a SplitTuner; Unsupported when it cannot compile and benchmark
    apart (a split session's tuner always can: sessions checks it when the session opens)."""
    if not isinstance(runner.tuner, SplitTuner):
        raise Unsupported(f"tuner {runner.tuner.name} cannot compile and benchmark apart")
    return runner.tuner


def _bundle_kind(runner: Runner) -> tuple[MergeArtifacts, ArtifactCommits, CheckArtifacts]:
    """How the session's tuner merges its bundles, reads their commits and checks what an
    unpacked bundle names (its TunerKind)."""
    kind = runner.kind
    if kind.merge_artifacts is None or kind.artifact_commits is None:
        raise Unsupported(f"the {kind.name} tuner has no two-stage bundles")
    return kind.merge_artifacts, kind.artifact_commits, kind.check_artifacts


def _unpacked(runner: Runner, lease: Lease, dest: Path) -> Path | str:
    """The job's bundle unpacked at `dest`, or why it cannot be benchmarked (a bundle that is
    damaged or of another commit is removed, so that `jobs requeue` compiles it again)."""
    try:
        fetched = runner.retrying(
            lambda: bundles.fetch(runner.db, lease.session_id, lease.problem_id)
        )
    except bundles.BundleMissing as exc:
        return str(exc)
    try:
        cap = runner.session.bundle_cap_bytes  # the session's: one file may be all of it
        bundles.unpack(fetched.data, dest, max_file=cap, max_total=cap)
        _, commits, check = _bundle_kind(runner)
        check(dest)  # names from index.json stay inside it before anything uses them
        for commit in commits(dest) | {fetched.commit_id}:
            bundles.check_commit(commit, runner.session.mlir_v, f"bundle {fetched.bundle_id}")
    except (TunerError, tarfile.TarError) as exc:
        runner.retrying(lambda: bundles.delete(runner.db, fetched.bundle_id))
        return f"{exc}"
    return dest


__all__ = [
    "Prepared", "benchmark", "compile_batch", "compile_job", "prepare", "run", "split_tuner",
]  # fmt: skip
