"""Jobs as people manage them: load a session's jobs, count, list, show, requeue, cancel;
delete a session with everything the queue holds of it.

The worker-side operations (claim, heartbeat, fenced record) are in claim.py and settle.py.
"""

from __future__ import annotations

import datetime as dt
import time
from collections.abc import Callable, Collection
from dataclasses import asdict, dataclass, field
from typing import TYPE_CHECKING, Any

import sqlalchemy as sa
from sqlalchemy.orm import Session

from mlirtuna import catalog, sessions, stats
from mlirtuna.db import Database, db_now, rowcount
from mlirtuna.db.models import (
    BENCHMARK,
    CANCELLED,
    COMPILE,
    COMPLETED,
    ERROR,
    JOB_STATES,
    NEW,
    RUNNING,
    STAGES,
    TUNE,
    WAITING,
    Attempt,
    Candidate,
    FusionConfig,
    Job,
    Problem,
    ProblemTag,
    Result,
    SearchStep,
    SessionNote,
    TuningSession,
)
from mlirtuna.errors import NotFound, UserError
from mlirtuna.problems import ExpandOptions

if TYPE_CHECKING:  # annotations only: the read commands load no tuner code
    from mlirtuna.tuners.registry import BuildLimit


@dataclass(frozen=True)
class LoadReport:
    added: int
    existing: int
    #: {why: test vectors} of the selected problems left out: the session's tuner can never
    #: run them (the cpu tuner's fp8, …), as `run` leaves them out.
    cannot_run: dict[str, list[str]] = field(default_factory=dict)

    def as_dict(self) -> dict[str, Any]:
        return {"added": self.added, "existing": self.existing, "cannot_run": self.cannot_run}


def load(
    db: Database,
    session_id: int,
    *,
    op: str | None = None,
    tag: str | None = None,
    file: str | None = None,
    all_problems: bool = False,
    options: ExpandOptions | None = None,
    exclude: Collection[int] = (),
    keep: Callable[[Session, int, dict[int, int]], dict[int, int]] | None = None,
) -> LoadReport:
    """One `new` job per selected problem of the session (idempotent), but none for the
    problem ids in `exclude` (`run`: those the tuner cannot run with the worker's memory), nor
    for a problem the session's tuner can never run (left out and reported: cannot_run).

    `keep(s, session_id, {problem_id: priority})` narrows the selection inside the same
    transaction (reuse.py: skip what is already tuned, re-tune only what changed).
    """
    if sum(x is not None and x is not False for x in (tag, file, all_problems or None)) != 1:
        raise UserError("choose the problems with exactly one of --tag, --file or --all")
    sess = sessions.get(db, session_id)
    limit = _build_limit(sess)
    # Another `jobs load` of the same session may race this one: the loser tries again.
    return db.retrying_conflicts(
        lambda: _load(
            db, sess, op, tag, file, all_problems, options, exclude, keep, limit,
        )
    )  # fmt: skip


def _build_limit(sess: sessions.Session) -> BuildLimit | None:
    """What this session's build can never tune, as its tuner's kind says (rocmlir E3: gemm
    -transO true); None for most sessions, so no problem is read for it."""
    from mlirtuna import tuners  # here: the read commands import this module, not the tuners

    build = tuners.SessionBuild(key_form=sess.key_form, capabilities=sess.capabilities)
    return tuners.build_limit(sess.tuner, build)


def stage_rows(session_id: int, problem_id: int, priority: int, two_stage: bool) -> list[dict]:
    """The job rows of one problem: one `tune` job, or a compile job and a benchmark job that
    waits for the compile job's bundle (two-stage sessions)."""
    row = {"session_id": session_id, "problem_id": problem_id, "priority": priority, "reason": ""}
    if not two_stage:
        return [{**row, "stage": TUNE, "state": NEW}]
    return [{**row, "stage": COMPILE, "state": NEW}, {**row, "stage": BENCHMARK, "state": WAITING}]


