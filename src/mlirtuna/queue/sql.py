"""The queue's hot statements, built once: the claim, the record, the lease renewal and the
attempt log, with their bind parameters (`p_…`; `w_…` the winner, `c_…`/`a_…` candidates).

The claim and the record run once per job on every worker: their statements are built once,
here, with bind parameters, compiled once per dialect and sent as SQL text (db.Precompiled).
Per backend, the fewest round trips it allows (bench/bench_overhead.py counts them); a worker
that takes one job at a time sends the record and the next claim together (RECORD_AND_CLAIM_*):
  PostgreSQL: claim = 1 statement (data-modifying CTEs: pick, take, attempt row, the problem),
              record = 1 statement (fenced update, result, candidates, attempt end), each in
              autocommit (one statement is atomic by itself: no BEGIN, no COMMIT);
  MariaDB/MySQL: claim = pick (SKIP LOCKED), then one script (problem, take, attempt);
              record = one script (fenced update, result and attempt end guarded by its row
              count), then the candidates (one multi-row INSERT); one transaction each;
  SQLite: statement by statement after BEGIN IMMEDIATE (no network: round trips cost little);
              the claim picks and takes in one UPDATE … RETURNING.
"""

from __future__ import annotations

from typing import Any

import sqlalchemy as sa
from sqlalchemy.dialects import postgresql

from mlirtuna.db import Precompiled, db_now, json_object
from mlirtuna.db.models import (
    COMPLETED,
    CONFIG_TABLES,
    NEW,
    RUNNING,
    Attempt,
    Candidate,
    Job,
    Result,
)
from mlirtuna.db.models import Problem as ProblemRow
from mlirtuna.defaults import MAX_LEASE_S

_J, _A, _P = Job.__table__, Attempt.__table__, ProblemRow.__table__
_R, _C = Result.__table__, Candidate.__table__
_NOW = db_now()
_TOKEN = sa.bindparam("p_token", type_=sa.String(32))
_MACHINE = sa.bindparam("p_machine", type_=sa.String(200))
_GPU = sa.bindparam("p_gpu", type_=sa.Integer())
_GPU_KEY = sa.bindparam("p_gpu_key", type_=sa.String(200))
_WORKER = sa.bindparam("p_worker", type_=sa.String(32))
# One worker per GPU: a GPU (its key, models.Attempt.gpu) on which another worker holds a live
# attempt (open, its job running under that attempt's lease, the lease not expired) is not
# claimed on ("" : a worker without a GPU). Containers with a /tmp of their own share the GPU,
# not the host's lock file (worker/gpulock.py). Only a lease a claim or a heartbeat could have
# set counts (at most MAX_LEASE_S ahead), of an attempt claimed by now: a job set running with
# an unbounded lease by a worker login, with an attempt naming another machine's GPU, stopped
# every worker on that GPU (issue 43).
_HELD = _J.alias("held")
PLAUSIBLE_LEASE = db_now(MAX_LEASE_S)
# Who holds it, and the job and lease end a worker waiting for the GPU names (claim.GpuHolder).
_HOLDER = (_A.c.machine_name, _A.c.pid, _HELD.c.session_id, _A.c.claimed_at, _A.c.worker)
_HOLDING = (_HELD.c.id.label("job_id"), _HELD.c.lease_expires_at, _NOW.label("db_now"))
GPU_HOLDERS = (
    sa.select(*_HOLDER, *_HOLDING)
    .join(_HELD, _HELD.c.id == _A.c.job_id)
    .where(
        _A.c.gpu == _GPU_KEY,
        _A.c.ended_at.is_(None),
        _A.c.worker != _WORKER,
        _HELD.c.lease_token == _A.c.lease_token,
        _HELD.c.state == RUNNING,
        _HELD.c.lease_expires_at > _NOW,
        _HELD.c.lease_expires_at <= PLAUSIBLE_LEASE,
        _A.c.claimed_at <= _NOW,
    )
)
_GPU_HELD = sa.exists(GPU_HOLDERS.with_only_columns(_A.c.id))
# What makes a job claimable: the one place to extend (every backend's claim uses it).
_CLAIMABLE = sa.and_(
    _J.c.session_id == sa.bindparam("p_session", type_=sa.Integer()),
    _J.c.state == NEW,
    # One stage per claim (the worker's role in its session): with equality on every column
    # before them, ix_job_claim yields the rows in (priority, id) order and LIMIT 1 stops there.
    _J.c.stage == sa.bindparam("p_stage", type_=sa.String(16)),
    sa.or_(_J.c.not_before.is_(None), _J.c.not_before <= _NOW),
    sa.or_(_GPU_KEY == "", sa.not_(_GPU_HELD)),
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
    "gpu": _GPU_KEY,
    "gpu_perf": sa.bindparam("p_gpu_perf", type_=sa.String(64)),
    "worker": _WORKER,
}
# A claim sent with a record (record_and_claim) names the next job's token n_token: p_token
# is the recorded job's, which fences the record.
_NEXT_TOKEN = sa.bindparam("n_token", type_=sa.String(32))
_TAKE_NEXT = {**_TAKE, "lease_token": _NEXT_TOKEN}
_ATTEMPT_NEXT = {**_ATTEMPT, "lease_token": _NEXT_TOKEN}
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
CLAIM_SQLITE = Precompiled(
    sa.update(_J)
    .where(_J.c.id == _NEXT.with_only_columns(_J.c.id).scalar_subquery())
    .values(_TAKE)
    .returning(_J.c.id, _J.c.problem_id, _J.c.retries)
)
_JOB_ID = sa.bindparam("p_job", type_=sa.BigInteger())  # ids are 64-bit (migration 0019)
ADD_ATTEMPT = sa.insert(_A).values(job_id=_JOB_ID, **_ATTEMPT)
_READ_PROBLEM = (
    sa.select(*_PROBLEM_COLUMNS)
    .select_from(_with_problem(_P, _P.c.id))
    .where(_P.c.id == sa.bindparam("p_problem", type_=sa.Integer()))
)
ADD_ATTEMPT_SQLITE = Precompiled(ADD_ATTEMPT)
READ_PROBLEM_SQLITE = Precompiled(_READ_PROBLEM)
# MariaDB/MySQL (no UPDATE … RETURNING, no data-modifying CTEs): one script, one round trip, in
# the claim's transaction: lock the next free row, skipping rows other workers hold, into session
# variables; take it; add its attempt row; read it back with its problem (no row: none free).
_PICKED = ("@mlirtuna_job", "@mlirtuna_problem", "@mlirtuna_retries")


