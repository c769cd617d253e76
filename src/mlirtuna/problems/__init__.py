"""Problems: one module per op that parses a rocMLIR config line into typed fields, prints the
canonical test vector exactly as perfRunner's `to_command_line()` does, and counts flops.

The contract every op module fulfils (see conv.py, gemm.py, attention.py):
- a frozen dataclass (ConvProblem, GemmProblem, AttentionProblem) whose field names are exactly
  the columns of that op's config table in models.py;
- `Cls.op` (class attribute), `p.canonical() -> str`, `p.flops() -> int`,
  `p.columns() -> dict` (field name -> value), `Cls.from_columns(dict)`;
- `parse(line) -> Problem` raising errors.InputError (no file/line: the reader adds those);
- `expand(line, options) -> list[str]`: perfRunner's expansion of one config-list line;
- `SPEC`: its OpSpec (spec.py), what every other layer knows of the op: its sniffer, config
  table, `.debug` columns, perf-config family and `.inc` section.

The ops are the modules of this package that define SPEC, found by importing each (no roster to
edit: a new op is its module); OPS, CONFIG_LIST_OPS and SPECS derive from their specs, config-list
ops first, then module ops, each alphabetical.

This package must import nothing from the database layer.
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from types import ModuleType
from typing import Any, ClassVar, Protocol

from mlirtuna import keys
from mlirtuna.errors import UserError
from mlirtuna.problems.attention import AttentionProblem
from mlirtuna.problems.conv import ConvProblem
from mlirtuna.problems.conv_gemm import ConvGemmProblem
from mlirtuna.problems.flags import ExpandOptions
from mlirtuna.problems.fusion import FusionProblem
from mlirtuna.problems.gemm import GemmProblem
from mlirtuna.problems.gemm_gemm import GemmGemmProblem
from mlirtuna.problems.spec import OpSpec, op_modules
from mlirtuna.problems.spec import op_of as op_among

__all__ = [
    "CONFIG_LIST_OPS",
    "OPS",
    "SPECS",
    "AttentionProblem",
    "ConvGemmProblem",
    "ConvProblem",
    "ExpandOptions",
    "FusionProblem",
    "GemmGemmProblem",
    "GemmProblem",
    "OpSpec",
    "Problem",
    "check_options",
    "expand",
    "expand_problems",
    "from_columns",
    "op_of",
    "op_of_vector",
    "parse",
    "perf_config_fits",
    "problem_class",
    "spec_of",
    "stored_vector",
]


class Problem(Protocol):
    """What every op's problem dataclass is (the module docstring's contract): a protocol, not a
    union of the classes, so that a new op's module is all this package needs."""

    op: ClassVar[str]

    def canonical(self) -> str: ...

    def flops(self) -> int: ...

    def columns(self) -> dict[str, Any]: ...


def _module(op: str) -> ModuleType:
    try:
        return _MODULES[op]
    except KeyError:
        raise UserError(f"unknown op {op!r} (known: {', '.join(OPS)})") from None


def spec_of(op: str) -> OpSpec:
    """The OpSpec of one op; UserError listing the known ones for another name."""
    _module(op)
    return _SPECS[op]


def op_of(words: Sequence[str]) -> str | None:
    """The op a config line or test vector is written for, from its words (None: no op claims
    them): the first spec, in sniff_rank order, whose sniffer does. `run --op auto`,
    `import-tsv` (each row's op) and the key forms of a tool's written key read it."""
    return op_among(SPECS, words)


def op_of_vector(written: str) -> str | None:
    """op_of on a written key's plain test vector (split-K and fusion words dropped)."""
    return op_of(keys.split_key(written).plain.split())


def stored_vector(written: str) -> str:
    """keys.stored_vector of a key whose op only its text tells (a tool's row, `.state` key or
    index.json testVector)."""
    return keys.stored_vector(written, op_of_vector(written))


def perf_config_fits(op: str, perf_config: str) -> bool:
    """Whether a perf config can be one of `op`'s (OpSpec.fits)."""
    return spec_of(op).fits(perf_config)


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


# Last: configlist.py, one of the modules looked at, imports this package's functions above.
_MODULES = op_modules(__name__, __path__)
SPECS: tuple[OpSpec, ...] = tuple(m.SPEC for m in _MODULES.values())
OPS: tuple[str, ...] = tuple(s.name for s in SPECS)
CONFIG_LIST_OPS: tuple[str, ...] = tuple(s.name for s in SPECS if s.config_list)
_SPECS = {s.name: s for s in SPECS}
