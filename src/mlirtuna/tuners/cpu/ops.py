"""The CPU tuner's ops registry: which op class runs which problem.

Every CpuOp subclass of kernels.py (gemm, conv, attention) and fused.py (gemm_gemm, conv_gemm,
fusion) names the op it runs (`op`), so a new op's kernel is its class alone. Kept apart from
both because it reads both, and fused.py builds on kernels.py: neither imports the other back.
"""

from __future__ import annotations

from collections.abc import Callable
from typing import Any

import mlirtuna.tuners.cpu.fused as fused
import mlirtuna.tuners.cpu.kernels as kernels
from mlirtuna.errors import TunerError
from mlirtuna.tuners.cpu.kernels import CpuOp


def _registry() -> dict[str, Callable[[Any], CpuOp]]:
    ops: dict[str, Callable[[Any], CpuOp]] = {}
    for cls in CpuOp.__subclasses__():
        if cls.__module__ not in (kernels.__name__, fused.__name__):
            continue  # a test's or plugin's own CpuOp is not the CPU tuner's kernel
        if cls.op in ops:
            raise TypeError(f"two CPU kernels for op {cls.op!r}: {ops[cls.op]} and {cls}")
        ops[cls.op] = cls
    return ops


OPS = _registry()


def make_op(problem: Any) -> CpuOp:
    """The CPU op for a problem, or a TunerError for one the CPU tuner cannot run."""
    op = getattr(problem, "op", None)
    make = OPS.get(op) if isinstance(op, str) else None
    if make is None:
        raise TunerError(f"cpu tuner cannot run op {op}")
    return make(problem)
