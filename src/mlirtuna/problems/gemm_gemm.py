"""GEMM+GEMM problems (`perfRunner --op gemm_gemm`): O = (A @ B) @ C, G times.

Follows ROCm/rocMLIR mlir/utils/performance/perfRunner.py (GemmGemmConfiguration), newest
stored version:

- Canonical (to_command_line): `-t DT -transA B -transB B -transC B -transO B -g G -m M -k K
  -n N -gemmO O`; note the order `-m -k -n` (rocmlir-gen's tuning key prints `-m -n -k`; perfRunner
  re-canonicalizes it). A is M x K, B is K x N, C is N x gemmO, the output M x gemmO.
- Flags: -t -g -m -k -n -gemmO required; -transA/B/C/O default false (1/0/true/false in any
  case). -t: f32 f16 bf16 (DATA_TYPES_GEMM_GEMM). `-perf_config` is dropped by the config-list
  reader, as elsewhere.
- Flops: 2*G*M*K*N + 2*G*M*N*gemmO (compute_tflops).
- Expansion: every absent flag among -t (f32 f16 bf16) and -transA/-transB/-transC/-transO
  (false, true) takes every value, in that nesting order; present ones are kept as written.
"""

from __future__ import annotations

from dataclasses import dataclass
from functools import lru_cache
from itertools import product
from typing import Any, ClassVar

from mlirtuna.errors import InputError
from mlirtuna.formats import debug as dbg
from mlirtuna.problems.flags import (
    Columns,
    ExpandOptions,
    SizeFlags,
    bool_text,
    bool_value,
    check_name,
    flag_values,
    known_name,
    option_values,
)
from mlirtuna.problems.spec import OpSpec

DATA_TYPES = ("f32", "f16", "bf16")

SIZE_FLAGS = SizeFlags(  # (flag, field, minimum, default; None = required)
    ("-g", "group_size", 1, None),
    ("-m", "m", 1, None),
    ("-k", "k", 1, None),
    ("-n", "n", 1, None),
    ("-gemmO", "gemm_o", 1, None),
)
TRANS_FLAGS = (
    ("-transA", "trans_a"),
    ("-transB", "trans_b"),
    ("-transC", "trans_c"),
    ("-transO", "trans_o"),
)
FLAGS = frozenset(["-t", *SIZE_FLAGS.flags, *(f for f, _ in TRANS_FLAGS)])

_TYPE_NAMES = {t: t for t in DATA_TYPES}


@dataclass(frozen=True, slots=True, kw_only=True)
class GemmGemmProblem(Columns):
    """One GEMM+GEMM, field names = gemm_gemm_config columns."""

    op: ClassVar[str] = "gemm_gemm"

    data_type: str
    trans_a: bool = False
    trans_b: bool = False
    trans_c: bool = False
    trans_o: bool = False
    group_size: int
    m: int
    k: int
    n: int
    gemm_o: int

    def __post_init__(self) -> None:
        check_name("-t", self.data_type, DATA_TYPES)
        SIZE_FLAGS.check(self)

    def canonical(self) -> str:
        """The test vector as perfRunner's GemmGemmConfiguration.to_command_line prints it."""
        b = bool_text
        return (
            f"-t {self.data_type} -transA {b(self.trans_a)} -transB {b(self.trans_b)} "
            f"-transC {b(self.trans_c)} -transO {b(self.trans_o)} -g {self.group_size} "
            f"-m {self.m} -k {self.k} -n {self.n} -gemmO {self.gemm_o}"
        )

    def flops(self) -> int:
        g, m = self.group_size, self.m
        return 2 * g * m * self.k * self.n + 2 * g * m * self.n * self.gemm_o


def _split(line: str) -> dict[str, str]:
    return flag_values(line.split(), "gemm_gemm", FLAGS)


def _data_type(flags: dict[str, str]) -> str:
    if "-t" not in flags:
        raise InputError("missing required flag -t")
    return known_name("-t", flags["-t"], _TYPE_NAMES)


def parse(line: str) -> GemmGemmProblem:
    """One gemm_gemm line as written (absent -trans flags are false, as in perfRunner)."""
    flags = _split(line)
    trans: dict[str, Any] = {
        name: bool_value(flag, flags[flag]) for flag, name in TRANS_FLAGS if flag in flags
    }
    sizes: dict[str, Any] = SIZE_FLAGS.parse(flags)
    return GemmGemmProblem(data_type=_data_type(flags), **trans, **sizes)


@lru_cache(maxsize=64)
def _resolved(options: ExpandOptions) -> tuple[str, ...]:
    return option_values("gemm_gemm data type", options.data_types, _TYPE_NAMES, DATA_TYPES)


def check_options(options: ExpandOptions) -> None:
    _resolved(options)


def expand_problems(line: str, options: ExpandOptions) -> list[GemmGemmProblem]:
    """perfRunner's expansion of one gemm_gemm line, as problems."""
    if not options.expand:
        return [parse(line)]
    flags = _split(line)
    types = (_data_type(flags),) if "-t" in flags else _resolved(options)
    sizes: dict[str, Any] = SIZE_FLAGS.parse(flags)
    both = (False, True)
    space = [(bool_value(f, flags[f]),) if f in flags else both for f, _ in TRANS_FLAGS]
    names = [name for _, name in TRANS_FLAGS]
    return [
        GemmGemmProblem(data_type=t, **dict[str, Any](zip(names, trans, strict=True)), **sizes)
        for t in types
        for trans in product(*space)
    ]


def expand(line: str, options: ExpandOptions) -> list[str]:
    return [p.canonical() for p in expand_problems(line, options)]


PROBLEM = GemmGemmProblem


SPEC = OpSpec(
    name="gemm_gemm",
    problem=GemmGemmProblem,
    table="gemm_gemm_config",
    flags=FLAGS,
    sniff=lambda words: "-gemmO" in words and "-c" not in words,
    sniff_rank=0,
    debug=dbg.Layout(
        lead=(dbg.Column("DataType", "data_type"),),
        rest=(
            *(dbg.Column(f"Trans{x}", f"trans_{x.lower()}") for x in "ABCO"),
            dbg.Column("G", "group_size"),
            dbg.Column("M", "m"),
            dbg.Column("K", "k"),
            dbg.Column("N", "n"),
            dbg.Column("O", "gemm_o"),
        ),
    ),
    attention_kernel=True,  # built as attention is: attn:… perf configs
)
