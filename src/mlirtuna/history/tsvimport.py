"""`mlirtuna import-tsv` (this module was history.py): existing tuning DBs (.tsv) into sessions
and results, so history can be compared.

Rules (docs: rocmlir-interfaces §1d, §2a, §5):
- Layouts: legacy 3-column, E2 v2 (4/5 columns), MITuna's `(tuna)` export, E3 v3; one file may
  hold several headers (rocMLIR appends). Parsing is tuningdb's.
- One session per (file, context), where the context is (arch, numCUs, numChiplets, tuning space,
  commit): tuner `imported`, reason from --reason or the file name. Its created_at is the
  earliest row timestamp (v3), so that "newest session wins" in export follows when the tuning
  ran, not when it was imported; without timestamps it is the import time.
- What a layout lacks, flags fill; they never override a value a row has:
  numCUs (legacy files): `--num-cu` is required, because perfRunner since PR #2248 keys on it and
  a made-up 0 would never match; numChiplets (legacy, v2, tuna): `--num-chiplets`, else 1;
  tuning space (legacy, tuna): `--tuning-space`, else exhaustive (E1/E2's and MITuna's default).
- Test vectors are parsed with the op's parser and stored canonical; missing problems are created.
- Rows E2 wrote for "no valid perf config" (`None`, `-inf`) are skipped and counted; a TFlops of
  `nan` (export's "unknown") imports as no TFlops.
- The same key twice under one header with different perf configs is a FILE:LINE error (the
  same perf config again is fine); under a later header (a rerun appended) the later row wins,
  as in perfRunner's dict. A row of conv or gemm with an attention perf config is an error.
- E2.5 files: each `# commit:` section's commit and space apply to its rows, so one file may
  give several sessions. Its `### ` error lines become jobs in state `error` whose result is the
  line's text, in the session of the nearest row of the same section (a config that also has a
  winner there keeps the winner); the config is found in the text with the op's parser, and a
  line naming none is counted (`errors_unmatched`) and printed, never dropped silently.
- Keys with `-supportsSplitK true|false` or fusion words (`-inputFusions=…`): the problem is the
  plain key's, the result keeps the suffix (`key_suffix`) and the session the key form
  (split-k if any of its rows had the flag), so export can write the file's form back.
- Any bad row is `FILE:LINE: message` and nothing is written: the whole run is one transaction.
- Each session keeps the SHA-256 of its file's bytes. A file whose hash some session already
  has is imported again only for the ops those sessions lack (an earlier `--op conv` left the
  gemm rows out), else reported as `already`; `again=True` (`--again`) imports it whole.
"""

from __future__ import annotations

import bisect
import dataclasses
import datetime as dt
import hashlib
import math
import os
import re
from collections.abc import Callable, Sequence
from dataclasses import dataclass, field
from typing import Any

import sqlalchemy as sa
from sqlalchemy.orm import Session

import mlirtuna.formats.tuningdb as tuningdb
from mlirtuna import catalog, keys, problems
from mlirtuna.db import Database, utcnow
from mlirtuna.db.models import ERROR, Job, Problem, Result, TuningSession
from mlirtuna.errors import InputError, UserError
from mlirtuna.textinput import quote

TUNER = "imported"
DEFAULT_TUNING_SPACE = "exhaustive"
DEFAULT_NUM_CHIPLETS = 1
# Column widths of the session and result tables (db/models.py).
_QUOTED_RE = re.compile(r"'([^']+)'|\"([^\"]+)\"")
_LIMITS = {"arch": 32, "arch_full": 128, "tuning space": 16, "commitId": 64, "perfConfig": 255}
# What a row may hold (issue 23): an arch as gcnArchName writes it (gfx942, gfx90a,
# gfx942:sramecc+:xnack-), TFlops of a real chip (a million TFlops is far past any GPU), a
# duration of at most a year, a tuning space of one word.
# (mlirtuna's own CPU sessions export `cpu-x86_64` and the like.)
ARCH_RE = re.compile(
    r"(?:gfx[0-9a-f]{1,8}(?::[A-Za-z][A-Za-z0-9_-]{0,31}[+-]?){0,8}|cpu-[A-Za-z0-9_]{1,24})\Z"
)
MAX_TFLOPS = 1e6
MAX_DURATION_S = 366 * 86400.0
_SPACE_WORD = re.compile(r"[A-Za-z0-9_:.-]{1,64}\Z")