def _claim_mysql_statements(
    take: dict = _TAKE, attempt_values: dict = _ATTEMPT, guard: Any = None
) -> list[sa.ClauseElement]:
    """The claim script's statements; the second is the pick, which _pick_into edits.
    `guard`: a condition the pick also needs (record_and_claim: the record matched)."""
    picked: list[sa.ColumnClause[Any]] = [sa.literal_column(v) for v in _PICKED]
    job, problem, retries = picked
    attempt = sa.select(job, *attempt_values.values()).where(job.is_not(None))
    pick = _NEXT if guard is None else _NEXT.where(guard)
    return [
        sa.text(f"SET {', '.join(f'{v} = NULL' for v in _PICKED)}"),
        pick.with_for_update(skip_locked=True),
        sa.update(_J).where(_J.c.id == job).values(take),
        sa.insert(_A).from_select(["job_id", *attempt_values], attempt),
        sa.select(job, problem, retries, *_PROBLEM_COLUMNS)
        .select_from(_with_problem(_P, _P.c.id))
        .where(_P.c.id == problem),
    ]


def _pick_into(at: int):
    def edit(i: int, sql: str) -> str:  # SELECT … INTO @… FROM …: Core has no INTO
        if i != at:
            return sql
        return sql.replace("\nFROM job", f" INTO {', '.join(_PICKED)}\nFROM job", 1)

    return edit


CLAIM_MYSQL = Precompiled(*_claim_mysql_statements(), edit=_pick_into(1))


