"""The ops the CPU tuner runs: data, a plain reference, and blocked NumPy kernels.

Each op class (`GemmOp`, `ConvOp`, `AttentionOp`) is built from a problem without allocating
anything (so `mem_bytes()` can refuse a problem up front), then `setup(rng)` allocates the
inputs in the problem's memory layout, the output buffers, and a float64 (or exact int64)
reference computed by a plain formula that shares no code with the blocked kernels.
`run_blocked(blocks)` runs the tiled kernel under one perf config and writes `outputs`;
`check()` compares them with the reference.

Layouts only change memory order: every tensor is allocated in its layout's order and the
kernels read and write it through a transposed view in the logical order.

Numerics: f32 computes in f32; f16 loads f16 and accumulates in f32 (stores f16); bf16 is
emulated (values rounded to bf16, held and computed in f32, outputs rounded to bf16); i8
accumulates exactly in i32 (output i32). fp8/bf8 and other types are refused.
"""

from __future__ import annotations

from collections.abc import Iterable, Iterator, Sequence
from dataclasses import dataclass
from typing import Any, ClassVar

import numpy as np

from mlirtuna.errors import TunerError

Blocks = tuple[int, ...]


# --- element types ----------------------------------------------------------------------------


@dataclass(frozen=True)
class ElemType:
    """How the CPU tuner holds one rocMLIR data type."""

    name: str
    storage: type[np.generic]
    is_int: bool
    tol: float  # allowed max error relative to max |reference| when this is an output type

    def store(self, x: np.ndarray) -> np.ndarray:
        """What a kernel writes for accumulator values `x` (bf16 rounds, others cast on store)."""
        return _round_bf16(x) if self.name == "bf16" else x

    def random(self, rng: np.random.Generator, shape: tuple[int, ...], lo=-1.0, hi=1.0):
        if self.is_int:
            return rng.integers(-32, 33, size=shape, dtype=np.int8)
        x = rng.random(shape, dtype=np.float32)
        x *= hi - lo
        x += lo
        return self.store(x).astype(self.storage, copy=False)


_IN_TYPES = {
    "f32": ElemType("f32", np.float32, False, 1e-4),
    "f16": ElemType("f16", np.float16, False, 5e-3),
    "bf16": ElemType("bf16", np.float32, False, 2e-2),
    "i8": ElemType("i8", np.int8, True, 0.0),
}
_OUT_TYPES = {**_IN_TYPES, "i32": ElemType("i32", np.int32, True, 0.0)}
del _OUT_TYPES["i8"]
_DEFAULT_OUT = {"i8": "i32"}

F32 = _OUT_TYPES["f32"]

TYPE_NOTES = {
    "f16": "f16 loads f16 and accumulates in f32",
    "bf16": "bf16 is emulated: values rounded to bf16, held and computed in f32",
    "i8": "i8 accumulates exactly in i32",
}


def elem_types(data_type: str, out_data_type: str | None) -> tuple[ElemType, ElemType]:
    """The input and output element types, or a TunerError for a type the CPU cannot run."""
    tin = _IN_TYPES.get(data_type)
    if tin is None:
        raise TunerError(f"cpu tuner cannot run data type {data_type}")
    out_name = out_data_type or _DEFAULT_OUT.get(data_type, data_type)
    tout = _OUT_TYPES.get(out_name)
    if tout is None:
        raise TunerError(f"cpu tuner cannot run output data type {out_name}")
    if tin.is_int != tout.is_int:
        raise TunerError(f"cpu tuner cannot run data type {data_type} with output {out_name}")
    return tin, tout


def acc_dtype(tin: ElemType) -> type[np.generic]:
    return np.int32 if tin.is_int else np.float32


def _round_bf16(x: np.ndarray) -> np.ndarray:
    """Round float32 values to the nearest bf16 (ties to even), kept as float32."""
    bits = np.ascontiguousarray(x, dtype=np.float32).view(np.uint32)
    bits = (bits + (np.uint32(0x7FFF) + ((bits >> 16) & np.uint32(1)))) & np.uint32(0xFFFF0000)
    return bits.view(np.float32)


