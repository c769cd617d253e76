"""Export: the winners of matching sessions as the tuning DB that perfRunner reads.

- Which sessions: those named (`--session`), or every session of the chip (`--arch`, as the bare
  chip name or the exact arch_full) narrowed by num_cu, num_chiplets and tuning space. Unnamed
  sessions must then share one context (arch_full, num_cu, num_chiplets, tuning space): writing
  an MI300X winner next to an MI308 one (both gfx942) into one file is the mistake rocMLIR
  PR #2248 guards against, so we refuse and say which flag narrows it. Retired sessions
  (`session retire`) are never picked this way, only when named.
- Per problem, the newest session wins (created_at, then id). Only counted results
  (winners.counted: completed jobs, or imported rows).
- The `arch` column is the session's arch_full: perfRunner looks rows up by the exact
  gcnArchName (rocmlir-interfaces §1d/§2a), e.g. `gfx942:sramecc+:xnack-`, and tuningRunner E3
  writes it so. A session imported from a file with a bare chip name keeps that name.
- Formats: v3 (tuningRunner E3's ten columns), v2 (E2's five, one header per tuning space),
  t4 (the T4 autotuning results JSON of one session's candidates, for Kernel Tuner and the
  autotuning-methodology tools), debug (every candidate as rocMLIR's `.debug` TSV, for its
  quick-tuning tools: debugexport.py).
- Key form (v3, v2): `plain` test vectors, or `split-k` ones ending `-supportsSplitK true|false`
  (the row's own value, else what perfRunner assumes for a plain key: keys.with_form), as the
  target perfRunner looks them up. Default: the newest chosen session's key_form, recorded when
  it was opened (the form of its build) or imported (the form of its file).
- The file is written to a temp file in the same folder and renamed: a failure leaves the old
  file, never half a new one.
"""

from __future__ import annotations

import contextlib
import datetime as dt
import io
import json
import math
import os
import sys
import tempfile
from collections.abc import Sequence
from dataclasses import dataclass, field, replace
from typing import Any

import sqlalchemy as sa
from sqlalchemy.orm import Session

import mlirtuna.formats.tuningdb as tuningdb
import mlirtuna.history.debugexport as debugexport
import mlirtuna.history.winners as winners
from mlirtuna import keys, sessions
from mlirtuna.db import Database
from mlirtuna.db.models import Candidate, FusionConfig, Job, Problem, Result, TuningSession
from mlirtuna.errors import NotFound, UserError

FORMATS = ("v3", "v2", "t4", "debug")
T4_SCHEMA_VERSION = "1.0.0"  # Kernel Tuner's kernel_tuner/schema/T4/1.0.0/results-schema.json


@dataclass(frozen=True)
class ExportQuery:
    """What to export; arch may be None only when sessions are named."""

    arch: str | None = None
    num_cu: int | None = None
    num_chiplets: int | None = None
    sessions: tuple[int, ...] = ()
    op: str | None = None
    tuning_space: str | None = None
    key_format: str | None = None  # plain | split-k; None: the newest chosen session's
    # A context picks real sessions only; True: the stand-in's only (a stand-in `run` exports
    # its own context so). Named sessions are taken whatever they are.
    standin: bool = False


@dataclass
class Exported:
    """The rendered file and what went into it."""

    text: str
    rows: int
    sessions: list[int] = field(default_factory=list)
    format: str = "v3"
    notes: list[str] = field(default_factory=list)  # e.g. stand-in sessions left out
    # Which of two rows with one key was written (_one_per_key): only a fusion module's key
    # meets another's, so these concern fusion problems alone (`run` says them for a fusion run).
    key_notes: list[str] = field(default_factory=list)

    def as_dict(self) -> dict[str, Any]:
        return {"rows": self.rows, "sessions": self.sessions, "format": self.format}


def export(db: Database, query: ExportQuery, fmt: str = "v3", out: str = "-") -> Exported:
    """Render and write (atomically; `-` is stdout). Nothing matching is a UserError."""
    done = render(db, query, fmt)
    write_text(out, done.text)
    return done


