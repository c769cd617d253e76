"""Fusion modules in: `.mlir` files and directories -> fusion problems (`import --op fusion`).

- A directory means every `*.mlir` directly in it, sorted (rocMLIR's `glob(DIR/*.mlir)`; a
  `.mlir.template` is not a test and is skipped).
- The tuning key comes from the rocMLIR build when one is given, through perfRunner's pipeline
  (`rocmlir-gen -fut NAME -arch CHIP --clone-harness FILE | rocmlir-opt -migraphx-to-tosa |
  rocmlir-driver -host-pipeline highlevel -kernel-pipeline highlevel -targets CHIP |
  rocmlir-gen --emit-tuning-key -`; the rocmlir-opt stage only when the module's RUN line
  lowers MIGraphX that way), else mlirtuna derives it from the MIGraphX ops.
- Every file is read and keyed before the database is touched: one bad module, nothing written.
  Problems are unique by module hash: re-importing a directory adds nothing.
"""

from __future__ import annotations

from collections.abc import Sequence
from pathlib import Path

import sqlalchemy as sa

from mlirtuna import catalog
from mlirtuna.catalog import ImportReport
from mlirtuna.db import Database
from mlirtuna.db.models import FusionConfig, Problem
from mlirtuna.errors import UserError
from mlirtuna.problems.fusion import FusionProblem, from_module
from mlirtuna.tuners.rocmlir.fusionkey import DEFAULT_KEY_ARCH, emit_tuning_key


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
    if not found:
        raise UserError(f"no .mlir modules in {', '.join(paths)}")
    return list(dict.fromkeys(found))


def read_problem(
    path: Path, build_dir: str | None = None, arch: str | None = None
) -> FusionProblem:
    try:
        text = path.read_text(encoding="utf-8")
    except UnicodeDecodeError:
        raise UserError(f"{path}: not a UTF-8 text file") from None
    except OSError as error:
        raise UserError(f"{path}: {error.strerror or error}") from None
    emitted = None
    if build_dir:
        emitted = emit_tuning_key(path, text, build_dir, arch or DEFAULT_KEY_ARCH)
    return from_module(text, path.name, emitted, str(path))


def import_modules(
    db: Database,
    paths: Sequence[str],
    tag: str | None = None,
    build_dir: str | None = None,
    arch: str | None = None,
) -> ImportReport:
    """Read and key every module, then insert the new ones in one transaction."""
    report = ImportReport()
    problems: dict[str, FusionProblem] = {}
    for path in module_files(paths):
        report.lines += 1
        problem = read_problem(path, build_dir, arch)
        problems.setdefault(problem.canonical(), problem)
    report.problems = len(problems)
    with db.session(immediate=True) as s:
        ids, report.new = catalog.ensure_problems(s, "fusion", list(problems.values()))
        if tag:
            catalog.tag_problems(s, tag, {ids[v]: 0 for v in problems})
    report.existing = report.problems - report.new
    return report


def label_column() -> sa.ColumnElement[str]:
    """A fusion problem as people read it (file @function: key), others their test vector.
    Needs FusionConfig outer-joined on Problem.id."""
    label = FusionConfig.file_name + " @" + FusionConfig.function + ": " + FusionConfig.tuning_key
    return sa.func.coalesce(label, Problem.test_vector)