def _taken_pg(take: dict = _TAKE, attempt_values: dict = _ATTEMPT, guard: Any = None):
    """The claim's CTEs: `taken` (the job picked with SKIP LOCKED and taken, when `guard`
    holds) and its attempt row."""
    pick = _NEXT.with_only_columns(_J.c.id).with_for_update(skip_locked=True).scalar_subquery()
    where = _J.c.id == pick if guard is None else sa.and_(_J.c.id == pick, guard)
    taken = (
        sa.update(_J)
        .where(where)
        .values(take)
        .returning(_J.c.id, _J.c.problem_id, _J.c.retries)
        .cte("taken")
    )
    attempt = (
        sa.insert(_A)
        .from_select(["job_id", *attempt_values], sa.select(taken.c.id, *attempt_values.values()))
        .cte("new_attempt")
    )
    return taken, attempt


def _claim_pg() -> Precompiled:
    """PostgreSQL: pick (SKIP LOCKED), take, add the attempt row and read the problem, all in
    one statement."""
    taken, attempt = _taken_pg()
    return Precompiled(
        sa.select(taken.c.id, taken.c.problem_id, taken.c.retries, *_PROBLEM_COLUMNS)
        .select_from(_with_problem(taken, taken.c.problem_id))
        .add_cte(attempt)
    )


CLAIM_PG = _claim_pg()


# A batch: the next `limit` claimable jobs in claim order, locked (PostgreSQL, MariaDB: rows
# other workers hold are skipped) or, on SQLite, under the write lock of BEGIN IMMEDIATE.
NEXT_MANY = _NEXT.limit(sa.bindparam("p_limit", type_=sa.Integer()))
PICK_MANY_SKIP_LOCKED = NEXT_MANY.with_for_update(skip_locked=True)
# Each job of a batch gets its own token: one statement, run once per picked row.
TAKE_ONE = sa.update(_J).where(_J.c.id == _JOB_ID, _J.c.state == NEW).values(_TAKE)