def render(db: Database, query: ExportQuery, fmt: str = "v3") -> Exported:
    if fmt not in FORMATS:
        raise UserError(f"unknown format {fmt!r} (known: {', '.join(FORMATS)})")
    winners.check_op(query.op)
    if query.key_format is not None and query.key_format not in keys.KEY_FORMS:
        raise UserError(
            f"unknown key format {query.key_format!r} (known: {', '.join(keys.KEY_FORMS)})"
        )
    notes: list[str] = []
    key_notes: list[str] = []
    with db.session() as s:
        if fmt == "t4":
            t4 = _render_t4(s, select_t4_session(s, query, notes), query.op)
            return replace(t4, notes=notes)
        chosen = select_sessions(s, query, notes)
        if fmt == "debug":
            text, count = debugexport.render(s, chosen, query.op)
            return Exported(text, count, sorted(x.id for x in chosen), fmt, notes)
        form = query.key_format or chosen[0].key_form or keys.PLAIN
        rows, used = winner_rows(s, chosen, query.op, form, key_notes)
    if not rows:
        raise UserError(f"no completed results in session(s) {_ids(chosen)}{_op_text(query)}")
    out = io.StringIO()
    if fmt == "v3":
        tuningdb.write_v3(rows, out)
    else:
        _write_v2(rows, out)
    return Exported(out.getvalue(), len(rows), sorted(used), fmt, notes, key_notes)


# --- Sessions ---------------------------------------------------------------------------------


def select_sessions(
    s: Session, query: ExportQuery, notes: list[str] | None = None
) -> list[TuningSession]:
    """The sessions to export, newest first; UserError when none or an ambiguous mix. What a
    reader must know of them (stand-in sessions left out, or named) goes to `notes`."""
    said = notes if notes is not None else []
    if query.sessions:
        named = _named_sessions(s, query)
        said += [_named_standin(x) for x in named if x.standin]
        return named
    if not query.arch:
        raise UserError("give --arch (or name sessions with --session)")
    # A retired session is history, never picked by a context (only when named); a stand-in
    # session's numbers are made up, never picked for a real context (only when named).
    stmt = sa.select(TuningSession).where(*_filters(query), TuningSession.retired_at.is_(None))
    every = list(s.scalars(stmt.order_by(*_newest_first())))
    found = [x for x in every if x.standin == query.standin]
    left_out = [x.id for x in every if x.standin and not query.standin]
    how = "name them with --session to export them"
    if left_out:
        said.append(sessions.left_out_line(left_out, how))
    if not found and left_out:
        raise UserError(
            f"no session but stand-in ones matches {_describe(query)}: "
            + sessions.left_out_line(left_out, how)
        )
    if not found:
        raise UserError(
            f"no session matches {_describe(query)}: `mlirtuna session list` shows them"
        )
    contexts = {_context(x) for x in found}
    if len(contexts) > 1:
        listed = "; ".join(sorted(_context_text(c) for c in contexts))
        raise UserError(
            f"sessions of {len(contexts)} contexts match {_describe(query)} ({listed}): narrow "
            "with --arch (full name), --num-cu, --num-chiplets or --tuning-space, or name "
            "sessions with --session"
        )
    return found


def _named_standin(x: TuningSession) -> str:
    return f"session {x.id} is a stand-in session ({sessions.STANDIN_WHY}): exported as named"


def _named_sessions(s: Session, query: ExportQuery) -> list[TuningSession]:
    ids = list(dict.fromkeys(query.sessions))
    found = {x.id: x for x in s.scalars(sa.select(TuningSession).where(TuningSession.id.in_(ids)))}
    missing = [i for i in ids if i not in found]
    if missing:
        raise NotFound(f"no session {missing[0]}: `mlirtuna session list` shows them")
    wrong = [i for i in ids if not _matches(found[i], query)]
    if wrong:
        raise UserError(
            f"session {wrong[0]} ({_context_text(_context(found[wrong[0]]))}) does "
            f"not match {_describe(query)}"
        )
    return sorted(found.values(), key=lambda x: (x.created_at, x.id), reverse=True)


def _filters(query: ExportQuery) -> list[sa.ColumnElement[bool]]:
    where: list[sa.ColumnElement[bool]] = []
    if query.arch:
        where.append(
            sa.or_(TuningSession.arch == query.arch, TuningSession.arch_full == query.arch)
        )
    if query.num_cu is not None:
        where.append(TuningSession.num_cu == query.num_cu)
    if query.num_chiplets is not None:
        where.append(TuningSession.num_chiplets == query.num_chiplets)
    if query.tuning_space is not None:
        where.append(TuningSession.tuning_space == query.tuning_space)
    return where


def _matches(x: TuningSession, query: ExportQuery) -> bool:
    """_filters, for sessions already loaded."""
    return (
        (not query.arch or query.arch in (x.arch, x.arch_full))
        and query.num_cu in (None, x.num_cu)
        and query.num_chiplets in (None, x.num_chiplets)
        and query.tuning_space in (None, x.tuning_space)
    )


