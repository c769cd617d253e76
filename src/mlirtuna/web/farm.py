"""The farm as a whole, as the dashboard shows it: sessions with progress and rate, live workers.

Every query here aggregates in the database and pages on the server, so the answers stay small
however big the farm grows (docs/benchmarks.md, "dashboard"). Times are measured with the
database clock, as the queue does, so that no machine's clock matters.
"""

from __future__ import annotations

import datetime as dt
import weakref
from dataclasses import asdict, dataclass, field, replace
from typing import Any

import sqlalchemy as sa
from sqlalchemy.orm import Session as OrmSession

from mlirtuna import catalog, sessions
from mlirtuna.db import Database, db_now, stored_time, utcnow
from mlirtuna.db.models import (
    CANCELLED,
    COMPLETED,
    ERROR,
    JOB_STATES,
    NEW,
    RUNNING,
    WAITING,
    Attempt,
    FusionConfig,
    Job,
    Problem,
    TuningSession,
)
from mlirtuna.sessions import Session

RATE_WINDOW_S = 600  # jobs/min is measured over the last ten minutes of finished jobs
# A worker beats every third of its lease; a heartbeat older than half the lease means at least
# one beat was missed, which is flagged while the lease still holds (it expires at the full lease).
STALE_FRACTION = 0.5
DEFAULT_PAGE = 50
MAX_PAGE = 500


@dataclass(frozen=True)
class SessionProgress:
    """One session on the farm page: its context, counts by state, rate and ETA."""

    session: Session
    counts: dict[str, int]
    total: int
    done: int  # completed + error + cancelled: nothing more will happen to them
    per_minute: float | None  # None: no job finished in the rate window
    eta_s: float | None
    ops: list[str] = field(default_factory=list)  # what it tunes (sessions.ops)

    @property
    def active(self) -> bool:
        return _open(self.counts)

    def as_dict(self) -> dict[str, Any]:
        out = asdict(self)
        out["session"] = self.session.public_dict()  # no path of the host that opened it
        out["active"] = self.active
        return out


@dataclass(frozen=True)
class FarmPage:
    now: str
    total_sessions: int
    offset: int
    sessions: list[SessionProgress]

    def as_dict(self) -> dict[str, Any]:
        return {
            "now": self.now,
            "total_sessions": self.total_sessions,
            "offset": self.offset,
            "sessions": [p.as_dict() for p in self.sessions],
        }


@dataclass(frozen=True)
class BusyWorker:
    """A worker holding a job now: where it runs, what it tunes, how long, how fresh its beat."""

    session_id: int
    job_id: int
    machine_name: str
    gpu_id: int
    pid: int
    problem_id: int
    test_vector: str
    running_s: float
    heartbeat_age_s: float
    lease_left_s: float
    stale: bool  # missed heartbeats, lease still held
    expired: bool  # lease ran out: the next claim takes the job back
    # The GPU's identity (unique or PCI bus id, else MACHINE:INDEX) and performance level, as
    # the attempt recorded them ("" where the tools report none).
    gpu: str = ""
    gpu_perf: str = ""

    def as_dict(self) -> dict[str, Any]:
        return asdict(self)


def session_search(text: str | None) -> list[sa.ColumnElement[bool]]:
    """The farm page's search as conditions on the session table (none for no text)."""
    text = (text or "").strip()
    if not text:
        return []
    S = TuningSession
    escaped = text.replace("\\", "\\\\").replace("%", "\\%").replace("_", "\\_")
    like = f"%{escaped.lower()}%"
    columns = (S.name, S.reason, S.ticket, S.arch_full, S.tuner, S.mlir_v, S.tuning_space)
    matches: list[sa.ColumnElement[bool]] = [
        sa.func.lower(sa.func.coalesce(c, "")).like(like, escape="\\") for c in columns
    ]
    if text.isdigit() and len(text) <= 9:
        matches.append(S.id == int(text))
    return [sa.or_(*matches)]


def clamp_page(offset: int, limit: int) -> tuple[int, int]:
    return max(offset, 0), min(max(limit, 1), MAX_PAGE)


def now(s: OrmSession) -> dt.datetime:
    """The database clock, naive UTC."""
    # Never None (the database writes its clock as a timestamp); utcnow() only satisfies typing.
    return stored_time(s.scalar(sa.select(db_now()))) or utcnow()


