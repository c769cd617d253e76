"""Convolution problems: MIOpenDriver-style lines as rocMLIR's perfRunner.py reads them.

Follows ROCm/rocMLIR mlir/utils/performance/perfRunner.py, newest stored version (the one with
num_chiplets, TUNE_REP_MS and -transBias), checked against 00267dbf and the older 5cfde34a:

- Line: `[prefix] -F 1|2|4 -f FIL -I IN -O OUT -n N -c C -H H -W W -k K -y Y -x X -p P -q Q
  -u U -v V -l L -j J -g G [-m conv] [-t 1]`. `-m conv -t 1` are MIOpenDriver trailers: accepted
  (only `-m conv`, `-m trans` is another op; `-t` 0 or 1, it is a timing switch, not a type) and
  always printed as `-m conv … -t 1` in the canonical string.
- Prefix -> `data_type`, the rocmlir-gen `-t` name perfRunner uses: conv f32, convfp16 f16,
  convbfp16 bf16, convint8 i8, convfp8 fp8, convfp8_fp8 fp8_fp8, convfp8_bf8 fp8_bf8,
  convbf8_fp8 bf8_fp8, convbf8_bf8 bf8_bf8. Keeping the pair name (not just `fp8`) is what lets
  `convfp8` and `convfp8_fp8` stay two canonical strings, as perfRunner prints them.
  `in_data_type`/`fil_data_type` are the two halves (fp8/bf8), or the type itself when plain.
- `out_data_type` follows perfRunner's OUTPUT_DATA_TYPES_MAP: i8 -> i32 (rocmlir-gen's int8 conv
  writes i32, test rocmlir-driver/populate_prc.mlir), every fp8/bf8 form -> f32, else the same.
- A line without a prefix is f32 `conv` when taken as written (perfRunner itself cannot read it;
  its expansion always adds a prefix, and so does ours).
- Layouts are kept as written, upper-cased: newest perfRunner maps each letter (N C H W G 0 1)
  one to one, so N01GC, GNC01, 01NGC, NGC01, G0NC1 all round-trip.
- Missing -p -q default to 0 and -u -v -l -j -g to 1 (MIOpenDriver's defaults); perfRunner would
  crash instead. -F -f -I -O -n -c -H -W -k -y -x are required.
- Expansion (get_conv_configurations): directions x data types x layouts (NHWC, NCHW) over what
  the line leaves out; int8 and every fp8 form are forward only. Unlike perfRunner, which tests
  only the loop's own direction/type, a combination is dropped whenever either of the two was
  filled in (perfRunner would emit `convint8 -F 2` for a line saying `-F 2`); a line that spells
  out both is kept as written. Default types: conv convbfp16 convfp16 convfp8 convint8 (perfRunner
  drops convfp8 on gfx908/90a/942/1030/1101; we do not know the chip here).
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass
from functools import lru_cache
from typing import ClassVar, cast

from mlirtuna.errors import InputError, UserError
from mlirtuna.formats import debug as dbg
from mlirtuna.problems.flags import (
    Columns,
    ExpandOptions,
    SizeFlags,
    check_minimum,
    check_name,
    flag_values,
    int_value,
    option_values,
)
from mlirtuna.problems.spec import OpSpec

PREFIX_TYPES = {
    "conv": "f32",
    "convfp16": "f16",
    "convbfp16": "bf16",
    "convint8": "i8",
    "convfp8": "fp8",
    "convfp8_fp8": "fp8_fp8",
    "convfp8_bf8": "fp8_bf8",
    "convbf8_fp8": "bf8_fp8",
    "convbf8_bf8": "bf8_bf8",
}
TYPE_PREFIXES = {t: p for p, t in PREFIX_TYPES.items()}
DATA_TYPES = tuple(TYPE_PREFIXES)
FP8_TYPES = ("fp8", "fp8_fp8", "fp8_bf8", "bf8_fp8", "bf8_bf8")
FORWARD_ONLY = frozenset(("i8", *FP8_TYPES))
OUT_TYPES = {"i8": "i32", **dict.fromkeys(FP8_TYPES, "f32")}
DEFAULT_TYPES = ("f32", "bf16", "f16", "fp8", "i8")
DIRECTIONS = {1: "fwd", 2: "bwd", 4: "wrw"}
DIRECTION_CODES = {d: c for c, d in DIRECTIONS.items()}
DEFAULT_DIRECTIONS = ("fwd", "bwd", "wrw")
DEFAULT_LAYOUTS = ("NHWC", "NCHW")
LAYOUT_FLAGS = ("-f", "-I", "-O")

SIZE_FLAGS = SizeFlags(  # (flag, field, minimum, default; None = required)
    ("-n", "batchsize", 1, None),
    ("-c", "in_channels", 1, None),
    ("-H", "in_h", 1, None),
    ("-W", "in_w", 1, None),
    ("-k", "out_channels", 1, None),
    ("-y", "fil_h", 1, None),
    ("-x", "fil_w", 1, None),
    ("-p", "pad_h", 0, 0),
    ("-q", "pad_w", 0, 0),
    ("-u", "conv_stride_h", 1, 1),
    ("-v", "conv_stride_w", 1, 1),
    ("-l", "dilation_h", 1, 1),
    ("-j", "dilation_w", 1, 1),
    ("-g", "group_size", 1, 1),
)
FLAGS = frozenset(["-F", *LAYOUT_FLAGS, *SIZE_FLAGS.flags, "-m", "-t"])

# Names --data-type accepts: rocMLIR names and the MIOpen prefixes themselves.
_TYPE_OPTIONS = {**{t: t for t in DATA_TYPES}, **PREFIX_TYPES}
_DIRECTION_OPTIONS = {
    **{d: d for d in DIRECTION_CODES},
    **{str(c): d for c, d in DIRECTIONS.items()},
}


@dataclass(frozen=True, slots=True, kw_only=True)
class ConvProblem(Columns):
    """One 2-D convolution, field names = conv_config columns."""

    op: ClassVar[str] = "conv"

    data_type: str
    in_data_type: str
    fil_data_type: str
    out_data_type: str
    direction: str
    fil_layout: str
    in_layout: str
    out_layout: str
    spatial_dim: int = 2
    in_channels: int
    in_h: int
    in_w: int
    fil_h: int
    fil_w: int
    out_channels: int
    batchsize: int
    pad_h: int
    pad_w: int
    conv_stride_h: int
    conv_stride_w: int
    dilation_h: int
    dilation_w: int
    group_size: int
    kernel_repeats: int = 1

    def __post_init__(self) -> None:
        types = (self.in_data_type, self.fil_data_type, self.out_data_type)
        if TYPE_TRIPLES.get(self.data_type) != types:
            check_name("data_type", self.data_type, DATA_TYPES)
            raise InputError(f"data types {types} do not match {self.data_type!r}")
        if self.direction not in DIRECTION_CODES:
            raise InputError(f"-F: unknown direction {self.direction!r}")
        error = _layouts_error(self.fil_layout, self.in_layout, self.out_layout)
        if error:
            raise InputError(error)
        if self.spatial_dim != 2:
            raise InputError(f"only 2-D convolutions are supported, got {self.spatial_dim}-D")
        SIZE_FLAGS.check(self)
        check_minimum("kernel_repeats", self.kernel_repeats, 1)
        check_shape(self)

    def out_size(self) -> tuple[int, int]:
        """Output height and width, as perfRunner computes them."""
        return out_size(self)

    def canonical(self) -> str:
        """The test vector exactly as perfRunner's ConvConfiguration.to_command_line prints it."""
        return (
            f"{TYPE_PREFIXES[self.data_type]} -F {DIRECTION_CODES[self.direction]} "
            f"-f {self.fil_layout} -I {self.in_layout} -O {self.out_layout} "
            f"-n {self.batchsize} -c {self.in_channels} -H {self.in_h} -W {self.in_w} "
            f"-k {self.out_channels} -y {self.fil_h} -x {self.fil_w} "
            f"-p {self.pad_h} -q {self.pad_w} -u {self.conv_stride_h} -v {self.conv_stride_w} "
            f"-l {self.dilation_h} -j {self.dilation_w} -m conv -g {self.group_size} -t 1"
        )

    def flops(self) -> int:
        """2*N*(C/G)*K*Ho*Wo*Y*X; the same count for fwd, bwd and wrw."""
        out_h, out_w = self.out_size()
        per_group_c = self.in_channels // self.group_size
        return (
            2
            * self.batchsize
            * per_group_c
            * self.out_channels
            * out_h
            * out_w
            * self.fil_h
            * self.fil_w
        )


