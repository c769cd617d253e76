"""Fusion problems (`--op fusion`): one MIGraphX module, tuned as one kernel.

A fusion problem is the module itself (its text, sha256, file name and function under test) plus
its tuning key: the conv or gemm canonical string rocMLIR's tuning DB stores its winner under
(reference rocmlir-newest §6). perfRunner parses the key rocmlir-gen emits with its conv or gemm
configuration class and looks it up by `to_command_line()`; we store exactly that: the key read
by mlirtuna's own conv / gemm parser and printed canonically, so a fusion winner and a plain
problem's winner for the same kernel share one test vector.

- Identity (`canonical()`): `sha256:<hex>` of the module text, so importing a module twice,
  under any file name, gives one problem.
- Keys from rocmlir-gen (`--emit-tuning-key`): `arch\\tnumCU\\tnumChiplets\\tPROBLEM`, older
  builds `arch\\tnumCU\\tPROBLEM` (E2's reader took field [2], the newest [3]): PROBLEM is the
  last field either way. `-inputFusions=…`/`-outputFusions=…` and `-supportsSplitK B` are
  stripped, as perfRunner does.
- Keys derived here without a build (derive_key): `migraphx.convolution` (NCHW activations,
  KCYX filter; rocMLIR folds the transposes, giving the layouts `-f GNC01 -I NGC01 -O NGC01` its
  keys show), `migraphx.dot` (batch = product of the leading dims; transA/transB when a
  `migraphx.transpose` of the last two dims feeds the operand).
"""

from __future__ import annotations

import hashlib
import math
from dataclasses import dataclass
from typing import Any, ClassVar

import mlirtuna.problems.conv as conv
import mlirtuna.problems.gemm as gemm
import mlirtuna.problems.gemm_gemm as gemm_gemm
from mlirtuna import keys
from mlirtuna.errors import InputError, UserError
from mlirtuna.problems.flags import Columns, ExpandOptions
from mlirtuna.problems.migraphx import Function, Module, Op, read_module
from mlirtuna.problems.spec import OpSpec, op_of

KEY_OPS = ("conv", "gemm", "gemm_gemm")
CONV_TYPES = {"f32": "f32", "f16": "f16", "bf16": "bf16", "i8": "i8"}
MIGRAPHX_LAYOUTS = ("GNC01", "NGC01", "NGC01")  # filter, input, output as rocMLIR keys them


@dataclass(frozen=True, slots=True, kw_only=True)
class FusionProblem(Columns):
    """One fusion module, field names = fusion_config columns."""

    op: ClassVar[str] = "fusion"

    file_name: str
    function: str
    sha256: str
    tuning_key: str
    key_op: str
    key_source: str
    module_text: str

    def __post_init__(self) -> None:
        if self.key_op not in KEY_OPS:
            raise InputError(f"fusion key op {self.key_op!r} is not one of {', '.join(KEY_OPS)}")

    def canonical(self) -> str:
        return f"sha256:{self.sha256}"

    def label(self) -> str:
        """How people see it: file, function and key."""
        return f"{self.file_name} @{self.function}: {self.tuning_key}"

    def key_problem(self) -> Any:
        return _KEY_MODULES[self.key_op].parse(self.tuning_key)

    def flops(self) -> int:
        """The anchor's flops (what rocMLIR's TFlops counts for the fused kernel)."""
        return self.key_problem().flops()

    def module(self) -> Module:
        return read_module(self.module_text, self.file_name)


_KEY_MODULES = {"conv": conv, "gemm": gemm, "gemm_gemm": gemm_gemm}


def sha256_text(text: str) -> str:
    return hashlib.sha256(text.encode("utf-8")).hexdigest()


def from_module(
    text: str, file_name: str, emitted_key: str | None = None, path: str | None = None
) -> FusionProblem:
    """A fusion problem from a module's text; the key from rocmlir-gen's output when given,
    else derived from the MIGraphX ops. InputError `path:LINE: …` for what cannot be read."""
    where = path or file_name
    module = read_module(text, where)
    function = module.function_under_test()
    fn = module.function(function)
    if emitted_key is not None:
        key_op, key = parse_key(emitted_key)
        source = "rocmlir-gen"
    else:
        key_op, key = derive_key(fn, where)
        source = "migraphx"
    return FusionProblem(
        file_name=file_name,
        function=function,
        sha256=sha256_text(text),
        tuning_key=key,
        key_op=key_op,
        key_source=source,
        module_text=text,
    )