def _load(
    db: Database,
    sess: sessions.Session,
    op,
    tag,
    file,
    all_problems,
    options,
    exclude,
    keep,
    limit: BuildLimit | None = None,
) -> LoadReport:
    session_id, two_stage = sess.id, sess.two_stage
    with db.session(immediate=True) as s:
        selected = _select(s, op=op, tag=tag, file=file, all_problems=all_problems, options=options)
        if not selected and tag is not None:
            raise UserError(f"no problems carry the tag {tag!r}: import them with --tag {tag}")
        for pid in exclude:
            selected.pop(pid, None)
        if limit is not None:
            _refuse_limited(s, sess, selected, limit)
        left_out = _leave_out_unrunnable(s, sess, selected)
        if keep is not None:
            selected = keep(s, session_id, selected)
        have = set(s.scalars(sa.select(Job.problem_id).where(Job.session_id == session_id)))
        added = [pid for pid in selected if pid not in have]
        rows = [r for pid in added for r in stage_rows(session_id, pid, selected[pid], two_stage)]
        if rows:
            s.execute(sa.insert(Job.__table__), rows)
        return LoadReport(added=len(added), existing=len(selected) - len(added),
                          cannot_run=left_out)  # fmt: skip


def _leave_out_unrunnable(
    s: Session, sess: sessions.Session, selected: dict[int, int]
) -> dict[str, list[str]]:
    """Takes the problems the session's tuner can never run out of `selected` and returns
    them, {why: test vectors}; when that is all of them, UserError (nothing loaded). The same
    check as `run`'s (tuners.cannot_run), less the memory limit: that is the worker's."""
    # Imported here: `status` and the other read commands import this module, not the tuners.
    from mlirtuna import tuners

    if not selected:
        return {}
    try:
        if tuners.kind(sess.tuner).unsupported is None:
            return {}
    except UserError:  # a plugin this host lacks: its workers say what they cannot run
        return {}
    problems = dict(catalog.load_problems(s, selected))
    ids = {p.canonical(): pid for pid, p in problems.items()}
    found = tuners.cannot_run(sess.tuner, sess.tuning_space, problems.values())
    if sum(map(len, found.values())) == len(selected):
        why, vectors = next(iter(found.items()))
        raise UserError(
            f"session {sess.id}'s {sess.tuner} tuner can run none of the {len(selected)} "
            f"selected problem(s): {why} (e.g. {vectors[0]}); nothing loaded"
        )
    for vectors in found.values():
        for vector in vectors:
            selected.pop(ids[vector], None)
    return found


def _refuse_limited(
    s: Session, sess: sessions.Session, selected: dict[int, int], limit: BuildLimit
) -> None:
    """UserError (nothing loaded) when the selection holds a problem the build cannot tune."""
    hits = sorted(pid for pid, p in catalog.load_problems(s, selected) if limit.refuses(p))
    if hits:
        pid = hits[0]
        vector = s.scalar(sa.select(Problem.test_vector).where(Problem.id == pid))
        raise UserError(
            f"session {sess.id}'s {limit.why}: {len(hits)} selected problem(s) have it, e.g. "
            f"problem {pid} ({vector}); leave them out (--tag, --file) or {limit.remedy}"
        )


def _select(s: Session, *, op, tag, file, all_problems, options) -> dict[int, int]:
    """{problem_id: priority} of the chosen problems."""
    if file is not None:
        if op is None:
            raise UserError("--file needs --op (the op of the config list)")
        parsed = catalog.read_files(op, [file], options)  # fusion: a module or a directory
        ids, _ = catalog.ensure_problems(s, op, parsed.problems())
        return {ids[v]: prio for v, (_, prio) in parsed.entries.items()}
    if tag is not None:
        stmt = sa.select(ProblemTag.problem_id, ProblemTag.priority).where(ProblemTag.tag == tag)
        if op is not None:
            stmt = stmt.join(Problem, Problem.id == ProblemTag.problem_id).where(Problem.op == op)
        return {pid: prio for pid, prio in s.execute(stmt)}
    stmt = sa.select(Problem.id, sa.literal(0))
    if op is not None:
        stmt = stmt.where(Problem.op == op)
    return {pid: prio for pid, prio in s.execute(stmt)}


