"""What a build's tuningRunner.py can do, and the flags each capability takes: the one place
for them.

Read once from the tool's `--help` (detect_era): its flags, its tuning spaces, and from those
its capabilities (CAPABILITIES). Everything the tuner does differently per build asks for a
capability, and every error names the capability that is missing. The era names E2 … E4 are
labels only (rocMLIR's own newest E3 line has E4's --gpu-run-timeout; rocmlirTriton's E4 is the
one with two-stage jobs), kept because the file formats are named by them.
"""

from __future__ import annotations

import re
from dataclasses import dataclass
from pathlib import Path

from mlirtuna import keys
from mlirtuna.errors import TunerError, Unsupported
from mlirtuna.problems import Problem
from mlirtuna.tuners.base import TuneContext

_FLAG_RE = re.compile(r"(?<![\w-])--[A-Za-z][\w-]*")
_SPACES_RE = re.compile(r"--tuning-space\s*\{([^}]*)\}")
# Session settings -> (E4 flag, TuneContext field). sessions.py checks a session's against it.
E4_SETTINGS = (
    ("--rep", "rep_ms"),
    ("--warmup", "warmup_ms"),
    ("--gpu-run-timeout", "gpu_run_timeout_s"),
    ("--lfbo-effort", "lfbo_effort"),
)

# Capabilities: name -> the flags `--help` must list for it (all of them).
GPUS = "gpus"  # picks physical GPUs itself (--gpus); without it, the environment pins the GPU
BATCH = "batch"  # a list of configs in one call (-c), each row written as it finishes
TIMEOUT = "timeout"  # a per-config --timeout
GPU_RUN_TIMEOUT = "gpu-run-timeout"  # bounds each GPU run; a hang is state gpu_timed_out
TWO_STAGE = "two-stage"  # compile here (--compile-only), benchmark on a GPU host
TOPK = "topk-remeasure"  # re-measures the K fastest itself (--two-stage-topk; Discarded lines)
REP_WARMUP = "rep-warmup"  # time budgets per candidate (--rep, --warmup)
LFBO = "lfbo"  # the lfbo space's effort (--lfbo-effort)
# A proposed rocMLIR extension: one long-lived benchmark process fed bundles on stdin
# (docs/formats.md, "Streaming benchmarks").
STREAM = "stream"
CAPABILITIES: tuple[tuple[str, tuple[str, ...]], ...] = (
    (GPUS, ("--gpus",)),
    (BATCH, ("--configs-file", "--gpus")),  # E2's --configs_file writes its file at the end
    (TIMEOUT, ("--timeout",)),
    (GPU_RUN_TIMEOUT, ("--gpu-run-timeout",)),
    (TWO_STAGE, ("--compile-only", "--benchmark-artifacts", "--target-arch")),
    (TOPK, ("--two-stage-topk",)),
    (REP_WARMUP, ("--rep", "--warmup")),
    (LFBO, ("--lfbo-effort",)),
    (STREAM, ("--benchmark-stream",)),
)
# Measuring chosen perf configs (issue 45) is not tuningRunner's: neither rocMLIR's (3fc5be9e)
# nor rocmlirTriton's (520c8752) takes a list of perf configs. perfRunner's run_config_with_mlir
# times one as `rocmlir-gen LINE | rocmlir-tuning-driver --benchmark-config=PC … -`, and
# rocmlir-gen lists a problem's space (--emit-tuning-space=KIND). So this capability is read
# from those two tools' --help (tuners/rocmlir/chosen.py), not from tuningRunner.py's.
CHOSEN = "measure-chosen"
CHOSEN_DRIVER_FLAG = "--benchmark-config"  # rocmlir-tuning-driver: time this one perf config
LIST_SPACE_FLAG = "--emit-tuning-space"  # rocmlir-gen: print the space of a kind, one a line
# The capability each session setting needs.
SETTING_CAPABILITY = {
    "--rep": REP_WARMUP,
    "--warmup": REP_WARMUP,
    "--gpu-run-timeout": GPU_RUN_TIMEOUT,
    "--lfbo-effort": LFBO,
}
# What a build needs for two-stage jobs (rocmlir-newest.md §2).
SPLIT_FLAGS = dict(CAPABILITIES)[TWO_STAGE]