# --- keys from rocmlir-gen ----------------------------------------------------------------------


def parse_key(emitted: str) -> tuple[str, str]:
    """(key op, canonical key) from `rocmlir-gen --emit-tuning-key` output (either layout)."""
    lines = [line for line in emitted.splitlines() if line.strip()]
    if not lines:
        raise InputError("rocmlir-gen --emit-tuning-key printed nothing")
    problem = lines[-1].split("\t")[-1].strip()
    tokens = _strip_key_extras(problem.split())
    if not tokens:
        raise InputError(f"empty tuning key in {emitted.strip()!r}")
    op = op_of((conv.SPEC, gemm.SPEC, gemm_gemm.SPEC), tokens)  # KEY_OPS, by the one rule
    if op == "conv":
        return "conv", conv.parse(" ".join(tokens)).canonical()
    if op == "gemm_gemm":
        return "gemm_gemm", gemm_gemm.parse(" ".join(tokens)).canonical()
    key = gemm.parse(" ".join(tokens)).canonical()  # gemm, or gemm's parser says what is wrong
    # The key as rocmlir-gen spelled it: a gemm key that gives -transO keeps it (false too),
    # since the tool's rows for the module are keyed by that very string.
    return "gemm", keys.e4_vector("gemm", key) if keys.TRANS_O_FLAG in tokens else key


def _strip_key_extras(tokens: list[str]) -> list[str]:
    out: list[str] = []
    skip = False
    for token in tokens:
        if skip:
            skip = False
            continue
        if token.startswith(("-inputFusions", "-outputFusions")):
            skip = "=" not in token
            continue
        if token == "-supportsSplitK":
            skip = True
            continue
        out.append(token)
    return out


# --- keys derived from the MIGraphX ops ---------------------------------------------------------


def anchor(fn: Function, where: str) -> Op:
    """The one convolution or dot of the function (the op the fused kernel is tuned for)."""
    found = [
        op for op in fn.ops if op.name in ("convolution", "quant_convolution", "dot", "quant_dot")
    ]
    if not found:
        raise InputError(
            f"@{fn.name} has no migraphx.convolution or migraphx.dot: nothing to tune",
            where,
            fn.line,
        )
    if len(found) > 1:
        raise InputError(
            f"@{fn.name} has {len(found)} convolution/dot ops: mlirtuna tunes single-anchor "
            "fusions only",
            where,
            found[1].line,
        )
    return found[0]


def derive_key(fn: Function, where: str) -> tuple[str, str]:
    """(key op, canonical key) worked out from the anchor's operand types and attributes."""
    op = anchor(fn, where)
    try:
        if op.name.endswith("convolution"):
            return "conv", conv_key(fn, op).canonical()
        return "gemm", dot_key(fn, op).canonical()
    except InputError as exc:
        raise exc.at(where, op.line) from None
    except (ValueError, TypeError, KeyError, IndexError) as exc:  # an attribute of a wrong kind
        raise InputError(
            f"migraphx.{op.name}: cannot read its operands or attributes "
            f"({type(exc).__name__}: {str(exc)[:80]})",
            where,
            op.line,
        ) from None


def _pair(op: Op, name: str, default: int) -> tuple[int, int]:
    value = op.attrs.get(name, [default, default])
    if not isinstance(value, list) or len(value) != 2:
        raise InputError(f"migraphx.{op.name}: expected 2 values for {name}, got {value!r}")
    return _int(op, name, value[0]), _int(op, name, value[1])


def _int(op: Op, name: str, value: object) -> int:
    """An attribute's integer as the module wrote it in ASCII digits (the reader leaves
    anything else a string: fullwidth digits, `1_0`, a word)."""
    if isinstance(value, bool) or not isinstance(value, int):
        raise InputError(f"migraphx.{op.name}: {name} {ascii(value)[:40]} is not an integer")
    return value


