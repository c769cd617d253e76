"""Settling a held job: fenced writes, applied only while the job still carries this worker's
lease_token, so that a worker that lost its lease (paused, partitioned, requeued) writes nothing.

- heartbeat: extend the lease while the tuner runs;
- record_steps: a searched job's round of measurements, kept for its next attempt (search_step);
- record (winner and candidates), complete (a stage without a winner), fail, release;
- reclaim_expired: jobs whose lease ran out (their worker died) go back to `new` or to `error`;
- take_back: the same, at once, for the jobs of a worker known to be dead (worker/loop.py).
Every lease time is computed by the database clock (db.db_now), never a worker's. A write whose
reply was lost is recognised by its attempt's outcome when it is tried again.
"""

from __future__ import annotations

import datetime as dt
import logging
from collections.abc import Callable, Sequence

import sqlalchemy as sa
from sqlalchemy.orm import Session

import mlirtuna.queue.sql as sql
from mlirtuna.db import Database, db_now, rowcount, utcnow
from mlirtuna.db.faults import first_line
from mlirtuna.db.models import (
    BENCHMARK,
    COMPILE,
    ERROR,
    NEW,
    RUNNING,
    WAITING,
    Attempt,
    Job,
    Result,
    SearchStep,
)
from mlirtuna.db.text import MAX_CANDIDATE_ERROR_BYTES
from mlirtuna.db.text import cut_text as _cut
from mlirtuna.errors import RecordConflict
from mlirtuna.formats.outcome import Candidate, TuneOutcome
from mlirtuna.keys import perf_config_format
from mlirtuna.queue.claim import Lease, NextClaim, claimed_with

log = logging.getLogger(__name__)

MAX_BACKOFF_S = 600.0


def _attempt_outcome(s: Session, token: str) -> str | None:
    """How the attempt with this token ended, if it did: what an earlier try of a retried
    write did when its commit landed and its reply was lost."""
    return s.scalar(sa.select(Attempt.outcome).where(Attempt.lease_token == token))


def _fenced(lease: Lease):
    """The WHERE clause of every write about a held job: still ours, still running."""
    return sa.and_(Job.id == lease.job_id, Job.lease_token == lease.token, Job.state == RUNNING)


def heartbeat(db: Database, lease: Lease, lease_s: float) -> bool:
    """Extend the lease; False when it is no longer ours (the worker must not record)."""
    params = {"p_job": lease.job_id, "p_token": lease.token, "p_lease_s": float(lease_s)}
    with db.transaction(single=True) as conn:
        return sql.RENEW.run(conn, params).rowcount == 1


def record_steps(db: Database, lease: Lease, measured: Sequence[Candidate]) -> bool:
    """A searched job's round of measurements (each with its search_round), written as soon as
    it was taken, while the lease holds: the fenced update of the job's heartbeat comes first
    and holds its row, so a worker that lost the lease writes nothing (False). A new attempt of
    the job reads them back (`steps`). A retried write whose commit landed leaves a duplicate
    row; `steps` readers keep a perf config's first row."""
    rows = [
        {
            "job_id": lease.job_id,
            "lease_token": lease.token,
            "search_round": c.search_round or 0,
            "perf_config": c.perf_config,
            "kernel_time": c.kernel_time_ns if c.valid else None,
            "error": None if c.valid else _cut(c.error or "invalid", MAX_CANDIDATE_ERROR_BYTES),
            "created_at": utcnow(),
        }
        for c in measured
    ]
    with db.transaction(immediate=True) as conn:
        fence = sa.update(Job).where(_fenced(lease)).values(heartbeat_at=db_now())
        held = rowcount(conn.execute(fence))
        if held == 1 and rows:
            conn.execute(sa.insert(SearchStep), rows)
    return held == 1


def steps(db: Database, job_id: int) -> list[SearchStep]:
    """Every measurement earlier attempts of a searched job kept, in the order written."""
    with db.session() as s:
        found = s.scalars(
            sa.select(SearchStep).where(SearchStep.job_id == job_id).order_by(SearchStep.id)
        ).all()
        s.expunge_all()
    return list(found)


# Called inside a fenced transaction once the fence held, with its connection: what else must
# commit or roll back with it (a two-stage job's bundle, its benchmark job; bundles.py).
AlsoInTransaction = Callable[[sa.Connection], None]


def record(
    db: Database, lease: Lease, outcome: TuneOutcome, also: AlsoInTransaction | None = None
) -> bool:
    """Winner, every candidate and `completed` in one transaction, only while the lease holds;
    `also` adds its writes to that transaction (on PostgreSQL the record is then no longer one
    autocommitted statement but that statement and `also` in one transaction)."""
    return _record(db, lease, outcome, None, also)[0]


