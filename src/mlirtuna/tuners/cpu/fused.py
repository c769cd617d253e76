"""The CPU tuner's fused ops: gemm_gemm, conv_gemm and fusion modules (MIGraphX) in NumPy.

They implement kernels.CpuOp, so CpuTuner drives them like any op (same spaces, the same
verify-then-time harness). Perf configs are `cpu:v1:mPerBlock,nPerBlock,kPerBlock` over the
anchor's implicit GEMM, as for gemm and conv.

- gemm_gemm: O = (A @ B) @ C. Per M block, the first GEMM is computed one N block at a time,
  rounded to the data type (what the fused kernel holds in LDS) and multiplied straight into
  the output block: the M x N intermediate never exists whole.
- conv_gemm: the convolution (implicit GEMM, M = K/G channels, N = pixels) per pixel block and
  K block, multiplied into that pixel block's output rows of the second GEMM.
- fusion: the module's MIGraphX ops. Ops not depending on the convolution/dot (broadcasts of
  a bias, transposes of an operand) are computed once, as the kernel's inputs; the anchor is
  tiled; every op after it (element-wise ops, clip, convert, quantize, transpose, reshape) runs
  on each output tile, reading the other operands at that tile's coordinates, and the tile is
  stored where it lands in the result. The reference runs the same module unfused, every op on
  whole tensors in float64 (int64 for integers).
"""

from __future__ import annotations

import math
from collections.abc import Callable
from typing import Any

import numpy as np

from mlirtuna.errors import InputError, TunerError, Unsupported
from mlirtuna.problems.conv import ConvProblem
from mlirtuna.problems.fusion import anchor
from mlirtuna.problems.migraphx import (
    ANCHORS,
    BROADCAST,
    ELEMENTWISE_BINARY,
    ELEMENTWISE_UNARY,
    Op,
    TensorType,
)
from mlirtuna.tuners.cpu.kernels import (
    GEMM_GRID,
    GEMM_QUICK,
    Blocks,
    ConvOp,
    CpuOp,
    ElemType,
    alloc,
    block_ranges,
    elem_types,
    gemm_tile,
    sum_tiles,
    tile_bytes,
)

_ELEM = {
    "f32": ElemType("f32", np.float32, False, 1e-4),
    "f16": ElemType("f16", np.float16, False, 5e-3),
    "bf16": ElemType("bf16", np.float32, False, 2e-2),
    "i8": ElemType("i8", np.int8, True, 0.0),
    "i32": ElemType("i32", np.int32, True, 0.0),
}


def _held(et: ElemType, x: np.ndarray) -> np.ndarray:
    """Values as a kernel holds them in `et` (f16/bf16 rounding), kept in float32 / int32."""
    if et.is_int:
        return x
    return et.store(x).astype(et.storage, copy=False).astype(np.float32, copy=False)


# --- gemm_gemm --------------------------------------------------------------------------------


class GemmGemmOp(CpuOp):
    """O[g] = (A[g] @ B[g]) @ C[g]; trans flags only change memory order."""

    op = "gemm_gemm"
    prefix = "cpu:v1"
    grid = GEMM_GRID
    quick = GEMM_QUICK

    def __init__(self, p: Any) -> None:
        self.tin, self.tout = elem_types(p.data_type, None)
        self.g, self.m, self.k, self.n, self.o = (
            int(v) for v in (p.group_size, p.m, p.k, p.n, p.gemm_o)
        )
        self.trans = (bool(p.trans_a), bool(p.trans_b), bool(p.trans_c), bool(p.trans_o))
        self.dims = (self.m, self.n, self.k)
        self._out_types, self._out_names = [self.tout], ["O"]

    def mem_bytes(self) -> int:
        g, m, n, k, o = self.g, self.m, self.n, self.k, self.o
        elems = g * (m * k + k * n + n * o + m * o)
        return 20 * elems + 8 * g * m * n + tile_bytes(min(m, 512), min(n, 512), min(k, 1024))

    def setup(self, rng: np.random.Generator) -> None:
        ta, tb, tc, to = self.trans
        d = {"G": self.g, "M": self.m, "N": self.n, "K": self.k, "O": self.o}
        self.a = alloc(self.tin, rng, "GKM" if ta else "GMK", "GMK", d)
        self.b = alloc(self.tin, rng, "GNK" if tb else "GKN", "GKN", d)
        self.c = alloc(self.tin, rng, "GON" if tc else "GNO", "GNO", d)
        self.out = alloc(self.tout, None, "GOM" if to else "GMO", "GMO", d)
        self.outputs = [self.out]
        f64 = np.float64
        first = np.matmul(self.a.astype(f64), self.b.astype(f64))
        self._refs = [np.matmul(first, self.c.astype(f64))]

    def run_blocked(self, blocks: Blocks) -> None:
        mb, nb, kb = blocks
        for a, b, c, out in zip(self.a, self.b, self.c, self.out, strict=True):
            for m0, m1 in block_ranges(0, self.m, mb):
                acc = np.zeros((m1 - m0, self.o), self.acc)
                for n0, n1 in block_ranges(0, self.n, nb):
                    s = _held(self.tin, gemm_tile(a, b, kb, self.acc, m0, m1, n0, n1))
                    acc += s @ c[n0:n1].astype(self.acc, copy=False)
                out[m0:m1] = self.tout.store(acc)

    def notes(self) -> list[str]:
        return [*super().notes(), "gemm_gemm: the first GEMM is held in the data type per tile"]


