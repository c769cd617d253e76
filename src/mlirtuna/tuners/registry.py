"""The tuner registry: what each tuner is, in one place.

A tuner is known by a `TunerKind`: how to make it, whether its workers are one per GPU, its
tuning spaces, the prefix of its perf configs, how its tools are stopped when a worker loses a
job's lease, and what `session new` checks against its build. The worker, sessions, `run` and the
CLI ask the registry; nothing outside tuners/ branches on a tuner's name.

Where kinds come from, in this order:
- the built-ins (BUILT_IN: rocmlir, cpu, sleep), each declared next to its tuner;
- plugins installed as entry points of the group `mlirtuna.tuners` (ENTRY_POINT_GROUP): the entry
  point's name is the tuner's name, its object a TunerKind (docs/adding-a-tuner.md);
- `module.path:attr` named on the command line: a TunerKind, or (the older form) a callable
  returning a tuner, which gets CPU workers and unchecked perf configs.

A tuner spec is `NAME` or `NAME:ARG` (`sleep:0.2`; what ARG means is the kind's `arg`).
"""

from __future__ import annotations

import functools
import importlib
from collections.abc import Callable, Iterable, Sequence
from dataclasses import dataclass
from importlib import metadata
from pathlib import Path

from mlirtuna.errors import UserError
from mlirtuna.problems import Problem
from mlirtuna.tuners.base import TuneContext, Tuner
from mlirtuna.tuners.process import kill_tools

ENTRY_POINT_GROUP = "mlirtuna.tuners"
#: The built-in tuners, loaded as plugins are (`module:attr` of their TunerKind).
BUILT_IN = {
    "rocmlir": "mlirtuna.tuners.rocmlir.kind:KIND",
    "cpu": "mlirtuna.tuners.cpu:KIND",
    "sleep": "mlirtuna.tuners.sleep:KIND",
}
#: `run --tuner auto`: the first when a rocMLIR build dir is given, the second when none is.
AUTO = ("rocmlir", "cpu")

#: (build dir, tuning space, the session's setting flags) -> (key form, capabilities).
BuildCheck = Callable[[str, str, Sequence[str]], tuple[str, str]]


@dataclass(frozen=True)
class TunerKind:
    """What a tuner is, as the rest of mlirtuna needs to know it."""

    name: str
    #: (ARG of `NAME:ARG`, "" without one; the rocMLIR build dir or None) -> a tuner.
    make: Callable[[str, str | None], Tuner]
    #: True: one worker per GPU under `--gpus auto`, and a session describes the GPU (arch,
    #: CUs from rocminfo); False: CPU workers, and a session describes this machine's CPU.
    gpu: bool = False
    #: Its tuning spaces; None: any the session allows (a build may narrow them: check_build).
    spaces: tuple[str, ...] | None = None
    #: The first word of its perf configs (`cpu` of `cpu:v1:…`); "" for the tuner whose perf
    #: configs carry no tuner prefix (rocmlir's v2:…, attn:v1:…); None: not checked.
    perf_prefix: str | None = None
    #: Kills every tool the given thread started (a job's lease was lost); the number killed.
    #: The default knows the tools started through tuners.process.
    stop_tools: Callable[[int], int] = kill_tools
    #: True: it runs a rocMLIR build (--mlir-build-dir); `run` picks it when a build is given.
    uses_build: bool = False
    #: Checks a session against the build (None: nothing to check).
    check_build: BuildCheck | None = None
    #: Checks that the build can run two-stage (compile, benchmark) sessions; None: it cannot.
    check_split_build: Callable[[str], None] | None = None
    #: Two-stage bundles: several compiled directories moved into one (a batch benchmarked in
    #: one call), and the commits that compiled a directory (checked against the session's).
    merge_artifacts: Callable[[list[Path], Path], None] | None = None
    artifact_commits: Callable[[Path], set[str]] | None = None
    #: Refuses (TunerError) an unpacked bundle whose own files name what it must not (a path
    #: out of it): a job-level fault, checked before anything uses those names.
    check_artifacts: Callable[[Path], None] = lambda _directory: None
    #: Session settings only this tuner takes: (flag, SessionSpec field).
    settings: tuple[tuple[str, str], ...] = ()
    #: Why it can never run a problem (`run` leaves those out), or None; None: it can try all.
    unsupported: Callable[[Problem, TuneContext], str | None] | None = None
    #: True: its numbers are this machine's CPU's, so its session's arch is the CPU's
    #: (`cpu-<ISA>`), never a GPU's: `export --arch gfx942` would put them in that GPU's
    #: tuning DB. (The sleep tuner stands in for GPU sessions in tests: False.)
    measures_cpu: bool = False
    #: What ARG of `NAME:ARG` means ("SECONDS"); "" when it takes none.
    arg: str = ""
    #: (problem measured on, problem searched) -> the searched problem's perf configs that one
    #: measured there stands for (the cpu tuner clips block sizes to dims); None: the same
    #: name only. A search's history of other problems (worker/search.py) is read through it.
    carried: Callable[[Problem, Problem], Callable[[str], list[str]]] | None = None

    def owns(self, perf_config: str) -> bool:
        """Whether a perf config is of this tuner's family (True when that is not checked)."""
        return self.perf_prefix is None or family_of(perf_config) == self.name