@dataclass(frozen=True)
class Fill:
    """What the flags give for columns a file's layout lacks."""

    num_cu: int | None = None
    num_chiplets: int | None = None
    tuning_space: str | None = None


@dataclass(frozen=True, slots=True)
class Context:
    arch_full: str
    num_cu: int
    num_chiplets: int
    tuning_space: str
    commit: str  # "" when the file has none (or E3's "unknown")


@dataclass(slots=True)
class _Winner:
    test_vector: str  # canonical
    op: str
    perf_config: str
    tflops: float | None
    kernel_time: float | None
    tuned_at: dt.datetime | None
    duration_s: float | None
    key_suffix: str = ""


@dataclass
class _Group:
    """The rows of one (file, context): a session to be."""

    path: str
    context: Context
    sha256: str
    winners: dict[str, _Winner] = field(default_factory=dict)
    failed: dict[str, str] = field(default_factory=dict)  # canonical -> the ### line's text
    lines: list[int] = field(default_factory=list)  # line numbers of its rows
    # key -> (section, line) of its first row: the section is the header it is under
    first_line: dict[str, tuple[int, int]] = field(default_factory=dict)

    def without_ops(self, ops: set[str], op_of: Callable[[str], str]) -> _Group:
        """This group less the rows of `ops` (those an earlier import of the file took)."""
        return dataclasses.replace(
            self,
            winners={k: w for k, w in self.winners.items() if w.op not in ops},
            failed={k: t for k, t in self.failed.items() if op_of(k) not in ops},
        )

    e4: bool = False  # a gemm row spelled -transO false (rocmlirTriton's E4 keys)

    @property
    def key_form(self) -> str:
        split_k = any(keys.split_k_of(w.key_suffix) is not None for w in self.winners.values())
        if self.e4:
            return keys.E4_SPLIT_K if split_k else keys.E4
        return keys.SPLIT_K if split_k else keys.PLAIN


@dataclass
class ImportedSession:
    id: int
    file: str
    arch: str
    num_cu: int
    num_chiplets: int
    tuning_space: str
    commit: str
    results: int
    failed: int = 0
    key_form: str = keys.PLAIN


@dataclass
class TsvImportReport:
    files: int = 0
    rows: int = 0  # data rows read
    skipped: int = 0  # E2's "no valid perf config" rows
    other_op: int = 0  # rows of another op than --op asked for (left out)
    results: int = 0
    problems: int = 0
    new_problems: int = 0
    failed: int = 0  # E2.5 "### " lines kept as failed jobs
    errors_unmatched: list[str] = field(default_factory=list)  # FILE:LINE: text, no config
    sessions: list[ImportedSession] = field(default_factory=list)
    already: list[AlreadyImported] = field(default_factory=list)  # files not imported again

    def as_dict(self) -> dict[str, Any]:
        d = {
            k: getattr(self, k)
            for k in (
                "files",
                "rows",
                "skipped",
                "other_op",
                "results",
                "problems",
                "new_problems",
                "failed",
                "errors_unmatched",
            )
        }
        d["sessions"] = [vars(x) for x in self.sessions]
        d["already"] = [vars(x) for x in self.already]
        return d


@dataclass
class AlreadyImported:
    """A file whose exact content some sessions were imported from before."""

    file: str
    sha256: str
    sessions: list[int]


AUTO = "auto"  # each row's op from its test vector (problems.op_of_vector)