def conv_key(fn: Function, op: Op) -> conv.ConvProblem:
    types = fn.types()
    x, w = (types[v] for v in op.operands[:2])
    if len(x.shape) != 4 or len(w.shape) != 4:
        raise InputError(f"migraphx.{op.name}: only 2-D convolutions are read")
    n, c, h, wd = x.shape
    k, _, y, xs = w.shape
    pad = op.attrs.get("padding", [0, 0, 0, 0])
    if len(pad) == 4:
        if (pad[0], pad[1]) != (pad[2], pad[3]):
            raise InputError(f"migraphx.{op.name}: asymmetric padding {pad} has no key form")
        pad = pad[:2]
    if len(pad) != 2:
        raise InputError(f"migraphx.{op.name}: cannot read padding {pad!r}")
    pad = [_int(op, "padding", p) for p in pad]
    if _int(op, "padding_mode", op.attrs.get("padding_mode", 0)) != 0:
        raise InputError(f"migraphx.{op.name}: padding_mode {op.attrs['padding_mode']} is not read")
    data_type = CONV_TYPES.get(x.dtype)
    if data_type is None:
        raise InputError(f"migraphx.{op.name}: data type {x.dtype} has no conv key")
    in_t, fil_t, out_t = conv.TYPE_TRIPLES[data_type]
    sh, sw = _pair(op, "stride", 1)
    dh, dw = _pair(op, "dilation", 1)
    fil, inp, out = MIGRAPHX_LAYOUTS
    return conv.ConvProblem(
        data_type=data_type,
        in_data_type=in_t,
        fil_data_type=fil_t,
        out_data_type=out_t,
        direction="fwd",
        fil_layout=fil,
        in_layout=inp,
        out_layout=out,
        in_channels=c,
        in_h=h,
        in_w=wd,
        fil_h=y,
        fil_w=xs,
        out_channels=k,
        batchsize=n,
        pad_h=pad[0],
        pad_w=pad[1],
        conv_stride_h=sh,
        conv_stride_w=sw,
        dilation_h=dh,
        dilation_w=dw,
        group_size=_int(op, "group", op.attrs.get("group", 1)),
    )


def swaps_last_two(op: Op | None) -> bool:
    """A migraphx.transpose whose permutation swaps the last two dims (and nothing else)."""
    if op is None or op.name != "transpose":
        return False
    perm = list(op.attrs.get("permutation", []))
    n = len(perm)
    return n >= 2 and perm == [*range(n - 2), n - 1, n - 2]


def dot_key(fn: Function, op: Op) -> gemm.GemmProblem:
    types = fn.types()
    producers = {o.result: o for o in fn.ops}
    a, b = (types[v] for v in op.operands[:2])
    out = op.type
    if len(a.shape) < 2 or len(b.shape) < 2:
        raise InputError(f"migraphx.{op.name}: operands need at least 2 dims")
    m, k = a.shape[-2:]
    k2, n = b.shape[-2:]
    if k != k2 or out.shape[-2:] != (m, n):
        raise InputError(
            f"migraphx.{op.name}: shapes {a.text()} x {b.text()} -> {out.text()} do not multiply"
        )
    if a.dtype not in gemm.DATA_TYPES:
        raise InputError(f"migraphx.{op.name}: data type {a.dtype} has no gemm key")
    return gemm.GemmProblem(
        data_type=a.dtype,
        out_data_type=out.dtype,
        trans_a=swaps_last_two(producers.get(op.operands[0])),
        trans_b=swaps_last_two(producers.get(op.operands[1])),
        group_size=math.prod(out.shape[:-2]),
        m=m,
        n=n,
        k=k,
    )


# --- the op-module contract (config lists do not apply to fusion) -------------------------------

_NOT_A_LINE = (
    "fusion problems are .mlir modules, not config lines: `mlirtuna import --op fusion FILE.mlir"
    "|DIR`; a tuning_fusion_<arch>.tsv holds conv/gemm keys (read it with --op conv or gemm)"
)


def parse(line: str) -> FusionProblem:
    raise InputError(_NOT_A_LINE)


def check_options(options: ExpandOptions) -> None:
    """Called before a config list is read: fusion has none, whatever the options."""
    raise UserError(_NOT_A_LINE)


def expand_problems(line: str, options: ExpandOptions) -> list[FusionProblem]:
    raise InputError(_NOT_A_LINE)


def expand(line: str, options: ExpandOptions) -> list[str]:
    raise InputError(_NOT_A_LINE)


PROBLEM = FusionProblem


SPEC = OpSpec(
    name="fusion",
    problem=FusionProblem,
    table="fusion_config",
    flags=frozenset(),
    sniff=None,  # a module, not a config line (`run --op auto` takes .mlir files and folders)
    sniff_rank=99,
    # The tool tunes a module as its key's conv or gemm and writes that op's .debug rows.
    debug=None,
    config_list=False,
)