def check_shape(p) -> None:
    """Groups divide both channel counts and the output is not empty: one rule for conv and for
    conv_gemm's first convolution (any object with the conv size fields)."""
    g = p.group_size
    if p.in_channels % g or p.out_channels % g:
        raise InputError(
            f"-g: -c {p.in_channels} and -k {p.out_channels} must both "
            f"be divisible by the group count {g}"
        )
    out_h, out_w = out_size(p)
    if out_h < 1 or out_w < 1:
        raise InputError(
            f"output size {out_h}x{out_w} is empty: the filter does not fit the padded input"
        )


def out_size(p) -> tuple[int, int]:
    """Output height and width of a 2-D convolution, as perfRunner computes them."""
    return (
        _out_len(p.in_h, p.fil_h, p.pad_h, p.conv_stride_h, p.dilation_h),
        _out_len(p.in_w, p.fil_w, p.pad_w, p.conv_stride_w, p.dilation_w),
    )


def _out_len(size: int, fil: int, pad: int, stride: int, dilation: int) -> int:
    return (size + 2 * pad - (fil - 1) * dilation - 1) // stride + 1


def _types(data_type: str) -> tuple[str, str, str]:
    """(input, filter, output) types of a rocMLIR conv data type."""
    in_type, _, fil_type = data_type.partition("_")
    return in_type, fil_type or in_type, OUT_TYPES.get(data_type, data_type)