def farm(
    db: Database, offset: int = 0, limit: int = DEFAULT_PAGE, search: str | None = None
) -> FarmPage:
    """The newest sessions first (one page), each with counts, jobs/min and ETA; `search`: only
    sessions whose id is it, or whose name, reason, ticket, arch, tuner or rocMLIR commit
    contains it."""
    offset, limit = clamp_page(offset, limit)
    where = session_search(search)
    with db.session() as s:
        clock = now(s)
        total = s.scalar(sa.select(sa.func.count()).select_from(TuningSession).where(*where)) or 0
        rows = s.scalars(
            sa.select(TuningSession)
            .where(*where)
            .order_by(TuningSession.id.desc())
            .offset(offset)
            .limit(limit)
        ).all()
        ids = [r.id for r in rows]
        counts = _counts(s, ids)
        rates = _finished_recently(s, [i for i in ids if _open(counts[i])], clock)
    ops = _ops(db, ids, counts)
    return FarmPage(
        now=_iso(clock),
        total_sessions=total,
        offset=offset,
        sessions=[
            replace(_progress(Session.from_row(r), counts[r.id], rates.get(r.id)), ops=ops[r.id])
            for r in rows
        ],
    )


# sessions.ops reads a session's op from run_spec where `run` opened it; for another session it
# asks the database for the DISTINCT ops of the session's jobs: a scan of every job of the
# session (100k jobs: tenths of a second), and the farm page asks for 50 sessions every 2 s. So
# the answer is kept per session while its number of jobs stays the same (jobs are added by
# `jobs load`, which changes the count, and never change problem): one scan per session and
# load, not per poll. Kept per database handle (the dashboard holds one for its life): a key of
# the URL would outlive the database, and one made again at that URL numbers its sessions from 1
# again (tests do it all day). Cleared when it grows large.
_OPS_SEEN: weakref.WeakKeyDictionary[Database, dict[tuple[int, int], list[str]]] = (
    weakref.WeakKeyDictionary()
)
OPS_SEEN_MAX = 10_000


def _ops(db: Database, ids: list[int], counts: dict[int, dict[str, int]]) -> dict[int, list[str]]:
    seen = _OPS_SEEN.setdefault(db, {})
    keys = {sid: (sid, sum(counts[sid].values())) for sid in ids}
    out = {sid: seen[k] for sid, k in keys.items() if k in seen}
    missing = [sid for sid in ids if sid not in out]
    if missing:
        found = sessions.ops(db, missing)
        if len(seen) + len(missing) > OPS_SEEN_MAX:
            seen.clear()
        for sid in missing:
            out[sid] = found[sid]
            if found[sid]:  # nothing yet (an import still writing): ask again next time
                seen[keys[sid]] = found[sid]
    return out


def session_progress(db: Database, session_id: int) -> SessionProgress:
    info = sessions.get(db, session_id)
    with db.session() as s:
        counts = _counts(s, [session_id])[session_id]
        rates = _finished_recently(s, [session_id] if _open(counts) else [], now(s))
    ops = _ops(db, [session_id], {session_id: counts})[session_id]
    return replace(_progress(info, counts, rates.get(session_id)), ops=ops)


def stage_progress(db: Database, session_id: int) -> dict[str, dict[str, int]]:
    """{stage: {done, total}} of a two-stage session's compile and benchmark jobs ({} for a
    one-stage session)."""
    from mlirtuna.queue import jobs

    by_stage = jobs.stage_counts(db, session_id)
    if set(by_stage) <= {"tune"}:
        return {}
    return {
        stage: {"done": c[COMPLETED] + c[ERROR] + c[CANCELLED], "total": sum(c.values())}
        for stage, c in by_stage.items()
    }


def _open(counts: dict[str, int]) -> bool:
    return counts[NEW] + counts[WAITING] + counts[RUNNING] > 0


def _counts(s: OrmSession, ids: list[int]) -> dict[int, dict[str, int]]:
    out = {i: dict.fromkeys(JOB_STATES, 0) for i in ids}
    if ids:
        stmt = (
            sa.select(Job.session_id, Job.state, sa.func.count())
            .where(Job.session_id.in_(ids))
            .group_by(Job.session_id, Job.state)
        )
        for sid, state, n in s.execute(stmt):
            out[sid][state] = n
    return out


