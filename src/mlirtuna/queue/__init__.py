"""The job queue: the job table itself, made safe for any number of workers on any machines.

Four operations, each one short transaction (docs/architecture.md explains why they are safe):
- claim: the next `new` job of a session, by priority then id, skipping rows other workers hold
  (`FOR UPDATE SKIP LOCKED` on PostgreSQL/MariaDB; on SQLite the write lock of BEGIN IMMEDIATE
  serializes claims and `UPDATE … RETURNING` picks and takes the row in one statement);
  claim_many takes up to K jobs in one transaction, each with its own token and attempt;
- heartbeat: extend the lease while the tuner runs;
- record / fail / release: fenced writes, applied only while the job still carries this worker's
  lease_token, so a worker that lost its lease (paused, partitioned, requeued) writes nothing;
- reclaim_expired: jobs whose lease ran out (their worker died) go back to `new` or to `error`.
Every lease time is computed by the database clock (db.db_now), never a worker's.
"""

from __future__ import annotations

import datetime as dt
import json
import logging
import os
import uuid
from collections.abc import Callable, Sequence
from dataclasses import dataclass
from typing import NamedTuple

import sqlalchemy as sa
from sqlalchemy.dialects import postgresql
from sqlalchemy.orm import Session

from mlirtuna.catalog import load_problem
from mlirtuna.db import Database, Precompiled, db_now, json_object
from mlirtuna.db.models import (
    BENCHMARK,
    COMPILE,
    COMPLETED,
    CONFIG_TABLES,
    ERROR,
    NEW,
    RUNNING,
    TUNE,
    WAITING,
    Attempt,
    Candidate,
    Job,
    Result,
)
from mlirtuna.db.models import Problem as ProblemRow
from mlirtuna.db.text import MAX_CANDIDATE_ERROR_BYTES
from mlirtuna.db.text import cut_text as _cut
from mlirtuna.keys import perf_config_family
from mlirtuna.problems import Problem, from_columns
from mlirtuna.tuners import base
from mlirtuna.tuners.base import TuneOutcome

log = logging.getLogger(__name__)

MAX_BACKOFF_S = 600.0


@dataclass(frozen=True)
class Lease:
    """A job this worker holds. `token` fences every write about it."""

    job_id: int
    token: str
    session_id: int
    problem_id: int
    retries: int
    problem: Problem | None = None  # read with the claim
    stage: str = TUNE  # models.STAGES


@dataclass(frozen=True)
class Claimant:
    """Who claims: recorded on the job and its attempt."""

    machine_name: str
    gpu_id: int
    pid: int = os.getpid()


# The claim and the record run once per job on every worker: their statements are built once,
# here, with bind parameters, compiled once per dialect and sent as SQL text (db.Precompiled).
# Per backend, the fewest round trips it allows (bench/bench_overhead.py counts them):
#   PostgreSQL: claim = 1 statement (data-modifying CTEs: pick, take, attempt row, the problem),
#               record = 1 statement (fenced update, result, candidates, attempt end), each in
#               autocommit (one statement is atomic by itself: no BEGIN, no COMMIT);
#   MariaDB/MySQL: claim = pick (SKIP LOCKED), then one script (problem, take, attempt);
#               record = one script (fenced update, result and attempt end guarded by its row
#               count), then the candidates (one multi-row INSERT); one transaction each;
#   SQLite: statement by statement after BEGIN IMMEDIATE (no network: round trips cost little);
#               the claim picks and takes in one UPDATE … RETURNING.
_J, _A, _P = Job.__table__, Attempt.__table__, ProblemRow.__table__
_R, _C = Result.__table__, Candidate.__table__
_NOW = db_now()
_TOKEN = sa.bindparam("p_token", type_=sa.String(32))
_MACHINE = sa.bindparam("p_machine", type_=sa.String(200))
_GPU = sa.bindparam("p_gpu", type_=sa.Integer())
# What makes a job claimable: the one place to extend (every backend's claim uses it).
_CLAIMABLE = sa.and_(
    _J.c.session_id == sa.bindparam("p_session", type_=sa.Integer()),
    _J.c.state == NEW,
    # One stage per claim (the worker's role in its session): with equality on every column
    # before them, ix_job_claim yields the rows in (priority, id) order and LIMIT 1 stops there.
    _J.c.stage == sa.bindparam("p_stage", type_=sa.String(16)),
    sa.or_(_J.c.not_before.is_(None), _J.c.not_before <= _NOW),
)
_TAKE = {
    "state": RUNNING,
    "lease_token": _TOKEN,
    "lease_expires_at": db_now(sa.bindparam("p_lease_s", type_=sa.Double())),
    "heartbeat_at": _NOW,
    "claimed_at": _NOW,
    "compile_start": _NOW,
    "compile_end": None,
    "finished_at": None,
    "machine_name": _MACHINE,
    "gpu_id": _GPU,
}
_ATTEMPT = {
    "lease_token": _TOKEN,
    "machine_name": _MACHINE,
    "gpu_id": _GPU,
    "pid": sa.bindparam("p_pid", type_=sa.Integer()),
    "claimed_at": _NOW,
}
_NEXT = sa.select(_J.c.id, _J.c.problem_id, _J.c.retries).where(_CLAIMABLE)
_NEXT = _NEXT.order_by(_J.c.priority, _J.c.id).limit(1)