def compare(out: np.ndarray, ref: np.ndarray, et: ElemType, what: str = "") -> str | None:
    """None when `out` matches `ref` within `et`'s tolerance, else the reason."""
    where = f" in {what}" if what else ""
    if et.is_int:
        diff = out.astype(np.int64)
        diff -= ref
        bad = int(np.count_nonzero(diff))
        if bad:
            worst = int(np.abs(diff, out=diff).max())
            return f"wrong result{where}: {bad} of {diff.size} values differ (max abs err {worst})"
        return None
    got = out.astype(np.float64)  # the only full-size temporary: see mem_bytes()
    if not np.isfinite(got).all():
        return f"wrong result{where}: non-finite values"
    scale = max(float(ref.max(initial=0.0)), -float(ref.min(initial=0.0)), 1e-30)
    np.subtract(got, ref, out=got)
    err = float(np.abs(got, out=got).max(initial=0.0)) / scale
    if err > et.tol:
        return f"wrong result{where}: max rel err {err:.3g} > tol {et.tol:g}"
    return None


def _poison(arr: np.ndarray) -> None:
    """Fill an output so that a kernel that skips writing it fails verification."""
    if np.issubdtype(arr.dtype, np.integer):
        arr[...] = np.iinfo(arr.dtype).min
    else:
        arr[...] = np.nan


def block_ranges(start: int, stop: int, step: int) -> Iterator[tuple[int, int]]:
    """The blocks [lo, hi) of `step` covering start..stop (the last one may be shorter)."""
    for lo in range(start, stop, step):
        yield lo, min(lo + step, stop)


def alloc(
    et: ElemType,
    rng: np.random.Generator | None,
    order: Sequence[str],
    logical: Sequence[str],
    dims: dict[str, int],
    lo: float = -1.0,
    hi: float = 1.0,
) -> np.ndarray:
    """A tensor allocated in memory `order`, returned as a view in `logical` order.

    With `rng` it holds random data; without, it is an uninitialised output buffer.
    """
    shape = tuple(dims[a] for a in order)
    mem = et.random(rng, shape, lo, hi) if rng is not None else np.empty(shape, et.storage)
    return mem.transpose([list(order).index(a) for a in logical])


# --- the op interface -------------------------------------------------------------------------


class CpuOp:
    """One problem the CPU tuner runs: see the module docstring."""

    op: ClassVar[str]  # the op it runs (its OpSpec's name): ops.py finds it by that
    prefix: ClassVar[str]  # perf config prefix, e.g. "cpu:v1"
    grid: ClassVar[dict[str, tuple[tuple[int, ...], ...]]]  # full / exhaustive values per axis
    quick: ClassVar[tuple[Blocks, ...]]  # the curated quick list
    tin: ElemType
    tout: ElemType
    dims: tuple[int, ...]  # what each perf config axis tiles (block sizes are clipped to these)
    outputs: list[np.ndarray]  # logical views of the output buffers (after setup)
    _refs: list[np.ndarray]
    _out_types: list[ElemType]
    _out_names: list[str]

    @property
    def acc(self) -> type[np.generic]:
        return acc_dtype(self.tin)

    def mem_bytes(self) -> int:
        raise NotImplementedError

    def setup(self, rng: np.random.Generator) -> None:
        raise NotImplementedError

    def run_blocked(self, blocks: Blocks) -> None:
        raise NotImplementedError

    def notes(self) -> list[str]:
        return [TYPE_NOTES[self.tin.name]] if self.tin.name in TYPE_NOTES else []

    def perf_config(self, blocks: Blocks) -> str:
        return f"{self.prefix}:{','.join(map(str, blocks))}"

    def poison(self) -> None:
        for out in self.outputs:
            _poison(out)

    def check(self) -> str | None:
        for out, ref, et, name in zip(
            self.outputs, self._refs, self._out_types, self._out_names, strict=True
        ):
            bad = compare(out, ref, et, name if len(self.outputs) > 1 else "")
            if bad:
                return bad
        return None

    def tolerance(self) -> str:
        return ", ".join(
            "exact" if et.is_int else f"{name} tol {et.tol:g}"
            for et, name in zip(self._out_types, self._out_names, strict=True)
        )


# The gemm-like ops' tilings (also the fused ops': they tile their anchor's implicit GEMM).
GEMM_GRID: dict[str, tuple[tuple[int, ...], ...]] = {
    "exhaustive": ((16, 32, 64, 128, 256, 512),) * 2 + ((16, 32, 64, 128, 256, 512, 1024),),
    "full": ((16, 32, 64, 128, 256),) * 2 + ((16, 64, 256, 1024),),
}
GEMM_QUICK = (
    (32, 32, 32), (64, 64, 32), (64, 64, 64), (128, 64, 128),
    (64, 128, 128), (128, 128, 64), (128, 128, 256), (256, 256, 256),
)  # fmt: skip