def counts(db: Database, session_id: int | None = None) -> dict[int, dict[str, int]]:
    """{session_id: {state: n}} with every state present (0 when none)."""
    stmt = sa.select(Job.session_id, Job.state, sa.func.count()).group_by(Job.session_id, Job.state)
    if session_id is not None:
        sessions.get(db, session_id)
        stmt = stmt.where(Job.session_id == session_id)
    out: dict[int, dict[str, int]] = {}
    if session_id is not None:
        out[session_id] = dict.fromkeys(JOB_STATES, 0)
    with db.session() as s:
        for sid, state, n in s.execute(stmt):
            out.setdefault(sid, dict.fromkeys(JOB_STATES, 0))[state] = n
        if session_id is None:
            for sid in s.scalars(sa.select(TuningSession.id)):
                out.setdefault(sid, dict.fromkeys(JOB_STATES, 0))
    return dict(sorted(out.items()))


def stage_counts(db: Database, session_id: int) -> dict[str, dict[str, int]]:
    """{stage: {state: n}} of a session, for the stages it has (two-stage sessions show their
    compile and benchmark jobs apart)."""
    stmt = (
        sa.select(Job.stage, Job.state, sa.func.count())
        .where(Job.session_id == session_id)
        .group_by(Job.stage, Job.state)
    )
    out: dict[str, dict[str, int]] = {}
    with db.session() as s:
        for stage, state, n in s.execute(stmt):
            out.setdefault(stage, dict.fromkeys(JOB_STATES, 0))[state] = n
    return {stage: out[stage] for stage in STAGES if stage in out}


# A job in one of these states still has work ahead (a waiting one, once its bundle exists).
OPEN_STATES = (NEW, WAITING, RUNNING)


def is_drained(db: Database, session_id: int, stages: Collection[str] | None = None) -> bool:
    """True once the session has no job (of these stages) that is new, waiting or running."""
    where = [Job.session_id == session_id, Job.state.in_(OPEN_STATES)]
    if stages is not None:
        where.append(Job.stage.in_(list(stages)))
    with db.session() as s:
        return s.scalar(sa.select(sa.func.count()).where(*where)) == 0


@dataclass(frozen=True)
class JobInfo:
    id: int
    session_id: int
    problem_id: int
    op: str
    test_vector: str
    state: str
    retries: int
    priority: int
    machine_name: str
    gpu_id: int
    compile_start: dt.datetime | None
    compile_end: dt.datetime | None
    result: str | None
    stage: str = TUNE
    attempts: list[dict[str, Any]] = field(default_factory=list)
    perf_config: str | None = None
    tflops: float | None = None
    candidates: int = 0

    @property
    def first_line(self) -> str:
        return (self.result or "").strip().splitlines()[0] if (self.result or "").strip() else ""

    @property
    def worker(self) -> str:
        """Where the job last ran, as a person says it (worker_of)."""
        return worker_of(self.machine_name, self.gpu_id, self.stage)

    def as_dict(self) -> dict[str, Any]:
        d = {k: getattr(self, k) for k in self.__dataclass_fields__}
        d["message"] = self.first_line
        d["worker"] = self.worker
        for key in ("compile_start", "compile_end"):
            d[key] = _iso(d[key])
        return d


def worker_of(machine_name: str, gpu_id: int, stage: str = TUNE) -> str:
    """The worker a job ran on, as a person says it: `GPU 3`; `compile worker` or `CPU worker`
    for one without a GPU (gpu_id -1, which is no GPU's number); `—` where none ran it yet."""
    if not machine_name:
        return "—"
    if gpu_id >= 0:
        return f"GPU {gpu_id}"
    return "compile worker" if stage == COMPILE else "CPU worker"


def _iso(value: dt.datetime | None) -> str | None:
    return value.strftime("%Y-%m-%dT%H:%M:%S.%fZ") if value else None