def import_tsv(
    db: Database | Callable[[], Database],
    op: str | None,
    paths: Sequence[str],
    *,
    reason: str | None = None,
    fill: Fill = Fill(),
    again: bool = False,
) -> TsvImportReport:
    """Read and check every file first; then one transaction writes everything or nothing.

    A file imported before (same bytes) is skipped and listed in `already`, unless `again`.
    `db` may be a function that opens it: it is called once every file has been read, so
    that a file that does not parse leaves no database behind (a new SQLite file).
    Each row's op comes from its test vector; `op` (not None or "auto") keeps that op's rows
    only, and parses the rows whose op the flags do not tell with its parser.
    """
    op = None if op in (None, AUTO) else op
    if op is not None:
        problems.problem_class(op)  # an unknown op is a UserError before any file is read
    report = TsvImportReport(files=len(paths))
    # Every file is read and checked before any database is opened (FILE:LINE on a bad row).
    read = {path: _read(path, op, fill) for path in paths}
    hashes = {path: file.sha256 for path, file in read.items()}
    if not any(g.winners for file in read.values() for g in file.groups):
        raise UserError(
            f"nothing to import: no tuning rows with a perf config in {', '.join(paths)}"
        )
    if callable(db):
        db = db()
    before = {} if again else _imported_before(db, hashes)
    groups: list[_Group] = []
    found: dict[str, dict[str, problems.Problem]] = {}  # op -> canonical -> problem
    for path, file in read.items():
        earlier = before.get(hashes[path])
        if earlier is not None:  # imported before: only the ops it left out (another --op)
            file.groups = _left_out(file, earlier.ops)
            if not file.groups:
                report.already.append(AlreadyImported(path, hashes[path], earlier.sessions))
                continue
        report.rows += file.report.rows
        report.skipped += file.report.skipped
        report.other_op += file.report.other_op
        report.errors_unmatched += file.report.errors_unmatched
        groups += file.groups
        for row_op, some in file.problems.items():
            found.setdefault(row_op, {}).update(some)
    report.results = sum(len(g.winners) for g in groups)
    report.failed = sum(len(g.failed) for g in groups)
    if report.already and not groups:
        return report  # nothing new: every file was imported before
    if not report.results:
        raise UserError(
            f"nothing to import: no tuning rows with a perf config in {', '.join(paths)}"
        )
    report.problems = sum(map(len, found.values()))

    def write() -> tuple[int, list[ImportedSession]]:
        with db.session(immediate=True) as s:
            ids: dict[str, int] = {}  # canonical vectors of different ops never collide
            new = 0
            for row_op, of_op in sorted(found.items()):
                some, added = catalog.ensure_problems(s, row_op, list(of_op.values()))
                ids.update(some)
                new += added
            return new, [_write_group(s, group, ids, reason) for group in groups]

    report.new_problems, report.sessions = db.retrying_conflicts(write)
    return report


@dataclass
class _File:
    """One file read and checked: its groups, its counts, the problems its rows name."""

    groups: list[_Group]
    report: TsvImportReport
    problems: dict[str, dict[str, problems.Problem]]
    sha256: str


def _read(path: str, op: str | None, fill: Fill) -> _File:
    parsed = read_file(path)
    # Hashed once it parsed: a hostile file (1 GiB of NUL) is refused at its first line, not
    # read whole for its hash first.
    sha256 = file_sha256(path)
    counts = TsvImportReport(rows=len(parsed.rows))
    parser = _Parser(op, fill)
    groups = parser.groups(parsed, counts, sha256)
    return _File(groups, counts, parser.problems, sha256)


def file_sha256(path: str) -> str:
    """The SHA-256 of a file's bytes (what makes two imports "the same file")."""
    digest = hashlib.sha256()
    if os.path.exists(path) and not os.path.isfile(path):  # a FIFO or /dev/zero: never read it
        raise UserError(f"{path}: not a regular file")
    try:
        with open(path, "rb") as f:
            while chunk := f.read(1 << 20):
                digest.update(chunk)
    except FileNotFoundError:
        raise UserError(f"{path}: no such file") from None
    except IsADirectoryError:
        raise UserError(f"{path}: is a directory") from None
    return digest.hexdigest()


@dataclass(frozen=True)
class _Earlier:
    """What earlier imports of one file's bytes made: their sessions, the ops of their rows."""

    sessions: list[int]
    ops: set[str]


def _imported_before(db: Database, hashes: dict[str, str]) -> dict[str, _Earlier]:
    """sha256 -> the earlier imports of those bytes. The ops are those of the results and
    failed jobs they hold: an import with `--op conv` took the conv rows only."""
    sessions = sa.select(TuningSession.source_sha256, TuningSession.id).where(
        TuningSession.source_sha256.in_(set(hashes.values()))
    )
    found: dict[str, _Earlier] = {}
    with db.session() as s:
        for sha, sid in s.execute(sessions.order_by(TuningSession.id)):
            if sha is not None:  # matched by IN (the file's hashes): never None in fact
                found.setdefault(sha, _Earlier([], set())).sessions.append(sid)
        of: dict[int, str] = {sid: sha for sha, e in found.items() for sid in e.sessions}
        for table in (Result, Job):
            ops = (
                sa.select(table.session_id, Problem.op)
                .join(Problem, Problem.id == table.problem_id)
                .where(table.session_id.in_(of))
                .distinct()
            )
            for sid, op in s.execute(ops):
                found[of[sid]].ops.add(op)
    return found


