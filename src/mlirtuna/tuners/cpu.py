"""The built-in CPU reference tuner: compiles nothing, really measures.

Each op runs with NumPy as a blocked implicit GEMM (attention: a blocked online softmax)
under a space of tiling perf configs (`cpu_kernels`). Every candidate is first checked against
a plain float64 / exact-int reference computed once per job, and only then timed: warm-up,
then the median of `repeats` runs. The winner is the valid candidate with the most TFlops.

Perf configs: `cpu:v1:mPerBlock,nPerBlock,kPerBlock` for gemm and conv (tiling the op's
implicit GEMM), `cpu:attn:v1:qBlock,kvBlock` for attention. Block sizes are clipped to the
problem's dims and equivalent configs deduplicated. Tuning spaces:

- quick: a curated list of at most 8 configs;
- full: the product of a coarse grid per axis (up to 100 gemm/conv, 20 attention configs);
- greedy: coordinate descent over the full grid (each axis swept in turn, at most 3 rounds),
  so never more than full;
- exhaustive: the product of the fine grid (up to 252 gemm/conv, 42 attention configs);
- list:NAME: exactly the perf configs of a stored quick list (quick.py) for the problem's
  (arch, op, data type), clipped like the rest; the worker hands them over in the context.
"""

from __future__ import annotations

import datetime as dt
import itertools
import statistics
import time
from collections.abc import Callable, Mapping

import numpy as np

from mlirtuna.errors import TunerError, TunerTimeout, Unsupported
from mlirtuna.problems import Problem
from mlirtuna.tuners.base import Candidate, TuneContext, TuneOutcome
from mlirtuna.tuners.cpu_kernels import Blocks, CpuOp, make_op

#: A kernel a test (or an experiment) adds to the space: it runs the op given the op's data
#: (`op.outputs` must be written; `op.run_blocked(blocks)` runs a built-in tiling).
ExtraKernel = Callable[[CpuOp], None]

SPACES = ("quick", "full", "greedy", "exhaustive")
_GREEDY_ROUNDS = 3
_GiB = float(1 << 30)


def _gib(nbytes: int) -> str:
    gib = nbytes / _GiB
    return f"{gib:.1f}" if gib >= 0.1 else f"{gib:.2g}"


def _now() -> dt.datetime:
    return dt.datetime.now(dt.UTC)


def axes(op: CpuOp, grid: str) -> list[list[int]]:
    """The block sizes per axis of `op`'s `grid` (full | exhaustive), clipped and deduplicated."""
    return [
        sorted({min(v, dim) for v in values})
        for values, dim in zip(op.grid[grid], op.dims, strict=True)
    ]


def space(op: CpuOp, tuning_space: str) -> list[Blocks]:
    """Every tiling a non-adaptive tuning space tries, in order, without duplicates."""
    if tuning_space == "quick":
        clipped = (tuple(min(v, d) for v, d in zip(b, op.dims, strict=True)) for b in op.quick)
        return list(dict.fromkeys(clipped))
    if tuning_space in ("full", "exhaustive"):
        return list(itertools.product(*axes(op, tuning_space)))
    raise TunerError(f"unknown tuning space {tuning_space!r} (one of {', '.join(SPACES)})")


def list_blocks(op: CpuOp, perf_configs: tuple[str, ...] | None) -> list[Blocks]:
    """The tilings a `list:` space names for this op, clipped and deduplicated, in list order."""
    if perf_configs is None:
        raise TunerError("a list: tuning space needs the quick list's perf configs (worker)")
    blocks = [b for b in (parse_blocks(pc, op) for pc in perf_configs) if b is not None]
    if not blocks:
        raise TunerError(f"the quick list has no {op.prefix} perf config for this problem")
    return list(dict.fromkeys(blocks))


def parse_blocks(perf_config: str, op: CpuOp) -> Blocks | None:
    """`cpu:v1:64,64,32` → (64, 64, 32) clipped to op's dims; None for another family."""
    prefix = op.prefix + ":"
    if not perf_config.startswith(prefix):
        return None
    try:
        values = tuple(int(v) for v in perf_config[len(prefix) :].split(","))
    except ValueError:
        return None
    if len(values) != len(op.dims) or min(values) < 1:
        return None
    return tuple(min(v, d) for v, d in zip(values, op.dims, strict=True))