# The problem is read with the claim: the op from `problem` and its config row as one JSON
# object (outer joins on the primary key; only the op's own table matches). One column, not the
# ~100 of every config table: building a result of that width cost more than the query.
_PROBLEM_COLUMNS = [
    _P.c.op,
    sa.case(
        *(
            (_P.c.op == op, json_object(c for c in model.__table__.c if c.name != "id"))
            for op, model in CONFIG_TABLES.items()
        )
    ),
]


def _with_problem(source: sa.FromClause, problem_id: sa.ColumnElement) -> sa.FromClause:
    joined = source.join(_P, _P.c.id == problem_id) if source is not _P else _P
    for model in CONFIG_TABLES.values():
        t = model.__table__
        joined = joined.outerjoin(t, t.c.id == _P.c.id)
    return joined


# SQLite: BEGIN IMMEDIATE holds the write lock; one UPDATE … RETURNING picks and takes the row.
_CLAIM_SQLITE = Precompiled(
    sa.update(_J)
    .where(_J.c.id == _NEXT.with_only_columns(_J.c.id).scalar_subquery())
    .values(_TAKE)
    .returning(_J.c.id, _J.c.problem_id, _J.c.retries)
)
_JOB_ID = sa.bindparam("p_job", type_=sa.Integer())
_ADD_ATTEMPT = sa.insert(_A).values(job_id=_JOB_ID, **_ATTEMPT)
_READ_PROBLEM = (
    sa.select(*_PROBLEM_COLUMNS)
    .select_from(_with_problem(_P, _P.c.id))
    .where(_P.c.id == sa.bindparam("p_problem", type_=sa.Integer()))
)
_ADD_ATTEMPT_SQLITE = Precompiled(_ADD_ATTEMPT)
_READ_PROBLEM_SQLITE = Precompiled(_READ_PROBLEM)
# MariaDB/MySQL (no UPDATE … RETURNING, no data-modifying CTEs): one script, one round trip, in
# the claim's transaction: lock the next free row, skipping rows other workers hold, into session
# variables; take it; add its attempt row; read it back with its problem (no row: none free).
_PICKED = ("@mlirtuna_job", "@mlirtuna_problem", "@mlirtuna_retries")