def _newest_first() -> tuple[sa.UnaryExpression, sa.UnaryExpression]:
    return TuningSession.created_at.desc(), TuningSession.id.desc()


def _context(x: TuningSession) -> tuple[str, int, int, str]:
    return x.arch_full, x.num_cu, x.num_chiplets, x.tuning_space


def _context_text(c: tuple[str, int, int, str]) -> str:
    return f"{c[0]} {c[1]} CUs {c[2]} chiplet(s) {c[3]}"


def _describe(query: ExportQuery) -> str:
    parts = [f"arch {query.arch}"] if query.arch else []
    for label, value in (
        ("num_cu", query.num_cu),
        ("num_chiplets", query.num_chiplets),
        ("tuning space", query.tuning_space),
    ):
        if value is not None:
            parts.append(f"{label} {value}")
    return ", ".join(parts) or "the query"


def _ids(chosen: Sequence[TuningSession]) -> str:
    return ", ".join(str(x.id) for x in sorted(chosen, key=lambda x: x.id))


def _op_text(query: ExportQuery) -> str:
    return f" for op {query.op}" if query.op else ""


# --- Winners (v3 / v2) ------------------------------------------------------------------------


def winner_rows(
    s: Session,
    chosen: Sequence[TuningSession],
    op: str | None = None,
    form: str = keys.PLAIN,
    notes: list[str] | None = None,
) -> tuple[list[tuningdb.TuningRow], set[int]]:
    """One row per problem from the newest of `chosen` (newest first) that has it, and the
    sessions that gave rows; one query. A fusion winner is written under its tuning key (where
    perfRunner's fusion lookup searches); see _one_per_key for two problems with one key."""
    rank = {x.id: i for i, x in enumerate(chosen)}
    stmt = (
        winners.counted_results(
            Result.session_id,
            Result.problem_id,
            Problem.op,
            FusionConfig.file_name,
            sa.func.coalesce(FusionConfig.tuning_key, Problem.test_vector).label("test_vector"),
            Result.perf_config,
            Result.tflops,
            Result.tuned_at,
            Result.duration_s,
            Job.compile_start,
            Job.compile_end,
            Problem.op,
            Result.key_suffix,
        )
        .outerjoin(FusionConfig, FusionConfig.id == Problem.id)
        .where(Result.session_id.in_(list(rank)))
    )
    if op is not None:
        stmt = stmt.where(Problem.op == op)
    best: dict[int, Any] = {}
    for r in _rows(s, stmt):
        held = best.get(r.problem_id)
        if held is None or rank[r.session_id] < rank[held.session_id]:
            best[r.problem_id] = r
    best = _one_per_key(best, rank, notes if notes is not None else [])
    # Session columns read once per session, not through the ORM once per row.
    columns = {x.id: _SessionColumns.of(x) for x in chosen}
    rows = [columns[r.session_id].row(r, form) for r in best.values()]
    rows.sort(key=lambda row: row.test_vector)
    return rows, {r.session_id for r in best.values()}


def _one_per_key(best: dict[int, Any], rank: dict[int, int], notes: list[str]) -> dict[int, Any]:
    """A fusion's key can equal a plain problem's test vector (a fused kernel's key is the
    standalone problem's) or another fusion's. perfRunner keeps one perf config per key, so one
    row is written: the plain problem's (tuned on exactly the kernel the key names), else the
    newest session's fusion, else the first module by file name. Each drop is one note."""
    by_key: dict[str, Any] = {}
    for r in sorted(
        best.values(), key=lambda r: (r.op == "fusion", rank[r.session_id], r.file_name or "")
    ):
        kept = by_key.get(r.test_vector)
        if kept is None:
            by_key[r.test_vector] = r
            continue
        winner = f"{kept.op} problem {kept.problem_id}" + (
            f" ({kept.file_name})" if kept.file_name else ""
        )
        why = (
            "a plain problem is tuned on exactly that kernel"
            if kept.op != "fusion"
            else ("newer session or first file name")
        )
        notes.append(
            f"key {r.test_vector!r}: writing {winner}'s winner, not fusion {r.file_name}'s ({why})"
        )
    return {r.problem_id: r for r in by_key.values()}


def _rows(s: Session, stmt: sa.Select) -> Any:
    # Streamed in batches: 100,000 rows need not sit in the driver's buffer twice.
    return s.execute(stmt.execution_options(yield_per=10_000))


