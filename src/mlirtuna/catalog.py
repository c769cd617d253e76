"""The problem catalogue: problems in the database, the one place flow, jobs and the queue ask.

- Import: rocMLIR config lists (`import --op conv|gemm|…`) and fusion modules (`import --op
  fusion`: `.mlir` files and directories). Every file is read first (a bad line or module
  anywhere means nothing of that run is written), then one transaction and a bulk insert:
  100,000 problems take seconds, not minutes. Two imports of the same problems may race: the
  loser runs its transaction again and finds the winner's rows (Database.retrying_conflicts).
- Fusion modules: a directory means every `*.mlir` directly in it, sorted (rocMLIR's
  `glob(DIR/*.mlir)`; a `.mlir.template` is not a test and is skipped). The tuning key comes
  from the rocMLIR build when one is given, through perfRunner's pipeline
  (tuners/rocmlir/fusionkey.py), else mlirtuna derives it from the MIGraphX ops. Problems are
  unique by module hash: re-importing a directory adds nothing.
- Ids and tags; the typed problem behind a problem row (load_problem, problem_of: the one
  decoder); how a problem reads in a listing (label_column).
"""

from __future__ import annotations

import json
from collections.abc import Iterable, Iterator, Mapping, Sequence
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import sqlalchemy as sa
from sqlalchemy.orm import Session

from mlirtuna.db import Database, utcnow
from mlirtuna.db.models import CONFIG_TABLES, FusionConfig, Problem, ProblemTag
from mlirtuna.defaults import DEFAULT_MAX_MODULE_BYTES
from mlirtuna.errors import UserError
from mlirtuna.problems import ExpandOptions, from_columns
from mlirtuna.problems import Problem as ProblemSpec
from mlirtuna.problems.configlist import read_config_list
from mlirtuna.problems.fusion import FusionProblem, from_module
from mlirtuna.textinput import read_text_capped

# Keeps IN (...) lists well under every backend's bound-parameter limit.
CHUNK = 500
DEFAULT_KEY_ARCH = "gfx942"  # the key's problem string does not depend on the chip


@dataclass
class ImportReport:
    lines: int = 0  # config lines read (comments and blank lines excluded); fusion: modules
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


@dataclass
class Parsed:
    """The problems of some files, read and checked, before the database is touched."""

    lines: int = 0
    warnings: list[str] = field(default_factory=list)
    # {canonical string: (problem, priority)}, the first occurrence kept.
    entries: dict[str, tuple[ProblemSpec, int]] = field(default_factory=dict)

    def add(self, problem: ProblemSpec, priority: int = 0) -> None:
        self.entries.setdefault(problem.canonical(), (problem, priority))

    def problems(self) -> list[ProblemSpec]:
        return [p for p, _ in self.entries.values()]


# -- reading files ---------------------------------------------------------------------------


def read_files(
    op: str,
    paths: Sequence[str],
    options: ExpandOptions | None = None,
    build_dir: str | None = None,
    arch: str | None = None,
) -> Parsed:
    """The problems of config lists of `op`, or of fusion modules (files and directories)."""
    if op == "fusion":
        return read_modules(paths, build_dir, arch)
    return read_config_lists(op, paths, options)


def read_config_lists(
    op: str, paths: Sequence[str], options: ExpandOptions | None = None
) -> Parsed:
    """Parse every file first (any bad line stops here, before the database is touched)."""
    parsed = Parsed()
    for path in paths:
        found = read_config_list(path, op, options or ExpandOptions())
        if not found.entries and not found.warnings:
            # Nothing to tune: say so here, before a session or a tag is made for nothing.
            raise UserError(
                f"{path}: no {op} config in it (empty, or only comments and blank lines): "
                f"give one config per line, as rocMLIR's config lists (examples/{op}-small)"
            )
        parsed.lines += found.lines
        parsed.warnings.extend(found.warnings)
        for entry in found.entries:
            parsed.add(entry.problem, entry.priority)
    return parsed


def read_modules(
    paths: Sequence[str],
    build_dir: str | None = None,
    arch: str | None = None,
    max_bytes: int = DEFAULT_MAX_MODULE_BYTES,
) -> Parsed:
    """Read and key every module first (one bad module: nothing written); each is at most
    `max_bytes`, read in a bounded way."""
    if max_bytes < 1 << 20:
        raise UserError(f"--max-module-mib {max_bytes >> 20}: at least 1")
    parsed = Parsed()
    for path in module_files(paths):
        parsed.lines += 1
        parsed.add(read_problem(path, build_dir, arch, max_bytes))
    return parsed


def module_files(paths: Sequence[str]) -> list[Path]:
    """Every module a list of files and directories names, in order, without repeats."""
    found: list[Path] = []
    for text in paths:
        path = Path(text)
        if path.is_dir():
            found.extend(sorted(p for p in path.glob("*.mlir") if p.is_file()))
        elif path.is_file():
            found.append(path)
        else:
            raise UserError(f"{text}: no such file or directory")
    if not found:  # a directory of config lists, say, taken for fusion modules (--op auto)
        raise UserError(
            f"no .mlir modules in {', '.join(paths)}: a directory is read for fusion modules "
            "(*.mlir) only; a config list is given as its file"
        )
    return list(dict.fromkeys(found))


