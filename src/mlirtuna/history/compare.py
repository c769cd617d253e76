"""compare: an old tuning against a new one (sessions or .tsv files), problem by problem.

Keying (decided here, documented in the CLI help):
- Problems are matched by canonical test vector alone. A session's vectors are canonical already;
  a .tsv's are re-canonicalized with the op's parser when `--op` is given (so a file written by
  an older rocMLIR with other flag order still matches), else taken as written (tuningRunner E3
  writes canonical ones). Vectors of different ops cannot collide (their syntax differs), so the
  op is not part of the key.
- Arch is not part of the key: comparing a gfx90a tuning with a gfx942 one is a legitimate
  question. Each side must describe one context, though: a .tsv that gives the same vector for
  two contexts (arch, numCUs, numChiplets, tuning space) is an error at FILE:LINE; within one
  context a later row wins, as in perfRunner.
- Keys of newer tools (`-supportsSplitK true|false`, fusion words) are matched the way perfRunner
  looks them up (keys.match_key): a plain gemm key meets `-supportsSplitK true`, a plain attention
  key `false`; fusion words are dropped. So an old-format DB compares with a new-format one.
- A side is a session id when it is a whole number, else a path (write ./12 for a file named 12).
- Ratios are TFlops B/A over the common problems where both sides have a positive TFlops;
  a regression is a ratio below 1 - threshold, listed worst first with both perf configs.
  A regression whose winner is the same perf config on both sides is the same kernel measured
  twice: it is counted apart (noise or a changed machine, not a worse tuning).
- A problem of A that B lacks (its job failed or was cancelled) is a loss too: it fails
  `--fail-on-regression` unless `--allow-missing`. So is one whose B winner has no TFlops
  (import-tsv's `nan`, a legacy row) where A measured one (issue 43): B's measurement is missing,
  and a gate that skipped it would pass a problem it never compared. It is `missing` like a
  problem B lacks, and `--allow-missing` lets both through alike (one word, one meaning). Where
  A has no TFlops either, nothing was measured to lose: the problem is common, not a finding.
  Two sides with no problem in common are an error, never "no regression".
- Noise (issue 17): a session's winner carries the spread of its measurement (the candidate
  row's IQR and sample count). A drop past the threshold whose two TFlops lie within each
  other's noise (`mlirtuna.stats.within_noise`, the medians' ~95 % intervals overlap) is listed
  under `within_noise`, not `regressions`, so `--fail-on-regression` ignores it. Without a
  spread on both sides (a .tsv, the sleep tuner, E2) every drop past the threshold counts.
- One meaning per word (issue 35): every finding carries one verdict, printed by the CLI, in the
  JSON and on the page, and the gate fails on verdicts, never on anything else:
  `regression` (the winner changed and TFlops dropped beyond the threshold and the noise: fails),
  `slower` (the same winner measured slower beyond the threshold and the noise: the kernel ran
  slower, machine or toolchain, not a changed tuning; fails unless `--changed-winner-only`),
  `noise` (a drop past the threshold within the measurements' noise: never fails), `missing`
  (a problem of A that B lacks: fails unless `--allow-missing`), `improvement` (never fails).
- When B is a session and the winner changed, B's own measurement of A's perf config (if B
  tried it) is reported beside the two winners (`tflops_a_in_b`).
"""

from __future__ import annotations

import math
from collections.abc import Callable
from dataclasses import asdict, dataclass, field, replace
from typing import Any

import sqlalchemy as sa

import mlirtuna.history.tsvimport as tsvimport
import mlirtuna.history.winners as winners
from mlirtuna import keys, problems, sessions, stats
from mlirtuna.db import Database
from mlirtuna.db.models import COMPLETED, Candidate, Job, Problem, Result
from mlirtuna.errors import InputError, UserError

DEFAULT_THRESHOLD = 0.05

# The verdicts, one word each (module docstring): what a row is, and whether it fails the gate.
REGRESSION = "regression"
SLOWER = "slower"
NOISE = "noise"
MISSING = "missing"
IMPROVEMENT = "improvement"
VERDICT_MEANING = {
    REGRESSION: "the winner changed and TFlops dropped beyond the threshold and the noise",
    SLOWER: "the same winner measured slower beyond the threshold and the noise "
    "(the kernel ran slower: machine or toolchain, not a changed tuning)",
    NOISE: "a drop past the threshold within the measurements' noise (never fails)",
    MISSING: "a problem of A that B has no measured winner for (failed or cancelled in B, or "
    "its TFlops unknown)",
    IMPROVEMENT: "B beats A by more than the threshold",
}


