"""A small reader of MIGraphX-dialect MLIR modules (rocMLIR's `mlir/test/fusion` tests).

Reads what a fusion test holds, line by line: the `// RUN:` lines (for `-fut NAME`), the
`func.func` signatures and the `migraphx.*` ops of the function under test, in the three
spellings rocMLIR's tests use:

    %1 = migraphx.convolution(%a, %b) {attrs} : (tensor<…>, tensor<…>) -> tensor<…>
    %0 = "migraphx.dot"(%a, %b) {} : (tensor<…>, tensor<…>) -> tensor<…>
    %0 = migraphx.dot %a, %b : <1x7x3xf32, 21x3x1>, <…> -> <…>      (!migraphx.shaped types)

Only the ops in READABLE are accepted; anything else in the function (a TOSA op, an op this
reader does not know) is an InputError at its line naming the op. Used by fusion import (to
derive the tuning key) and by the CPU fusion tuner (to execute the module in NumPy).
"""

from __future__ import annotations

import re
from dataclasses import dataclass, field
from typing import Any

from mlirtuna.errors import InputError
from mlirtuna.textinput import is_ascii_float, is_ascii_int, quote

ANCHORS = frozenset({"convolution", "quant_convolution", "dot", "quant_dot"})
ELEMENTWISE_BINARY = frozenset({"add", "sub", "mul", "div", "pow", "max", "min"})
ELEMENTWISE_UNARY = frozenset(
    {"relu", "sigmoid", "tanh", "exp", "erf", "neg", "abs", "sqrt", "rsqrt", "log", "recip"}
)
LAYOUT = frozenset({"transpose", "reshape"})
BROADCAST = frozenset({"multibroadcast", "broadcast"})
CONVERSIONS = frozenset({"convert", "quantizelinear", "dequantizelinear"})
READABLE = ANCHORS | ELEMENTWISE_BINARY | ELEMENTWISE_UNARY | LAYOUT | BROADCAST | CONVERSIONS
READABLE = READABLE | {"clip"}

DTYPES = ("f32", "f16", "bf16", "i8", "i32", "si8", "ui8", "si32", "f64", "i64")


@dataclass(frozen=True)
class TensorType:
    shape: tuple[int, ...]
    dtype: str  # f32 f16 bf16 i8 i32 … (si8/ui8 spelled as i8 / u8 kept)

    def text(self) -> str:
        return "x".join([*map(str, self.shape), self.dtype])


@dataclass(frozen=True)
class Op:
    """One `migraphx.NAME` op: operands and result are SSA names (`%1`), `line` 1-based."""

    name: str
    result: str
    operands: tuple[str, ...]
    attrs: dict[str, Any]
    type: TensorType
    line: int


@dataclass
class Function:
    name: str
    args: list[tuple[str, TensorType]]
    ops: list[Op] = field(default_factory=list)
    returns: list[str] = field(default_factory=list)
    line: int = 0

    def types(self) -> dict[str, TensorType]:
        """Every SSA value's type."""
        known = dict(self.args)
        known.update((op.result, op.type) for op in self.ops)
        return known


@dataclass
class Module:
    path: str
    functions: list[Function]
    run_lines: list[str]

    def function_under_test(self) -> str:
        """`-fut NAME` of the first RUN line that has one, else the first func.func."""
        for run in self.run_lines:
            match = _FUT.search(run)
            if match:
                return self._not_an_option(match.group(1).lstrip("@"))
        if not self.functions:
            raise InputError(f"{self.path}: no func.func in the module")
        return self._not_an_option(self.functions[0].name)

    def _not_an_option(self, name: str) -> str:
        """The name goes to rocmlir-gen as `-fut NAME`: one starting with '-' would be taken
        as an option of its own (`-o`: an output file)."""
        if name.startswith("-"):
            raise InputError(
                f"{self.path}: function name {quote(name)} starts with '-' (it would reach "
                "rocmlir-gen as an option); rename the function"
            )
        return name

    def function(self, name: str) -> Function:
        for fn in self.functions:
            if fn.name == name:
                return fn
        raise InputError(f"{self.path}: no func.func @{name} (named by -fut in a RUN line)")


_FUT = re.compile(r"(?:^|\s)--?fut[= ]\s*(@?[\w.$-]+)")
_FUNC = re.compile(r"^\s*func\.func\s+(?:(?:private|public|nested)\s+)?@([\w.$-]+)\s*\((.*?)\)")
_ARG = re.compile(r"(%[\w.$-]+)\s*:\s*((?:tensor|!migraphx\.shaped)<[^>]*>)")
_TYPE = re.compile(r"(?:tensor|!migraphx\.shaped)?<([^<>]*)>")
_OP = re.compile(r'^\s*(%[\w.$-]+)\s*=\s*"?migraphx\.(\w+)"?\s*(.*)$')
_OTHER_OP = re.compile(r'^\s*(?:%[\w.$-]+(?::\d+)?\s*=\s*)?"?([a-z_]+\.[\w.]+)"?')
_RETURN = re.compile(r"^\s*(?:func\.)?return\b(.*)$")
_TYPE_SUFFIX = re.compile(r"\s*:\s*[a-z]+\d*\b")
_DIM = re.compile(r"[0-9]{1,10}\Z")