_JOB_COLUMNS = (
    Job.id,
    Job.session_id,
    Job.problem_id,
    Problem.op,
    catalog.label_column().label("test_vector"),  # a fusion module shows file, function, key
    Job.state,
    Job.retries,
    Job.priority,
    Job.machine_name,
    Job.gpu_id,
    Job.compile_start,
    Job.compile_end,
    Job.result,
    Job.stage,
)


def list_jobs(
    db: Database, session_id: int, state: str | None = None, limit: int | None = None
) -> list[JobInfo]:
    return page(db, session_id, state, limit).jobs


@dataclass(frozen=True)
class JobPage:
    """The first `limit` jobs of a session (by id) and how many there are in all."""

    jobs: list[JobInfo]
    total: int


def page(
    db: Database, session_id: int, state: str | None = None, limit: int | None = None
) -> JobPage:
    """A session's jobs by id, at most `limit` (None: all); `total` counts them all."""
    if state is not None and state not in JOB_STATES:
        raise UserError(f"unknown state {state!r} (known: {', '.join(JOB_STATES)})")
    if limit is not None and limit < 0:
        raise UserError(f"--limit {limit}: expected 0 or more")
    sessions.get(db, session_id)
    stmt, where = page_query(session_id, state, limit)
    with db.session() as s:
        rows = [JobInfo(*row) for row in s.execute(stmt)]
        total = len(rows)
        if limit is not None and total == limit:
            total = s.scalar(sa.select(sa.func.count()).select_from(Job).where(*where)) or 0
    return JobPage(rows, total)


def page_query(session_id: int, state: str | None, limit: int | None) -> tuple[sa.Select, list]:
    """The page's statement (it walks ix_job_session_list in id order and stops at `limit`)
    and its WHERE clauses (for the count)."""
    where = [Job.session_id == session_id]
    if state is not None:
        where.append(Job.state == state)
    stmt = (
        sa.select(*_JOB_COLUMNS)
        .join(Problem, Problem.id == Job.problem_id)
        .outerjoin(FusionConfig, FusionConfig.id == Problem.id)
        .where(*where)
        .order_by(Job.id)
        .limit(limit)
    )
    return stmt, where


def show(db: Database, job_id: int) -> JobInfo:
    """A job with its whole text, every attempt, and its winner if it has one."""
    with db.session() as s:
        row = s.execute(
            sa.select(*_JOB_COLUMNS)
            .join(Problem, Problem.id == Job.problem_id)
            .outerjoin(FusionConfig, FusionConfig.id == Problem.id)
            .where(Job.id == job_id)
        ).first()
        if row is None:
            raise NotFound(f"no job {job_id}")
        attempts = [
            {
                "machine_name": a.machine_name,
                "gpu_id": a.gpu_id,
                "worker": worker_of(a.machine_name, a.gpu_id, row.stage),
                "pid": a.pid,
                "claimed_at": _iso(a.claimed_at),
                "ended_at": _iso(a.ended_at),
                "outcome": a.outcome or "running",
                "message": a.message,
            }
            for a in s.scalars(
                sa.select(Attempt).where(Attempt.job_id == job_id).order_by(Attempt.id)
            )
        ]
        winner = s.execute(
            sa.select(Result.perf_config, Result.tflops).where(Result.job_id == job_id)
        ).first()
        n = s.scalar(sa.select(sa.func.count()).where(Candidate.job_id == job_id)) or 0
    info = JobInfo(**row._asdict(), attempts=attempts, candidates=n)
    if winner is not None:
        tflops = stats.stored_number(winner[1])  # text SQLite let in a REAL column: none
        info = JobInfo(**{**info.__dict__, "perf_config": winner[0], "tflops": tflops})
    return info


_FRESH = {
    "retries": 0,
    "not_before": None,
    "lease_token": None,
    "lease_expires_at": None,
    "finished_at": None,
}