@dataclass(frozen=True)
class Era:
    """What one tuningRunner.py accepts, as read from its --help."""

    name: str  # a label: E2 | E2.5 | E3 | E4 (what it can do is `capabilities`)
    flags: frozenset[str]
    tuning_spaces: tuple[str, ...]

    @property
    def capabilities(self) -> tuple[str, ...]:
        """The capabilities whose flags `--help` lists, in CAPABILITIES order."""
        return tuple(name for name, need in CAPABILITIES if all(f in self.flags for f in need))

    def has(self, capability: str) -> bool:
        return capability in self.capabilities

    def describe(self) -> str:
        """One line: the label, the capabilities and the spaces, for sessions and errors."""
        caps = ", ".join(self.capabilities) or "one-stage only"
        spaces = ", ".join(self.tuning_spaces) or "not listed"
        return f"{self.name}: {caps}; spaces {spaces}"


def detect_era(help_text: str) -> Era:
    """The label from the capabilities: E4 if it has two-stage jobs (or is rocmlirTriton's
    runner by its prog name); E3 if it has --gpus (rocMLIR's newest E3 line also has
    --gpu-run-timeout); E2.5 if it has E2's flags and the greedy space; E2 if
    --rocmlir_gen_flags or --tflops but no --gpus."""
    flags = frozenset(_FLAG_RE.findall(help_text))
    match = _SPACES_RE.search(help_text)
    spaces = tuple(s.strip() for s in match.group(1).split(",")) if match else ()
    if "rocmlirTriton" in help_text or all(f in flags for f in SPLIT_FLAGS):
        return Era("E4", flags, spaces)
    if "--gpus" in flags:
        return Era("E3", flags, spaces)
    if "--rocmlir_gen_flags" in flags or "--tflops" in flags:
        return Era("E2.5" if "greedy" in spaces else "E2", flags, spaces)
    raise TunerError(
        "tuningRunner.py --help shows no known era's flags (E2, E2.5, E3, E4)", detail=help_text
    )


def build_key_form(script_dir: Path, era: Era) -> str:
    """The key form the build's perfRunner reads, from its perfRunner.py beside the
    tuningRunner.py that runs (how it parses and prints a line): -transO spelled (e4) where its
    gemm parser knows -transO (rocmlirTriton's GemmConfiguration always prints it, and its
    tuning-DB lookup is by that exact string), -supportsSplitK appended where it knows that flag
    (split-k; both: e4-split-k), else plain. Without a perfRunner.py to read: e4 for an E4
    build (rocmlirTriton's), else plain."""
    perf_runner = script_dir / "perfRunner.py"
    if not perf_runner.is_file():
        return keys.E4 if era.name == "E4" else keys.PLAIN
    text = perf_runner.read_text(encoding="utf-8", errors="replace")
    trans_o = keys.TRANS_O_FLAG in _class_text(text, "GemmConfiguration")
    split_k = keys.SPLIT_K_FLAG in text
    if trans_o:
        return keys.E4_SPLIT_K if split_k else keys.E4
    return keys.SPLIT_K if split_k else keys.PLAIN


def _class_text(source: str, name: str) -> str:
    """The text of one top-level class of a Python source (up to the next top-level line)."""
    start = source.find(f"\nclass {name}(")
    if start < 0:
        return ""
    end = re.search(r"\n(?=[^\s#])", source[start + 1 :])
    return source[start : start + 1 + end.start()] if end else source[start:]


