"""Attention problems, as rocMLIR's perfRunner.py reads them.

Follows ROCm/rocMLIR mlir/utils/performance/perfRunner.py (AttentionConfiguration and
get_attn_configurations), newest stored version — the one whose to_command_line ends with
`-transBias`, after the older forms without -split_kv/-num_heads (00267dbf era) and without
-transBias:

  -t f16 -transQ false -transK false -transV false -transO false -causal false
  -return_lse false -split_kv 1 -g 1 -seq_len_q 256 -seq_len_k 256 -num_heads_q 8
  -num_heads_kv 8 -head_dim_qk 64 -head_dim_v 64 -with-attn-scale false -with-attn-bias false
  -transBias false

(perfRunner retries a DB miss with the false-valued -with-attn-*/-transBias flags stripped, so
the shorter, older strings still match these problems there.)

- Required: -t -g -seq_len_q -seq_len_k -head_dim_qk -head_dim_v. Defaults as in perfRunner:
  -num_heads_q/-num_heads_kv/-split_kv 1, every boolean false. -t: i8 f32 f16 bf16.
- Booleans accept 1/0/true/false in any case (newer lists write `False`).
- -transBias true needs -with-attn-bias true (perfRunner refuses it too).
- Expansion: absent -t (default i8 f32 f16 bf16) and -transQ/-transK/-transV/-transO (false,
  true) are expanded; absent -causal/-return_lse/-with-attn-*/-transBias are false.
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
    check_minimum,
    check_name,
    flag_values,
    known_name,
    option_values,
)
from mlirtuna.problems.spec import OpSpec

DATA_TYPES = ("i8", "f32", "f16", "bf16")

SIZE_FLAGS = SizeFlags(  # (flag, field, minimum, default; None = required)
    ("-split_kv", "split_kv", 1, 1),
    ("-g", "group_size", 1, None),
    ("-seq_len_q", "seq_len_q", 1, None),
    ("-seq_len_k", "seq_len_k", 1, None),
    ("-num_heads_q", "num_heads_q", 1, 1),
    ("-num_heads_kv", "num_heads_kv", 1, 1),
    ("-head_dim_qk", "head_dim_qk", 1, None),
    ("-head_dim_v", "head_dim_v", 1, None),
)
TRANS_FLAGS = (
    ("-transQ", "trans_q"),
    ("-transK", "trans_k"),
    ("-transV", "trans_v"),
    ("-transO", "trans_o"),
)
OTHER_BOOL_FLAGS = (
    ("-causal", "causal"),
    ("-return_lse", "return_lse"),
    ("-with-attn-scale", "with_attn_scale"),
    ("-with-attn-bias", "with_attn_bias"),
    ("-transBias", "trans_bias"),
)
FLAGS = frozenset(["-t", *SIZE_FLAGS.flags, *(f for f, _ in TRANS_FLAGS + OTHER_BOOL_FLAGS)])

_TYPE_NAMES = {t: t for t in DATA_TYPES}


@dataclass(frozen=True, slots=True, kw_only=True)
class AttentionProblem(Columns):
    """One fused attention, field names = attention_config columns."""

    op: ClassVar[str] = "attention"

    data_type: str
    trans_q: bool = False
    trans_k: bool = False
    trans_v: bool = False
    trans_o: bool = False
    causal: bool = False
    return_lse: bool = False
    split_kv: int = 1
    group_size: int
    seq_len_q: int
    seq_len_k: int
    num_heads_q: int = 1
    num_heads_kv: int = 1
    head_dim_qk: int
    head_dim_v: int
    with_attn_scale: bool = False
    with_attn_bias: bool = False
    trans_bias: bool = False
    kernel_repeats: int = 1

    def __post_init__(self) -> None:
        check_name("-t", self.data_type, DATA_TYPES)
        SIZE_FLAGS.check(self)
        check_minimum("kernel_repeats", self.kernel_repeats, 1)
        if self.trans_bias and not self.with_attn_bias:
            raise InputError("-transBias true needs -with-attn-bias true")

    def canonical(self) -> str:
        """The test vector as the newest perfRunner's to_command_line prints it."""
        b = bool_text
        return (
            f"-t {self.data_type} -transQ {b(self.trans_q)} -transK {b(self.trans_k)} "
            f"-transV {b(self.trans_v)} -transO {b(self.trans_o)} -causal {b(self.causal)} "
            f"-return_lse {b(self.return_lse)} -split_kv {self.split_kv} -g {self.group_size} "
            f"-seq_len_q {self.seq_len_q} -seq_len_k {self.seq_len_k} "
            f"-num_heads_q {self.num_heads_q} -num_heads_kv {self.num_heads_kv} "
            f"-head_dim_qk {self.head_dim_qk} -head_dim_v {self.head_dim_v} "
            f"-with-attn-scale {b(self.with_attn_scale)} -with-attn-bias {b(self.with_attn_bias)} "
            f"-transBias {b(self.trans_bias)}"
        )

    def flops(self) -> int:
        """The two matmuls only (as perfRunner counts), over g * max(heads) batches (GQA)."""
        batches = self.group_size * max(self.num_heads_q, self.num_heads_kv)
        scores = batches * self.seq_len_q * self.seq_len_k
        return 2 * scores * self.head_dim_qk + 2 * scores * self.head_dim_v