def parse_type(text: str, where: str = "") -> TensorType:
    """`tensor<1x128x1x1xf32>`, `!migraphx.shaped<1x7x3xf32, 21x3x1>` or `<…>`."""
    match = _TYPE.search(text)
    if match is None:
        raise InputError(f"cannot read the type {text.strip()!r}{where}")
    dims = match.group(1).split(",")[0].strip().split("x")
    dtype = dims[-1].strip()
    if not all(_DIM.match(d.strip()) for d in dims[:-1]):  # int() takes `1_0`, fullwidth digits
        raise InputError(f"dynamic or unreadable shape {quote(match.group(0))}{where}")
    shape = tuple(int(d) for d in dims[:-1])
    dtype = {"si8": "i8", "si32": "i32"}.get(dtype, dtype)
    if dtype not in DTYPES:
        raise InputError(f"unknown element type {dtype!r} in {match.group(0)!r}{where}")
    return TensorType(shape, dtype)


def parse_attrs(text: str) -> dict[str, Any]:
    """`{dilation = [1, 1], group = 1 : i64, out_lens= [1:i64, 5:i64]}` -> Python values."""
    body = text.strip()
    if not body.startswith("{"):
        return {}
    end = body.find("}")
    if end < 0:
        raise InputError(f"attributes {quote(body)} have no closing `}}`")
    body = body[1:end]
    attrs: dict[str, Any] = {}
    for key, value in re.findall(r"(\w+)\s*=\s*(\[[^\]]*\]|[^,]+)", body):
        value = _TYPE_SUFFIX.sub("", value).strip()
        if value.startswith("["):
            attrs[key] = [_scalar(v) for v in value[1:-1].split(",") if v.strip()]
        else:
            attrs[key] = _scalar(value)
    return attrs


def _scalar(text: str) -> Any:
    text = _TYPE_SUFFIX.sub("", text).strip()
    if is_ascii_int(text):  # ASCII only: int() and float() take `1_0` and fullwidth digits
        return int(text)
    if is_ascii_float(text):
        return float(text)
    return text.strip('"')


def read_module(text: str, path: str) -> Module:
    """The module's RUN lines, functions and their ops; InputError `path:LINE: …` on what it
    cannot read."""
    module = Module(path, [], [])
    current: Function | None = None
    for lineno, line in enumerate(text.splitlines(), 1):
        stripped = line.strip()
        if stripped.startswith("//"):
            if stripped[2:].lstrip().startswith("RUN:"):
                module.run_lines.append(stripped)
            continue
        if not stripped:
            continue
        try:
            current = _read_line(module, current, line, lineno)
        except InputError as exc:
            if exc.path is not None:
                raise
            raise exc.at(path, lineno) from None
    return module


def _read_line(module: Module, current: Function | None, line: str, lineno: int):
    fn = _FUNC.match(line)
    if fn:
        args = [(name, parse_type(t)) for name, t in _ARG.findall(fn.group(2))]
        current = Function(fn.group(1), args, line=lineno)
        module.functions.append(current)
        return current
    if current is None:
        return None
    ret = _RETURN.match(line)
    if ret:
        values = ret.group(1).split(":")[0]
        current.returns = re.findall(r"%[\w.$-]+", values)
        return None
    op = _OP.match(line)
    if op:
        current.ops.append(_read_op(op.group(1), op.group(2), op.group(3), lineno))
        return current
    other = _OTHER_OP.match(line)
    if other and other.group(1) not in ("func.func", "module"):
        raise InputError(f"op {other.group(1)} is not one mlirtuna reads (MIGraphX ops only)")
    return current


def _read_op(result: str, name: str, rest: str, lineno: int) -> Op:
    if name not in READABLE:
        raise InputError(
            f"op migraphx.{name} is not one mlirtuna reads (known: {', '.join(sorted(READABLE))})"
        )
    # Operands: `(%a, %b)` or `%a, %b` up to the attributes / type signature.
    head = rest.split("{", 1)[0].split(":", 1)[0]
    operands = tuple(re.findall(r"%[\w.$-]+", head))
    attrs = parse_attrs(rest[rest.index("{") :]) if "{" in rest.split(":", 1)[0] else {}
    if "->" not in rest:
        raise InputError(f"migraphx.{name}: expected `: (operand types) -> result type`")
    result_type = parse_type(rest.rsplit("->", 1)[1])
    return Op(name, result, operands, attrs, result_type, lineno)
