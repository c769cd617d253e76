"""The built-in CPU reference tuner: compiles nothing, really measures.

Each op runs with NumPy as a blocked implicit GEMM (attention: a blocked online softmax)
under a space of tiling perf configs (`kernels`; the fused ops in `fused`; `ops` says which
class runs which op). Every candidate is first checked against a plain float64 / exact-int
reference computed once per job, and only then timed by the harness in `timing` (one BLAS
thread, a warm-up and a measurement time budget, the median and spread of the runs, slow
outliers discarded). After the search the `ctx.topk` fastest
candidates are measured again, interleaved (A B C A B C ...), and the winner is the fastest of
that re-measurement; the outcome's `margin` says how far it is ahead of the runner-up and
whether that is within their noise.

Perf configs: `cpu:v1:mPerBlock,nPerBlock,kPerBlock` for gemm and conv (tiling the op's
implicit GEMM), `cpu:attn:v1:qBlock,kvBlock` for attention. Block sizes are clipped to the
problem's dims and equivalent configs deduplicated. Tuning spaces:

- quick: a curated list of at most 8 configs;
- full: the product of a coarse grid per axis (up to 100 gemm/conv, 20 attention configs);
- greedy: coordinate descent over the full grid (each axis swept in turn, at most 3 rounds),
  so never more than full;
- exhaustive: the product of the fine grid (up to 252 gemm/conv, 42 attention configs);
- list:NAME: exactly the perf configs of a stored quick list (history/quick/) for the problem's
  (arch, op, data type), clipped like the rest; the worker hands them over in the context.

It is a SearchableTuner (tuners.base): `search_space` lists a space's configs (greedy: the full
grid it walks), and a context with `perf_configs` set (a searched session's round, issue 45)
measures exactly those, whatever the space.
"""

from __future__ import annotations

import dataclasses
import datetime as dt
import functools
import itertools
import math
import time
from collections.abc import Callable, Iterable, Mapping

import numpy as np

import mlirtuna.tuners.timing as timing
from mlirtuna import stats
from mlirtuna.errors import TunerError, TunerTimeout, Unsupported
from mlirtuna.problems import Problem
from mlirtuna.stats import Spread
from mlirtuna.tuners.base import Candidate, TuneContext, TuneOutcome
from mlirtuna.tuners.cpu.kernels import Blocks, CpuOp
from mlirtuna.tuners.cpu.ops import make_op
from mlirtuna.tuners.registry import Listed, TunerKind, fields_by_layout
from mlirtuna.tuners.timing import Budget

#: A kernel a test (or an experiment) adds to the space: it runs the op given the op's data
#: (`op.outputs` must be written; `op.run_blocked(blocks)` runs a built-in tiling).
ExtraKernel = Callable[[CpuOp], None]

SPACES = ("quick", "full", "greedy", "exhaustive")
_GREEDY_ROUNDS = 3
#: Per candidate in the search, and per candidate in the top-k re-measurement (interleaved).
SEARCH_BUDGET = Budget(warmup_ms=5.0, rep_ms=25.0, min_samples=5)
TOPK_BUDGET = Budget(warmup_ms=5.0, rep_ms=100.0, min_samples=10)
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


def listed(problem: Problem) -> Listed:
    """Its TunerKind.listed: what a quick list's portable cpu: names mean on this problem."""
    return Listed(resolve=resolver(problem), expand=portable(problem))


def _op(problem: Problem, ctx: TuneContext) -> CpuOp:
    """The op to tune, or Unsupported: what the cpu tuner can never run (a data type, layout,
    direction or size it lacks) fails at once and is not retried."""
    try:
        op = make_op(problem)  # checks the problem; allocates nothing
    except TunerError as exc:
        raise Unsupported(str(exc), exc.detail) from None
    if ctx.tuning_space not in SPACES and not ctx.tuning_space.startswith("list:"):
        raise Unsupported(f"unknown tuning space {ctx.tuning_space!r} (one of {', '.join(SPACES)})")
    need = op.mem_bytes() + harness_bytes(ctx.topk)
    if need > ctx.cpu_mem_limit:
        limit = _gib(ctx.cpu_mem_limit)
        raise Unsupported(f"problem needs ~{_gib(need)} GiB, over --cpu-mem-limit {limit} GiB")
    return op