def split_spec(spec: str) -> tuple[str, str]:
    """(NAME, ARG) of a tuner spec; a `module.path:attr` plugin is named by the whole spec."""
    name, _, arg = spec.partition(":")
    return (spec, "") if "." in name else (name, arg)


def kind(spec: str) -> TunerKind:
    """The kind of a tuner spec; UserError for one that is unknown or does not load."""
    name, arg = split_spec(spec)
    if "." in name:
        return _by_path(spec)
    ref = BUILT_IN.get(name) or _entry_points().get(name)
    found = _load(name, ref) if ref else None  # only this plugin is imported
    if found is None:
        raise UserError(
            f"unknown tuner {spec!r} (known: {', '.join(names())}, or module.path:factory)"
        )
    if arg and not found.arg:
        raise UserError(f"unknown tuner {spec!r}: {name} takes no argument")
    return found


def make(spec: str, *, mlir_build_dir: str | None = None) -> Tuner:
    """A tuner for a spec (a name, `NAME:ARG`, or `module.path:attr`)."""
    found = kind(spec)
    return found.make(split_spec(spec)[1], mlir_build_dir)


#: The memory a problem may use where no worker's --cpu-mem-limit is known (`jobs load`):
#: none is assumed, so a problem is left out only for what no worker can ever run.
ANY_MEMORY = 1 << 62


def cannot_run(
    spec: str, tuning_space: str, problems: Iterable[Problem], cpu_mem_limit: int = ANY_MEMORY
) -> dict[str, list[str]]:
    """{why: test vectors} of the problems this tuner can never run (the cpu tuner's fp8, 3-D
    conv, …: its TunerKind.unsupported), for `run` and `jobs load` to leave out and say so,
    instead of queueing jobs that fail. `cpu_mem_limit`: the worker's, where it is known."""
    unsupported = kind(spec).unsupported
    if unsupported is None:
        return {}
    # What the check depends on is the problem, the space and the memory limit only.
    ctx = TuneContext(
        arch="cpu",
        arch_full="cpu",
        num_cu=1,
        num_chiplets=1,
        tuning_space=tuning_space,
        gpu_id=-1,
        cpu_mem_limit=cpu_mem_limit,
    )
    out: dict[str, list[str]] = {}
    for p in problems:
        why = unsupported(p, ctx)
        if why is not None:
            out.setdefault(why, []).append(p.canonical())
    return out


def names() -> list[str]:
    """Every registered tuner's name: the built-ins, then installed plugins."""
    return [*BUILT_IN, *sorted(_entry_points().keys() - BUILT_IN.keys())]


def family_of(perf_config: str) -> str:
    """Which registered tuner wrote a perf config, by its first word (`cpu:…`, `sleep:…`, a
    plugin's prefix); else the tuner whose perf configs carry no prefix (rocmlir: v2:…, v3:…,
    attn:v1:… and the bare comma lists of older rocMLIR). Not keys.perf_config_family, which
    tells a perf config's format apart (v2, attn:v1, …)."""
    prefixes = _prefixes()
    return prefixes.get(perf_config.partition(":")[0], prefixes.get("", ""))


@functools.cache
def _prefixes() -> dict[str, str]:
    return {k.perf_prefix: k.name for k in _known().values() if k.perf_prefix is not None}


def _known() -> dict[str, TunerKind]:
    """Every registered kind (each plugin imported)."""
    return {name: _load(name, ref) for name, ref in {**_entry_points(), **BUILT_IN}.items()}


@functools.cache
def _entry_points() -> dict[str, str]:
    """{name: `module:attr`} of the installed plugins (read once per process)."""
    return {ep.name: ep.value for ep in metadata.entry_points(group=ENTRY_POINT_GROUP)}


@functools.cache
def _load(name: str, ref: str) -> TunerKind:
    module, _, attr = ref.partition(":")
    found = _import(module, attr)
    if not isinstance(found, TunerKind) or found.name != name:
        raise UserError(f"tuner plugin {name} ({ref}): expected a TunerKind named {name!r}")
    return found


def _by_path(spec: str) -> TunerKind:
    module, _, attr = spec.partition(":")
    if not attr:
        raise UserError(f"unknown tuner {spec!r}: expected module.path:factory")
    found = _import(module, attr)
    if isinstance(found, TunerKind):
        return found
    if not callable(found):
        raise UserError(f"cannot load tuner {spec}: {attr} is neither a TunerKind nor callable")
    # The older form: a factory of tuners, CPU workers, perf configs unchecked.
    return TunerKind(name=spec, make=lambda _arg, _build: found())


def _import(module: str, attr: str) -> object:
    try:
        return getattr(importlib.import_module(module), attr)
    except (ImportError, AttributeError) as exc:
        raise UserError(f"cannot load tuner {module}:{attr}: {exc}") from None