def _claim_mysql() -> Precompiled:
    job, problem, retries = (sa.literal_column(v) for v in _PICKED)
    attempt = sa.select(job, *_ATTEMPT.values()).where(job.is_not(None))

    def pick_into(i: int, sql: str) -> str:  # SELECT … INTO @… FROM …: Core has no INTO
        if i != 1:
            return sql
        return sql.replace("\nFROM job", f" INTO {', '.join(_PICKED)}\nFROM job", 1)

    return Precompiled(
        sa.text(f"SET {', '.join(f'{v} = NULL' for v in _PICKED)}"),
        _NEXT.with_for_update(skip_locked=True),
        sa.update(_J).where(_J.c.id == job).values(_TAKE),
        sa.insert(_A).from_select(["job_id", *_ATTEMPT], attempt),
        sa.select(job, problem, retries, *_PROBLEM_COLUMNS)
        .select_from(_with_problem(_P, _P.c.id))
        .where(_P.c.id == problem),
        edit=pick_into,
    )


_CLAIM_MYSQL = _claim_mysql()


def _claim_pg() -> Precompiled:
    """PostgreSQL: pick (SKIP LOCKED), take, add the attempt row and read the problem, all in
    one statement."""
    pick = _NEXT.with_only_columns(_J.c.id).with_for_update(skip_locked=True).scalar_subquery()
    taken = (
        sa.update(_J)
        .where(_J.c.id == pick)
        .values(_TAKE)
        .returning(_J.c.id, _J.c.problem_id, _J.c.retries)
        .cte("taken")
    )
    attempt = (
        sa.insert(_A)
        .from_select(["job_id", *_ATTEMPT], sa.select(taken.c.id, *_ATTEMPT.values()))
        .cte("new_attempt")
    )
    return Precompiled(
        sa.select(taken.c.id, taken.c.problem_id, taken.c.retries, *_PROBLEM_COLUMNS)
        .select_from(_with_problem(taken, taken.c.problem_id))
        .add_cte(attempt)
    )


_CLAIM_PG = _claim_pg()


def new_token() -> str:
    return uuid.uuid4().hex


def claim(
    db: Database,
    session_id: int,
    who: Claimant,
    lease_s: float,
    token: str | None = None,
    stage: str = TUNE,
) -> Lease | None:
    """Take the next job of the session in this stage (models.STAGES: the worker's role in the
    session), or None when there is nothing to take now.

    The problem is read in the same transaction, so a claimed job is ready to tune. A caller
    that retries a claim passes the same `token` and asks `claimed_with` first.
    """
    params = {
        "p_session": session_id,
        "p_stage": stage,
        "p_token": token or new_token(),
        "p_lease_s": float(lease_s),
        "p_machine": who.machine_name,
        "p_gpu": who.gpu_id,
        "p_pid": who.pid,
    }
    with db.transaction(immediate=True, single=db.backend == "postgresql") as conn:
        row, problem = _take_next(db, conn, params)
        if row is None:
            return None
        return Lease(
            row.id, params["p_token"], session_id, row.problem_id, row.retries, problem, stage
        )


class _Taken(NamedTuple):
    id: int
    problem_id: int
    retries: int


def _take_next(db: Database, conn: sa.Connection, params: dict) -> tuple[object, object]:
    """(the job taken: id, problem_id, retries; its problem), or (None, None)."""
    if db.backend == "postgresql":
        row = _CLAIM_PG.run(conn, params).first()
        return row, row and _problem_of(conn, row[3:])
    if db.is_sqlite:
        row = _CLAIM_SQLITE.run(conn, params).first()
        if row is None:
            return None, None
        _ADD_ATTEMPT_SQLITE.run(conn, {**params, "p_job": row.id})
        problem = _READ_PROBLEM_SQLITE.run(conn, {"p_problem": row.problem_id}).one()
        return row, _problem_of(conn, problem)
    taken = _CLAIM_MYSQL.run_script(conn, params)[-1]
    if not taken:
        return None, None
    job_id, problem_id, retries, *problem = taken[0]
    return _Taken(job_id, problem_id, retries), _problem_of(conn, problem)


def _problem_of(conn: sa.Connection, values: Sequence) -> Problem:
    """The problem from the values of _PROBLEM_COLUMNS (op, config row as JSON)."""
    op, config = values
    if op is None:
        raise LookupError("the claimed job's problem is gone")
    if isinstance(config, str):  # PostgreSQL's driver parses JSON itself
        config = json.loads(config)
    for name, process in _result_processors(conn.dialect, op).items():
        config[name] = process(config[name])
    return from_columns(op, config)


