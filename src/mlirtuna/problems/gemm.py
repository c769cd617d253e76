"""GEMM problems: `-t T -out_datatype O -transA a -transB b [-transO o] -g G -m M -n N -k K`.

Follows ROCm/rocMLIR mlir/utils/performance/perfRunner.py (GemmConfiguration and
get_gemm_configurations), newest stored version and 00267dbf:

- Canonical (the problem's identity, its stored test vector): E2 perfRunner's to_command_line,
  which is also the E3 tuningRunner test vector
  (`-t f32 -out_datatype f32 -transA false -transB false -g 1 -m 1024 -n 512 -k 769`), with
  `-transO true` after -transB for a problem whose output is transposed. `-transO false` is the
  default and is not spelled, so every key written before -transO existed names the same problem.
- The E4 form (keys.e4_vector): rocmlirTriton's perfRunner (eb003bed) prints `-transO false|true`
  after -transB in every gemm key (GemmConfiguration.to_command_line), canonicalizes every config
  through it and looks its tuning DB up by that exact string. Which form a line gets is the
  build's (keys.E4, read from its perfRunner by tuners/rocmlir/eras.py).
- `-t`: f32 f16 bf16 i8 fp8 f4E2M1FN (perfRunner's DATA_TYPES_GEMM) and the fp8/bf8 operand
  pairs fp8_fp8 fp8_bf8 bf8_fp8 bf8_bf8 that rocmlir-gen's tuning key prints; matched
  case-insensitively. `-out_datatype` is lower-cased as perfRunner does; when absent it comes
  from perfRunner's OUTPUT_DATA_TYPES_MAP (i8 -> i32, fp8 forms and f4E2M1FN -> f32, else same).
- Import accepts `-transO` (1/0/true/false). rocMLIR's own tuningRunner at 3fc5be9e has no
  -transO in its gemm parser; a session of such a build refuses `-transO true` problems at
  `jobs load` (queue/jobs.py), and writes `-transO false` problems without the flag.
- Booleans: 1/0/true/false in any case (perfRunner reads anything else as false; we refuse it).
- Scaled GEMM (-scaledGemm, -scale_a_dtype, -scale_b_dtype, -transScaleA, -transScaleB) is
  refused: it needs columns the gemm_config table does not have.
- Expansion: data types x transA x transB over what the line leaves out. The out type follows
  the line's own -t when it has one (perfRunner pairs it with its loop variable instead). The
  newest perfRunner also expands -transO; we do not (a line without it is -transO false). Default
  types: f32 f16 bf16 i8 fp8 (f4E2M1FN only exists on gfx950; perfRunner also drops fp8 on
  gfx908/90a/942/1030/1101 — we do not know the chip here).
"""

from __future__ import annotations

from dataclasses import dataclass
from functools import lru_cache
from typing import ClassVar

from mlirtuna.errors import InputError
from mlirtuna.formats import debug as dbg
from mlirtuna.problems.flags import (
    Columns,
    ExpandOptions,
    SizeFlags,
    bool_text,
    bool_value,
    check_minimum,
    check_name,
    flag_values,
    known_name,
    option_values,
)
from mlirtuna.problems.spec import OpSpec

FP8_PAIRS = ("fp8_fp8", "fp8_bf8", "bf8_fp8", "bf8_bf8")  # A_B operand types
DATA_TYPES = ("f32", "f16", "bf16", "i8", "fp8", "f4E2M1FN", *FP8_PAIRS)
OUT_DATA_TYPES = ("f32", "f16", "bf16", "i32", "i8", "fp8", "bf8")
OUT_TYPE_MAP = {"i8": "i32", **dict.fromkeys(("fp8", "f4E2M1FN", *FP8_PAIRS), "f32")}
DEFAULT_TYPES = ("f32", "f16", "bf16", "i8", "fp8")

SIZE_FLAGS = SizeFlags(  # (flag, field, minimum, default; None = required)
    ("-g", "group_size", 1, None),
    ("-m", "m", 1, None),
    ("-n", "n", 1, None),
    ("-k", "k", 1, None),
)
TRANS_FLAGS = (("-transA", "trans_a"), ("-transB", "trans_b"))
FLAGS = frozenset(["-t", "-out_datatype", "-transA", "-transB", "-transO", *SIZE_FLAGS.flags])
SCALED_FLAGS = frozenset(
    ["-scaledGemm", "-scale_a_dtype", "-scale_b_dtype", "-transScaleA", "-transScaleB"]
)

_TYPE_NAMES = {t.lower(): t for t in DATA_TYPES}