def record_and_claim(
    db: Database,
    lease: Lease,
    outcome: TuneOutcome,
    claim: NextClaim,
    also: AlsoInTransaction | None = None,
) -> tuple[bool, Lease | None]:
    """`record`, and the claim of the next job in the same transaction: one durable commit per
    job. (recorded, the job taken or None). A refused record (the lease was lost) takes
    nothing. Per backend: PostgreSQL one statement (sql.RECORD_AND_CLAIM_PG); MariaDB/MySQL one
    script, the candidates and the COMMIT (three round trips); SQLite one BEGIN IMMEDIATE.

    A retry passes the same `claim` (its token): when an earlier try committed and its reply
    was lost, the attempt's outcome says the record landed and `claimed_with` finds the job
    that try took (None when it took none, or the lease has since expired)."""
    return _record(db, lease, outcome, claim, also)


def _record(
    db: Database,
    lease: Lease,
    outcome: TuneOutcome,
    claim: NextClaim | None,
    also: AlsoInTransaction | None,
) -> tuple[bool, Lease | None]:
    try:
        recorded, taken = _record_once(db, lease, outcome, claim, also)
    except sa.exc.IntegrityError as exc:
        # Nothing of this transaction was written. Waiting or another worker cannot cure it
        # (a result row the record did not write: a login that may INSERT result forged one),
        # so it is the job's failure, never the worker's (issue 43).
        raise RecordConflict(_conflict(db, lease, exc)) from exc
    if recorded:
        return True, taken
    with db.session() as s:
        if _attempt_outcome(s, lease.token) == "completed":
            # An earlier try committed (with its claim); its reply was lost.
            return True, claimed_with(db, claim.token) if claim is not None else None
    log.warning("job %s: lease lost before recording; recording nothing", lease.job_id)
    return False, None


def _conflict(db: Database, lease: Lease, exc: sa.exc.IntegrityError) -> str:
    """What the record clashed with: the result row already there for the job's session and
    problem, named, with what to do; else the server's own words."""
    with db.session() as s:
        row = s.execute(
            sa.select(Result.id, Result.job_id, Result.perf_config).where(
                Result.session_id == lease.session_id, Result.problem_id == lease.problem_id
            )
        ).first()
    if row is None:
        return f"record refused by the database: {first_line(exc.orig)}"
    return (
        f"record refused: result row {row.id} (job {row.job_id}, perf config "
        f"{row.perf_config!r}) already holds session {lease.session_id}'s winner for problem "
        f"{lease.problem_id}, and this job's record did not write it; an admin checks it, "
        "deletes it and requeues the job"
    )


def _record_once(
    db: Database,
    lease: Lease,
    outcome: TuneOutcome,
    claim: NextClaim | None,
    also: AlsoInTransaction | None,
) -> tuple[bool, Lease | None]:
    """One try of the record (and claim): (whether the fence held, the job taken)."""
    params = _record_params(lease, outcome)
    pg = db.backend == "postgresql"
    taken: Lease | None = None
    with db.transaction(immediate=True, single=pg and also is None) as conn:
        if pg:
            args = {**params, **_candidate_arrays(lease, outcome)}
            if claim is None:
                recorded = sql.RECORD_PG.run(conn, args).first() is not None
            else:
                args.update(claim.params("n_token"))
                row = sql.RECORD_AND_CLAIM_PG.run(conn, args).first()
                recorded = row is not None
                taken = claim.lease(conn, row[1:]) if row is not None else None
        elif db.is_sqlite:
            # The fenced update comes first: when it matches nothing, nothing has been written.
            recorded = sql.COMPLETE_SQLITE.run(conn, params).rowcount == 1
            if recorded:
                sql.ADD_RESULT_SQLITE.run(conn, params)
                sql.END_ATTEMPT_SQLITE.run(conn, params)
        elif claim is None:
            recorded = sql.RECORD_MYSQL.run_script(conn, params)[-1].rows[0][0] == 1
        else:
            args = {**params, **claim.params("n_token")}
            results = sql.RECORD_AND_CLAIM_MYSQL.run_script(conn, args)
            recorded = results[4].rows[0][0] == 1
            next_row = results[-1].first()
            taken = claim.lease(conn, next_row) if next_row is not None else None
        if recorded and not pg and outcome.candidates:
            sql.ADD_CANDIDATES.run(conn, _candidate_rows(lease, outcome))
        if recorded and also is not None:
            also(conn)
        if recorded and claim is not None and db.is_sqlite:
            taken = claim.take(db, conn)
    return recorded, taken