def tile_bytes(mb: int, nb: int, kb: int) -> int:
    """Generous bound on one tile's temporaries (gathered operands, indices, accumulators)."""
    return 24 * (mb * kb + kb * nb + mb * nb)


def sum_tiles(parts: Iterable[np.ndarray]) -> np.ndarray:
    """The sum of a non-empty stream of partial tiles, accumulated in the first one."""
    it = iter(parts)
    total = next(it)
    for part in it:
        total += part
    return total


def gemm_tile(
    a: np.ndarray,
    b: np.ndarray,
    kb: int,
    acc: type[np.generic],
    m0: int,
    m1: int,
    n0: int,
    n1: int,
) -> np.ndarray:
    """a[m0:m1, :] @ b[:, n0:n1], one K block at a time, accumulated in `acc`."""
    return sum_tiles(
        a[m0:m1, k0:k1].astype(acc, copy=False) @ b[k0:k1, n0:n1].astype(acc, copy=False)
        for k0, k1 in block_ranges(0, a.shape[1], kb)
    )


# --- gemm -------------------------------------------------------------------------------------


class GemmOp(CpuOp):
    """C[g] = A[g] @ B[g]: M x K times K x N, G times; transA/B/O only change memory order."""

    op = "gemm"
    prefix = "cpu:v1"
    grid = GEMM_GRID
    quick = GEMM_QUICK

    def __init__(self, problem: Any) -> None:
        self.tin, self.tout = elem_types(problem.data_type, problem.out_data_type)
        self.g = int(problem.group_size or 1)
        self.m, self.n, self.k = int(problem.m), int(problem.n), int(problem.k)
        if min(self.g, self.m, self.n, self.k) <= 0:
            raise TunerError("cpu tuner needs positive g, m, n, k")
        self.trans = (bool(problem.trans_a), bool(problem.trans_b), bool(problem.trans_o))
        self.dims = (self.m, self.n, self.k)
        self._out_types, self._out_names = [self.tout], ["C"]

    def mem_bytes(self) -> int:
        g, m, n, k = self.g, self.m, self.n, self.k
        es, os_ = np.dtype(self.tin.storage).itemsize, np.dtype(self.tout.storage).itemsize
        data = g * (m * k + k * n) * es + g * m * n * os_ + 4 * max(m * k, k * n) * g
        ref = 8 * g * (m * k + k * n) + 8 * g * m * n * 3  # float64 operands, result, compare
        return data + ref + tile_bytes(min(m, 512), min(n, 512), min(k, 1024))

    def setup(self, rng: np.random.Generator) -> None:
        ta, tb, to = self.trans
        d = {"G": self.g, "M": self.m, "N": self.n, "K": self.k}
        self.a = alloc(self.tin, rng, "GKM" if ta else "GMK", "GMK", d)
        self.b = alloc(self.tin, rng, "GNK" if tb else "GKN", "GKN", d)
        self.c = alloc(self.tout, None, "GNM" if to else "GMN", "GMN", d)
        self.outputs = [self.c]
        ref_t = np.int64 if self.tin.is_int else np.float64
        self._refs = [np.matmul(self.a.astype(ref_t), self.b.astype(ref_t))]

    def run_blocked(self, blocks: Blocks) -> None:
        mb, nb, kb = blocks
        for a, b, c in zip(self.a, self.b, self.c, strict=True):
            for m0, m1 in block_ranges(0, self.m, mb):
                for n0, n1 in block_ranges(0, self.n, nb):
                    acc = gemm_tile(a, b, kb, self.acc, m0, m1, n0, n1)
                    c[m0:m1, n0:n1] = self.tout.store(acc)


# --- conv -------------------------------------------------------------------------------------

_ACT = ("N", "G", "C", "H", "W")  # logical order of activations (input and output)
_FIL = ("G", "K", "C", "H", "W")  # logical order of the filter
_ACT_LETTERS = {"N": "N", "C": "C", "K": "C", "G": "G", "H": "H", "0": "H", "W": "W", "1": "W"}
_FIL_LETTERS = {"N": "K", "K": "K", "C": "C", "G": "G", "H": "H", "Y": "H", "0": "H",
                "W": "W", "X": "W", "1": "W"}  # fmt: skip


