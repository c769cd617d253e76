"""The nouns every step of a quick list shares: a Group (arch, op, data type), its History
(the measurements collect.py reads), the Options a list is made with, and the GroupList made.

Nothing of the database: cover, evaluate and across work on these alone.
"""

from __future__ import annotations

from collections.abc import Callable, Iterable
from dataclasses import asdict, dataclass, field
from typing import Any

from mlirtuna.defaults import DEFAULT_QUICK_THRESHOLD as DEFAULT_THRESHOLD
from mlirtuna.errors import UserError


@dataclass(frozen=True, order=True)
class Group:
    """What one list is for: an arch (a chip, or `cpu-<ISA>`), an op and a data type."""

    arch: str
    op: str
    data_type: str

    def __str__(self) -> str:
        return f"{self.arch} {self.op} {self.data_type}"


#: How a listed perf config reads on a given problem (the CPU tuner clips block sizes to the
#: problem's dims, so `cpu:v1:256,…` on a 100-row problem is the measured `cpu:v1:100,…`).
#: The tuner that owns a perf config says so (TunerKind.listed); collect.py asks it.
Resolver = Callable[[str, int], str]
#: The portable names of a measured perf config on a problem (Resolver's inverse).
Expander = Callable[[str, int], list[str]]


@dataclass
class History:
    """One group's measurements: {problem_id: {perf_config: best TFlops}}."""

    group: Group
    perf: dict[int, dict[str, float]]
    vectors: dict[int, str]
    resolve: Resolver = field(default=lambda pc, pid: pc, repr=False)
    #: The portable names of a measured perf config (cpu: every grid value a clipped one means).
    expand: Expander = field(default=lambda pc, pid: [pc], repr=False)

    def achieved(self, pc: str, pid: int) -> float | None:
        return self.perf[pid].get(self.resolve(pc, pid))

    def best(self, pid: int) -> float:
        return max(self.perf[pid].values())

    def configs(self) -> list[str]:
        return sorted(
            {n for pid, row in self.perf.items() for pc in row for n in self.expand(pc, pid)}
        )

    def covers(self, pids: Iterable[int], threshold: float) -> dict[int, set[str]]:
        """{problem: the (portable) perf configs reaching threshold x its best}.

        Linear in the measurements: a name covers a problem exactly when what it resolves to
        there is a good measured config, i.e. when it is one of the good configs' portable names.
        """
        out = {}
        for pid in pids:
            floor = threshold * self.best(pid)
            good = (pc for pc, tf in self.perf[pid].items() if tf >= floor)
            out[pid] = {name for pc in good for name in self.expand(pc, pid)}
        return out


@dataclass
class Options:
    """How the lists are made (`quick-list`'s options)."""

    threshold: float = DEFAULT_THRESHOLD
    max_size: int | None = None
    top_k: int | None = None  # the per-problem variant instead of the set cover
    across: str | None = None  # one list for an arch (problem) none of the history's is

    def check(self) -> None:
        if not 0 < self.threshold <= 1:
            raise UserError(f"--threshold must be in (0, 1], not {self.threshold}")
        if self.max_size is not None and self.max_size < 1:
            raise UserError("--max-size must be at least 1")
        if self.top_k is not None and (self.top_k < 1 or self.max_size is not None):
            raise UserError("--top-k K (K >= 1) is the per-problem variant: not with --max-size")


@dataclass
class GroupList:
    """One group's list as made: its perf configs, in the order a tuner should try them."""

    group: Group
    perf_configs: list[str]
    problems: int
    uncovered: list[str]  # test vectors
    method: str
    evaluation: dict[str, Any] | None = None

    def as_dict(self) -> dict[str, Any]:
        d = asdict(self)
        d.update(asdict(self.group))
        del d["group"]
        return d