def complete(db: Database, lease: Lease, output: str, also: AlsoInTransaction) -> bool:
    """`completed` without a winner, for a stage that produces something else (a compile job's
    bundle, which `also` makes visible in the same fenced transaction). False when the lease
    was lost: then nothing was written and `also` never ran."""
    params = {"p_job": lease.job_id, "p_token": lease.token, "p_output": _cut(output),
              "p_compile_start": None, "p_compile_end": None, "p_outcome": "completed",
              "p_message": None}  # fmt: skip
    with db.transaction(immediate=True) as conn:
        done = conn.execute(sql.COMPLETE, params).rowcount == 1
        if done:
            also(conn)
            conn.execute(sql.END_ATTEMPT, params)
    if done:
        return True
    with db.session() as s:
        return _attempt_outcome(s, lease.token) == "completed"  # an earlier try committed


def _record_params(lease: Lease, outcome: TuneOutcome) -> dict[str, object]:
    w, m = outcome.winner, outcome.margin
    return {
        "p_job": lease.job_id,
        "p_token": lease.token,
        "p_session": lease.session_id,
        "p_problem": lease.problem_id,
        "p_output": _cut(outcome.output),
        "p_compile_start": _naive_utc(outcome.compile_start),
        "p_compile_end": _naive_utc(outcome.compile_end),
        "w_perf_config": w.perf_config,
        "w_kernel_time": w.kernel_time_ns,
        "w_tflops": w.tflops,
        "w_perf_family": perf_config_format(w.perf_config),
        "w_margin": m and m.margin,
        "w_noise": m and m.noise,
        "p_outcome": "completed",
        "p_message": None,
    }


def _candidate_rows(lease: Lease, outcome: TuneOutcome) -> list[dict[str, object]]:
    ids = {"p_session": lease.session_id, "p_problem": lease.problem_id, "p_job": lease.job_id}
    return [
        {**ids, **{f"c_{k}": v for k, v in _candidate_columns(c).items()}}
        for c in outcome.candidates
    ]


def _candidate_arrays(lease: Lease, outcome: TuneOutcome) -> dict[str, list]:
    """The candidates column by column, for PostgreSQL's unnest."""
    rows = [_candidate_columns(c) for c in outcome.candidates]
    return {f"a_{k}": [r[k] for r in rows] for k in sql.CANDIDATE_TYPES}


def _candidate_columns(c: Candidate) -> dict[str, object]:
    return {
        "perf_config": c.perf_config,
        "kernel_time": c.kernel_time_ns,
        "tflops": c.tflops,
        "error": _cut(c.error, MAX_CANDIDATE_ERROR_BYTES),
        "perf_family": perf_config_format(c.perf_config),
        "search_round": c.search_round,
        **_spread_columns(c),
    }


def _spread_columns(c: Candidate) -> dict[str, object]:
    """The candidate row's statistics columns (None where the tuner measured no spread)."""
    sp = c.spread
    return {
        "time_min": sp and sp.min,
        "time_iqr": sp and sp.iqr,
        "samples": sp and sp.samples,
        "remeasured": c.remeasured,
        # The search pass's time: kept when the top-k re-measurement replaced kernel_time.
        "search_time": c.kernel_time_ns if c.search_time_ns is None else c.search_time_ns,
    }


def _naive_utc(when: dt.datetime | None) -> dt.datetime | None:
    """Tuners report aware UTC times; the columns hold naive UTC (models.py)."""
    if when is None or when.tzinfo is None:
        return when
    return when.astimezone(dt.UTC).replace(tzinfo=None)


def fail(
    db: Database,
    lease: Lease,
    message: str,
    *,
    max_retries: int,
    backoff_s: float,
    final: bool = False,
) -> str | None:
    """Count a failed attempt: back to `new` after a backoff, or `error` once retries run out
    or at once when `final` (a deterministic failure: retrying cannot help).

    Returns the job's new state, or None when the lease was already lost (nothing written).
    """
    retries = lease.retries + 1
    state = ERROR if final or retries >= max_retries else NEW
    delay = min(backoff_s * 2 ** (retries - 1), MAX_BACKOFF_S)
    what = "failed, not retried" if final else f"{retries}/{max_retries} failed"
    values: dict = {
        "state": state,
        "retries": retries,
        "result": _cut(f"attempt {what}: {message}"),
        "compile_end": db_now(),
        "not_before": db_now(delay) if state == NEW else None,
        "finished_at": db_now() if state == ERROR else None,
    }
    with db.session(immediate=True) as s:
        if rowcount(s.execute(sa.update(Job).where(_fenced(lease)).values(values))) != 1:
            if _attempt_outcome(s, lease.token) == "failed":  # an earlier try committed
                return s.scalar(sa.select(Job.state).where(Job.id == lease.job_id))
            return None
        _end_attempt(s, lease.token, "failed", _cut(message))
        if state == ERROR and lease.stage == COMPILE:
            _fail_benchmark(s, lease.session_id, lease.problem_id, lease.job_id, message)
        return state


