"""The CPU tuner's ops registry: which op class runs which problem.

Kept apart from kernels.py (gemm, conv, attention) and fused.py (gemm_gemm, conv_gemm, fusion)
because it names both, and fused.py builds on kernels.py: neither imports the other back.
"""

from __future__ import annotations

from collections.abc import Callable
from typing import Any

from mlirtuna.errors import TunerError
from mlirtuna.tuners.cpu.fused import ConvGemmOp, FusionOp, GemmGemmOp
from mlirtuna.tuners.cpu.kernels import AttentionOp, ConvOp, CpuOp, GemmOp

OPS: dict[str, Callable[[Any], CpuOp]] = {
    "gemm": GemmOp,
    "conv": ConvOp,
    "attention": AttentionOp,
    "gemm_gemm": GemmGemmOp,
    "conv_gemm": ConvGemmOp,
    "fusion": FusionOp,
}


def make_op(problem: Any) -> CpuOp:
    """The CPU op for a problem, or a TunerError for one the CPU tuner cannot run."""
    op = getattr(problem, "op", None)
    make = OPS.get(op) if isinstance(op, str) else None
    if make is None:
        raise TunerError(f"cpu tuner cannot run op {op}")
    return make(problem)