_PROCESSORS: dict[tuple[str, str], dict] = {}


def _result_processors(dialect: sa.Dialect, op: str) -> dict:
    """Each config column's result processor, where it has one (booleans stored as 0/1)."""
    found = _PROCESSORS.get((dialect.name, op))
    if found is None:
        columns = CONFIG_TABLES[op].__table__.c
        found = {c.name: c.type._cached_result_processor(dialect, None) for c in columns}
        found = {k: v for k, v in found.items() if v is not None and k != "id"}
        _PROCESSORS[(dialect.name, op)] = found
    return found


# A batch: the next `limit` claimable jobs in claim order, locked (PostgreSQL, MariaDB: rows
# other workers hold are skipped) or, on SQLite, under the write lock of BEGIN IMMEDIATE.
_NEXT_MANY = _NEXT.limit(sa.bindparam("p_limit", type_=sa.Integer()))
_PICK_MANY_SKIP_LOCKED = _NEXT_MANY.with_for_update(skip_locked=True)
# Each job of a batch gets its own token: one statement, run once per picked row.
_TAKE_ONE = sa.update(_J).where(_J.c.id == sa.bindparam("p_job"), _J.c.state == NEW).values(_TAKE)


def claim_many(
    db: Database,
    session_id: int,
    who: Claimant,
    lease_s: float,
    limit: int,
    tokens: list[str] | None = None,
    stage: str = TUNE,
) -> list[Lease]:
    """Take up to `limit` jobs of the session in this stage in one transaction, in claim order
    (priority, id); an empty list when there is nothing to take now.

    Each job gets its own lease token (tokens[i] for the i-th job taken) and its own attempt,
    so that each is recorded, failed, released or lost on its own, exactly as a job taken by
    `claim`. A caller that retries passes the same `tokens` and asks `claimed_with_any` first.
    """
    tokens = tokens or [new_token() for _ in range(limit)]
    if len(tokens) < limit:
        raise ValueError(f"claim_many: {len(tokens)} tokens for up to {limit} jobs")
    params = {
        "p_session": session_id,
        "p_stage": stage,
        "p_limit": int(limit),
        "p_lease_s": float(lease_s),
        "p_machine": who.machine_name,
        "p_gpu": who.gpu_id,
        "p_pid": who.pid,
    }
    with db.session(immediate=True) as s:
        conn = s.connection()
        pick = _NEXT_MANY if db.is_sqlite else _PICK_MANY_SKIP_LOCKED
        rows = conn.execute(pick, params).all()
        if not rows:
            return []
        taken = [
            {**params, "p_job": r.id, "p_token": t}
            for r, t in zip(rows, tokens[: len(rows)], strict=True)
        ]
        conn.execute(_TAKE_ONE, taken)
        conn.execute(_ADD_ATTEMPT, taken)
        return [
            Lease(r.id, t["p_token"], session_id, r.problem_id, r.retries,
                  load_problem(s, r.problem_id), stage)
            for r, t in zip(rows, taken, strict=True)
        ]  # fmt: skip


def claimed_with_any(db: Database, tokens: list[str]) -> list[Lease]:
    """The jobs a batch claim with these tokens took, when that claim committed (its reply may
    have been lost), in claim order; empty when it did not commit."""
    with db.session() as s:
        rows = s.execute(
            sa.select(
                _J.c.id,
                _J.c.session_id,
                _J.c.problem_id,
                _J.c.retries,
                _J.c.lease_token,
                _J.c.stage,
            )
            .where(_J.c.lease_token.in_(tokens), _J.c.state == RUNNING)
            .order_by(_J.c.priority, _J.c.id)
        ).all()
        return [
            Lease(r.id, r.lease_token, r.session_id, r.problem_id, r.retries,
                  load_problem(s, r.problem_id), r.stage)
            for r in rows
        ]  # fmt: skip