def _finished_recently(
    s: OrmSession, ids: list[int], clock: dt.datetime
) -> dict[int, tuple[int, float]]:
    """{session: (jobs finished in the window, seconds of the window the session was running)}."""
    if not ids:
        return {}
    since = clock - dt.timedelta(seconds=RATE_WINDOW_S)
    stmt = (
        sa.select(
            Job.session_id,
            sa.func.count(Job.finished_at),
            sa.func.min(Job.claimed_at),
        )
        .where(
            Job.session_id.in_(ids),
            Job.state.in_((COMPLETED, ERROR, RUNNING)),
            Job.claimed_at.is_not(None),
            sa.or_(Job.finished_at >= since, Job.state == RUNNING),
        )
        .group_by(Job.session_id)
    )
    out = {}
    for sid, finished, first in s.execute(stmt):
        started = max(stored_time(first) or since, since)
        out[sid] = (finished, max((clock - started).total_seconds(), 1.0))
    return out


def _progress(
    info: Session, counts: dict[str, int], rate: tuple[int, float] | None
) -> SessionProgress:
    total = sum(counts.values())
    done = counts[COMPLETED] + counts[ERROR] + counts[CANCELLED]
    per_minute, eta = _rate_and_eta(total - done, rate)
    return SessionProgress(info, counts, total, done, per_minute, eta)


def _rate_and_eta(left: int, rate: tuple[int, float] | None) -> tuple[float | None, float | None]:
    """(jobs/min, seconds to finish `left` jobs at that rate); None, None: nothing finished in
    the window."""
    if rate is None or rate[0] <= 0:
        return None, None
    per_minute = 60.0 * rate[0] / rate[1]
    return per_minute, left / (per_minute / 60.0)


def rates(
    db: Database, counts: dict[int, dict[str, int]]
) -> dict[int, tuple[float | None, float | None]]:
    """{session: (jobs/min, ETA seconds)} of sessions whose counts by state are `counts`, as
    the farm page shows them (`status` asks too): one query for every open session."""
    with db.session() as s:
        recent = _finished_recently(s, [sid for sid, c in counts.items() if _open(c)], now(s))
    left = {
        sid: sum(c.values()) - c[COMPLETED] - c[ERROR] - c[CANCELLED] for sid, c in counts.items()
    }
    return {sid: _rate_and_eta(left[sid], recent.get(sid)) for sid in counts}


def workers(db: Database, session_id: int | None = None) -> list[BusyWorker]:
    """Every job held now, with its worker (from the attempt that holds the lease)."""
    stmt = (
        sa.select(
            Job.session_id,
            Job.id,
            Job.machine_name,
            Job.gpu_id,
            Attempt.pid,
            Attempt.gpu,
            Attempt.gpu_perf,
            Job.problem_id,
            catalog.label_column().label("test_vector"),  # a fusion: file @function: key
            Job.claimed_at,
            Job.heartbeat_at,
            Job.lease_expires_at,
        )
        .join(Problem, Problem.id == Job.problem_id)
        .outerjoin(FusionConfig, FusionConfig.id == Problem.id)
        .outerjoin(Attempt, Attempt.lease_token == Job.lease_token)
        .where(Job.state == RUNNING)
        .order_by(Job.machine_name, Job.gpu_id, Job.id)
    )
    if session_id is not None:
        stmt = stmt.where(Job.session_id == session_id)
    with db.session() as s:
        clock = now(s)
        return [_busy(row, clock) for row in s.execute(stmt)]


def _busy(row: sa.Row, clock: dt.datetime) -> BusyWorker:
    claimed, beat, expires = (
        stored_time(v) for v in (row.claimed_at, row.heartbeat_at, row.lease_expires_at)
    )
    beat = beat or claimed or clock
    expires = expires or clock
    lease_s = max((expires - beat).total_seconds(), 0.0)
    age = max((clock - beat).total_seconds(), 0.0)
    left = (expires - clock).total_seconds()
    return BusyWorker(
        session_id=row.session_id,
        job_id=row.id,
        machine_name=row.machine_name,
        gpu_id=row.gpu_id,
        pid=row.pid or 0,
        gpu=str(row.gpu or ""),
        gpu_perf=str(row.gpu_perf or ""),
        problem_id=row.problem_id,
        test_vector=row.test_vector,
        running_s=max((clock - (claimed or clock)).total_seconds(), 0.0),
        heartbeat_age_s=age,
        lease_left_s=left,
        stale=left > 0 and age > STALE_FRACTION * lease_s,
        expired=left <= 0,
    )


def _iso(value: dt.datetime) -> str:
    return value.strftime("%Y-%m-%dT%H:%M:%SZ")