# --- conv_gemm --------------------------------------------------------------------------------


class ConvGemmOp(CpuOp):
    """out[p, o] = sum_k conv(x, w)[p, k] * C[k, o], p = (n, ho, wo) over all K channels."""

    op = "conv_gemm"
    prefix = "cpu:v1"
    grid = GEMM_GRID
    quick = GEMM_QUICK

    def __init__(self, p: Any) -> None:
        self.conv = ConvOp(
            ConvProblem(
                data_type=p.data_type,
                in_data_type=p.data_type,
                fil_data_type=p.data_type,
                out_data_type=p.data_type,
                direction="fwd",
                fil_layout=p.fil_layout,
                in_layout=p.in_layout,
                out_layout=p.in_layout,
                **{
                    name: getattr(p, name)
                    for name in [
                        "in_channels",
                        "in_h",
                        "in_w",
                        "fil_h",
                        "fil_w",
                        "out_channels",
                        "batchsize",
                        "pad_h",
                        "pad_w",
                        "conv_stride_h",
                        "conv_stride_w",
                        "dilation_h",
                        "dilation_w",
                        "group_size",
                    ]
                },
            )
        )
        self.tin, self.tout = self.conv.tin, self.conv.tout
        self.o = int(p.gemm_o)
        self.trans = (bool(p.trans_c), bool(p.trans_o))
        self.dims = self.conv.dims  # (K/G, pixels, C/G*Y*X)
        self._out_types, self._out_names = [self.tout], ["O"]

    def mem_bytes(self) -> int:
        conv = self.conv
        return conv.mem_bytes() + 20 * (conv.k * self.o + conv.p * self.o)

    def setup(self, rng: np.random.Generator) -> None:
        conv = self.conv
        conv.setup(rng)
        tc, to = self.trans
        d = {"K": conv.k, "O": self.o, "P": conv.p}
        self.c = alloc(self.tin, rng, "OK" if tc else "KO", "KO", d)
        self.out = alloc(self.tout, None, "OP" if to else "PO", "PO", d)
        self.outputs = [self.out]
        y = conv._refs[0]  # (N, G, K/G, Ho, Wo) float64
        y = y.transpose(0, 3, 4, 1, 2).reshape(conv.p, conv.k)
        self._refs = [y @ self.c.astype(np.float64)]

    def run_blocked(self, blocks: Blocks) -> None:
        conv = self.conv
        mb, nb, kb = blocks
        xp = conv._padded()
        wm = np.ascontiguousarray(conv.fil, dtype=self.acc).reshape(conv.g, conv.kg, conv.cyx)
        for p0, p1 in block_ranges(0, conv.p, nb):
            cols = conv.col_off[p0:p1]
            acc = np.zeros((p1 - p0, self.o), self.acc)
            for g in range(conv.g):
                for m0, m1 in block_ranges(0, conv.kg, mb):
                    tile = sum_tiles(
                        wm[g, m0:m1, k0:k1]
                        @ xp[g][conv.row_off[k0:k1, None] + cols].astype(self.acc, copy=False)
                        for k0, k1 in block_ranges(0, conv.cyx, kb)
                    )
                    ch = g * conv.kg
                    acc += _held(self.tin, tile).T @ self.c[ch + m0 : ch + m1].astype(self.acc)
            self.out[p0:p1] = self.tout.store(acc)