def conv_layout(layout: str, filt: bool) -> tuple[str, ...]:
    """Memory order of a conv tensor in logical axis names; G (absent) sits before channels.

    Filter layouts name output channels N (canonical -f strings) or K; spatial dims H/W, Y/X
    or 0/1.
    """
    letters = _FIL_LETTERS if filt else _ACT_LETTERS
    text = (layout or "NCHW").upper()
    try:
        order = [letters[ch] for ch in text]
    except KeyError:
        raise TunerError(f"cpu tuner cannot read conv layout {layout!r} (2-D only)") from None
    chan = "K" if filt else "C"
    if "G" not in order and chan in order:
        order.insert(order.index(chan), "G")
    want = _FIL if filt else _ACT
    if sorted(order) != sorted(want):
        raise TunerError(f"cpu tuner cannot read conv layout {layout!r}")
    return tuple(order)


_DIRECTIONS = {"fwd": "fwd", "1": "fwd", "bwd": "bwd", "2": "bwd", "wrw": "wrw", "4": "wrw"}


class ConvOp(CpuOp):
    """2-D grouped convolution as an implicit GEMM (no im2col buffer: tiles are gathered).

    fwd: M = K/G, N = n*Ho*Wo, K = C/G*Y*X  (gather input tiles from the padded input)
    bwd: M = C/G (each row with all Y*X taps), N = n*Ho*Wo, K = K/G  (GEMM then col2im scatter)
    wrw: M = K/G, N = C/G*Y*X, K = n*Ho*Wo  (gather input tiles, transposed)
    """

    op = "conv"
    prefix = "cpu:v1"
    grid = GEMM_GRID
    quick = GEMM_QUICK

    def __init__(self, p: Any) -> None:
        direction = _DIRECTIONS.get(str(p.direction).lower())
        if direction is None:
            raise TunerError(f"cpu tuner cannot run conv direction {p.direction!r}")
        self.direction: str = direction
        if int(p.spatial_dim or 2) != 2:
            raise TunerError("cpu tuner runs 2-D convolutions only")
        self.tin, self.tout = elem_types(p.data_type, p.out_data_type or None)
        for other in (p.in_data_type, p.fil_data_type):
            if (other or p.data_type) != p.data_type:
                raise TunerError(f"cpu tuner cannot run mixed data types {p.data_type}/{other}")
        if self.tin.is_int and self.direction != "fwd":
            raise TunerError(f"cpu tuner runs {p.data_type} conv forward only")
        self.n, self.c, self.h, self.w = (
            int(v) for v in (p.batchsize, p.in_channels, p.in_h, p.in_w)
        )
        self.k, self.y, self.x = int(p.out_channels), int(p.fil_h), int(p.fil_w)
        self.g = int(p.group_size or 1)
        self.ph, self.pw = int(p.pad_h), int(p.pad_w)
        self.sh, self.sw = int(p.conv_stride_h or 1), int(p.conv_stride_w or 1)
        self.dh, self.dw = int(p.dilation_h or 1), int(p.dilation_w or 1)
        if min(self.n, self.c, self.h, self.w, self.k, self.y, self.x, self.g) <= 0:
            raise TunerError("cpu tuner needs positive conv sizes")
        if self.c % self.g or self.k % self.g:
            raise TunerError(f"conv channels {self.c}/{self.k} not divisible by group {self.g}")
        self.cg, self.kg = self.c // self.g, self.k // self.g
        self.hp, self.wp = self.h + 2 * self.ph, self.w + 2 * self.pw
        self.ho = (self.hp - self.dh * (self.y - 1) - 1) // self.sh + 1
        self.wo = (self.wp - self.dw * (self.x - 1) - 1) // self.sw + 1
        if self.ho <= 0 or self.wo <= 0:
            raise TunerError("conv filter larger than the padded input")
        self.in_order = conv_layout(p.in_layout, False)
        self.fil_order = conv_layout(p.fil_layout, True)
        self.out_order = conv_layout(p.out_layout, False)
        self.p = self.n * self.ho * self.wo  # output pixels
        self.cyx = self.cg * self.y * self.x
        self.dims = {
            "fwd": (self.kg, self.p, self.cyx),
            "bwd": (self.cg, self.p, self.kg),
            "wrw": (self.kg, self.cyx, self.p),
        }[self.direction]
        self._out_types = [self.tout]
        names = {"fwd": "output", "bwd": "input grad", "wrw": "filter grad"}
        self._out_names = [names[self.direction]]

    # sizes of the tensors (element counts)
    def _counts(self) -> tuple[int, int, int, int]:
        nx = self.n * self.c * self.h * self.w
        nw = self.k * self.cg * self.y * self.x
        ny = self.n * self.k * self.ho * self.wo
        nxp = self.n * self.c * self.hp * self.wp
        return nx, nw, ny, nxp

    def mem_bytes(self) -> int:
        nx, nw, ny, nxp = self._counts()
        es, os_ = np.dtype(self.tin.storage).itemsize, np.dtype(self.tout.storage).itemsize
        index = 8 * (self.cyx + self.p)
        m, n, k = (min(d, cap) for d, cap in zip(self.dims, (512, 512, 1024), strict=True))
        tile = tile_bytes(m * (self.y * self.x if self.direction == "bwd" else 1), n, k)
        gen = 4 * max(nx, nw, ny)  # random numbers are drawn as float32 first
        if self.direction == "fwd":
            data = (nx + nw) * es + ny * os_ + nxp * es + nw * 4 + ny * os_
            ref = 8 * (3 * nxp + nw + 4 * ny)
        elif self.direction == "bwd":
            data = (ny + nw) * es + nx * os_ + (ny + nw + nxp) * 4 + nx * os_
            ref = 8 * (3 * ny + nw + nxp + 3 * nx)
        else:
            data = (nx + ny) * es + nw * os_ + nxp * es + ny * 4 + nw * os_
            ref = 8 * (3 * nxp + 2 * ny + 4 * nw)
        return data + ref + index + tile + gen

    def _dims(self) -> dict[str, int]:
        return {"N": self.n, "G": self.g, "H": self.h, "W": self.w}

    def setup(self, rng: np.random.Generator) -> None:
        act_in = {**self._dims(), "C": self.cg}
        act_out = {"N": self.n, "G": self.g, "C": self.kg, "H": self.ho, "W": self.wo}
        fil = {"G": self.g, "K": self.kg, "C": self.cg, "H": self.y, "W": self.x}
        src = rng if self.direction != "bwd" else None
        grad = rng if self.direction != "fwd" else None
        wsrc = rng if self.direction != "wrw" else None
        # x: input (N,G,C,H,W); w: filter (G,K,C,Y,X); dy / out: output (N,G,K,Ho,Wo)
        self.xin = alloc(self.tin if src else self.tout, src, self.in_order, _ACT, act_in)
        self.fil = alloc(self.tin if wsrc else self.tout, wsrc, self.fil_order, _FIL, fil)
        self.yout = alloc(self.tin if grad else self.tout, grad, self.out_order, _ACT, act_out)
        self.outputs = [{"fwd": self.yout, "bwd": self.xin, "wrw": self.fil}[self.direction]]
        hp, wp, y, x = self.hp, self.wp, np.arange(self.y), np.arange(self.x)
        c = np.arange(self.cg)
        self.c_off = c * (hp * wp)
        self.tap_off = ((y * self.dh * wp)[:, None] + x * self.dw).ravel()
        self.row_off = (self.c_off[:, None] + self.tap_off).ravel()  # (C/G*Y*X,)
        n, ho, wo = np.arange(self.n), np.arange(self.ho), np.arange(self.wo)
        self.col_off = (
            (n * self.cg * hp * wp)[:, None, None] + (ho * self.sh * wp)[:, None] + wo * self.sw
        ).ravel()  # (n*Ho*Wo,)
        self._refs = [getattr(self, f"_ref_{self.direction}")()]

    # --- plain references: one einsum per filter tap, in float64 / int64 ---

    def _ref_t(self) -> type[np.generic]:
        return np.int64 if self.tin.is_int else np.float64

    def _taps(self):
        for i in range(self.y):
            for j in range(self.x):
                hs = slice(i * self.dh, i * self.dh + self.sh * (self.ho - 1) + 1, self.sh)
                ws = slice(j * self.dw, j * self.dw + self.sw * (self.wo - 1) + 1, self.sw)
                yield i, j, hs, ws

    def _padded64(self) -> np.ndarray:
        xp = np.zeros((self.g, self.n, self.cg, self.hp, self.wp), self._ref_t())
        xp[..., self.ph : self.ph + self.h, self.pw : self.pw + self.w] = self.xin.transpose(
            1, 0, 2, 3, 4
        )
        return xp

    def _ref_fwd(self) -> np.ndarray:
        xp, w = self._padded64(), self.fil.astype(self._ref_t())
        out = np.zeros((self.g, self.n, self.kg, self.ho, self.wo), self._ref_t())
        for i, j, hs, ws in self._taps():
            out += np.einsum("gkc,gnchw->gnkhw", w[..., i, j], xp[..., hs, ws], optimize=True)
        return out.transpose(1, 0, 2, 3, 4)

    def _ref_bwd(self) -> np.ndarray:
        dy = self.yout.transpose(1, 0, 2, 3, 4).astype(np.float64)
        w = self.fil.astype(np.float64)
        dxp = np.zeros((self.g, self.n, self.cg, self.hp, self.wp))
        for i, j, hs, ws in self._taps():
            dxp[..., hs, ws] += np.einsum("gkc,gnkhw->gnchw", w[..., i, j], dy, optimize=True)
        return dxp[..., self.ph : self.ph + self.h, self.pw : self.pw + self.w].transpose(
            1, 0, 2, 3, 4
        )

    def _ref_wrw(self) -> np.ndarray:
        xp, dy = self._padded64(), self.yout.transpose(1, 0, 2, 3, 4).astype(np.float64)
        dw = np.zeros((self.g, self.kg, self.cg, self.y, self.x))
        for i, j, hs, ws in self._taps():
            dw[..., i, j] = np.einsum("gnkhw,gnchw->gkc", dy, xp[..., hs, ws], optimize=True)
        return dw

    # --- blocked kernels ---

    def _padded(self) -> np.ndarray:
        """The input, zero-padded, as (G, n*C/G*Hp*Wp): what the gathers index into."""
        xp = np.zeros((self.g, self.n, self.cg, self.hp, self.wp), self.xin.dtype)
        xp[..., self.ph : self.ph + self.h, self.pw : self.pw + self.w] = self.xin.transpose(
            1, 0, 2, 3, 4
        )
        return xp.reshape(self.g, -1)

    def _dy(self) -> np.ndarray:
        """The output gradient as (G, K/G, n*Ho*Wo) in the accumulator type."""
        dy = np.ascontiguousarray(self.yout.transpose(1, 2, 0, 3, 4), dtype=self.acc)
        return dy.reshape(self.g, self.kg, self.p)

    def run_blocked(self, blocks: Blocks) -> None:
        getattr(self, f"_run_{self.direction}")(*blocks)

    def _run_fwd(self, mb: int, nb: int, kb: int) -> None:
        xp = self._padded()
        wm = np.ascontiguousarray(self.fil, dtype=self.acc).reshape(self.g, self.kg, self.cyx)
        out = np.empty((self.g, self.kg, self.p), self.tout.storage)
        for g in range(self.g):
            for n0, n1 in block_ranges(0, self.p, nb):
                cols = self.col_off[n0:n1]
                for m0, m1 in block_ranges(0, self.kg, mb):
                    acc = sum_tiles(
                        wm[g, m0:m1, k0:k1]
                        @ xp[g][self.row_off[k0:k1, None] + cols].astype(self.acc, copy=False)
                        for k0, k1 in block_ranges(0, self.cyx, kb)
                    )
                    out[g, m0:m1, n0:n1] = self.tout.store(acc)
        view = out.reshape(self.g, self.kg, self.n, self.ho, self.wo).transpose(2, 0, 1, 3, 4)
        self.yout[...] = view

    def _run_bwd(self, mb: int, nb: int, kb: int) -> None:
        dy = self._dy()
        taps = self.y * self.x
        wt = np.ascontiguousarray(self.fil.transpose(0, 2, 3, 4, 1), dtype=self.acc)
        wt = wt.reshape(self.g, self.cyx, self.kg)
        dxp = np.zeros((self.g, self.n * self.cg * self.hp * self.wp), self.acc)
        for g in range(self.g):
            for n0, n1 in block_ranges(0, self.p, nb):
                cols = self.col_off[n0:n1]
                for c0, c1 in block_ranges(0, self.cg, mb):
                    rows = (c0 * taps, c1 * taps)
                    acc = gemm_tile(wt[g], dy[g], kb, self.acc, *rows, n0, n1)
                    acc = acc.reshape(c1 - c0, taps, n1 - n0)
                    for t in range(taps):  # col2im: unique indices within one tap
                        idx = (self.c_off[c0:c1] + self.tap_off[t])[:, None] + cols
                        dxp[g][idx] += acc[:, t, :]
        dx = dxp.reshape(self.g, self.n, self.cg, self.hp, self.wp)
        dx = dx[..., self.ph : self.ph + self.h, self.pw : self.pw + self.w]
        self.xin[...] = self.tout.store(dx).transpose(1, 0, 2, 3, 4)

    def _run_wrw(self, mb: int, nb: int, kb: int) -> None:
        xp, dy = self._padded(), self._dy()
        out = np.empty((self.g, self.kg, self.cyx), self.tout.storage)
        for g in range(self.g):
            for m0, m1 in block_ranges(0, self.kg, mb):
                for n0, n1 in block_ranges(0, self.cyx, nb):
                    rows = self.row_off[n0:n1, None]
                    acc = sum_tiles(
                        dy[g, m0:m1, k0:k1]
                        @ xp[g][rows + self.col_off[k0:k1]].astype(self.acc, copy=False).T
                        for k0, k1 in block_ranges(0, self.p, kb)
                    )
                    out[g, m0:m1, n0:n1] = self.tout.store(acc)
        self.fil[...] = out.reshape(self.g, self.kg, self.cg, self.y, self.x)