@dataclass(frozen=True, slots=True)
class Entry:
    perf_config: str
    tflops: float | None  # None: unknown (legacy rows, or not a positive number)
    rel_noise: float | None = None  # the measurement's noise / its median; None: unknown
    problem_id: int | None = None  # a session's problem (None for a .tsv row)


@dataclass
class Side:
    label: str
    entries: dict[str, Entry]  # canonical test vector -> winner
    # (test vector, perf config) -> this side's measurement of other perf configs than its
    # winners (filled for B: A's changed winners as B measured them)
    measured: dict[tuple[str, str], Entry] = field(default_factory=dict)


@dataclass(frozen=True)
class Regression:
    test_vector: str
    perf_config_a: str
    perf_config_b: str
    tflops_a: float
    tflops_b: float
    ratio: float
    winner_changed: bool = False
    noise_a: float | None = None  # relative noise of each side's measurement, where known
    noise_b: float | None = None
    within_noise: bool = False  # the two TFlops lie within each other's noise
    tflops_a_in_b: float | None = None  # A's perf config as measured in B, where B tried it
    verdict: str = ""  # REGRESSION, SLOWER, NOISE or IMPROVEMENT ("" for a plain pair)


def verdict_of(r: Regression) -> str:
    """A drop's verdict: noise first (within each other's noise), then by its winner."""
    if r.within_noise:
        return NOISE
    return REGRESSION if r.winner_changed else SLOWER


@dataclass
class Comparison:
    a: str
    b: str
    threshold: float
    common: int = 0
    same_winner: int = 0
    same_winner_pct: float | None = None
    with_tflops: int = 0  # common problems where both sides have TFlops
    geomean_ratio: float | None = None
    min_ratio: float | None = None
    max_ratio: float | None = None
    only_a: int = 0
    only_b: int = 0
    regressions: list[Regression] = field(default_factory=list)  # beyond threshold and noise
    regressions_winner_changed: int = 0
    regressions_same_winner: int = 0
    # A's vectors B has no winner for, or a winner without TFlops where A has them
    missing_in_b: list[str] = field(default_factory=list)
    within_noise: list[Regression] = field(default_factory=list)  # beyond threshold, in noise
    improvements: list[Regression] = field(default_factory=list)  # B beats A: best gain first

    def as_dict(
        self, *, changed_winner_only: bool = False, allow_missing: bool = False
    ) -> dict[str, Any]:
        """Everything, plus `verdicts`: each finding's verdict and whether it fails the gate
        under these options (the same rows the CLI prints and the page shows)."""
        out = asdict(self)
        failing = failing_verdicts(changed_winner_only, allow_missing)
        out["verdicts"] = [
            {"test_vector": tv, "verdict": v, "fails": v in failing} for tv, v in self.verdicts()
        ]
        return out

    def verdicts(self) -> list[tuple[str, str]]:
        """(test vector, verdict) of every finding: regressions, slower, noise, missing, and
        improvements (which never fail)."""
        rows = [(r.test_vector, r.verdict) for r in self.regressions + self.within_noise]
        rows += [(tv, MISSING) for tv in self.missing_in_b]
        return rows + [(r.test_vector, IMPROVEMENT) for r in self.improvements]

    def counted_regressions(self, changed_winner_only: bool = False) -> list[Regression]:
        """The regressions that fail a check (`--changed-winner-only`: a changed winner only)."""
        failing = failing_verdicts(changed_winner_only, allow_missing=True)
        return [r for r in self.regressions if r.verdict in failing]

    def failing(
        self, *, changed_winner_only: bool = False, allow_missing: bool = False
    ) -> list[tuple[str, str]]:
        """The findings that fail `--fail-on-regression`: by their verdict alone."""
        failing = failing_verdicts(changed_winner_only, allow_missing)
        return [(tv, v) for tv, v in self.verdicts() if v in failing]

    def fails(self, *, changed_winner_only: bool = False, allow_missing: bool = False) -> bool:
        """What `--fail-on-regression` exits 1 on: a finding whose verdict fails the gate."""
        return bool(
            self.failing(changed_winner_only=changed_winner_only, allow_missing=allow_missing)
        )


