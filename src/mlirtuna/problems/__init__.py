"""Problems: one module per op that parses a rocMLIR config line into typed fields, prints the
canonical test vector exactly as perfRunner's `to_command_line()` does, and counts flops.

The contract every op module fulfils (see conv.py, gemm.py, attention.py):
- a frozen dataclass (ConvProblem, GemmProblem, AttentionProblem) whose field names are exactly
  the columns of that op's config table in models.py;
- `Cls.op` (class attribute), `p.canonical() -> str`, `p.flops() -> int`,
  `p.columns() -> dict` (field name -> value), `Cls.from_columns(dict)`;
- `parse(line) -> Problem` raising errors.InputError (no file/line: the reader adds those);
- `expand(line, options) -> list[str]`: perfRunner's expansion of one config-list line.

This package must import nothing from the database layer.
"""

from __future__ import annotations

from collections.abc import Mapping
from types import ModuleType
from typing import Any, TypeAlias

from mlirtuna.defaults import CONFIG_LIST_OPS, OPS
from mlirtuna.errors import UserError
from mlirtuna.problems import attention, conv, conv_gemm, fusion, gemm, gemm_gemm
from mlirtuna.problems.attention import AttentionProblem
from mlirtuna.problems.conv import ConvProblem
from mlirtuna.problems.conv_gemm import ConvGemmProblem
from mlirtuna.problems.flags import ExpandOptions
from mlirtuna.problems.fusion import FusionProblem
from mlirtuna.problems.gemm import GemmProblem
from mlirtuna.problems.gemm_gemm import GemmGemmProblem

__all__ = [
    "CONFIG_LIST_OPS",
    "OPS",
    "AttentionProblem",
    "ConvGemmProblem",
    "ConvProblem",
    "ExpandOptions",
    "FusionProblem",
    "GemmGemmProblem",
    "GemmProblem",
    "Problem",
    "check_options",
    "expand",
    "expand_problems",
    "from_columns",
    "parse",
    "problem_class",
]


Problem: TypeAlias = (
    ConvProblem | GemmProblem | AttentionProblem | GemmGemmProblem | ConvGemmProblem | FusionProblem
)

# Each op's module, by the op its problem class names (defaults.OPS is their order).
_MODULES: dict[str, ModuleType] = {
    m.PROBLEM.op: m for m in (conv, gemm, attention, gemm_gemm, conv_gemm, fusion)
}


def _module(op: str) -> ModuleType:
    try:
        return _MODULES[op]
    except KeyError:
        raise UserError(f"unknown op {op!r} (known: {', '.join(OPS)})") from None


def problem_class(op: str) -> type[Problem]:
    """The dataclass of one op."""
    return _module(op).PROBLEM


def parse(op: str, line: str) -> Problem:
    """One config line of `op`, as written (no expansion), as a problem."""
    return _module(op).parse(line)


def from_columns(op: str, columns: Mapping[str, Any]) -> Problem:
    """A problem from its config-table row (extra keys such as `id` are ignored)."""
    return _module(op).PROBLEM.from_columns(columns)


def check_options(op: str, options: ExpandOptions) -> None:
    """Raises UserError for option values `op` does not know, before any line is read."""
    _module(op).check_options(options)


def expand_problems(op: str, line: str, options: ExpandOptions = ExpandOptions()) -> list[Problem]:
    """perfRunner's expansion of one config line, as problems."""
    return _module(op).expand_problems(line, options)


def tool_rejects(problem: Problem) -> str | None:
    """Why rocMLIR's tuningRunner would refuse this problem's test vector (its perfRunner parser
    rejects it before tuning anything, failing every config of the call), or None. An op module
    says so with its own `tool_rejects`; the others' canonical forms are always accepted."""
    check = getattr(_module(problem.op), "tool_rejects", None)
    return None if check is None else check(problem)


def expand(op: str, line: str, options: ExpandOptions = ExpandOptions()) -> list[str]:
    """perfRunner's expansion of one config line, as canonical test vectors."""
    return [p.canonical() for p in expand_problems(op, line, options)]
