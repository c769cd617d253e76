"""The config tables: rocMLIR config lists in, one canonical row per problem out.

Import is one transaction and a bulk insert: a bad line anywhere means nothing of that run is
written, and 100,000 problems take seconds, not minutes.
"""

from __future__ import annotations

from collections.abc import Iterable, Sequence
from dataclasses import dataclass, field

import sqlalchemy as sa
from sqlalchemy.orm import Session

from mlirtuna.db import Database, utcnow
from mlirtuna.db.models import CONFIG_TABLES, Problem, ProblemTag
from mlirtuna.problems import ExpandOptions
from mlirtuna.problems import Problem as ProblemSpec
from mlirtuna.problems.configlist import read_config_list

# Keeps IN (...) lists well under every backend's bound-parameter limit.
CHUNK = 500


@dataclass
class ImportReport:
    lines: int = 0  # config lines read (comments and blank lines excluded)
    problems: int = 0  # distinct problems after expansion
    new: int = 0
    existing: int = 0
    warnings: list[str] = field(default_factory=list)

    def as_dict(self) -> dict[str, int]:
        return {
            "lines": self.lines,
            "problems": self.problems,
            "new": self.new,
            "existing": self.existing,
        }


def import_files(
    db: Database,
    op: str,
    paths: Sequence[str],
    options: ExpandOptions | None = None,
    tag: str | None = None,
) -> ImportReport:
    """Parse every file first (any bad line stops here, before the database is touched)."""
    options = options or ExpandOptions()
    report = ImportReport()
    entries: dict[str, tuple[ProblemSpec, int]] = {}
    for path in paths:
        parsed = read_config_list(path, op, options)
        report.lines += parsed.lines
        report.warnings.extend(parsed.warnings)
        for entry in parsed.entries:
            entries.setdefault(entry.problem.canonical(), (entry.problem, entry.priority))
    report.problems = len(entries)

    def write() -> int:
        with db.session(immediate=True) as s:
            ids, new = ensure_problems(s, op, [p for p, _ in entries.values()])
            if tag:
                priorities = {ids[v]: prio for v, (_, prio) in entries.items()}
                tag_problems(s, tag, priorities)
            return new

    report.new = db.retrying_conflicts(write)  # another import of the same problems may race
    report.existing = report.problems - report.new
    return report


def ensure_problems(
    s: Session, op: str, problems: Sequence[ProblemSpec]
) -> tuple[dict[str, int], int]:
    """Ids of these problems by test vector, inserting those not yet known; (ids, new count)."""
    by_vector = {p.canonical(): p for p in problems}
    ids = problem_ids(s, op, by_vector)
    missing = [v for v in by_vector if v not in ids]
    if missing:
        new_ids = _insert_problems(s, op, missing)
        s.execute(
            sa.insert(CONFIG_TABLES[op].__table__),
            [{"id": new_ids[v], **by_vector[v].columns()} for v in missing],
        )
        ids.update(new_ids)
    return ids, len(missing)


def _insert_problems(s: Session, op: str, vectors: list[str]) -> dict[str, int]:
    """Insert problem rows and return their ids, in one round trip where the backend can."""
    now = utcnow()
    rows = [{"op": op, "test_vector": v, "created_at": now} for v in vectors]
    table = Problem.__table__
    if s.get_bind().dialect.insert_executemany_returning_sort_by_parameter_order:
        stmt = sa.insert(table).returning(table.c.id, sort_by_parameter_order=True)
        return dict(zip(vectors, s.scalars(stmt, rows), strict=True))
    # MySQL has no INSERT … RETURNING: read the ids back by their unique key.
    s.execute(sa.insert(table), rows)
    return problem_ids(s, op, vectors)


def problem_ids(s: Session, op: str, vectors: Iterable[str]) -> dict[str, int]:
    """{test_vector: id} for those of `vectors` already in the problem table."""
    vectors = list(vectors)
    found: dict[str, int] = {}
    for i in range(0, len(vectors), CHUNK):
        rows = s.execute(
            sa.select(Problem.test_vector, Problem.id).where(
                Problem.op == op, Problem.test_vector.in_(vectors[i : i + CHUNK])
            )
        )
        found.update((vector, pid) for vector, pid in rows)
    return found


def tag_problems(s: Session, tag: str, priorities: dict[int, int]) -> None:
    """Label problems with `tag` (idempotent; a re-import updates nothing already tagged)."""
    ids = list(priorities)
    tagged: set[int] = set()
    for i in range(0, len(ids), CHUNK):
        tagged.update(
            s.scalars(
                sa.select(ProblemTag.problem_id).where(
                    ProblemTag.tag == tag, ProblemTag.problem_id.in_(ids[i : i + CHUNK])
                )
            )
        )
    rows = [
        {"problem_id": p, "tag": tag, "priority": prio}
        for p, prio in priorities.items()
        if p not in tagged
    ]
    if rows:
        s.execute(sa.insert(ProblemTag.__table__), rows)


def load_problem(s: Session, problem_id: int) -> ProblemSpec:
    """The typed problem behind a problem id (supertable row + its op's config row)."""
    from mlirtuna.problems import from_columns

    op = s.scalar(sa.select(Problem.op).where(Problem.id == problem_id))
    if op is None:
        raise LookupError(f"no problem {problem_id}")
    table = CONFIG_TABLES[op].__table__
    row = s.execute(sa.select(table).where(table.c.id == problem_id)).mappings().one()
    return from_columns(op, {k: v for k, v in row.items() if k != "id"})