def requeue(db: Database, session_id: int, state: str = ERROR, job_id: int | None = None) -> int:
    """Put error (or running: a worker known to be dead) jobs back to new with fresh retries.

    A benchmark job whose bundle is gone goes back to waiting instead, and its compile job is
    requeued with it (unless that one is already new or running): the bundle is made again.
    A requeued compile job takes its failed or cancelled benchmark job back to waiting."""
    if state not in (ERROR, RUNNING, CANCELLED):
        raise UserError("requeue takes --state error, running or cancelled")
    sessions.get(db, session_id)
    where = [Job.session_id == session_id, Job.state == state]
    if job_id is not None:
        where.append(Job.id == job_id)
    with db.session(immediate=True) as s:
        _end_open_attempts(s, where, "requeued")
        recompile = s.scalars(sa.select(Job.problem_id).where(*where, Job.stage == COMPILE)).all()
        rebuild = _bundle_gone(s, session_id, where)
        n = _requeue_compile(s, session_id, rebuild) if rebuild else 0
        if rebuild or recompile:
            n += _wait_again(s, session_id, [*rebuild, *recompile], where)
        return n + rowcount(s.execute(sa.update(Job).where(*where).values(state=NEW, **_FRESH)))


def _bundle_gone(s: Session, session_id: int, where: list) -> list[int]:
    """The problems of the benchmark jobs selected by `where` that have no complete bundle."""
    import mlirtuna.queue.bundles as bundles

    picked = s.scalars(sa.select(Job.problem_id).where(*where, Job.stage == BENCHMARK)).all()
    conn = s.connection()
    return [pid for pid in picked if not bundles.exists(conn, session_id, pid)]


def _wait_again(s: Session, session_id: int, problem_ids: list[int], where: list) -> int:
    """These problems' benchmark jobs wait for a new bundle: the selected ones, and those that
    failed or were cancelled because their compile job did."""
    picked = sa.and_(*where)
    stmt = (
        sa.update(Job)
        .where(
            Job.session_id == session_id,
            Job.stage == BENCHMARK,
            Job.problem_id.in_(problem_ids),
            sa.or_(picked, Job.state.in_((ERROR, CANCELLED))),
        )
        .values(state=WAITING, **_FRESH)
    )
    return rowcount(s.execute(stmt))


def _requeue_compile(s: Session, session_id: int, problem_ids: list[int]) -> int:
    """Compile these problems again: their compile jobs back to new (a running one is left to
    its worker; its completion makes the benchmark job claimable again)."""
    where = [
        Job.session_id == session_id,
        Job.stage == COMPILE,
        Job.problem_id.in_(problem_ids),
        Job.state.in_((COMPLETED, ERROR, CANCELLED)),
    ]
    return rowcount(s.execute(sa.update(Job).where(*where).values(state=NEW, **_FRESH)))


def cancel(db: Database, session_id: int, job_id: int | None = None) -> int:
    """Cancel jobs not yet done; a running one's worker then records nothing (its fence fails)."""
    sessions.get(db, session_id)
    where = [Job.session_id == session_id, Job.state.in_((NEW, WAITING, RUNNING, ERROR))]
    if job_id is not None:
        where.append(Job.id == job_id)
    with db.session(immediate=True) as s:
        _end_open_attempts(s, where, "cancelled")
        done = s.execute(
            sa.update(Job)
            .where(*where)
            .values(state=CANCELLED, lease_token=None, lease_expires_at=None)
        )
        return rowcount(done)


@dataclass(frozen=True)
class WaitOutcome:
    """How `wait` ended: timed out (exit 3), some job in error (exit 1), else done (exit 0)."""

    session_id: int
    timed_out: bool
    counts: dict[str, int]
    errors: list[JobInfo]

    @property
    def exit_code(self) -> int:
        return 3 if self.timed_out else 1 if self.errors else 0

    def as_dict(self) -> dict[str, Any]:
        return {
            "session_id": self.session_id,
            "timed_out": self.timed_out,
            "exit_code": self.exit_code,
            "counts": self.counts,
            "errors": [{"id": j.id, "message": j.first_line} for j in self.errors],
        }