def resolver(problem: Problem) -> Callable[[str], str]:
    """What a perf config *is* on this problem: the CPU tuner clips block sizes to its dims, so
    `cpu:v1:256,256,64` on a 100-row gemm is the measured `cpu:v1:100,256,64`. Other perf
    configs (rocMLIR's) are their own name."""
    try:
        op = make_op(problem)
    except TunerError:
        return lambda pc: pc

    def resolve(pc: str) -> str:
        blocks = parse_blocks(pc, op)
        return op.perf_config(blocks) if blocks is not None else pc

    return resolve


def portable(problem: Problem) -> Callable[[str], list[str]]:
    """The perf configs that *mean* a measured one on any problem: a block size clipped to this
    problem's dim stands for every grid value that clips to it (`cpu:v1:40,…` on a 40-row gemm
    is `cpu:v1:64,…`, `cpu:v1:128,…`, … of the exhaustive grid). Quick lists are built from these
    names, so that a list carries grid values, never one problem's dims."""
    try:
        op = make_op(problem)
    except TunerError:
        return lambda pc: [pc]
    grid = getattr(op, "grid", {}).get("exhaustive")

    def names(pc: str) -> list[str]:
        blocks = parse_blocks(pc, op)
        if blocks is None or grid is None or len(grid) != len(blocks):
            return [pc]
        choices = [
            ([v for v in axis if min(v, d) == b] or [b]) if b == d else [b]
            for b, d, axis in zip(blocks, op.dims, grid, strict=True)
        ]
        return [op.perf_config(c) for c in itertools.product(*choices)]

    return names


def _op(problem: Problem, ctx: TuneContext) -> CpuOp:
    """The op to tune, or Unsupported: what the cpu tuner can never run (a data type, layout,
    direction or size it lacks) fails at once and is not retried."""
    try:
        op = make_op(problem)  # checks the problem; allocates nothing
    except TunerError as exc:
        raise Unsupported(str(exc), exc.detail) from None
    if ctx.tuning_space not in SPACES and not ctx.tuning_space.startswith("list:"):
        raise Unsupported(f"unknown tuning space {ctx.tuning_space!r} (one of {', '.join(SPACES)})")
    need = op.mem_bytes()
    if need > ctx.cpu_mem_limit:
        limit = _gib(ctx.cpu_mem_limit)
        raise Unsupported(f"problem needs ~{_gib(need)} GiB, over --cpu-mem-limit {limit} GiB")
    return op


def unsupported(problem: Problem, ctx: TuneContext) -> str | None:
    """Why the cpu tuner cannot run this problem at all, or None: `run` skips those up front."""
    try:
        _op(problem, ctx)
    except Unsupported as exc:
        return str(exc)
    return None


class _Deadline:
    """Raises TunerTimeout once the job timeout has passed (a no-op without one)."""

    def __init__(self, timeout_s: float | None) -> None:
        self.timeout_s = timeout_s
        self.end = None if timeout_s is None else time.monotonic() + timeout_s

    def check(self, tried: int) -> None:
        if self.end is not None and time.monotonic() > self.end:
            raise TunerTimeout(
                f"cpu tuner ran past the job timeout of {self.timeout_s:g} s "
                f"after {tried} candidates"
            )