def claimed_with(db: Database, token: str) -> Lease | None:
    """The job a claim with this token took, when that claim committed (its reply may not have
    reached us: a server restart between the commit and the answer)."""
    with db.session() as s:
        row = s.execute(
            sa.select(_J.c.id, _J.c.session_id, _J.c.problem_id, _J.c.retries, _J.c.stage).where(
                _J.c.lease_token == token, _J.c.state == RUNNING
            )
        ).first()
        if row is None:
            return None
        problem = load_problem(s, row.problem_id)
        return Lease(row.id, token, row.session_id, row.problem_id, row.retries, problem, row.stage)


def _attempt_outcome(s: Session, token: str) -> str | None:
    """How the attempt with this token ended, if it did: what an earlier try of a retried
    write did when its commit landed and its reply was lost."""
    return s.scalar(sa.select(Attempt.outcome).where(Attempt.lease_token == token))


def _fenced(lease: Lease):
    """The WHERE clause of every write about a held job: still ours, still running."""
    return sa.and_(Job.id == lease.job_id, Job.lease_token == lease.token, Job.state == RUNNING)


_FENCE = sa.and_(
    _J.c.id == sa.bindparam("p_job", type_=sa.Integer()),
    _J.c.lease_token == _TOKEN,
    _J.c.state == RUNNING,
)
_COMPLETED = {
    "state": COMPLETED,
    "result": sa.bindparam("p_output", type_=sa.Text()),
    "finished_at": _NOW,
    # The tuner's own phases where it has them, else the claim time and now.
    "compile_start": sa.func.coalesce(
        sa.bindparam("p_compile_start", type_=_J.c.compile_start.type), _J.c.compile_start
    ),
    "compile_end": sa.func.coalesce(
        sa.bindparam("p_compile_end", type_=_J.c.compile_end.type), _NOW
    ),
}
# Every column is given: the statements run at driver level, where SQLAlchemy's Python-side
# column defaults (perf_family from perf_config, say) are not applied, so they are computed here.
_WINNER = {
    "perf_config": sa.bindparam("w_perf_config", type_=sa.String(255)),
    "kernel_time": sa.bindparam("w_kernel_time", type_=sa.Double()),
    "tflops": sa.bindparam("w_tflops", type_=sa.Double()),
    "perf_family": sa.bindparam("w_perf_family", type_=sa.String(16)),
    "key_suffix": "",
    "winner_margin": sa.bindparam("w_margin", type_=sa.Double()),
    "winner_noise": sa.bindparam("w_noise", type_=sa.Double()),
}
_CANDIDATE_TYPES = {
    "perf_config": sa.String(255),
    "kernel_time": sa.Double(),
    "tflops": sa.Double(),
    "error": sa.Text(),
    "perf_family": sa.String(16),
    "time_min": sa.Double(),
    "time_iqr": sa.Double(),
    "samples": sa.Integer(),
    "remeasured": sa.Boolean(),
}
_IDS = {
    "session_id": sa.bindparam("p_session", type_=sa.Integer()),
    "problem_id": sa.bindparam("p_problem", type_=sa.Integer()),
    "job_id": sa.bindparam("p_job", type_=sa.Integer()),
}
_ENDED = {"ended_at": _NOW, "outcome": sa.bindparam("p_outcome", type_=sa.String(16))}
_ENDED["message"] = sa.bindparam("p_message", type_=sa.Text())
_OPEN_ATTEMPT = sa.and_(_A.c.lease_token == _TOKEN, _A.c.ended_at.is_(None))
# SQLite: the fenced update first; nothing else is sent when it matched nothing.
_COMPLETE = sa.update(_J).where(_FENCE).values(_COMPLETED)
_COMPLETE_SQLITE = Precompiled(_COMPLETE)
_ADD_RESULT_SQLITE = Precompiled(sa.insert(_R).values(**_IDS, **_WINNER))
_ADD_CANDIDATES = Precompiled(
    sa.insert(_C).values(
        **_IDS, **{k: sa.bindparam(f"c_{k}", type_=t) for k, t in _CANDIDATE_TYPES.items()}
    )
)
_END_ATTEMPT = sa.update(_A).where(_OPEN_ATTEMPT).values(_ENDED)
_END_ATTEMPT_SQLITE = Precompiled(_END_ATTEMPT)