def failing_verdicts(changed_winner_only: bool = False, allow_missing: bool = False) -> set[str]:
    """The verdicts that fail the gate: regression always, slower unless
    `--changed-winner-only`, missing unless `--allow-missing`; noise and improvement never."""
    out = {REGRESSION}
    if not changed_winner_only:
        out.add(SLOWER)
    if not allow_missing:
        out.add(MISSING)
    return out


def gate_line(c: Comparison, changed_winner_only: bool, allow_missing: bool) -> str:
    """What `--fail-on-regression` decided, in one line, by verdict (the words the output and
    the page print): what failed it, or that it passed, over how many problems and with how many
    improvements; and what it left out."""
    failing = c.failing(changed_winner_only=changed_winner_only, allow_missing=allow_missing)
    counts = {v: sum(1 for _, x in c.verdicts() if x == v) for v in (REGRESSION, SLOWER, MISSING)}
    counted = ", ".join(
        f"{counts[v]} {v}"
        for v in (REGRESSION, SLOWER, MISSING)
        if v in failing_verdicts(changed_winner_only, allow_missing)
    )
    left = [f"{len(c.within_noise)} noise"]
    if changed_winner_only:
        left.append(f"{counts[SLOWER]} slower (--changed-winner-only)")
    if allow_missing:
        left.append(f"{counts[MISSING]} missing (--allow-missing)")
    threshold = f"threshold {100 * c.threshold:g}%"
    if failing:
        return (
            f"failed: {len(failing)} findings fail the gate ({counted}; {threshold}); "
            f"not counted: {', '.join(left)}"
        )
    return (
        f"gate passed: 0 findings fail it ({counted}) in {c.common} common problems "
        f"({threshold}); not counted: {', '.join(left)}; {len(c.improvements)} {IMPROVEMENT}"
    )


class NoCommonProblem(UserError):
    """The two sides share no problem: there is nothing to compare."""


def is_session(spec: str) -> bool:
    return spec.isdigit()


def load_sides(a: str, b: str, op: str | None, db: Callable[[], Database]) -> tuple[Side, Side]:
    """Sessions first: their canonical vectors spare the parser on a .tsv that has them
    verbatim (a canonical string parses back to itself)."""
    winners.check_op(op)
    loaded = {spec: session_side(db(), int(spec), op) for spec in (a, b) if is_session(spec)}
    known = frozenset().union(*(side.entries for side in loaded.values()))
    for spec in (a, b):
        if spec not in loaded:
            loaded[spec] = tsv_side(spec, op, known)
    if is_session(b):
        add_measured(db(), int(b), loaded[b], changed_winners(loaded[a], loaded[b]))
    return loaded[a], loaded[b]


def standin_sides(a: str, b: str, db: Callable[[], Database]) -> list[int]:
    """The sides that are stand-in sessions (named, so compared; said, for their numbers are
    made up)."""
    ids = list(dict.fromkeys(int(x) for x in (a, b) if is_session(x)))
    return [i for i in ids if sessions.get(db(), i).standin]


def changed_winners(a: Side, b: Side) -> dict[str, str]:
    """Test vector -> A's perf config, for the common problems whose winner changed."""
    return {
        key: ea.perf_config
        for key, ea in a.entries.items()
        if key in b.entries and b.entries[key].perf_config != ea.perf_config
    }


_CHUNK = 500  # perf configs per IN list


def add_measured(db: Database, session_id: int, side: Side, wanted: dict[str, str]) -> None:
    """Put into `side.measured` the session's candidates for the wanted (vector, perf config)
    pairs: one query per chunk of distinct perf configs, filtered to the pairs in Python."""
    configs = sorted(set(wanted.values()))
    with db.session() as s:
        for i in range(0, len(configs), _CHUNK):
            stmt = (
                sa.select(
                    Problem.test_vector,
                    Candidate.perf_config,
                    Candidate.tflops,
                    Candidate.kernel_time,
                    Candidate.time_iqr,
                    Candidate.samples,
                )
                .join(Problem, Problem.id == Candidate.problem_id)
                .join(Job, Job.id == Candidate.job_id)
                .where(
                    Candidate.session_id == session_id,
                    Job.state == COMPLETED,
                    Candidate.perf_config.in_(configs[i : i + _CHUNK]),
                )
            )
            for tv, pc, tf, ns, iqr, n in s.execute(stmt):
                if wanted.get(tv) == pc and _tflops(tf) is not None:
                    side.measured[(tv, pc)] = Entry(pc, _tflops(tf), stats.rel_noise(ns, iqr, n))