@dataclass(frozen=True, slots=True)
class _SessionColumns:
    """What every row of one session shares."""

    arch: str
    num_cu: int
    num_chiplets: int
    tuning_space: str
    commit: str | None
    created_at: dt.datetime

    @classmethod
    def of(cls, x: TuningSession) -> _SessionColumns:
        # arch_full: perfRunner keys on the exact gcnArchName (module docstring).
        # commit None: the writer prints "unknown", as E3 does where git fails.
        return cls(
            x.arch_full, x.num_cu, x.num_chiplets, x.tuning_space, x.mlir_v or None, x.created_at
        )

    def row(self, r: Any, form: str = keys.PLAIN) -> tuningdb.TuningRow:
        vector = r.test_vector
        if form != keys.PLAIN:
            vector = keys.with_form(r.op, vector, r.key_suffix, form)
        return tuningdb.TuningRow(
            arch=self.arch,
            num_cu=self.num_cu,
            num_chiplets=self.num_chiplets,
            test_vector=vector,
            perf_config=r.perf_config,
            # Legacy imports have no TFlops; "nan" is what str(float) prints and readers skip.
            tflops=math.nan if r.tflops is None else r.tflops,
            tuning_space=self.tuning_space,
            commit_id=self.commit,
            timestamp=_stamp(r.compile_start or r.tuned_at or self.created_at),
            duration_s=_duration(r),
            lineno=0,
        )


def _stamp(when: dt.datetime) -> str:
    """tuningdb.format_timestamp's text for our naive UTC values, by the C isoformat (strftime
    was a tenth of a 100,000-row export)."""
    return when.isoformat(timespec="seconds") + "Z"


def _duration(r: Any) -> float:
    if r.compile_start is not None and r.compile_end is not None:
        return max((r.compile_end - r.compile_start).total_seconds(), 0.0)
    return r.duration_s if r.duration_s is not None else 0.0


def _write_v2(rows: list[tuningdb.TuningRow], out: io.StringIO) -> None:
    """E2 prints one header per invocation, with the space in parentheses: one block per space."""
    spaces: dict[str, list[tuningdb.TuningRow]] = {}
    for row in rows:
        spaces.setdefault(row.tuning_space or "full", []).append(row)
    for space, block in spaces.items():
        tuningdb.write_v2(block, out, space)


# --- T4 ---------------------------------------------------------------------------------------


def _render_t4(s: Session, x: TuningSession, op: str | None) -> Exported:
    entries = _t4_candidates(s, x, op) or _t4_winners(s, x, op)
    if not entries:
        raise UserError(
            f"session {x.id} has no candidates or results{' for op ' + op if op else ''}"
        )
    doc = {"schema_version": T4_SCHEMA_VERSION, "results": entries, "metadata": _t4_meta(x)}
    return Exported(json.dumps(doc, indent=1) + "\n", len(entries), [x.id], "t4")


def select_t4_session(
    s: Session, query: ExportQuery, notes: list[str] | None = None
) -> TuningSession:
    if len(set(query.sessions)) > 1:
        raise UserError("t4 exports one session: give one --session")
    return select_sessions(s, query, notes)[0]


def _t4_candidates(s: Session, x: TuningSession, op: str | None) -> list[dict[str, Any]]:
    stmt = (
        sa.select(
            Problem.op,
            Problem.test_vector,
            Candidate.perf_config,
            Candidate.kernel_time,
            Candidate.tflops,
            Candidate.error,
            Job.compile_start,
        )
        .join(Problem, Problem.id == Candidate.problem_id)
        .join(Job, Job.id == Candidate.job_id)
        .where(Candidate.session_id == x.id)
        .order_by(Candidate.id)
    )
    if op is not None:
        stmt = stmt.where(Problem.op == op)
    return [
        _t4_entry(
            r.op,
            r.test_vector,
            r.perf_config,
            r.kernel_time,
            r.tflops,
            r.error,
            r.compile_start or x.created_at,
        )
        for r in _rows(s, stmt)
    ]


def _t4_winners(s: Session, x: TuningSession, op: str | None) -> list[dict[str, Any]]:
    """Imported sessions hold winners only: they are all the candidates there are."""
    stmt = (
        sa.select(
            Problem.op,
            Problem.test_vector,
            Result.perf_config,
            Result.kernel_time,
            Result.tflops,
            Result.tuned_at,
        )
        .join(Problem, Problem.id == Result.problem_id)
        .where(Result.session_id == x.id, Result.job_id.is_(None))
        .order_by(Result.id)
    )
    if op is not None:
        stmt = stmt.where(Problem.op == op)
    return [
        _t4_entry(
            r.op,
            r.test_vector,
            r.perf_config,
            r.kernel_time,
            r.tflops,
            None,
            r.tuned_at or x.created_at,
        )
        for r in _rows(s, stmt)
    ]