# --- fusion modules ---------------------------------------------------------------------------

_ERF = np.frompyfunc(math.erf, 1, 1)


def _erf(x: np.ndarray) -> np.ndarray:
    """NumPy has no erf: math.erf vectorised (an object array), cast back to x's type."""
    return np.asarray(_ERF(x)).astype(x.dtype)


_UNARY: dict[str, Callable[[np.ndarray], np.ndarray]] = {
    "relu": lambda x: np.maximum(x, 0),
    "sigmoid": lambda x: 1 / (1 + np.exp(-x)),
    "tanh": np.tanh,
    "exp": np.exp,
    "erf": _erf,
    "neg": np.negative,
    "abs": np.abs,
    "sqrt": np.sqrt,
    "rsqrt": lambda x: 1 / np.sqrt(x),
    "log": np.log,
    "recip": lambda x: 1 / x,
}


def _divide(x: np.ndarray, y: np.ndarray) -> np.ndarray:
    if np.issubdtype(x.dtype, np.integer) and np.issubdtype(np.asarray(y).dtype, np.integer):
        return np.trunc(x / y).astype(np.result_type(x, y))
    return x / y


_BINARY: dict[str, Callable[[np.ndarray, np.ndarray], np.ndarray]] = {
    "add": np.add,
    "sub": np.subtract,
    "mul": np.multiply,
    "div": _divide,
    "pow": np.power,
    "max": np.maximum,
    "min": np.minimum,
}


def _elementwise(op: Op, args: list[np.ndarray]) -> np.ndarray:
    """One element-wise op on same-shaped arrays (a tile or whole tensors alike)."""
    if op.name in ELEMENTWISE_UNARY:
        return _UNARY[op.name](args[0])
    if op.name in ELEMENTWISE_BINARY:
        return _BINARY[op.name](args[0], args[1])
    if op.name == "clip":
        return np.minimum(np.maximum(args[0], args[1]), args[2])
    if op.name == "quantizelinear":
        zero = args[2] if len(args) > 2 else 0
        lo, hi = (-128, 127) if op.type.dtype == "i8" else (-(2**31), 2**31 - 1)
        return np.clip(np.round(args[0] / args[1]) + zero, lo, hi)
    if op.name == "dequantizelinear":
        zero = args[2] if len(args) > 2 else 0
        return (args[0] - zero) * args[1]
    if op.name == "convert":
        return _convert(args[0], op.type.dtype)
    raise TunerError(f"cpu tuner cannot run migraphx.{op.name} (line {op.line})")


def _convert(x: np.ndarray, dtype: str) -> np.ndarray:
    et = _ELEM.get(dtype)
    if et is None:
        raise TunerError(f"cpu tuner cannot convert to {dtype}")
    if et.is_int:
        return np.trunc(x).astype(np.int64) if x.dtype.kind == "f" else x
    if x.dtype == np.float64:  # the reference: exact
        return x
    return _held(et, x.astype(np.float32))


def _full_layout(op: Op, x: np.ndarray) -> np.ndarray:
    """transpose / reshape / broadcasts on a whole tensor."""
    if op.name == "transpose":
        return np.transpose(x, op.attrs["permutation"])
    if op.name == "reshape":
        return np.reshape(x, op.type.shape)
    if op.name == "multibroadcast":
        return np.broadcast_to(x, op.type.shape)
    if op.name == "broadcast":  # `axis`: where x's dims start in out_lens
        axis = int(op.attrs.get("axis", 0))
        shape = [1] * len(op.type.shape)
        shape[axis : axis + x.ndim] = x.shape
        return np.broadcast_to(x.reshape(shape), op.type.shape)
    raise TunerError(f"cpu tuner cannot run migraphx.{op.name} (line {op.line})")