#: (input, filter, output) types of each conv data type (fusion.py reads them too).
TYPE_TRIPLES = {t: _types(t) for t in DATA_TYPES}


@lru_cache(maxsize=1024)
def layout_error(layout: str) -> str | None:
    """Why a layout string is not one perfRunner can map, or None. Cached: files repeat them."""
    letters = set(layout)
    if len(letters) != len(layout) or not letters <= set("NCHWG01"):
        return "expected each of N, C, G (optional) and H, W or 0, 1 once"
    spatial = letters & set("HW01")
    if not {"N", "C"} <= letters or spatial not in ({"H", "W"}, {"0", "1"}):
        return "expected N, C and the spatial dims H, W or 0, 1"
    return None


@lru_cache(maxsize=1024)
def _layouts_error(*layouts: str) -> str | None:
    """The message for the first bad one of (filter, input, output) layouts, or None."""
    for flag, layout in zip(LAYOUT_FLAGS, layouts, strict=True):
        error = layout_error(layout)
        if error:
            return f"{flag}: bad layout {layout!r}: {error}"
    return None


def _split(line: str) -> tuple[str | None, dict[str, str]]:
    """The data-type prefix (None when the line starts with a flag) and the flag values."""
    tokens = line.split()
    if not tokens:
        raise InputError("empty conv line")
    prefix = None
    if not tokens[0].startswith("-"):
        prefix, tokens = tokens[0], tokens[1:]
        if prefix not in PREFIX_TYPES:
            raise InputError(
                f"unknown data type prefix {prefix!r} (known: {', '.join(PREFIX_TYPES)})"
            )
    flags = flag_values(tokens, "conv", FLAGS)
    if flags.get("-m", "conv") != "conv":
        raise InputError(f"-m: only 'conv' is supported, got {flags['-m']!r}")
    if flags.get("-t", "1") not in ("0", "1"):  # MIOpenDriver's timing switch, not a data type
        raise InputError(
            f"-t: expected 0 or 1 (MIOpenDriver's timing flag; the data type is the prefix, "
            f"e.g. convfp16), got {flags['-t']!r}"
        )
    return prefix, flags


def _direction(flags: dict[str, str]) -> str:
    code = int_value("-F", flags["-F"])
    if code not in DIRECTIONS:
        raise InputError(f"-F: expected 1 (fwd), 2 (bwd) or 4 (wrw), got {flags['-F']!r}")
    return DIRECTIONS[code]