def session_side(db: Database, session_id: int, op: str | None) -> Side:
    info = sessions.get(db, session_id)
    winner = sa.and_(Candidate.job_id == Result.job_id, Candidate.perf_config == Result.perf_config)
    stmt = (
        winners.counted_results(
            Problem.test_vector,
            Result.perf_config,
            Result.tflops,
            Problem.op,
            Result.key_suffix,
            Candidate.kernel_time,
            Candidate.time_iqr,
            Candidate.samples,
            Problem.id,
        )
        .outerjoin(Candidate, winner)
        .where(Result.session_id == session_id)
    )
    if op is not None:
        stmt = stmt.where(Problem.op == op)
    with db.session() as s:
        entries = {
            keys.match_key(row_op, f"{tv} {suffix}" if suffix else tv): Entry(
                pc, _tflops(tf), stats.rel_noise(ns, iqr, n), pid
            )
            for tv, pc, tf, row_op, suffix, ns, iqr, n, pid in s.execute(stmt)
        }
    label = f"session {session_id} ({info.arch_full}, {info.tuning_space}, {info.tuner})"
    return Side(label, entries)


def tsv_side(path: str, op: str | None, known: frozenset[str] = frozenset()) -> Side:
    """A .tsv in memory; `known` are vectors known canonical (they skip the parser)."""
    parsed = tsvimport.read_file(path)
    canonical = _canonicalizer(op, known)
    entries: dict[str, Entry] = {}
    where: dict[str, tuple[tuple[Any, ...], int]] = {}  # vector -> (context, line)
    for row in parsed.rows:
        if tsvimport.no_winner(row):
            continue
        try:
            row_op = op or problems.op_of_vector(row.test_vector)
            key = keys.match_key(row_op, row.test_vector, canonical)
        except InputError as exc:
            raise exc.at(path, row.lineno) from None
        context = (row.arch, row.num_cu, row.num_chiplets, row.tuning_space)
        seen = where.setdefault(key, (context, row.lineno))
        if seen[0] != context:
            raise InputError(
                f"this test vector is also on line {seen[1]} for another context "
                f"({' '.join(map(str, seen[0]))}): compare needs one context per side",
                path,
                row.lineno,
            )
        entries[key] = Entry(row.perf_config, _tflops(row.tflops))
    if not entries:  # "0 regressions" against nothing would read as a pass
        raise UserError(f"{path}: no tuning rows with a perf config: nothing to compare")
    return Side(path, entries)


def _canonicalizer(op: str | None, known: frozenset[str]) -> Callable[[str], str]:
    if op is None:
        return str.strip
    cache: dict[str, str] = dict(zip(known, known, strict=True))

    def canonical(vector: str) -> str:
        key = cache.get(vector)
        if key is None:
            key = cache[vector] = problems.parse(op, vector).canonical()
        return key

    return canonical


def _tflops(value: float | None) -> float | None:
    number = stats.stored_number(value)  # text stored in a REAL column (SQLite) is no number
    return number if number is not None and number > 0 else None


def parse_threshold(text: str) -> float:
    """`5%` or `0.5%` (percent), `0.05` (a fraction: 5%); a fraction of 1 afterwards.

    A bare number of 1 or more is refused: `5` might mean 5% or 500%, and reading `0.05` as
    0.05% once let every regression through.
    """
    stripped = text.strip()
    percent = stripped.endswith("%")
    try:
        value = float(stripped.removesuffix("%").strip())
    except ValueError:
        raise UserError(f"--threshold {text!r}: expected a percentage such as 5%") from None
    if not percent:
        if not 0 <= value < 1:
            raise UserError(
                f"--threshold {text!r}: a number without % is a fraction (0.05 = 5%); "
                f"write {text.strip()}% for a percentage"
            )
        return value
    if not 0 <= value < 100:
        raise UserError(f"--threshold {text!r}: expected 0% to 100%")
    return value / 100