def release(db: Database, lease: Lease, why: str = "given back by a stopping worker") -> bool:
    """Give a job back untouched (state new, no retry counted)."""
    with db.session(immediate=True) as s:
        done = s.execute(
            sa.update(Job)
            .where(_fenced(lease))
            .values(state=NEW, lease_token=None, lease_expires_at=None, not_before=None)
        )
        if rowcount(done) != 1:
            return _attempt_outcome(s, lease.token) == "released"  # an earlier try committed
        _end_attempt(s, lease.token, "released", why)
        return True


def reclaim_expired(db: Database, *, max_retries: int, session_id: int | None = None) -> int:
    """Jobs whose lease ran out (worker killed, machine gone) go back to new, or to error; so
    does a job whose lease runs out later than any claim or heartbeat sets (forged)."""
    lease = Job.lease_expires_at
    expired = sa.and_(Job.state == RUNNING, sa.or_(lease < db_now(), lease > sql.PLAUSIBLE_LEASE))
    if session_id is not None:
        expired = sa.and_(expired, Job.session_id == session_id)
    return _expire_all(db, expired, max_retries)


def take_back(db: Database, machine_name: str, pid: int, worker: str, *, max_retries: int) -> int:
    """The running jobs of a worker known to be gone (worker `pid` on `machine_name`, its
    token `worker`) go back to new, or to error, at once, as reclaim_expired does once their
    lease runs out: each fenced on the lease token of that worker's open attempt, so a job
    another worker holds by now is never touched. The number taken back."""
    why = (
        f"taken back: the worker (pid {pid}) on {machine_name} and its tool are gone "
        "(killed); its lease had not run out yet"
    )
    attempts = sa.select(Attempt.lease_token).where(
        Attempt.worker == worker,
        Attempt.machine_name == machine_name,
        Attempt.pid == pid,
        Attempt.ended_at.is_(None),
    )
    held = sa.and_(Job.state == RUNNING, Job.lease_token.in_(attempts))
    return _expire_all(db, held, max_retries, why, fenced=True)


def _expire_all(
    db: Database,
    which: sa.ColumnElement[bool],
    max_retries: int,
    why: str | None = None,
    *,
    fenced: bool = False,
) -> int:
    """Every running job `which` picks (rows another transaction holds skipped) expired as
    _expire does; `fenced`: each on its own lease token, not on `which` again. How many."""
    with db.session(immediate=True) as s:
        pick = sa.select(
            Job.id, Job.lease_token, Job.machine_name, Job.gpu_id, Job.retries, Job.stage,
            Job.session_id, Job.problem_id,
        ).where(which)  # fmt: skip
        if not db.is_sqlite:
            pick = pick.with_for_update(skip_locked=True)
        rows = s.execute(pick).all()
        for row in rows:
            fence = (
                sa.and_(Job.state == RUNNING, Job.lease_token == row.lease_token)
                if fenced
                else which
            )
            _expire(s, row, fence, max_retries, why)
        return len(rows)


def _expire(s: Session, row, expired, max_retries: int, why: str | None = None) -> None:
    why = why or (
        f"lease expired: the worker on {row.machine_name or '?'} GPU {row.gpu_id} "
        "stopped renewing it (killed, stalled or cut off)"
    )
    retries = row.retries + 1
    state = ERROR if retries >= max_retries else NEW
    s.execute(
        sa.update(Job)
        .where(Job.id == row.id, Job.retries == row.retries, expired)
        .values(
            state=state,
            retries=retries,
            result=f"attempt {retries}/{max_retries} failed: {why}",
            lease_token=None,
            lease_expires_at=None,
            finished_at=db_now() if state == ERROR else None,
        )
    )
    if row.lease_token:
        _end_attempt(s, row.lease_token, "expired", why)
    if state == ERROR and row.stage == COMPILE:
        _fail_benchmark(s, row.session_id, row.problem_id, row.id, why)


def _fail_benchmark(
    s: Session, session_id: int, problem_id: int, compile_job: int, why: str
) -> None:
    """A compile job that ended in error takes its waiting benchmark job with it: there will
    be no bundle to benchmark (`jobs requeue` brings both back)."""
    s.execute(
        sa.update(Job)
        .where(
            Job.session_id == session_id,
            Job.problem_id == problem_id,
            Job.stage == BENCHMARK,
            Job.state == WAITING,
        )
        .values(
            state=ERROR,
            finished_at=db_now(),
            result=_cut(f"compile job {compile_job} failed: {why}"),
        )
    )


def _end_attempt(s: Session, token: str, outcome: str, message: str | None) -> None:
    s.execute(
        sa.update(Attempt)
        .where(Attempt.lease_token == token, Attempt.ended_at.is_(None))
        .values(ended_at=db_now(), outcome=outcome, message=message)
    )