def _left_out(file: _File, ops: set[str]) -> list[_Group]:
    """A file's groups less the rows of `ops`; only the groups that still hold a row."""
    op_of = {canonical: op for op, some in file.problems.items() for canonical in some}
    groups = [g.without_ops(ops, lambda k: op_of.get(k, "")) for g in file.groups]
    return [g for g in groups if g.winners]


def read_file(path: str) -> tuningdb.TuningFile:
    try:
        return tuningdb.read_tuning_db(path)
    except FileNotFoundError:
        raise UserError(f"{path}: no such file") from None
    except OSError as error:  # EIO and the like, mid-read
        raise UserError(f"{path}: {error.strerror or error}") from None


class _Parser:
    """Turns tuning rows into canonical winners. A 100,000-line file repeats few contexts and
    holds each vector about once: both are worked out once per distinct value, not per row."""

    def __init__(self, op: str | None, fill: Fill) -> None:
        self.op, self.fill = op, fill  # op: keep only this op's rows (None: every op)
        self.problems: dict[str, dict[str, problems.Problem]] = {}  # op -> canonical -> problem
        # as written -> (op, canonical, flops)
        self._vectors: dict[str, tuple[str, str, int]] = {}
        self._contexts: dict[tuple[Any, ...], Context] = {}  # row's own values -> context

    def groups(
        self, parsed: tuningdb.TuningFile, report: TsvImportReport, sha256: str
    ) -> list[_Group]:
        by_context: dict[Context, _Group] = {}
        starts = sorted(h.lineno for h in parsed.headers)
        for row in parsed.rows:
            try:
                check_ranges(row)
                if no_winner(row):
                    report.skipped += 1
                    continue
                if not self.wanted(row.test_vector):
                    report.other_op += 1
                    continue
                context = self.context(row)
                winner = self.winner(row)
            except InputError as exc:
                raise exc.at(parsed.path, row.lineno) from None
            group = by_context.get(context)
            if group is None:
                group = by_context[context] = _Group(parsed.path, context, sha256)
            section = bisect.bisect(starts, row.lineno)  # a rerun appends under a new header
            _add_winner(group, winner, parsed.path, row.lineno, section)
            group.e4 = (
                group.e4
                or keys.e4_vector(winner.op, winner.test_vector)
                == (keys.split_key(row.test_vector).plain)
                != winner.test_vector
            )
        groups = list(by_context.values())
        for error in parsed.errors:
            self.attach_error(parsed.path, error, groups, report)
        return groups

    def attach_error(
        self,
        path: str,
        error: tuningdb.TuningError,
        groups: list[_Group],
        report: TsvImportReport,
    ) -> None:
        """A `### ` line into the session of the nearest row of its section (same commit and
        space); its config is found in the text."""
        commit = error.commit_id or ""
        space = error.tuning_space or self.fill.tuning_space or DEFAULT_TUNING_SPACE
        same = [g for g in groups if g.context.commit == commit and g.context.tuning_space == space]
        canonical = self.vector_in(error.text)
        if not same or canonical is None:
            report.errors_unmatched.append(f"{path}:{error.lineno}: {error.text}")
            return
        group = min(same, key=lambda g: min(abs(n - error.lineno) for n in g.lines))
        if canonical not in group.winners:
            group.failed[canonical] = error.text

    def vector_in(self, text: str) -> str | None:
        """The canonical vector named in `text` (the line's wording around the config is the
        tool's, not a format): a quoted part that parses, else the longest run of words from
        one of the first words that look like a config's start."""
        for match in _QUOTED_RE.finditer(text):
            found = self._try_vector(match.group(1) or match.group(2))
            if found is not None:
                return found
        words = [w.strip("'\"`:,;") for w in text.split()]
        starts = [i for i, w in enumerate(words) if w.startswith(("-", "conv"))][:2]
        for start in starts:
            for end in range(len(words), start, -1):
                found = self._try_vector(" ".join(words[start:end]))
                if found is not None:
                    return found
        return None

    def _try_vector(self, text: str) -> str | None:
        try:
            plain = keys.split_key(text).plain
            return self.vector(plain)[1] if self.wanted(plain) else None
        except InputError:
            return None

    def row_op(self, written: str) -> str:
        """The op of a test vector: from its flags, else --op; neither is one clear error."""
        found = problems.op_of_vector(written)
        if found is None and self.op is None:
            raise InputError("cannot tell this row's op from its flags: give --op")
        return found or self.op or ""

    def wanted(self, written: str) -> bool:
        return self.op is None or self.row_op(written) == self.op

    def context(self, row: tuningdb.TuningRow) -> Context:
        key = (row.arch, row.num_cu, row.num_chiplets, row.tuning_space, row.commit_id)
        context = self._contexts.get(key)
        if context is None:
            context = self._contexts[key] = self._new_context(row)
        return context

    def _new_context(self, row: tuningdb.TuningRow) -> Context:
        num_cu = row.num_cu if row.num_cu is not None else self.fill.num_cu
        if num_cu is None:
            raise InputError(
                "this legacy row has no numCUs: give --num-cu N for it "
                "(and --num-chiplets C; default 1)"
            )
        chiplets = row.num_chiplets
        if chiplets is None:
            chiplets = self.fill.num_chiplets or DEFAULT_NUM_CHIPLETS
        if num_cu < 1 or chiplets < 1:
            raise InputError(f"numCUs {num_cu} and numChiplets {chiplets} must be at least 1")
        space = row.tuning_space or self.fill.tuning_space or DEFAULT_TUNING_SPACE
        commit = "" if row.commit_id in (None, "unknown") else row.commit_id
        for name, value in (
            ("arch", _chip(row.arch)),
            ("arch_full", row.arch),
            ("tuning space", space),
            ("commitId", commit),
        ):
            _check_width(name, value)
        return Context(row.arch, num_cu, chiplets, space, commit)

    def vector(self, written: str) -> tuple[str, str, int]:
        known = self._vectors.get(written)
        if known is None:
            op = self.row_op(written)
            problem = problems.parse(op, written)
            known = self._vectors[written] = (op, problem.canonical(), problem.flops())
            self.problems.setdefault(op, {}).setdefault(known[1], problem)
        return known

    def winner(self, row: tuningdb.TuningRow) -> _Winner:
        key = keys.split_key(row.test_vector)
        op, canonical, flops = self.vector(key.plain)
        if len(row.perf_config) > _LIMITS["perfConfig"]:
            _check_width("perfConfig", row.perf_config)
        if not problems.perf_config_fits(op, row.perf_config):
            raise InputError(
                f"perf config {quote(row.perf_config)} is an attention one, not {op}'s"
            )
        tflops = None if row.tflops is None or math.isnan(row.tflops) else row.tflops
        if tflops is not None and not (math.isfinite(tflops) and math.isfinite(flops / tflops)):
            raise InputError(f"TFlops {tflops!r} gives no finite kernel time")
        duration = row.duration_s
        return _Winner(
            test_vector=canonical,
            op=op,
            perf_config=row.perf_config,
            tflops=tflops,
            # The file holds TFlops only; the kernel time follows from the op's flop count.
            kernel_time=flops / (tflops * 1e3) if tflops else None,
            tuned_at=_timestamp(row.timestamp),
            duration_s=duration if duration is None or math.isfinite(duration) else None,
            key_suffix=key.suffix,
        )