def tool_vector(problem: Problem, key_form: str) -> str:
    """A problem's line as this build's tuningRunner canonicalizes it (so its rows, `.state`
    and index.json come back in the same spelling, and E4's gemm loader does not add a
    `-transO true` twin to a line without -transO)."""
    vector = problem.canonical()
    return keys.e4_vector(problem.op, vector) if keys.spells_trans_o(key_form) else vector


def lacks_split(script: Path, era: Era) -> str:
    """The one message for a build without two-stage jobs, naming what it lacks."""
    missing = [f for f in SPLIT_FLAGS if f not in era.flags]
    return (
        f"{script} lacks the {TWO_STAGE} capability (no {', '.join(missing)}), which two-stage "
        f"jobs need ({era.describe()})"
    )


def setting_flags(ctx: TuneContext, era: Era) -> list[str]:
    """The session settings as flags; TunerError for one this era lacks (never dropped)."""
    argv = []
    for flag, name in E4_SETTINGS:
        value = getattr(ctx, name)
        if value is None:
            continue
        if flag not in era.flags:
            raise TunerError(
                f"this tuningRunner.py has no {flag} (session setting): it lacks the "
                f"{SETTING_CAPABILITY[flag]} capability ({era.describe()})"
            )
        argv.append(f"{flag}={value}")
    return argv


def can_split(era: Era) -> bool:
    """Whether this tuningRunner can compile on one host and benchmark on another."""
    return era.has(TWO_STAGE)


def can_stream(era: Era) -> bool:
    """Whether this tuningRunner offers the benchmark stream with the two-stage flags."""
    return era.has(TWO_STAGE) and era.has(STREAM)


def can_batch(era: Era) -> bool:
    """Whether this tuningRunner tunes a list of configs in one call, writing each config's row
    as it finishes (E3, E4; E2 writes its file only at the end)."""
    return era.has(BATCH)


def tool_space(ctx: TuneContext) -> str:
    """The --tuning-space tuningRunner.py gets for a job (space_of its session's space)."""
    return space_of(ctx.tuning_space)


def space_of(tuning_space: str) -> str:
    """The tool's space for a session's. A `list:NAME` session that tuningRunner runs (a build
    that cannot measure chosen configs: chosen.py) runs the tool's `quick` space: rocMLIR
    compiles its quick list in (QuickTuningPerfconfigs.inc), so a list becomes rocMLIR's own by
    writing it with `quick-list --format inc` into the source and rebuilding."""
    return "quick" if tuning_space.startswith("list:") else tuning_space


def check_space(ctx: TuneContext, era: Era) -> None:
    """Unsupported when this era does not offer the session's space (no retry can help)."""
    if era.tuning_spaces and tool_space(ctx) not in era.tuning_spaces:
        raise Unsupported(  # the same for every job of the session: no retry
            f"this tuningRunner.py has no tuning space {tool_space(ctx)!r} ({era.describe()})"
        )


def tool_flags(help_text: str) -> frozenset[str]:
    """The long flags a tool's --help lists (tuningRunner's argparse, or an LLVM tool's)."""
    return frozenset(_FLAG_RE.findall(help_text))


def listed_kinds(help_text: str, flag: str = LIST_SPACE_FLAG) -> tuple[str, ...]:
    """The values an LLVM `--help` lists under an enum option (`  --flag=<value> - …` then
    `    =quick - …` lines); () where the option takes none (rocmlir-gen's older boolean
    --emit-tuning-space, which lists no kind) or is absent."""
    lines = help_text.splitlines()
    start = next((i for i, line in enumerate(lines) if line.strip().startswith(f"{flag}=")), None)
    if start is None:
        return ()
    kinds = []
    for line in lines[start + 1 :]:
        value = line.strip()
        if not value.startswith("="):
            break
        kinds.append(value[1:].split()[0])
    return tuple(kinds)


def lacks_chosen(what: str, era: Era) -> str:
    """The one message for a build that cannot measure chosen perf configs, naming what its
    tools lack (`what`)."""
    return f"this build cannot measure chosen perf configs ({CHOSEN}): {what} ({era.describe()})"
