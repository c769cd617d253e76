"""Convolution+GEMM problems (`perfRunner --op conv_gemm`): a forward convolution whose output,
read as an (N*Ho*Wo) x K matrix, is multiplied by a K x gemmO matrix.

Follows ROCm/rocMLIR mlir/utils/performance/perfRunner.py (ConvGemmConfiguration), newest
stored version:

- Canonical (to_command_line): `-t DT -f FIL -I IN -transC B -transO B -n N -c C -H HI -W WI
  -k K -y Y -x X -p PH -q PW -u SH -v SW -l DH -j DW -g G -gemmO O` (no -F, -O, -m, trailing -t;
  older versions printed `-g G-gemmO O` without the space, a bug not reproduced).
- Every conv flag, -f, -I and -gemmO are required (perfRunner raises "Incomplete conv+gemm
  configuration"); -transC/-transO default false. -t: f32 f16 bf16. Layouts as conv's (N, C,
  optional G, H/W or 0/1), kept upper-cased.
- Flops: the conv's 2*N*(C/G)*K*Ho*Wo*Y*X plus 2*(N*Ho*Wo)*K*gemmO: perfRunner's
  compute_tflops takes the second GEMM over all K channels with batch 1, whatever G is.
- Expansion: absent -t (f32 f16 bf16), -f and -I (NHWC, NCHW, independently), -transC and
  -transO (false, true), in that nesting order.
"""

from __future__ import annotations

from dataclasses import dataclass
from functools import lru_cache
from itertools import product
from typing import Any, ClassVar

from mlirtuna.errors import InputError, UserError
from mlirtuna.formats import debug as dbg
from mlirtuna.problems.conv import check_shape, layout_error, out_size
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
DEFAULT_LAYOUTS = ("NHWC", "NCHW")
LAYOUT_FLAGS = (("-f", "fil_layout"), ("-I", "in_layout"))
TRANS_FLAGS = (("-transC", "trans_c"), ("-transO", "trans_o"))

SIZE_FLAGS = SizeFlags(  # (flag, field, minimum, default; None = required)
    ("-n", "batchsize", 1, None),
    ("-c", "in_channels", 1, None),
    ("-H", "in_h", 1, None),
    ("-W", "in_w", 1, None),
    ("-k", "out_channels", 1, None),
    ("-y", "fil_h", 1, None),
    ("-x", "fil_w", 1, None),
    ("-p", "pad_h", 0, None),
    ("-q", "pad_w", 0, None),
    ("-u", "conv_stride_h", 1, None),
    ("-v", "conv_stride_w", 1, None),
    ("-l", "dilation_h", 1, None),
    ("-j", "dilation_w", 1, None),
    ("-g", "group_size", 1, None),
    ("-gemmO", "gemm_o", 1, None),
)
FLAGS = frozenset(
    ["-t", *SIZE_FLAGS.flags, *(f for f, _ in LAYOUT_FLAGS), *(f for f, _ in TRANS_FLAGS)]
)

_TYPE_NAMES = {t: t for t in DATA_TYPES}