def _fields(flags: dict[str, str]) -> dict[str, Any]:
    """Every field the line gives or defaults, except -t and the -trans{Q,K,V,O} flags."""
    values: dict[str, Any] = SIZE_FLAGS.parse(flags)
    for flag, name in OTHER_BOOL_FLAGS:
        if flag in flags:
            values[name] = bool_value(flag, flags[flag])
    return values


def _data_type(flags: dict[str, str]) -> str:
    return known_name("-t", flags["-t"], _TYPE_NAMES)


def parse(line: str) -> AttentionProblem:
    """One attention line as written."""
    flags = flag_values(line.split(), "attention", FLAGS)
    if "-t" not in flags:
        raise InputError("missing required flag -t")
    values = _fields(flags)
    for flag, name in TRANS_FLAGS:
        if flag in flags:
            values[name] = bool_value(flag, flags[flag])
    _check_heads(values)
    return AttentionProblem(data_type=_data_type(flags), **values)


def _check_heads(values: dict[str, Any]) -> None:
    """Grouped-query attention shares each K/V head among num_heads_q / num_heads_kv query
    heads: a line whose counts do not divide names no kernel rocMLIR can build (checked where
    lines are read; rows already stored are read as they are)."""
    q, kv = values.get("num_heads_q", 1), values.get("num_heads_kv", 1)
    if q % kv:
        raise InputError(f"-num_heads_q {q} is not a multiple of -num_heads_kv {kv}")


@lru_cache(maxsize=64)
def _resolved(options: ExpandOptions) -> tuple[str, ...]:
    return option_values("attention data type", options.data_types, _TYPE_NAMES, DATA_TYPES)


def check_options(options: ExpandOptions) -> None:
    _resolved(options)


def expand_problems(line: str, options: ExpandOptions) -> list[AttentionProblem]:
    """perfRunner's get_attn_configurations for one line, as problems."""
    if not options.expand:
        return [parse(line)]
    types = _resolved(options)
    flags = flag_values(line.split(), "attention", FLAGS)
    if "-t" in flags:
        types = (_data_type(flags),)
    values = _fields(flags)
    _check_heads(values)
    both = (False, True)
    trans_space = [
        (bool_value(flag, flags[flag]),) if flag in flags else both for flag, _ in TRANS_FLAGS
    ]
    names = [name for _, name in TRANS_FLAGS]
    return [
        AttentionProblem(data_type=t, **values, **dict(zip(names, trans, strict=True)))
        for t in types
        for trans in product(*trans_space)
    ]


def expand(line: str, options: ExpandOptions) -> list[str]:
    return [p.canonical() for p in expand_problems(line, options)]


PROBLEM = AttentionProblem


SPEC = OpSpec(
    name="attention",
    problem=AttentionProblem,
    table="attention_config",
    flags=FLAGS,
    sniff=lambda words: "-seq_len_q" in words or "-seq_len" in words,
    sniff_rank=1,
    debug=dbg.Layout(
        lead=(dbg.Column("DataType", "data_type"),),
        rest=(
            *(dbg.Column(f"Trans{x}", f"trans_{x.lower()}") for x in "QKVO"),
            dbg.Column("Causal", "causal", eras=dbg.FROM_E3),
            dbg.Column("ReturnLSE", "return_lse", eras=dbg.FROM_E3),
            dbg.Column("SplitKV", "split_kv", eras=dbg.FROM_E3),
            # no sliding window in mlirtuna's attention: perfRunner's "off"
            dbg.Column("SlidingWindowLookBack", default="-1", eras=dbg.FROM_E3),
            dbg.Column("WithAttnScale", "with_attn_scale"),
            dbg.Column("WithAttnBias", "with_attn_bias", eras=dbg.FROM_E3),
            dbg.Column("TransBias", "trans_bias", eras=dbg.FROM_E3),
            dbg.Column("G", "group_size"),
            dbg.Column("SeqLenQ", "seq_len_q"),
            dbg.Column("SeqLenK", "seq_len_k"),
            dbg.Column("NumHeadsQ", "num_heads_q", eras=dbg.FROM_E3),
            dbg.Column("NumHeadsKV", "num_heads_kv", eras=dbg.FROM_E3),
            dbg.Column("HeadDimQK", "head_dim_qk"),
            dbg.Column("HeadDimV", "head_dim_v"),
        ),
    ),
    attention_kernel=True,
    inc_section="GemmGemm",  # quickTuningGen.py: attention lists are GemmGemm's on every arch
)
