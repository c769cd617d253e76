"""The query pieces every page's read model shares: a problem's data type whichever config table
holds it, the joins that give it and a problem's label, LIKE escaping, error first lines."""

from __future__ import annotations

import re
from typing import Any

import sqlalchemy as sa
from sqlalchemy.orm import aliased

from mlirtuna import catalog, stats
from mlirtuna.db import Database
from mlirtuna.db.models import CONFIG_TABLES, FusionConfig, Problem
from mlirtuna.history import perffields
from mlirtuna.problems import conv as conv_problems
from mlirtuna.problems import gemm as gemm_problems


def typed_configs() -> list[Any]:
    """The config tables with a data_type column (a fusion module has none of its own)."""
    return [t for t in CONFIG_TABLES.values() if hasattr(t, "data_type")]


# A fusion module's data type is its tuning key's: joined under a name of its own, so that a
# query may also join FusionConfig for the label (_with_labels).
FUSION_TYPES = aliased(FusionConfig, name="fusion_types")


def fusion_data_type() -> sa.ColumnElement[str]:
    """The data type of a fusion's tuning key: a GEMM key's `-t TYPE`, a conv key's prefix
    (convfp16: f16); NULL for another key."""
    key, op = FUSION_TYPES.tuning_key, FUSION_TYPES.key_op
    whens = [(sa.and_(op == "gemm", key.like(f"-t {t} %")), t) for t in gemm_problems.DATA_TYPES]
    whens += [
        (sa.and_(op == "conv", key.like(f"{prefix} %")), t)
        for prefix, t in conv_problems.PREFIX_TYPES.items()
    ]
    return sa.case(*whens, else_=sa.null())


def data_type_column() -> sa.ColumnElement[str]:
    """The problem's data type, whichever config table holds it (a fusion: its key's; '' where
    none does)."""
    return sa.func.coalesce(*(t.data_type for t in typed_configs()), fusion_data_type(), "")


def with_configs(stmt: sa.Select, problem_id: sa.ColumnExpressionArgument[int]) -> sa.Select:
    for table in typed_configs():
        stmt = stmt.outerjoin(table, table.id == problem_id)
    return stmt.outerjoin(FUSION_TYPES, FUSION_TYPES.id == problem_id)


def with_labels(stmt: sa.Select) -> sa.Select:
    """Outer-join FusionConfig on the problem: what catalog.label_column needs."""
    return stmt.outerjoin(FusionConfig, FusionConfig.id == Problem.id)


def escape_like(text: str) -> str:
    return text.replace("\\", "\\\\").replace("%", "\\%").replace("_", "\\_")


_NUMBER = re.compile(r"\d+(?:\.\d+)?")


def mask_numbers(line: str) -> str:
    """An error line with each number written N: "timed out after 1/2/4 candidates" are one
    group ("timed out after N candidates")."""
    return _NUMBER.sub("N", line)


# queue.fail writes "attempt 2/3 failed: <why>" (or "attempt failed, not retried: <why>" for a
# failure retrying cannot fix); the count is not part of what went wrong.
_ATTEMPT = re.compile(r"^attempt (?:\d+/\d+ failed|failed, not retried): ")


ERROR_TEXT_READ = 400  # characters of an error read to find its first line


def first_line(text: str | None) -> str:
    stripped = (text or "").strip()
    return _ATTEMPT.sub("", stripped.splitlines()[0]) if stripped else "(no message)"


def labels(db: Database, problem_ids: list[int]) -> dict[int, str]:
    """How each problem reads (catalog.label_column): a fusion's file @function: key."""
    wanted = sorted(set(problem_ids))
    out: dict[int, str] = {}
    with db.session() as s:
        for i in range(0, len(wanted), 500):
            stmt = with_labels(
                sa.select(Problem.id, catalog.label_column()).where(
                    Problem.id.in_(wanted[i : i + 500])
                )
            )
            out.update({pid: label for pid, label in s.execute(stmt)})
    return out


# ---------------------------------------------------------------- rows of the wrong type
# SQLite stores what it is given: text in a REAL column, a perf-config field past a double.
# Such a row is flagged (its numbers read as None, its error says why) or skipped (a plot),
# never a 500.
WRONG_TYPE = "stored TFlops or time is not a number (the row was written outside mlirtuna)"
PLOT_FIELD_MAX = 2**53  # a perf-config field a float axis holds exactly


def numbers(*values: Any) -> list[float | None]:
    """Stored numbers as floats; None where a row holds something else."""
    return [stats.stored_number(v) for v in values]


def flagged(error: str | None, *values: Any) -> str | None:
    """A candidate's error, or WRONG_TYPE when a stored number of it is not one."""
    wrong = any(v is not None and stats.stored_number(v) is None for v in values)
    return error if error is not None or not wrong else WRONG_TYPE


def plottable(tflops: Any, best: Any, perf_config: str) -> bool:
    """A candidate a plot can draw: numbers where numbers are stored, and perf config fields a
    float holds."""
    if stats.stored_number(tflops) is None or stats.stored_number(best) is None:
        return False
    fields = perffields.fields(perf_config).values()
    return all(not isinstance(v, int) or abs(v) <= PLOT_FIELD_MAX for v in fields)