def compare(a: Side, b: Side, threshold: float = DEFAULT_THRESHOLD) -> Comparison:
    common = a.entries.keys() & b.entries.keys()
    if not common:
        raise NoCommonProblem(
            f"no problem in common between A ({len(a.entries)} winners) and B "
            f"({len(b.entries)} winners): nothing to compare (another op, or --op needed?)"
        )
    out = Comparison(a.label, b.label, threshold)
    unmeasured = {
        k for k in common if a.entries[k].tflops is not None and b.entries[k].tflops is None
    }
    out.missing_in_b = sorted((a.entries.keys() - common) | unmeasured)
    out.common, out.only_a, out.only_b = (
        len(common),
        len(a.entries) - len(common),
        (len(b.entries) - len(common)),
    )
    ratios: list[float] = []
    for key in common:
        ea, eb = a.entries[key], b.entries[key]
        changed = ea.perf_config != eb.perf_config
        out.same_winner += not changed
        if ea.tflops is None or eb.tflops is None:
            continue
        ratio = eb.tflops / ea.tflops
        ratios.append(ratio)
        if ratio < 1 - threshold:
            drop = Regression(
                key, ea.perf_config, eb.perf_config, ea.tflops, eb.tflops, ratio, changed,
                **_noise(ea, eb, b.measured.get((key, ea.perf_config))),
            )  # fmt: skip
            drop = replace(drop, verdict=verdict_of(drop))
            (out.within_noise if drop.within_noise else out.regressions).append(drop)
    out.same_winner_pct = 100 * out.same_winner / out.common
    out.regressions_winner_changed = sum(r.winner_changed for r in out.regressions)
    out.regressions_same_winner = len(out.regressions) - out.regressions_winner_changed
    if ratios:
        out.with_tflops = len(ratios)
        out.geomean_ratio = math.exp(math.fsum(map(math.log, ratios)) / len(ratios))
        out.min_ratio, out.max_ratio = min(ratios), max(ratios)
    out.regressions.sort(key=lambda r: (r.ratio, r.test_vector))
    out.within_noise.sort(key=lambda r: (r.ratio, r.test_vector))
    out.improvements = improvements(a, b, threshold)
    return out


def pairs(a: Side, b: Side) -> list[Regression]:
    """Every common problem with TFlops on both sides (ratio B/A), lowest ratio first: the
    points of an A-vs-B plot; `compare` counts and thresholds the same ratios."""
    out = [
        Regression(
            key,
            ea.perf_config,
            eb.perf_config,
            ea.tflops,
            eb.tflops,
            eb.tflops / ea.tflops,
            ea.perf_config != eb.perf_config,
        )
        for key in a.entries.keys() & b.entries.keys()
        if (ea := a.entries[key]).tflops is not None and (eb := b.entries[key]).tflops is not None
    ]
    out.sort(key=lambda r: (r.ratio, r.test_vector))
    return out


def improvements(a: Side, b: Side, threshold: float = DEFAULT_THRESHOLD) -> list[Regression]:
    """Problems where B beats A by more than the threshold, biggest gain first."""
    better = (r for r in reversed(pairs(a, b)) if r.ratio > 1 + threshold)
    return [replace(r, verdict=IMPROVEMENT) for r in better]


def is_within_noise(a: Entry, b: Entry) -> bool:
    """True when both TFlops carry a noise and lie within each other's (stats.within_noise);
    a time's relative noise is its TFlops' relative noise (TFlops = flops / time)."""
    if a.tflops is None or b.tflops is None or a.rel_noise is None or b.rel_noise is None:
        return False
    return stats.within_noise(a.tflops, a.tflops * a.rel_noise, b.tflops, b.tflops * b.rel_noise)


def _noise(a: Entry, b: Entry, a_in_b: Entry | None) -> dict[str, Any]:
    return {
        "noise_a": a.rel_noise,
        "noise_b": b.rel_noise,
        "within_noise": is_within_noise(a, b),
        "tflops_a_in_b": a_in_b.tflops if a_in_b else None,
    }