def harness_bytes(topk: int) -> int:
    """What timing itself may hold beside the op's buffers: the samples of the top-k
    re-measurement (at most max_samples Python ints, ~40 bytes each, per candidate)."""
    return max(topk, 1) * TOPK_BUDGET.max_samples * 40


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

    `budget` is the time budget of each candidate in the search, `topk_budget` that of each
    candidate in the top-k re-measurement; `repeats=N` is shorthand for exactly N timed runs in
    both (tests). `clock` is the timing clock (ns; the thread's CPU time, see `timing`).
    `extra_kernels` maps a perf config name to a kernel that is tried (verified, then timed)
    alongside the built-in space: the hook tests use to inject a wrong kernel.
    """

    name = "cpu"

    def __init__(
        self,
        repeats: int | None = None,
        seed: int = 0,
        extra_kernels: Mapping[str, ExtraKernel] | None = None,
        *,
        budget: Budget = SEARCH_BUDGET,
        topk_budget: Budget = TOPK_BUDGET,
        clock: timing.Clock = time.thread_time_ns,
    ) -> None:
        if repeats is not None:
            budget = topk_budget = Budget.fixed(repeats)
        self.budget, self.topk_budget, self.clock = budget, topk_budget, clock
        self.seed = seed
        self.extra_kernels = dict(extra_kernels or {})

    def tune(self, problem: Problem, ctx: TuneContext) -> TuneOutcome:
        with timing.one_blas_thread():
            return self._tune(problem, ctx)

    def search_space(self, problem: Problem, ctx: TuneContext) -> list[str]:
        """Every perf config of the context's space for this problem, in the space's order
        (greedy: the full grid it walks; list:NAME: the quick list's, clipped)."""
        op = _op(problem, ctx)
        if ctx.tuning_space.startswith("list:"):
            blocks = list_blocks(op, ctx.perf_configs)
        elif ctx.tuning_space == "greedy":
            blocks = list(itertools.product(*axes(op, "full")))
        else:
            blocks = space(op, ctx.tuning_space)
        return [op.perf_config(b) for b in blocks]

    def _tune(self, problem: Problem, ctx: TuneContext) -> TuneOutcome:
        deadline = _Deadline(ctx.timeout_s)
        op = _op(problem, ctx)
        listed = ctx.tuning_space.startswith("list:")
        compile_start = _now()
        op.setup(np.random.default_rng(self.seed))  # data + reference
        deadline.check(0)
        tried: dict[str, Candidate] = {}
        kernels: dict[str, timing.Kernel] = {}
        flops = problem.flops()

        def measure(name: str, kernel: timing.Kernel) -> Candidate:
            if name not in tried:
                deadline.check(len(tried))
                tried[name] = self._measure(op, kernel, name, flops, deadline, len(tried))
                kernels[name] = kernel
            return tried[name]

        def builtin(blocks: Blocks) -> Candidate:
            return measure(op.perf_config(blocks), lambda: op.run_blocked(blocks))

        chosen = ctx.perf_configs is not None and not listed  # a search's round: only those
        if listed or chosen:
            for blocks in list_blocks(op, ctx.perf_configs):
                builtin(blocks)
        elif ctx.tuning_space == "greedy":
            _greedy(op, builtin)
        else:
            for blocks in space(op, ctx.tuning_space):
                builtin(blocks)
        for name, kernel in self.extra_kernels.items() if not chosen else ():
            measure(name, functools.partial(kernel, op))
        if not any(c.valid for c in tried.values()):
            output = self._output(problem, op, ctx, list(tried.values()))
            first = next(iter(tried.values()), None)
            reason = first.error if first else "empty space"
            raise TunerError(
                f"no valid perf config: {len(tried)} tried, first: {reason}", detail=output
            )
        self._remeasure_top(tried, kernels, ctx.topk, flops, deadline)
        compile_end = _now()
        candidates = list(tried.values())
        winner, margin = pick_winner(candidates)
        return TuneOutcome(
            candidates=candidates,
            winner=winner,
            output=self._output(problem, op, ctx, candidates),
            compile_start=compile_start,
            compile_end=compile_end,
            notes=op.notes(),
            margin=margin,
        )

    def _measure(
        self,
        op: CpuOp,
        kernel: timing.Kernel,
        name: str,
        flops: int,
        deadline: _Deadline,
        tried: int,
    ) -> Candidate:
        """Verify one run of `kernel` (it counts as warm-up), then time it for the budget."""
        op.poison()
        try:
            kernel()
        except Exception as exc:  # a candidate that crashes is invalid, not the job
            return Candidate(name, error=f"kernel failed: {type(exc).__name__}: {exc}")
        bad = op.check()
        if bad:
            return Candidate(name, error=bad)
        spread = timing.measure(
            kernel, self.budget, clock=self.clock, tick=lambda: deadline.check(tried)
        )
        return timed(name, spread, flops)

    def _remeasure_top(
        self,
        tried: dict[str, Candidate],
        kernels: Mapping[str, timing.Kernel],
        k: int,
        flops: int,
        deadline: _Deadline,
    ) -> None:
        """Measure the k fastest valid candidates again, interleaved; their numbers replace
        the search's (a single candidate has nothing to be compared with: it is kept)."""
        top = [c.perf_config for c in shortlist(tried.values(), k)]
        if len(top) < 2:
            return
        spreads = timing.measure_interleaved(
            {name: kernels[name] for name in top},
            self.topk_budget,
            clock=self.clock,
            tick=lambda: deadline.check(len(tried)),
        )
        for name, spread in spreads.items():
            search = tried[name].kernel_time_ns  # kept: quick lists learn from the search's
            tried[name] = dataclasses.replace(
                timed(name, spread, flops, remeasured=True), search_time_ns=search
            )

    def _output(
        self, problem: Problem, op: CpuOp, ctx: TuneContext, candidates: list[Candidate]
    ) -> str:
        b, t = self.budget, self.topk_budget
        header = [
            f"# cpu tuner (NumPy): {problem.op} {problem.canonical()}",
            f"# space {ctx.tuning_space}: {len(candidates)} candidates; each verified against "
            f"a float64/exact reference ({op.tolerance()}), then timed on one BLAS thread: "
            f"{b.warmup_ms:g} ms warm-up, {b.rep_ms:g} ms (>= {b.min_samples} runs); "
            f"top {ctx.topk} again interleaved, {t.rep_ms:g} ms each (>= {t.min_samples} runs)",
            "# perf_config\tmedian_ns\tmin_ns\tiqr_ns\tsamples[\tremeasured]",
            *(f"# {note}" for note in op.notes()),
        ]
        lines = [_output_line(c) for c in candidates]
        return "\n".join(header + lines) + "\n"


def timed(name: str, spread: Spread, flops: int, remeasured: bool = False) -> Candidate:
    """A valid candidate from its timing statistics (ns): time = median, TFlops from it."""
    ns = max(spread.median, 1.0)
    return Candidate(
        name, kernel_time_ns=ns, tflops=flops / ns / 1e3, spread=spread, remeasured=remeasured
    )


def shortlist(candidates: Iterable[Candidate], k: int) -> list[Candidate]:
    """The k valid candidates to re-measure: the fastest by their *minimum* time. Interference
    only ever adds time, so a single search-pass measurement's minimum ranks kernels more
    repeatably than its median on a busy machine (docs/benchmarks.md)."""
    valid = [c for c in candidates if c.valid]
    return sorted(valid, key=_best_time)[: max(k, 0)]


def _best_time(c: Candidate) -> float:
    if c.spread is not None and c.spread.min is not None:
        return c.spread.min
    return c.kernel_time_ns or math.inf


def fastest(candidates: Iterable[Candidate], k: int) -> list[Candidate]:
    """The k valid candidates with the most TFlops, best first."""
    valid = [c for c in candidates if c.valid]
    return sorted(valid, key=lambda c: -(c.tflops or 0.0))[: max(k, 0)]


def pick_winner(candidates: list[Candidate]) -> tuple[Candidate, stats.Margin | None]:
    """The winner and its margin over the runner-up. Re-measured candidates, when there are
    any, are compared among themselves only: they were measured side by side."""
    pool = [c for c in candidates if c.remeasured and c.valid] or candidates
    best = fastest(pool, 2)
    if not best:
        raise TunerError("no valid perf config")
    if len(best) < 2 or best[0].spread is None or best[1].spread is None:
        return best[0], None
    return best[0], stats.margin(best[0].spread, best[1].spread)


def _output_line(c: Candidate) -> str:
    if not c.valid:
        return f"{c.perf_config}\tinvalid: {c.error}"
    s = c.spread
    if s is None:
        return f"{c.perf_config}\t{c.kernel_time_ns:.0f}"
    again = "\tremeasured" if c.remeasured else ""
    return f"{c.perf_config}\t{s.median:.0f}\t{s.min:.0f}\t{s.iqr:.0f}\t{s.samples}{again}"


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


#: The fields of each perf-config layout (the dashboard's columns): gemm and conv tile the op's
#: implicit GEMM (CpuOp.prefix "cpu:v1"), attention its query and key/value blocks.
FIELDS = {
    "cpu:v1": ("mPerBlock", "nPerBlock", "kPerBlock"),
    "cpu:attn:v1": ("qBlock", "kvBlock"),
}

KIND = TunerKind(
    name="cpu",
    make=lambda _arg, _build_dir: CpuTuner(),
    spaces=SPACES,
    perf_prefix="cpu",
    unsupported=unsupported,
    measures_cpu=True,
    listed=listed,
    perf_fields=fields_by_layout(FIELDS),
)
