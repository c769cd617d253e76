"""An op, declared once: the OpSpec each problems/<op>.py module exports as `SPEC`.

Everything the layers above need to know about one op and cannot read off its problem dataclass
is a field here, so that a new op is its module (plus its table, its CPU kernel and the stand-in:
docs/adding-an-op.md) and no list elsewhere names it:

- `sniff`: how a config line or test vector is recognised as this op (`run --op auto`,
  `import-tsv`, a tool's written key): the one rule is `problems.op_of`, which asks the specs in
  `sniff_rank` order (the most specific first) and takes the first that claims the words;
- `table`: its config table in db/models.py, whose columns are the dataclass's fields (a test
  checks every spec against the models);
- `debug`: its `.debug` columns (formats/debug.py), read back by the rocmlir tuner and written
  by `export --format debug`;
- `attention_kernel`: rocMLIR tunes it with the attention attribute, so its perf configs are
  the `attn:…` family (and an `attn:` perf config fits no other op: `OpSpec.fits`);
- `inc_section`: the QuickTuningPerfconfigs.inc instruction section its lists go to whatever
  the arch (attention: GemmGemm); None: the arch's (XDL, Wmma, NonAccel).
"""

from __future__ import annotations

import dataclasses
import importlib
import pkgutil
from collections.abc import Callable, Iterable, Sequence
from dataclasses import dataclass
from types import ModuleType

from mlirtuna.formats.debug import Layout

# A perf config of rocMLIR's attention attribute (or the CPU tuner's stand-in for it).
ATTENTION_PERF_PREFIXES = ("attn:", "cpu:attn:")


@dataclass(frozen=True)
class OpSpec:
    """What one op is, for every layer (module docstring)."""

    name: str
    problem: type  # the frozen dataclass (Cls.op == name); its fields are `table`'s columns
    table: str  # its config table (db/models.py), joined to `problem` by id
    flags: frozenset[str]  # the flags its config lines take (empty: no config-line form)
    # Whether a config line's / test vector's words are this op's; None: never (fusion's
    # problems are .mlir modules). Asked in sniff_rank order: it may assume the specs ranked
    # before it said no.
    sniff: Callable[[Sequence[str]], bool] | None
    sniff_rank: int
    debug: Layout | None  # its .debug columns; None: the tool writes another op's rows
    attention_kernel: bool = False
    inc_section: str | None = None
    config_list: bool = True  # read from rocMLIR config lists (fusion: .mlir modules)

    @property
    def columns(self) -> tuple[str, ...]:
        """The config table's columns mlirtuna fills: the dataclass's fields."""
        return tuple(f.name for f in dataclasses.fields(self.problem))

    def fits(self, perf_config: str) -> bool:
        """Whether a perf config can be one of this op's: an attention perf config names no
        conv or gemm kernel."""
        attention = perf_config.strip().startswith(ATTENTION_PERF_PREFIXES)
        return not attention or self.attention_kernel


def op_of(specs: Iterable[OpSpec], words: Sequence[str]) -> str | None:
    """The one op-guessing rule over `specs`: the first, in sniff_rank order, whose sniffer
    claims the words (None: none does). problems.op_of asks every op; a fusion module's tuning
    key, the ops a key can be (problems/fusion.py)."""
    ranked = sorted((s for s in specs if s.sniff is not None), key=lambda s: s.sniff_rank)
    return next((s.name for s in ranked if s.sniff is not None and s.sniff(words)), None)


def op_modules(package: str, path: Sequence[str]) -> dict[str, ModuleType]:
    """The modules of `package` (found on `path`) that define SPEC, by op: config-list ops
    first, then module ops, each alphabetical. problems/ finds its ops so, with no roster to
    edit. A module's SPEC must name it (ImportError: `--op gemm` would read another op's)."""
    found: dict[str, ModuleType] = {}
    for info in pkgutil.iter_modules(path):
        module = importlib.import_module(f"{package}.{info.name}")
        spec = getattr(module, "SPEC", None)
        if spec is None:
            continue  # a helper (flags, spec, configlist, migraphx)
        if spec.name != info.name or spec.problem.op != info.name:
            raise ImportError(f"problems/{info.name}.py declares op {spec.name!r}")
        found[info.name] = module
    order = sorted(found, key=lambda op: (not found[op].SPEC.config_list, op))
    return {op: found[op] for op in order}