# --- attention --------------------------------------------------------------------------------


class AttentionOp(CpuOp):
    """O = softmax(Q K^T [* scale] [+ bias] [causal mask]) V per head, blocked online softmax.

    No implicit 1/sqrt(d): as in rocMLIR, scaling is the optional elementwise scale tensor
    (shape of Q K^T). Causal masks key j > query i (top-left aligned). split_kv splits the keys
    into chunks computed independently and merged through their log-sum-exp. Grouped-query
    heads (num_heads_kv dividing num_heads_q) share K and V.
    """

    op = "attention"
    prefix = "cpu:attn:v1"
    grid: ClassVar = {
        "exhaustive": ((16, 32, 64, 128, 256, 512), (16, 32, 64, 128, 256, 512, 1024)),
        "full": ((16, 32, 64, 128, 256), (16, 64, 256, 1024)),
    }
    quick: ClassVar = ((32, 64), (64, 64), (64, 128), (128, 128), (128, 256), (256, 256))

    def __init__(self, p: Any) -> None:
        self.tin, self.tout = elem_types(p.data_type, None)
        if self.tin.is_int:
            raise TunerError(f"cpu tuner cannot run attention with data type {p.data_type}")
        self.hq = int(p.num_heads_q or 1)
        self.hkv = int(p.num_heads_kv or self.hq)
        if self.hq <= 0 or self.hkv <= 0 or self.hq % self.hkv:
            raise TunerError(f"num_heads_q {self.hq} is not a multiple of num_heads_kv {self.hkv}")
        g = int(p.group_size or 1)
        self.gq, self.gkv = g * self.hq, g * self.hkv
        self.sq, self.sk = int(p.seq_len_q), int(p.seq_len_k)
        self.dqk, self.dv = int(p.head_dim_qk), int(p.head_dim_v)
        if min(g, self.sq, self.sk, self.dqk, self.dv) <= 0:
            raise TunerError("cpu tuner needs positive attention sizes")
        self.trans = tuple(bool(getattr(p, f"trans_{t}")) for t in "qkvo")
        self.causal, self.return_lse = bool(p.causal), bool(p.return_lse)
        self.with_scale, self.with_bias = bool(p.with_attn_scale), bool(p.with_attn_bias)
        self.trans_bias = bool(getattr(p, "trans_bias", False))
        self.split = max(1, min(int(p.split_kv or 1), self.sk))
        self.split_len = -(-self.sk // self.split)
        self.dims = (self.sq, self.split_len)
        self._out_types = [self.tout] + ([F32] if self.return_lse else [])
        self._out_names = ["O"] + (["LSE"] if self.return_lse else [])

    def mem_bytes(self) -> int:
        es = np.dtype(self.tin.storage).itemsize
        nq, nk = self.gq * self.sq * self.dqk, self.gkv * self.sk * self.dqk
        nv, no = self.gkv * self.sk * self.dv, self.gq * self.sq * self.dv
        ns = self.gq * self.sq * self.sk * (self.with_scale + self.with_bias)
        data = (nq + nk + nv + ns + no) * es + 8 * self.gq * self.sq + 4 * max(nq, nk, nv, ns)
        ref = 8 * (nq + nk + nv + 3 * no + 2 * self.gq * self.sq) + 8 * 5 * self.sq * self.sk
        qb, kb = min(self.sq, 512), min(self.split_len, 1024)
        tile = 16 * (qb * kb + qb * max(self.dqk, self.dv) * (2 + self.split))
        return data + ref + tile

    def setup(self, rng: np.random.Generator) -> None:
        tq, tk, tv, to = self.trans
        d = {"G": self.gq, "H": self.gkv, "Q": self.sq, "K": self.sk, "D": self.dqk, "V": self.dv}
        self.q = alloc(self.tin, rng, "GDQ" if tq else "GQD", "GQD", d)
        self.k = alloc(self.tin, rng, "HDK" if tk else "HKD", "HKD", d)
        self.v = alloc(self.tin, rng, "HVK" if tv else "HKV", "HKV", d)
        self.scale = self.bias = None
        if self.with_scale:
            self.scale = alloc(self.tin, rng, "GQK", "GQK", d, 0.25, 1.0)
        if self.with_bias:
            self.bias = alloc(self.tin, rng, "GKQ" if self.trans_bias else "GQK", "GQK", d)
        self.o = alloc(self.tout, None, "GVQ" if to else "GQV", "GQV", d)
        self.lse = np.empty((self.gq, self.sq), np.float32)
        self.outputs = [self.o] + ([self.lse] if self.return_lse else [])
        self._refs = self._reference()

    def kv_head(self, h: int) -> int:
        return (h // self.hq) * self.hkv + (h % self.hq) // (self.hq // self.hkv)

    def _reference(self) -> list[np.ndarray]:
        o = np.empty((self.gq, self.sq, self.dv))
        lse = np.empty((self.gq, self.sq))
        mask = np.triu(np.ones((self.sq, self.sk), bool), 1) if self.causal else None
        for h in range(self.gq):
            kh = self.kv_head(h)
            s = self.q[h].astype(np.float64) @ self.k[kh].astype(np.float64).T
            if self.scale is not None:
                s *= self.scale[h]
            if self.bias is not None:
                s += self.bias[h]
            if mask is not None:
                s[mask] = -np.inf
            m = s.max(axis=1, keepdims=True)
            p = np.exp(s - m)
            den = p.sum(axis=1, keepdims=True)
            o[h] = (p @ self.v[kh].astype(np.float64)) / den
            lse[h] = (m + np.log(den))[:, 0]
        return [o] + ([lse] if self.return_lse else [])

    def run_blocked(self, blocks: Blocks) -> None:
        qb, kvb = blocks
        f32 = np.float32
        for h in range(self.gq):
            kh = self.kv_head(h)
            for q0, q1 in block_ranges(0, self.sq, qb):
                qt = self.q[h, q0:q1].astype(f32)
                splits = (
                    self._split(h, kh, qt, q0, q1, s0, s1, kvb)
                    for s0, s1 in block_ranges(0, self.sk, self.split_len)
                )
                o_all, lse_all = next(splits)
                for o_s, lse_s in splits:  # merge split_kv partials by their log-sum-exp
                    both = np.logaddexp(lse_all, lse_s)
                    o_all = o_all * np.exp(lse_all - both)[:, None]
                    o_all += o_s * np.exp(lse_s - both)[:, None]
                    lse_all = both
                self.o[h, q0:q1] = self.tout.store(o_all)
                self.lse[h, q0:q1] = lse_all

    def _split(
        self, h: int, kh: int, qt: np.ndarray, q0: int, q1: int, s0: int, s1: int, kvb: int
    ) -> tuple[np.ndarray, np.ndarray]:
        """Online softmax over keys s0:s1 for queries q0:q1: (normalised O, log-sum-exp)."""
        f32 = np.float32
        m = np.full(q1 - q0, -np.inf, f32)
        den = np.zeros(q1 - q0, f32)
        acc = np.zeros((q1 - q0, self.dv), f32)
        for j0, j1 in block_ranges(s0, s1, kvb):
            if self.causal and j0 > q1 - 1:
                break  # every later key block is masked for every query in this block
            s = qt @ self.k[kh, j0:j1].astype(f32).T
            if self.scale is not None:
                s *= self.scale[h, q0:q1, j0:j1]
            if self.bias is not None:
                s += self.bias[h, q0:q1, j0:j1]
            if self.causal and j1 - 1 > q0:
                masked = np.arange(j0, j1)[None, :] > np.arange(q0, q1)[:, None]
                s[masked] = -np.inf
            m_new = np.maximum(m, s.max(axis=1))
            m_safe = np.where(np.isneginf(m_new), f32(0), m_new)
            p = np.exp(s - m_safe[:, None])
            alpha = np.exp(m - m_safe)
            den = den * alpha + p.sum(axis=1)
            acc = acc * alpha[:, None] + p @ self.v[kh, j0:j1].astype(f32)
            m = m_new
        seen = den > 0
        safe = np.where(seen, den, f32(1))
        return acc / safe[:, None], np.where(seen, m + np.log(safe), f32(-np.inf))