def _t4_entry(
    op: str,
    test_vector: str,
    perf_config: str,
    kernel_ns: float | None,
    tflops: float | None,
    error: str | None,
    when: dt.datetime,
) -> dict[str, Any]:
    """One T4 result: `configuration` is the problem plus the tuned parameter (perf_config);
    the objective is time, in ms as Kernel Tuner writes it."""
    valid = error is None and kernel_ns is not None
    ms = kernel_ns / 1e6 if valid and kernel_ns is not None else None
    measurements = [{"name": "time", "value": ms, "unit": "ms"}] if ms is not None else []
    if tflops is not None and math.isfinite(tflops):
        measurements.append({"name": "TFlops", "value": tflops, "unit": "TFLOP/s"})
    entry: dict[str, Any] = {
        "timestamp": when.strftime("%Y-%m-%dT%H:%M:%SZ"),
        "configuration": {"op": op, "test_vector": test_vector, "perf_config": perf_config},
        "objectives": ["time"],
        "times": {"runtimes": [ms] if ms is not None else []},
        "invalidity": "correct" if valid else t4_invalidity(error or ""),
        "correctness": 1 if valid else 0,
        "measurements": measurements,
    }
    if error:
        entry["error"] = error
    return entry


def t4_invalidity(error: str) -> str:
    """Our free-text reasons mapped onto T4's enum (timeout/compile/runtime/correctness/
    constraints); rocmlir-tuning-driver's N/A means the perf config does not apply."""
    text = error.lower()
    for needles, kind in (
        (("not applicable", "n/a"), "constraints"),
        (("timeout", "timed out"), "timeout"),
        (("compil",), "compile"),
        (("wrong result", "verif", "mismatch", "incorrect"), "correctness"),
    ):
        if any(n in text for n in needles):
            return kind
    return "runtime"


def _t4_meta(x: TuningSession) -> dict[str, Any]:
    return {
        "tool": "mlirtuna",
        "session": x.id,
        "arch": x.arch_full,
        "num_cu": x.num_cu,
        "num_chiplets": x.num_chiplets,
        "tuning_space": x.tuning_space,
        "tuner": x.tuner,
        "mlir_v": x.mlir_v or "unknown",
        "rocm_v": x.rocm_v,
    }


# --- Writing ----------------------------------------------------------------------------------


def fusion_file_name(db: Database, session_ids: Sequence[int]) -> str:
    """`tuning_fusion_<chip>.tsv`, rocMLIR's weekly job's name for its fusion tuning DB."""
    with db.session() as s:
        chips = set(
            s.scalars(sa.select(TuningSession.arch).where(TuningSession.id.in_(session_ids)))
        )
    return f"tuning_fusion_{'_'.join(sorted(chips)) or 'unknown'}.tsv"


def write_text(path: str, text: str) -> None:
    """`-` is stdout; a file is written next to its final name and renamed over it."""
    if path == "-":
        sys.stdout.write(text)
        sys.stdout.flush()
        return
    target = os.path.abspath(path)
    folder = os.path.dirname(target)
    if not os.path.isdir(folder):
        raise UserError(f"{path}: folder {folder} does not exist")
    try:
        fd, tmp = tempfile.mkstemp(prefix=".mlirtuna-", suffix=".tmp", dir=folder)
    except OSError as error:  # read-only file system, permission denied, disk full
        raise UserError(f"{path}: {error.strerror or error}") from None
    try:
        with os.fdopen(fd, "w", encoding="utf-8", newline="\n") as f:
            f.write(text)
            f.flush()
            os.fsync(f.fileno())
        os.chmod(tmp, _file_mode(target))  # mkstemp makes it 0600
        os.replace(tmp, target)
    except BaseException as error:
        with contextlib.suppress(FileNotFoundError):
            os.unlink(tmp)
        if isinstance(error, OSError):  # disk full, EIO: one line, the old file left whole
            raise UserError(f"{path}: {error.strerror or error}") from None
        raise


def _file_mode(target: str) -> int:
    """Keep the mode of the file replaced; a new one gets what open() would give it."""
    try:
        return os.stat(target).st_mode & 0o777
    except FileNotFoundError:
        umask = os.umask(0o022)
        os.umask(umask)
        return 0o666 & ~umask