def _make(
    data_type: str, direction: str, layouts: tuple[str, ...], sizes: dict[str, int]
) -> ConvProblem:
    in_type, fil_type, out_type = TYPE_TRIPLES[data_type]
    fil_layout, in_layout, out_layout = layouts
    return ConvProblem(
        data_type=data_type,
        in_data_type=in_type,
        fil_data_type=fil_type,
        out_data_type=out_type,
        direction=direction,
        fil_layout=fil_layout,
        in_layout=in_layout,
        out_layout=out_layout,
        **sizes,
    )


def parse(line: str) -> ConvProblem:
    """One conv line as written; no prefix means f32."""
    prefix, flags = _split(line)
    for flag in ("-F", *LAYOUT_FLAGS):
        if flag not in flags:
            raise InputError(f"missing required flag {flag}")
    layouts = tuple(flags[f].upper() for f in LAYOUT_FLAGS)
    return _make(
        PREFIX_TYPES[prefix or "conv"], _direction(flags), layouts, SIZE_FLAGS.parse(flags)
    )


@lru_cache(maxsize=64)
def _resolved(options: ExpandOptions) -> tuple[tuple[str, ...], tuple[str, ...], tuple[str, ...]]:
    types = option_values("conv data type", options.data_types, _TYPE_OPTIONS, DEFAULT_TYPES)
    directions = option_values(
        "direction", options.directions, _DIRECTION_OPTIONS, DEFAULT_DIRECTIONS
    )
    layouts = tuple(dict.fromkeys(x.upper() for x in options.layouts or DEFAULT_LAYOUTS))
    for layout in layouts:
        if layout_error(layout):
            raise UserError(f"bad layout {layout!r}: {layout_error(layout)}")
    return types, directions, layouts


def check_options(options: ExpandOptions) -> None:
    _resolved(options)


def expand_problems(line: str, options: ExpandOptions) -> list[ConvProblem]:
    """perfRunner's get_conv_configurations for one line, as problems."""
    if not options.expand:
        return [parse(line)]
    all_types, all_directions, all_layouts = _resolved(options)
    prefix, flags = _split(line)
    types = (PREFIX_TYPES[prefix],) if prefix else all_types
    directions = (_direction(flags),) if "-F" in flags else all_directions
    given = tuple(flags[f].upper() if f in flags else None for f in LAYOUT_FLAGS)
    layouts = all_layouts if None in given else (None,)
    sizes = SIZE_FLAGS.parse(flags)
    both_given = prefix is not None and "-F" in flags
    # A layout left out is filled from each of the options' layouts (then fill is never None).
    filled = [
        cast("tuple[str, ...]", tuple(fill if x is None else x for x in given)) for fill in layouts
    ]
    return [
        _make(data_type, direction, layout, sizes)
        for direction in directions
        for data_type in types
        if direction == "fwd" or data_type not in FORWARD_ONLY or both_given
        for layout in filled
    ]


def expand(line: str, options: ExpandOptions) -> list[str]:
    return [p.canonical() for p in expand_problems(line, options)]


PROBLEM = ConvProblem


def _sniff(words: Sequence[str]) -> bool:
    """A conv line starts with its prefix (`conv…`); a vector written without one still has
    -c (in channels) or -F (direction), which no gemm or attention line has."""
    return (bool(words) and words[0].startswith("conv")) or "-c" in words or "-F" in words


SPEC = OpSpec(
    name="conv",
    problem=ConvProblem,
    table="conv_config",
    flags=FLAGS,
    sniff=_sniff,
    sniff_rank=2,  # after conv_gemm (which has -c too)
    debug=dbg.Layout(
        lead=(dbg.Column("Direction", "direction"), dbg.Column("DataType", "data_type")),
        rest=(
            dbg.FILTER_LAYOUT,
            dbg.INPUT_LAYOUT,
            dbg.OUTPUT_LAYOUT,
            *dbg.CONV_SIZES,
            *dbg.CONV_WINDOW,
        ),
        lds_bank_conflict=True,
    ),
)