def _random(et: ElemType, rng: np.random.Generator, t: TensorType) -> np.ndarray:
    if t.dtype == "i32":
        return rng.integers(-1000, 1001, size=t.shape, dtype=np.int32)
    return et.random(rng, t.shape)


class _Tile:
    """One tile of a value computed from the anchor: its data and its coordinates in the
    value's shape (index arrays, all of the tile's shape)."""

    __slots__ = ("coords", "data", "shape")

    def __init__(self, data: np.ndarray, coords: tuple[np.ndarray, ...], shape: tuple[int, ...]):
        self.data, self.coords, self.shape = data, coords, shape


class FusionOp(CpuOp):
    """A fusion module: see the module docstring."""

    op = "fusion"
    prefix = "cpu:v1"
    grid = GEMM_GRID
    quick = GEMM_QUICK

    def __init__(self, problem: Any) -> None:
        try:
            fn = problem.module().function(problem.function)
            self.anchor = anchor(fn, problem.file_name)
        except InputError as exc:
            raise Unsupported(f"cpu tuner cannot read the module: {exc}") from None
        self.fn, self.name = fn, problem.file_name
        self.types = fn.types()
        unknown = [op for op in fn.ops if op.name not in _RUNNABLE and op is not self.anchor]
        if unknown:
            op = unknown[0]
            raise Unsupported(f"cpu tuner cannot run migraphx.{op.name} ({self.name}:{op.line})")
        if len(fn.returns) != 1:
            raise TunerError(f"cpu tuner runs functions with one result, @{fn.name} has "
                             f"{len(fn.returns)}")  # fmt: skip
        a_type = self.types[self.anchor.operands[0]]
        dtype = {"i8": "i8", "f32": "f32", "f16": "f16", "bf16": "bf16"}.get(a_type.dtype)
        if dtype is None:
            raise TunerError(f"cpu tuner cannot run data type {a_type.dtype}")
        self.tin = _ELEM[dtype]
        out_type = self.types[fn.returns[0]]
        self.tout = _ELEM.get(out_type.dtype) or self._no_type(out_type)
        self.after = self._after_anchor()
        if fn.returns[0] not in self.after and fn.returns[0] != self.anchor.result:
            raise TunerError(f"@{fn.name}'s result does not depend on its conv/dot")
        self._shape_anchor()
        self._out_types, self._out_names = [self.tout], ["result"]

    @staticmethod
    def _no_type(t: TensorType) -> ElemType:
        raise TunerError(f"cpu tuner cannot store a {t.dtype} result")

    def _after_anchor(self) -> set[str]:
        """SSA names that depend on the anchor's result."""
        tainted = {self.anchor.result}
        for op in self.fn.ops:
            if tainted.intersection(op.operands):
                if op.name in BROADCAST:
                    raise Unsupported(
                        f"cpu tuner cannot fuse migraphx.{op.name} of the conv/dot result "
                        f"({self.name}:{op.line})"
                    )
                tainted.add(op.result)
        return tainted - {self.anchor.result}

    def _shape_anchor(self) -> None:
        op, t = self.anchor, self.types
        if op.name.endswith("convolution"):
            n, _c, _h, _w = t[op.operands[0]].shape
            k, cg, y, x = t[op.operands[1]].shape
            g = int(op.attrs.get("group", 1))
            pad = list(op.attrs.get("padding", [0, 0, 0, 0]))
            if len(pad) == 4 and pad[:2] != pad[2:]:
                raise TunerError("cpu tuner runs symmetric padding only")
            (self.sh, self.sw), (self.dh, self.dw) = (
                tuple(op.attrs.get(name, [1, 1])) for name in ("stride", "dilation")
            )
            self.ph, self.pw = pad[:2]
            self.g, self.kg, self.cg, self.y, self.x = g, k // g, cg, y, x
            _, _, self.ho, self.wo = op.type.shape
            self.npix = n * self.ho * self.wo
            self.dims = (self.kg, self.npix, cg * y * x)
        else:
            out = op.type.shape
            self.batch = out[:-2]
            self.m, self.n = out[-2:]
            self.k = t[op.operands[0]].shape[-1]
            self.dims = (self.m, self.n, self.k)

    def mem_bytes(self) -> int:
        total = sum(math.prod(t.shape) for t in self.types.values())
        m, n, k = (min(d, cap) for d, cap in zip(self.dims, (512, 512, 1024), strict=True))
        return 32 * total + tile_bytes(m, n, k) * 4

    # --- setup and the unfused reference ---

    def setup(self, rng: np.random.Generator) -> None:
        self.inputs = {name: _random(self.tin, rng, t) for name, t in self.fn.args}
        ref = {
            name: v.astype(np.int64 if v.dtype.kind in "iu" else np.float64)
            for name, v in self.inputs.items()
        }
        for op in self.fn.ops:
            args = [ref[v] for v in op.operands]
            if op is self.anchor:
                ref[op.result] = self._reference_anchor(args)
            elif op.name in _LAYOUT_OPS:
                ref[op.result] = _full_layout(op, args[0])
            else:
                ref[op.result] = _elementwise(op, [np.asarray(a) for a in args])
        self._refs = [np.asarray(ref[self.fn.returns[0]])]
        # What the kernel reads: the inputs as stored, and what the ops before the anchor make.
        self.side: dict[str, np.ndarray] = dict(self.inputs)
        for op in self.fn.ops:
            if op is self.anchor or op.result in self.after:
                continue
            args = [self.side[v] for v in op.operands]
            if op.name in _LAYOUT_OPS:
                self.side[op.result] = _full_layout(op, args[0])
            else:
                self.side[op.result] = _elementwise(op, args)
        self.result = np.empty(self.types[self.fn.returns[0]].shape, self.tout.storage)
        self.outputs = [self.result]
        self._prepare_anchor()

    def _reference_anchor(self, args: list[np.ndarray]) -> np.ndarray:
        if not self.anchor.name.endswith("convolution"):
            return np.matmul(args[0], args[1])
        x, w = args
        n, c, h, wd = x.shape
        xp = np.zeros((n, c, h + 2 * self.ph, wd + 2 * self.pw), x.dtype)
        xp[:, :, self.ph : self.ph + h, self.pw : self.pw + wd] = x
        xg = xp.reshape(n, self.g, self.cg, *xp.shape[2:])
        wg = w.reshape(self.g, self.kg, self.cg, self.y, self.x)
        out = np.zeros((n, self.g, self.kg, self.ho, self.wo), x.dtype)
        for i in range(self.y):
            for j in range(self.x):
                hs = slice(i * self.dh, i * self.dh + self.sh * (self.ho - 1) + 1, self.sh)
                ws = slice(j * self.dw, j * self.dw + self.sw * (self.wo - 1) + 1, self.sw)
                out += np.einsum("gkc,ngchw->ngkhw", wg[..., i, j], xg[..., hs, ws])
        return out.reshape(n, self.g * self.kg, self.ho, self.wo)

    def _prepare_anchor(self) -> None:
        a, b = (self.side[v] for v in self.anchor.operands[:2])
        if not self.anchor.name.endswith("convolution"):
            shape = (*self.batch, self.m, self.k), (*self.batch, self.k, self.n)
            self.a = np.broadcast_to(a, shape[0]).reshape(-1, self.m, self.k)
            self.b = np.broadcast_to(b, shape[1]).reshape(-1, self.k, self.n)
            return
        n, _c, h, w = a.shape
        hp, wp = h + 2 * self.ph, w + 2 * self.pw
        xp = np.zeros((n, self.g, self.cg, hp, wp), a.dtype)
        xp[..., self.ph : self.ph + h, self.pw : self.pw + w] = a.reshape(n, self.g, self.cg, h, w)
        self.xp = np.ascontiguousarray(xp.transpose(1, 0, 2, 3, 4)).reshape(self.g, -1)
        self.wm = np.ascontiguousarray(b, dtype=self.acc).reshape(self.g, self.kg, -1)
        yy, xx, cc = np.arange(self.y), np.arange(self.x), np.arange(self.cg)
        taps = ((yy * self.dh * wp)[:, None] + xx * self.dw).ravel()
        self.row_off = ((cc * hp * wp)[:, None] + taps).ravel()
        nn, ho, wo = np.arange(n), np.arange(self.ho), np.arange(self.wo)
        self.col_off = (
            (nn * self.cg * hp * wp)[:, None, None] + (ho * self.sh * wp)[:, None] + wo * self.sw
        ).ravel()

    # --- the fused kernel ---

    def run_blocked(self, blocks: Blocks) -> None:
        mb, nb, kb = blocks
        for tile in self._anchor_tiles(mb, nb, kb):
            self._epilogue(tile)

    def _anchor_tiles(self, mb: int, nb: int, kb: int):
        acc = self.acc
        if not self.anchor.name.endswith("convolution"):
            shape = self.anchor.type.shape
            for g in range(self.a.shape[0]):
                lead = np.unravel_index(g, self.batch) if self.batch else ()
                for m0, m1 in block_ranges(0, self.m, mb):
                    for n0, n1 in block_ranges(0, self.n, nb):
                        data = gemm_tile(self.a[g], self.b[g], kb, acc, m0, m1, n0, n1)
                        mm = np.arange(m0, m1)[:, None]
                        nn = np.arange(n0, n1)[None, :]
                        yield _Tile(data, _coords((*lead, mm, nn), data.shape), shape)
            return
        shape, hw = self.anchor.type.shape, self.ho * self.wo
        for g in range(self.g):
            for p0, p1 in block_ranges(0, self.npix, nb):
                cols = self.col_off[p0:p1]
                p = np.arange(p0, p1)[None, :]
                pix = (p // hw, (p // self.wo) % self.ho, p % self.wo)
                for m0, m1 in block_ranges(0, self.kg, mb):
                    data = sum_tiles(
                        self.wm[g, m0:m1, k0:k1]
                        @ self.xp[g][self.row_off[k0:k1, None] + cols].astype(acc, copy=False)
                        for k0, k1 in block_ranges(0, self.wm.shape[2], kb)
                    )
                    ch = g * self.kg + np.arange(m0, m1)[:, None]
                    yield _Tile(data, _coords((pix[0], ch, pix[1], pix[2]), data.shape), shape)

    def _epilogue(self, tile: _Tile) -> None:
        """Every op after the anchor, on this tile only; then the tile is stored."""
        held = _ELEM.get(self.anchor.type.dtype)
        if held is not None and not held.is_int:  # the anchor's result type (f16 rounds)
            tile.data = _held(held, tile.data)
        tiles = {self.anchor.result: tile}
        for op in self.fn.ops:
            if op.result not in self.after:
                continue
            first = next(tiles[v] for v in op.operands if v in tiles)
            if op.name == "transpose":
                perm = op.attrs["permutation"]
                tiles[op.result] = _Tile(
                    first.data, tuple(first.coords[i] for i in perm), op.type.shape
                )
                continue
            if op.name == "reshape":
                flat = np.ravel_multi_index(first.coords, first.shape)
                coords = np.unravel_index(flat, op.type.shape)
                tiles[op.result] = _Tile(first.data, coords, op.type.shape)
                continue
            args = [
                tiles[v].data if v in tiles else self._gather(self.side[v], first)
                for v in op.operands
            ]
            tiles[op.result] = _Tile(_elementwise(op, args), first.coords, first.shape)
        out = tiles[self.fn.returns[0]]
        self.result[out.coords] = self.tout.store(out.data)

    @staticmethod
    def _gather(full: np.ndarray, at: _Tile) -> np.ndarray:
        """A side operand read at a tile's coordinates (broadcast to the tile's value shape)."""
        return np.broadcast_to(full, at.shape)[at.coords]

    def notes(self) -> list[str]:
        after = [op.name for op in self.fn.ops if op.result in self.after]
        return [
            *super().notes(),
            f"fusion @{self.fn.name}: {self.anchor.name} tiled, per-tile epilogue "
            f"{', '.join(after) or '(none)'}",
        ]


def _coords(parts: tuple[Any, ...], shape: tuple[int, ...]) -> tuple[np.ndarray, ...]:
    return tuple(np.broadcast_to(np.asarray(c), shape) for c in parts)


_LAYOUT_OPS = frozenset({"transpose", "reshape", "multibroadcast", "broadcast"})
_RUNNABLE = (
    ELEMENTWISE_UNARY
    | ELEMENTWISE_BINARY
    | _LAYOUT_OPS
    | {"clip", "convert", "quantizelinear", "dequantizelinear"}
) - ANCHORS