def _record_mysql() -> Precompiled:
    """MariaDB/MySQL: one script (one round trip): the fenced update, its row count kept in a
    session variable, the result and the attempt's end only when it matched, and that count;
    the candidates follow (one multi-row INSERT) only when it did."""
    recorded = sa.literal_column("@mlirtuna_recorded")
    values = (sa.literal(v) if isinstance(v, str) else v for v in _WINNER.values())
    winner = sa.select(*_IDS.values(), *values).where(recorded == 1)
    return Precompiled(
        _COMPLETE,
        sa.text("SET @mlirtuna_recorded = ROW_COUNT()"),
        sa.insert(_R).from_select([*_IDS, *_WINNER], winner),
        sa.update(_A).where(_OPEN_ATTEMPT, recorded == 1).values(_ENDED),
        sa.select(recorded),
    )


_RECORD_MYSQL = _record_mysql()


_RENEW = Precompiled(
    sa.update(_J)
    .where(_FENCE)
    .values(
        lease_expires_at=db_now(sa.bindparam("p_lease_s", type_=sa.Double())), heartbeat_at=_NOW
    )
)


def heartbeat(db: Database, lease: Lease, lease_s: float) -> bool:
    """Extend the lease; False when it is no longer ours (the worker must not record)."""
    params = {"p_job": lease.job_id, "p_token": lease.token, "p_lease_s": float(lease_s)}
    with db.transaction(single=True) as conn:
        return _RENEW.run(conn, params).rowcount == 1


def _record_pg() -> Precompiled:
    """PostgreSQL: the fenced update, the result, every candidate (arrays, unnested) and the
    attempt's end in one statement; each insert reads the update's RETURNING, so nothing is
    written when the fence matched nothing. Returns one row per job completed (0 or 1)."""
    done = (
        sa.update(_J)
        .where(_FENCE)
        .values(_COMPLETED)
        .returning(_J.c.id, _J.c.session_id, _J.c.problem_id)
        .cte("done")
    )
    ids = [done.c.session_id, done.c.problem_id, done.c.id]
    # Typed: a NULL parameter in a SELECT list would otherwise be text to PostgreSQL.
    values = (sa.literal(v) if isinstance(v, str) else sa.cast(v, v.type) for v in _WINNER.values())
    winner = sa.insert(_R).from_select([*_IDS, *_WINNER], sa.select(*ids, *values))
    rows = sa.func.unnest(
        *(sa.bindparam(f"a_{k}", type_=postgresql.ARRAY(t)) for k, t in _CANDIDATE_TYPES.items())
    ).table_valued(*(sa.column(k, t) for k, t in _CANDIDATE_TYPES.items()))
    rows = rows.render_derived(name="tried")
    candidates = sa.insert(_C).from_select(
        [*_IDS, *_CANDIDATE_TYPES],
        sa.select(*ids, *(rows.c[k] for k in _CANDIDATE_TYPES)).select_from(
            done.join(rows, sa.true())
        ),
    )
    ended = sa.update(_A).where(_OPEN_ATTEMPT, sa.exists(sa.select(done.c.id))).values(_ENDED)
    return Precompiled(
        sa.select(done.c.id).add_cte(
            winner.cte("winner"), candidates.cte("candidates"), ended.cte("ended")
        )
    )


_RECORD_PG = _record_pg()


# Called inside a fenced transaction once the fence held, with its connection: what else must
# commit or roll back with it (a two-stage job's bundle, its benchmark job; bundles.py).
AlsoInTransaction = Callable[[sa.Connection], None]