def wait(
    db: Database, session_id: int, timeout_s: float | None = None, poll_s: float = 2.0
) -> WaitOutcome:
    """Block until no job of the session is new or running, or until the timeout."""
    sessions.get(db, session_id)
    deadline = None if timeout_s is None else time.monotonic() + timeout_s
    timed_out = False
    while not is_drained(db, session_id):
        if deadline is not None and time.monotonic() >= deadline:
            timed_out = True
            break
        time.sleep(poll_s if deadline is None else min(poll_s, max(deadline - time.monotonic(), 0)))
    return WaitOutcome(
        session_id,
        timed_out,
        counts(db, session_id)[session_id],
        [] if timed_out else list_jobs(db, session_id, ERROR),
    )


def _end_open_attempts(s: Session, where: list, outcome: str) -> None:
    """Close the attempt log of running jobs taken from their worker (whose fence now fails)."""
    held = sa.select(Job.lease_token).where(*where, Job.state == RUNNING)
    s.execute(
        sa.update(Attempt)
        .where(Attempt.ended_at.is_(None), Attempt.lease_token.in_(held))
        .values(ended_at=db_now(), outcome=outcome, message=f"{outcome} by an operator")
    )


@dataclass(frozen=True)
class Deleted:
    """What `session delete` removed."""

    session: int
    jobs: int
    attempts: int
    results: int
    candidates: int

    def as_dict(self) -> dict[str, int]:
        return asdict(self)


def delete_session(db: Database, session_id: int, *, force: bool = False) -> Deleted:
    """Delete a session with its jobs, attempts, results, candidates and bundles, in one
    transaction (the bundles' files are removed after the commit).

    Refused while one of its jobs is running (a worker would record into nothing) unless
    `force`; a worker that still holds such a job then finds its lease gone and writes nothing.
    """
    import mlirtuna.queue.bundles as bundles

    with db.session(immediate=True) as s:
        if s.get(TuningSession, session_id) is None:
            raise NotFound(f"no session {session_id}: `mlirtuna session list` shows them")
        running = s.scalar(
            sa.select(sa.func.count()).where(Job.session_id == session_id, Job.state == RUNNING)
        )
        if running and not force:
            raise UserError(
                f"session {session_id} has {running} running job(s): stop its workers first, "
                "or give --force"
            )
        in_session = Job.session_id == session_id
        job_ids = sa.select(Job.id).where(in_session).scalar_subquery()
        # Children first: candidates and results point at jobs, jobs at the session.
        attempts = rowcount(s.execute(sa.delete(Attempt).where(Attempt.job_id.in_(job_ids))))
        candidates = rowcount(
            s.execute(sa.delete(Candidate).where(Candidate.session_id == session_id))
        )
        results = rowcount(s.execute(sa.delete(Result).where(Result.session_id == session_id)))
        # Copies `jobs load --reuse` made from it stay where they are, no longer naming it.
        s.execute(
            sa.update(Result).where(Result.reused_from == session_id).values(reused_from=None)
        )
        s.execute(sa.delete(SearchStep).where(SearchStep.job_id.in_(job_ids)))
        files = bundles.delete_session(s.connection(), session_id)
        jobs = rowcount(s.execute(sa.delete(Job).where(in_session)))
        s.execute(sa.delete(SessionNote).where(SessionNote.session_id == session_id))
        s.execute(sa.delete(TuningSession).where(TuningSession.id == session_id))
    bundles.remove_files(files)  # after the commit: a rolled-back delete keeps them
    return Deleted(session_id, jobs, attempts, results, candidates)


__all__ = [
    "Deleted",
    "JobInfo",
    "JobPage",
    "LoadReport",
    "WaitOutcome",
    "cancel",
    "counts",
    "delete_session",
    "is_drained",
    "list_jobs",
    "load",
    "page",
    "requeue",
    "show",
    "stage_counts",
    "wait",
]