@dataclass(frozen=True, slots=True, kw_only=True)
class GemmProblem(Columns):
    """One (batched) GEMM, field names = gemm_config columns."""

    op: ClassVar[str] = "gemm"

    data_type: str
    out_data_type: str
    trans_a: bool
    trans_b: bool
    trans_o: bool = False
    group_size: int
    m: int
    n: int
    k: int
    kernel_repeats: int = 1

    def __post_init__(self) -> None:
        check_name("-t", self.data_type, DATA_TYPES)
        check_name("-out_datatype", self.out_data_type, OUT_DATA_TYPES)
        SIZE_FLAGS.check(self)
        check_minimum("kernel_repeats", self.kernel_repeats, 1)

    def canonical(self) -> str:
        """The test vector as perfRunner (E2) / tuningRunner (E3) print it; -transO only when
        true (module docstring)."""
        trans_o = " -transO true" if self.trans_o else ""
        return (
            f"-t {self.data_type} -out_datatype {self.out_data_type} "
            f"-transA {bool_text(self.trans_a)} -transB {bool_text(self.trans_b)}{trans_o} "
            f"-g {self.group_size} -m {self.m} -n {self.n} -k {self.k}"
        )

    def flops(self) -> int:
        return 2 * self.group_size * self.m * self.k * self.n


def _split(line: str) -> dict[str, str]:
    tokens = line.split()
    scaled = SCALED_FLAGS.intersection(tokens)
    if scaled:
        raise InputError(f"scaled gemm is not supported yet ({' '.join(sorted(scaled))})")
    return flag_values(tokens, "gemm", FLAGS)


def _required(flags: dict[str, str], flag: str) -> str:
    text = flags.get(flag)
    if text is None:
        raise InputError(f"missing required flag {flag}")
    return text


def _make(flags: dict[str, str], data_type: str, trans_a: bool, trans_b: bool) -> GemmProblem:
    out = flags.get("-out_datatype")
    out_type = out.lower() if out is not None else OUT_TYPE_MAP.get(data_type, data_type)
    trans_o = flags.get("-transO")
    return GemmProblem(
        data_type=data_type,
        out_data_type=out_type,
        trans_a=trans_a,
        trans_b=trans_b,
        trans_o=False if trans_o is None else bool_value("-transO", trans_o),
        **SIZE_FLAGS.parse(flags),
    )


def _data_type(flags: dict[str, str]) -> str:
    return known_name("-t", _required(flags, "-t"), _TYPE_NAMES)


def parse(line: str) -> GemmProblem:
    """One gemm line as written."""
    flags = _split(line)
    trans = [bool_value(flag, _required(flags, flag)) for flag, _ in TRANS_FLAGS]
    return _make(flags, _data_type(flags), *trans)


@lru_cache(maxsize=64)
def _resolved(options: ExpandOptions) -> tuple[str, ...]:
    names = {t: t for t in DATA_TYPES}
    return option_values("gemm data type", options.data_types, names, DEFAULT_TYPES)


def check_options(options: ExpandOptions) -> None:
    _resolved(options)


def expand_problems(line: str, options: ExpandOptions) -> list[GemmProblem]:
    """perfRunner's get_gemm_configurations for one line, as problems."""
    if not options.expand:
        return [parse(line)]
    types = _resolved(options)
    flags = _split(line)
    if "-t" in flags:
        types = (_data_type(flags),)
    both = (False, True)
    trans_a, trans_b = (
        (bool_value(flag, flags[flag]),) if flag in flags else both for flag, _ in TRANS_FLAGS
    )
    return [_make(flags, t, a, b) for t in types for a in trans_a for b in trans_b]


def expand(line: str, options: ExpandOptions) -> list[str]:
    return [p.canonical() for p in expand_problems(line, options)]


PROBLEM = GemmProblem


SPEC = OpSpec(
    name="gemm",
    problem=GemmProblem,
    table="gemm_config",
    flags=FLAGS,
    sniff=lambda words: "-m" in words,  # asked last: conv lines carry `-m conv` too
    sniff_rank=3,
    debug=dbg.Layout(
        lead=(dbg.Column("DataType", "data_type"), dbg.Column("OutDataType", "out_data_type")),
        rest=(
            dbg.Column("TransA", "trans_a"),
            dbg.Column("TransB", "trans_b"),
            dbg.Column("TransO", "trans_o", eras=dbg.E4_ONLY),  # E3 has none
            dbg.Column("G", "group_size"),
            dbg.Column("M", "m"),
            dbg.Column("K", "k"),
            dbg.Column("N", "n"),
            # Scaled gemms (E3 on): mlirtuna's gemm has no scales, so the plain values.
            dbg.Column("ScaledGemm", default="False", eras=dbg.FROM_E3),
            dbg.Column("ScaleADtype", eras=dbg.FROM_E3),
            dbg.Column("ScaleBDtype", eras=dbg.FROM_E3),
            dbg.Column("TransScaleA", default="False", eras=dbg.FROM_E3),
            dbg.Column("TransScaleB", default="False", eras=dbg.FROM_E3),
        ),
        lds_bank_conflict=True,
    ),
)