_FENCE = sa.and_(
    _J.c.id == _JOB_ID,
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
_WINNER: dict[str, sa.BindParameter[Any] | str] = {
    "perf_config": sa.bindparam("w_perf_config", type_=sa.String(255)),
    "kernel_time": sa.bindparam("w_kernel_time", type_=sa.Double()),
    "tflops": sa.bindparam("w_tflops", type_=sa.Double()),
    "perf_family": sa.bindparam("w_perf_family", type_=sa.String(16)),
    "key_suffix": "",
    "winner_margin": sa.bindparam("w_margin", type_=sa.Double()),
    "winner_noise": sa.bindparam("w_noise", type_=sa.Double()),
}
CANDIDATE_TYPES: dict[str, sa.types.TypeEngine[Any]] = {
    "perf_config": sa.String(255),
    "kernel_time": sa.Double(),
    "tflops": sa.Double(),
    "error": sa.Text(),
    "perf_family": sa.String(16),
    "time_min": sa.Double(),
    "time_iqr": sa.Double(),
    "samples": sa.Integer(),
    "remeasured": sa.Boolean(),
    "search_time": sa.Double(),
    "search_round": sa.Integer(),
}
_IDS = {
    "session_id": sa.bindparam("p_session", type_=sa.Integer()),
    "problem_id": sa.bindparam("p_problem", type_=sa.Integer()),
    "job_id": _JOB_ID,
}
_ENDED = {"ended_at": _NOW, "outcome": sa.bindparam("p_outcome", type_=sa.String(16))}
_ENDED["message"] = sa.bindparam("p_message", type_=sa.Text())
_OPEN_ATTEMPT = sa.and_(_A.c.lease_token == _TOKEN, _A.c.ended_at.is_(None))
# SQLite: the fenced update first; nothing else is sent when it matched nothing.
COMPLETE = sa.update(_J).where(_FENCE).values(_COMPLETED)
COMPLETE_SQLITE = Precompiled(COMPLETE)
ADD_RESULT_SQLITE = Precompiled(sa.insert(_R).values(**_IDS, **_WINNER))
ADD_CANDIDATES = Precompiled(
    sa.insert(_C).values(
        **_IDS, **{k: sa.bindparam(f"c_{k}", type_=t) for k, t in CANDIDATE_TYPES.items()}
    )
)
END_ATTEMPT = sa.update(_A).where(_OPEN_ATTEMPT).values(_ENDED)
END_ATTEMPT_SQLITE = Precompiled(END_ATTEMPT)


_RECORDED: sa.ColumnClause[Any] = sa.literal_column("@mlirtuna_recorded")


def _record_mysql_statements() -> list[sa.ClauseElement]:
    """MariaDB/MySQL: one script (one round trip): the fenced update, its row count kept in a
    session variable, the result and the attempt's end only when it matched, and that count;
    the candidates follow (one multi-row INSERT) only when it did."""
    values = (sa.literal(v) if isinstance(v, str) else v for v in _WINNER.values())
    winner = sa.select(*_IDS.values(), *values).where(_RECORDED == 1)
    return [
        COMPLETE,
        sa.text("SET @mlirtuna_recorded = ROW_COUNT()"),
        sa.insert(_R).from_select([*_IDS, *_WINNER], winner),
        sa.update(_A).where(_OPEN_ATTEMPT, _RECORDED == 1).values(_ENDED),
        sa.select(_RECORDED),
    ]


RECORD_MYSQL = Precompiled(*_record_mysql_statements())
# The record of job N and the claim of job N+1 as one script (record_and_claim): the record's
# five statements, then the claim's, whose pick also needs the record to have matched. Rows:
# [4] the record's count, [-1] the job taken with its problem (none: none taken).
_RECORD = _record_mysql_statements()
RECORD_AND_CLAIM_MYSQL = Precompiled(
    *_RECORD,
    *_claim_mysql_statements(_TAKE_NEXT, _ATTEMPT_NEXT, _RECORDED == 1),
    edit=_pick_into(len(_RECORD) + 1),
)


RENEW = Precompiled(
    sa.update(_J)
    .where(_FENCE)
    .values(
        lease_expires_at=db_now(sa.bindparam("p_lease_s", type_=sa.Double())), heartbeat_at=_NOW
    )
)


def _record_pg_ctes() -> tuple[sa.CTE, list[sa.CTE]]:
    """The record's CTEs: `done` (the fenced update's RETURNING) and the writes that read it."""
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
        *(sa.bindparam(f"a_{k}", type_=postgresql.ARRAY(t)) for k, t in CANDIDATE_TYPES.items())
    ).table_valued(*(sa.column(k, t) for k, t in CANDIDATE_TYPES.items()))
    rows = rows.render_derived(name="tried")
    candidates = sa.insert(_C).from_select(
        [*_IDS, *CANDIDATE_TYPES],
        sa.select(*ids, *(rows.c[k] for k in CANDIDATE_TYPES)).select_from(
            done.join(rows, sa.true())
        ),
    )
    ended = sa.update(_A).where(_OPEN_ATTEMPT, sa.exists(sa.select(done.c.id))).values(_ENDED)
    return done, [winner.cte("winner"), candidates.cte("candidates"), ended.cte("ended")]


def _record_pg() -> Precompiled:
    """PostgreSQL: the fenced update, the result, every candidate (arrays, unnested) and the
    attempt's end in one statement; each insert reads the update's RETURNING, so nothing is
    written when the fence matched nothing. Returns one row per job completed (0 or 1)."""
    done, writes = _record_pg_ctes()
    return Precompiled(sa.select(done.c.id).add_cte(*writes))


RECORD_PG = _record_pg()


def _record_and_claim_pg() -> Precompiled:
    """PostgreSQL: the record of job N and the claim of job N+1 in one statement (one round
    trip, one commit): the claim's update also needs the record's `done` row, so a refused
    record takes nothing. One row when recorded: (recorded job, the job taken or NULLs, its
    problem); no row when the fence matched nothing."""
    done, writes = _record_pg_ctes()
    taken, attempt = _taken_pg(_TAKE_NEXT, _ATTEMPT_NEXT, sa.exists(sa.select(done.c.id)))
    claimed = _with_problem(taken, taken.c.problem_id)
    return Precompiled(
        sa.select(done.c.id, taken.c.id, taken.c.problem_id, taken.c.retries, *_PROBLEM_COLUMNS)
        .select_from(done.outerjoin(claimed, sa.true()))
        .add_cte(*writes, attempt)
    )


RECORD_AND_CLAIM_PG = _record_and_claim_pg()