def read_problem(
    path: Path,
    build_dir: str | None = None,
    arch: str | None = None,
    max_bytes: int = DEFAULT_MAX_MODULE_BYTES,
) -> FusionProblem:
    text = read_text_capped(str(path), max_bytes)
    emitted = None
    if build_dir:
        from mlirtuna.tuners.rocmlir import fusionkey  # runs the build's tools: only when asked

        emitted = fusionkey.emit_tuning_key(path, text, build_dir, arch or DEFAULT_KEY_ARCH)
    try:
        return from_module(text, path.name, emitted, str(path))
    except (ValueError, IndexError, KeyError, TypeError, ArithmeticError) as exc:
        # What the readers did not foresee is still one line, never a traceback.
        raise UserError(f"{path}: cannot read this module ({type(exc).__name__}: {exc})") from None


# -- importing -------------------------------------------------------------------------------


def import_files(
    db: Database,
    op: str,
    paths: Sequence[str],
    options: ExpandOptions | None = None,
    tag: str | None = None,
) -> ImportReport:
    """Import config lists of `op`: every file parsed first, then one transaction."""
    return store(db, op, read_config_lists(op, paths, options), tag)


def import_modules(
    db: Database,
    paths: Sequence[str],
    tag: str | None = None,
    build_dir: str | None = None,
    arch: str | None = None,
    max_bytes: int = DEFAULT_MAX_MODULE_BYTES,
) -> ImportReport:
    """Read and key every module, then insert the new ones in one transaction."""
    return store(db, "fusion", read_modules(paths, build_dir, arch, max_bytes), tag)


def store(db: Database, op: str, parsed: Parsed, tag: str | None = None) -> ImportReport:
    """Insert the problems not yet known (and tag them all) in one transaction."""
    report = ImportReport(lines=parsed.lines, problems=len(parsed.entries))
    report.warnings.extend(parsed.warnings)

    def write() -> int:
        with db.session(immediate=True) as s:
            ids, new = ensure_problems(s, op, parsed.problems())
            if tag:
                priorities = {ids[v]: prio for v, (_, prio) in parsed.entries.items()}
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


# -- ids and tags ----------------------------------------------------------------------------


def problem_ids(s: Session, op: str, vectors: Iterable[str]) -> dict[str, int]:
    """{test_vector: id} for those of `vectors` already in the problem table."""
    return dict(_vector_ids(s, op, vectors))


def ids_of(s: Session, op: str | None, vectors: Iterable[str]) -> set[int]:
    """The ids of the problems with these test vectors, of any op when `op` is None."""
    return {pid for _, pid in _vector_ids(s, op, vectors)}


def _vector_ids(s: Session, op: str | None, vectors: Iterable[str]) -> Iterator[tuple[str, int]]:
    vectors = list(vectors)
    for i in range(0, len(vectors), CHUNK):
        stmt = sa.select(Problem.test_vector, Problem.id).where(
            Problem.test_vector.in_(vectors[i : i + CHUNK])
        )
        if op is not None:
            stmt = stmt.where(Problem.op == op)
        yield from s.execute(stmt)


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


# -- problems from rows ----------------------------------------------------------------------


def load_problem(s: Session, problem_id: int) -> ProblemSpec:
    """The typed problem behind a problem id (supertable row + its op's config row)."""
    op = s.scalar(sa.select(Problem.op).where(Problem.id == problem_id))
    if op is None:
        raise LookupError(f"no problem {problem_id}")
    table = CONFIG_TABLES[op].__table__
    row = s.execute(sa.select(table).where(table.c.id == problem_id)).mappings().one()
    return problem_of(op, row)


def load_problems(s: Session, ids: Iterable[int]) -> Iterator[tuple[int, ProblemSpec]]:
    """(id, typed problem) of each of these problem ids, a config table and CHUNK ids a query."""
    wanted = sorted(set(ids))
    for op, model in CONFIG_TABLES.items():
        table = model.__table__
        for at in range(0, len(wanted), CHUNK):
            chunk = wanted[at : at + CHUNK]
            rows = s.execute(
                sa.select(table)
                .join(Problem, Problem.id == table.c.id)
                .where(Problem.op == op, table.c.id.in_(chunk))
            )
            for row in rows.mappings():
                yield row["id"], problem_of(op, row)


def problem_of(op: str, columns: Mapping[Any, Any]) -> ProblemSpec:
    """The typed problem from its op's config row (its id column, if there, is not a field)."""
    return from_columns(op, {k: v for k, v in columns.items() if k != "id"})


def problem_from_json(dialect: sa.Dialect, op: str, config: str | dict) -> ProblemSpec:
    """The typed problem from its config row as one JSON object built by the database (the
    claim reads it so): the values as the driver gives them, put through each column's result
    processor as a selected row's would be (booleans stored as 0/1)."""
    # PostgreSQL's driver parses JSON itself
    columns: dict[str, Any] = json.loads(config) if isinstance(config, str) else config
    for name, process in _result_processors(dialect, op).items():
        columns[name] = process(columns[name])
    return problem_of(op, columns)


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


def label_column() -> sa.ColumnElement[str]:
    """A fusion problem as people read it (file @function: key), others their test vector.
    Needs FusionConfig outer-joined on Problem.id."""
    label = FusionConfig.file_name + " @" + FusionConfig.function + ": " + FusionConfig.tuning_key
    return sa.func.coalesce(label, Problem.test_vector)