def _add_winner(group: _Group, winner: _Winner, path: str, lineno: int, section: int) -> None:
    """A row into its session to be. The same key again under the same header with another
    perf config: the file contradicts itself, and which row perfRunner keeps depends on its
    reader, so an InputError at FILE:LINE (with the same perf config it is the same fact). A
    later header's rows (a rerun rocMLIR appended) replace an earlier run's, as in perfRunner."""
    key = winner.test_vector + winner.key_suffix
    before = group.winners.get(winner.test_vector)
    first = group.first_line.get(key)
    if (
        before is not None
        and first is not None
        and first[0] == section
        and before.perf_config != winner.perf_config
    ):
        raise InputError(
            f"key {quote(key)} is already at line {first[1]} with perf config "
            f"{quote(before.perf_config)}, here with {quote(winner.perf_config)}",
            path,
            lineno,
        )
    if first is None or first[0] != section:
        group.first_line[key] = (section, lineno)
    group.winners[winner.test_vector] = winner
    group.lines.append(lineno)


def check_ranges(row: tuningdb.TuningRow) -> None:
    """InputError for a value no real tuning run writes: an arch not like gfx942[:features],
    TFlops negative, infinite or past MAX_TFLOPS (E2's `-inf` and NaN are markers, kept), a
    negative or endless duration, a tuning space that is not one word."""
    if not ARCH_RE.match(row.arch):
        raise InputError(
            f"arch {quote(row.arch)} is not like gfx942, gfx942:sramecc+:xnack- or cpu-x86_64"
        )
    t = row.tflops
    if t is not None and not math.isnan(t) and t != -math.inf and not (0 <= t <= MAX_TFLOPS):
        raise InputError(f"TFlops {t!r} is out of range (0 to {MAX_TFLOPS:g}, -inf or nan)")
    d = row.duration_s
    if d is not None and not math.isnan(d) and not (0 <= d <= MAX_DURATION_S):
        raise InputError(f"durationSec {d!r} is out of range (0 to {MAX_DURATION_S:g})")
    if row.tuning_space is not None and not _SPACE_WORD.match(row.tuning_space):
        raise InputError(f"tuningSpace {quote(row.tuning_space)} is not one word")