def record(
    db: Database, lease: Lease, outcome: TuneOutcome, also: AlsoInTransaction | None = None
) -> bool:
    """Winner, every candidate and `completed` in one transaction, only while the lease holds;
    `also` adds its writes to that transaction (on PostgreSQL the record is then no longer one
    autocommitted statement but that statement and `also` in one transaction)."""
    params = _record_params(lease, outcome)
    pg = db.backend == "postgresql"
    with db.transaction(immediate=True, single=pg and also is None) as conn:
        if pg:
            done = _RECORD_PG.run(conn, {**params, **_candidate_arrays(lease, outcome)})
            recorded = done.first() is not None
        elif db.is_sqlite:
            # The fenced update comes first: when it matches nothing, nothing has been written.
            recorded = _COMPLETE_SQLITE.run(conn, params).rowcount == 1
            if recorded:
                _ADD_RESULT_SQLITE.run(conn, params)
                _END_ATTEMPT_SQLITE.run(conn, params)
        else:
            recorded = _RECORD_MYSQL.run_script(conn, params)[-1][0][0] == 1
        if recorded and not pg and outcome.candidates:
            _ADD_CANDIDATES.run(conn, _candidate_rows(lease, outcome))
        if recorded and also is not None:
            also(conn)
    if recorded:
        return True
    with db.session() as s:
        if _attempt_outcome(s, lease.token) == "completed":
            return True  # an earlier try of this record committed; its reply was lost
    log.warning("job %s: lease lost before recording; recording nothing", lease.job_id)
    return False


def complete(db: Database, lease: Lease, output: str, also: AlsoInTransaction) -> bool:
    """`completed` without a winner, for a stage that produces something else (a compile job's
    bundle, which `also` makes visible in the same fenced transaction). False when the lease
    was lost: then nothing was written and `also` never ran."""
    params = {"p_job": lease.job_id, "p_token": lease.token, "p_output": _cut(output),
              "p_compile_start": None, "p_compile_end": None, "p_outcome": "completed",
              "p_message": None}  # fmt: skip
    with db.transaction(immediate=True) as conn:
        done = conn.execute(_COMPLETE, params).rowcount == 1
        if done:
            also(conn)
            conn.execute(_END_ATTEMPT, params)
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
        "w_perf_family": perf_config_family(w.perf_config),
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
    return {f"a_{k}": [r[k] for r in rows] for k in _CANDIDATE_TYPES}


def _candidate_columns(c: base.Candidate) -> dict[str, object]:
    return {
        "perf_config": c.perf_config,
        "kernel_time": c.kernel_time_ns,
        "tflops": c.tflops,
        "error": _cut(c.error, MAX_CANDIDATE_ERROR_BYTES),
        "perf_family": perf_config_family(c.perf_config),
        **_spread_columns(c),
    }


def _spread_columns(c: base.Candidate) -> dict[str, object]:
    """The candidate row's statistics columns (None where the tuner measured no spread)."""
    sp = c.spread
    return {
        "time_min": sp and sp.min,
        "time_iqr": sp and sp.iqr,
        "samples": sp and sp.samples,
        "remeasured": c.remeasured,
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
        if s.execute(sa.update(Job).where(_fenced(lease)).values(values)).rowcount != 1:
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
        if done.rowcount != 1:
            return _attempt_outcome(s, lease.token) == "released"  # an earlier try committed
        _end_attempt(s, lease.token, "released", why)
        return True


def reclaim_expired(db: Database, *, max_retries: int, session_id: int | None = None) -> int:
    """Jobs whose lease ran out (worker killed, machine gone) go back to new, or to error."""
    expired = sa.and_(Job.state == RUNNING, Job.lease_expires_at < db_now())
    if session_id is not None:
        expired = sa.and_(expired, Job.session_id == session_id)
    with db.session(immediate=True) as s:
        pick = sa.select(
            Job.id, Job.lease_token, Job.machine_name, Job.gpu_id, Job.retries, Job.stage,
            Job.session_id, Job.problem_id,
        ).where(expired)  # fmt: skip
        if not db.is_sqlite:
            pick = pick.with_for_update(skip_locked=True)
        rows = s.execute(pick).all()
        for row in rows:
            _expire(s, row, expired, max_retries)
        return len(rows)


def _expire(s: Session, row, expired, max_retries: int) -> None:
    why = (
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