class CpuTuner:
    """Tunes conv / gemm / attention on the CPU with NumPy; see the module docstring.

    `extra_kernels` maps a perf config name to a kernel that is tried (verified, then timed)
    alongside the built-in space: the hook tests use to inject a wrong kernel.
    """

    name = "cpu"

    def __init__(
        self,
        repeats: int = 5,
        warmup: int = 1,
        seed: int = 0,
        extra_kernels: Mapping[str, ExtraKernel] | None = None,
    ) -> None:
        if repeats < 1 or warmup < 0:
            raise ValueError("repeats must be >= 1 and warmup >= 0")
        self.repeats, self.warmup, self.seed = repeats, warmup, seed
        self.extra_kernels = dict(extra_kernels or {})

    def tune(self, problem: Problem, ctx: TuneContext) -> TuneOutcome:
        deadline = _Deadline(ctx.timeout_s)
        op = _op(problem, ctx)
        listed = ctx.tuning_space.startswith("list:")
        compile_start = _now()
        op.setup(np.random.default_rng(self.seed))  # data + reference
        deadline.check(0)
        tried: dict[str, Candidate] = {}
        flops = problem.flops()

        def measure(name: str, kernel: Callable[[], None]) -> Candidate:
            if name not in tried:
                deadline.check(len(tried))
                tried[name] = self._measure(op, kernel, name, flops, deadline, len(tried))
            return tried[name]

        def builtin(blocks: Blocks) -> Candidate:
            return measure(op.perf_config(blocks), lambda: op.run_blocked(blocks))

        if ctx.tuning_space == "greedy":
            _greedy(op, builtin)
        elif listed:
            for blocks in list_blocks(op, ctx.perf_configs):
                builtin(blocks)
        else:
            for blocks in space(op, ctx.tuning_space):
                builtin(blocks)
        for name, kernel in self.extra_kernels.items():
            measure(name, lambda kernel=kernel: kernel(op))
        compile_end = _now()

        candidates = list(tried.values())
        output = self._output(problem, op, ctx, candidates)
        valid = [c for c in candidates if c.valid]
        if not valid:
            reason = candidates[0].error if candidates else "empty space"
            raise TunerError(
                f"no valid perf config: {len(candidates)} tried, first: {reason}", detail=output
            )
        winner = max(valid, key=lambda c: c.tflops or 0.0)
        return TuneOutcome(
            candidates=candidates,
            winner=winner,
            output=output,
            compile_start=compile_start,
            compile_end=compile_end,
            notes=op.notes(),
        )

    def _measure(
        self,
        op: CpuOp,
        kernel: Callable[[], None],
        name: str,
        flops: int,
        deadline: _Deadline,
        tried: int,
    ) -> Candidate:
        """Verify one run of `kernel` (it counts as warm-up), warm up, time the median."""
        op.poison()
        try:
            kernel()
        except Exception as exc:  # a candidate that crashes is invalid, not the job
            return Candidate(name, error=f"kernel failed: {type(exc).__name__}: {exc}")
        bad = op.check()
        if bad:
            return Candidate(name, error=bad)
        for _ in range(self.warmup - 1):
            kernel()
            deadline.check(tried)
        times = []
        for _ in range(self.repeats):
            t0 = time.perf_counter_ns()
            kernel()
            times.append(time.perf_counter_ns() - t0)
            deadline.check(tried)
        ns = max(float(statistics.median(times)), 1.0)
        return Candidate(name, kernel_time_ns=ns, tflops=flops / ns / 1e3)

    def _output(
        self, problem: Problem, op: CpuOp, ctx: TuneContext, candidates: list[Candidate]
    ) -> str:
        header = [
            f"# cpu tuner (NumPy): {problem.op} {problem.canonical()}",
            f"# space {ctx.tuning_space}: {len(candidates)} candidates; each verified against "
            f"a float64/exact reference ({op.tolerance()}), then {self.warmup} warm-up, "
            f"median of {self.repeats} runs (ns)",
            *(f"# {note}" for note in op.notes()),
        ]
        lines = [
            f"{c.perf_config}\t{c.kernel_time_ns:.0f}" if c.valid
            else f"{c.perf_config}\tinvalid: {c.error}"
            for c in candidates
        ]  # fmt: skip
        return "\n".join(header + lines) + "\n"


def _greedy(op: CpuOp, measure: Callable[[Blocks], Candidate]) -> None:
    """Coordinate descent over the full grid: sweep each axis in turn, keep the fastest."""
    grid = axes(op, "full")
    point = [values[len(values) // 2] for values in grid]
    best = measure(tuple(point))
    for _ in range(_GREEDY_ROUNDS):
        moved = False
        for i, values in enumerate(grid):
            for v in values:
                trial = (*point[:i], v, *point[i + 1 :])
                cand = measure(trial)
                if cand.valid and (not best.valid or (cand.tflops or 0) > (best.tflops or 0)):
                    best, point, moved = cand, list(trial), True
        if not moved:
            break