def no_winner(row: tuningdb.TuningRow) -> bool:
    """E2's rows for "no valid perf config" (`None`, `-inf`). NaN is not one of them: it is what
    export writes for a winner whose TFlops is unknown (a legacy row), so it imports as None."""
    if not row.has_perf_config:
        return True
    return row.tflops is not None and not math.isnan(row.tflops) and not row.has_valid_tflops


def _chip(arch: str) -> str:
    return arch.split(":", 1)[0]


def _check_width(name: str, value: str) -> None:
    if len(value) > _LIMITS[name]:
        raise InputError(f"{name} {value[:40]!r}… is longer than {_LIMITS[name]} characters")


def _timestamp(text: str | None) -> dt.datetime | None:
    # tuningdb has checked the form YYYY-MM-DDTHH:MM:SSZ; fromisoformat is the fast C parser.
    try:
        return dt.datetime.fromisoformat(text[:-1]) if text else None
    except ValueError:  # never a traceback (FILE:LINE is added by the caller)
        raise InputError(f"timestamp {quote(text or '')} is not YYYY-MM-DDTHH:MM:SSZ") from None


def _write_group(
    s: Session, group: _Group, ids: dict[str, int], reason: str | None
) -> ImportedSession:
    c = group.context
    times = [w.tuned_at for w in group.winners.values() if w.tuned_at is not None]
    row = TuningSession(
        arch=_chip(c.arch_full),
        arch_full=c.arch_full,
        num_cu=c.num_cu,
        num_chiplets=c.num_chiplets,
        rocm_v="",
        mlir_v=c.commit,
        reason=(reason or os.path.basename(group.path))[:200],
        ticket="",
        docker="",
        tuning_space=c.tuning_space,
        tuner=TUNER,
        host="",
        created_at=min(times) if times else utcnow(),
        source_sha256=group.sha256,
        key_form=group.key_form,
    )
    s.add(row)
    s.flush()
    s.execute(
        sa.insert(Result.__table__),
        [
            {
                "session_id": row.id,
                "problem_id": ids[w.test_vector],
                "job_id": None,
                "perf_config": w.perf_config,
                "kernel_time": w.kernel_time,
                "tflops": w.tflops,
                "tuned_at": w.tuned_at,
                "duration_s": w.duration_s,
                "key_suffix": w.key_suffix,
            }
            for w in group.winners.values()
        ],
    )
    if group.failed:
        now = utcnow()
        s.execute(
            sa.insert(Job.__table__),
            [
                {
                    "session_id": row.id,
                    "problem_id": ids[vector],
                    "reason": "imported: a ### line of the tuning DB",
                    "state": ERROR,
                    "result": text,
                    "finished_at": now,
                }
                for vector, text in group.failed.items()
            ],
        )
    return ImportedSession(
        row.id,
        group.path,
        c.arch_full,
        c.num_cu,
        c.num_chiplets,
        c.tuning_space,
        c.commit,
        len(group.winners),
        len(group.failed),
        group.key_form,
    )