@dataclass(frozen=True, slots=True, kw_only=True)
class ConvGemmProblem(Columns):
    """One conv+GEMM, field names = conv_gemm_config columns."""

    op: ClassVar[str] = "conv_gemm"

    data_type: str
    fil_layout: str
    in_layout: str
    trans_c: bool = False
    trans_o: bool = False
    batchsize: int
    in_channels: int
    in_h: int
    in_w: int
    out_channels: int
    fil_h: int
    fil_w: int
    pad_h: int
    pad_w: int
    conv_stride_h: int
    conv_stride_w: int
    dilation_h: int
    dilation_w: int
    group_size: int
    gemm_o: int

    def __post_init__(self) -> None:
        check_name("-t", self.data_type, DATA_TYPES)
        for flag, name in LAYOUT_FLAGS:
            error = layout_error(getattr(self, name))
            if error:
                raise InputError(f"{flag}: bad layout {getattr(self, name)!r}: {error}")
        SIZE_FLAGS.check(self)
        check_shape(self)

    def out_size(self) -> tuple[int, int]:
        return out_size(self)

    def canonical(self) -> str:
        """The test vector as perfRunner's ConvGemmConfiguration.to_command_line prints it."""
        b = bool_text
        return (
            f"-t {self.data_type} -f {self.fil_layout} -I {self.in_layout} "
            f"-transC {b(self.trans_c)} -transO {b(self.trans_o)} "
            f"-n {self.batchsize} -c {self.in_channels} -H {self.in_h} -W {self.in_w} "
            f"-k {self.out_channels} -y {self.fil_h} -x {self.fil_w} "
            f"-p {self.pad_h} -q {self.pad_w} -u {self.conv_stride_h} -v {self.conv_stride_w} "
            f"-l {self.dilation_h} -j {self.dilation_w} -g {self.group_size} -gemmO {self.gemm_o}"
        )

    def flops(self) -> int:
        out_h, out_w = self.out_size()
        pixels = self.batchsize * out_h * out_w
        conv = (
            2
            * pixels
            * (self.in_channels // self.group_size)
            * self.out_channels
            * self.fil_h
            * self.fil_w
        )
        return conv + 2 * pixels * self.out_channels * self.gemm_o


def _split(line: str) -> dict[str, str]:
    return flag_values(line.split(), "conv_gemm", FLAGS)


def _data_type(flags: dict[str, str]) -> str:
    if "-t" not in flags:
        raise InputError("missing required flag -t")
    return known_name("-t", flags["-t"], _TYPE_NAMES)


def _bools(flags: dict[str, str]) -> dict[str, bool]:
    return {name: bool_value(flag, flags[flag]) for flag, name in TRANS_FLAGS if flag in flags}


def parse(line: str) -> ConvGemmProblem:
    """One conv_gemm line as written."""
    flags = _split(line)
    layouts: dict[str, Any] = {}
    for flag, name in LAYOUT_FLAGS:
        if flag not in flags:
            raise InputError(f"missing required flag {flag}")
        layouts[name] = flags[flag].upper()
    bools: dict[str, Any] = _bools(flags)
    sizes: dict[str, Any] = SIZE_FLAGS.parse(flags)
    return ConvGemmProblem(data_type=_data_type(flags), **layouts, **bools, **sizes)


@lru_cache(maxsize=64)
def _resolved(options: ExpandOptions) -> tuple[tuple[str, ...], tuple[str, ...]]:
    types = option_values("conv_gemm data type", options.data_types, _TYPE_NAMES, DATA_TYPES)
    layouts = tuple(dict.fromkeys(x.upper() for x in options.layouts or DEFAULT_LAYOUTS))
    for layout in layouts:
        if layout_error(layout):
            raise UserError(f"bad layout {layout!r}: {layout_error(layout)}")
    return types, layouts


def check_options(options: ExpandOptions) -> None:
    _resolved(options)


def expand_problems(line: str, options: ExpandOptions) -> list[ConvGemmProblem]:
    """perfRunner's expansion of one conv_gemm line, as problems."""
    if not options.expand:
        return [parse(line)]
    all_types, all_layouts = _resolved(options)
    flags = _split(line)
    types = (_data_type(flags),) if "-t" in flags else all_types
    sizes = SIZE_FLAGS.parse(flags)
    both = (False, True)
    layout_space = [(flags[f].upper(),) if f in flags else all_layouts for f, _ in LAYOUT_FLAGS]
    trans_space = [(bool_value(f, flags[f]),) if f in flags else both for f, _ in TRANS_FLAGS]
    return [
        ConvGemmProblem(data_type=t, fil_layout=fil, in_layout=inp, trans_c=tc, trans_o=to, **sizes)
        for t in types
        for fil, inp in product(*layout_space)
        for tc, to in product(*trans_space)
    ]


def expand(line: str, options: ExpandOptions) -> list[str]:
    return [p.canonical() for p in expand_problems(line, options)]


PROBLEM = ConvGemmProblem


SPEC = OpSpec(
    name="conv_gemm",
    problem=ConvGemmProblem,
    table="conv_gemm_config",
    flags=FLAGS,
    sniff=lambda words: "-gemmO" in words and "-c" in words,
    sniff_rank=0,
    debug=dbg.Layout(
        lead=(dbg.Column("DataType", "data_type"),),
        rest=(
            dbg.FILTER_LAYOUT,
            dbg.INPUT_LAYOUT,
            dbg.Column("TransC", "trans_c"),
            dbg.Column("TransO", "trans_o"),
            *dbg.CONV_SIZES,
            dbg.Column("O", "gemm_o"),
            *dbg.CONV_WINDOW,
        ),
    ),
    attention_kernel=True,  # built as attention is: attn:… perf configs
)
