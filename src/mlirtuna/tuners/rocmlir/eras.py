"""The eras of tuningRunner.py and the flags each takes: the one place for them.

An era is read once from the tool's `--help` (detect_era). See the package docstring for what
each era does differently; this module says which flags and spaces it has.
"""

from __future__ import annotations

import re
from dataclasses import dataclass
from pathlib import Path

from mlirtuna import keys
from mlirtuna.errors import TunerError, Unsupported
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
# Eras driven like E2 (device through the environment, --tflops) and like E3 (--gpus).
E2_LIKE = ("E2", "E2.5")
# What a build needs for two-stage jobs (E4, rocmlir-newest.md §2).
SPLIT_FLAGS = ("--compile-only", "--benchmark-artifacts", "--target-arch")
# Eras that write each config's row as it finishes, so a list of configs can be one call.
BATCH_ERAS = ("E3", "E4")
# A proposed rocMLIR extension, found by its flag in --help (flag token -> capability): one
# long-lived benchmark process fed bundles on stdin (docs/formats.md, "Streaming benchmarks").
STREAM_CAPABILITY = ("--benchmark-stream", "stream")


@dataclass(frozen=True)
class Era:
    """What one tuningRunner.py accepts, as read from its --help."""

    name: str  # E2 | E2.5 | E3 | E4
    flags: frozenset[str]
    tuning_spaces: tuple[str, ...]


def detect_era(help_text: str) -> Era:
    """E4 if it is rocmlirTriton's runner (its prog name, or --gpu-run-timeout); E3 if it has
    --gpus; E2.5 if it has E2's flags and the greedy space; E2 if --rocmlir_gen_flags or
    --tflops but no --gpus."""
    flags = frozenset(_FLAG_RE.findall(help_text))
    match = _SPACES_RE.search(help_text)
    spaces = tuple(s.strip() for s in match.group(1).split(",")) if match else ()
    if "rocmlirTriton" in help_text or "--gpu-run-timeout" in flags:
        return Era("E4", flags, spaces)
    if "--gpus" in flags:
        return Era("E3", flags, spaces)
    if "--rocmlir_gen_flags" in flags or "--tflops" in flags:
        return Era("E2.5" if "greedy" in spaces else "E2", flags, spaces)
    raise TunerError(
        "tuningRunner.py --help shows no known era's flags (E2, E2.5, E3, E4)", detail=help_text
    )


def build_key_form(build_dir: Path, era: Era) -> str:
    """The key form the build's perfRunner reads: split-k where its perfRunner.py knows
    -supportsSplitK (or, without one to read, for E4, whose keys carry it), else plain."""
    perf_runner = build_dir / "bin" / "perfRunner.py"
    if perf_runner.is_file():
        text = perf_runner.read_text(encoding="utf-8", errors="replace")
        return keys.SPLIT_K if keys.SPLIT_K_FLAG in text else keys.PLAIN
    return keys.SPLIT_K if era.name == "E4" else keys.PLAIN


def setting_flags(ctx: TuneContext, era: Era) -> list[str]:
    """The session settings as flags; TunerError for one this era lacks (never dropped)."""
    argv = []
    for flag, name in E4_SETTINGS:
        value = getattr(ctx, name)
        if value is None:
            continue
        if flag not in era.flags:
            raise TunerError(f"this tuningRunner.py ({era.name}) has no {flag} (session setting)")
        argv.append(f"{flag}={value}")
    return argv


def can_split(era: Era) -> bool:
    """Whether this tuningRunner can compile on one host and benchmark on another."""
    return all(flag in era.flags for flag in SPLIT_FLAGS)


def can_stream(era: Era) -> bool:
    """Whether this tuningRunner offers the benchmark stream (STREAM_CAPABILITY) with E4's
    split flags."""
    return can_split(era) and STREAM_CAPABILITY[0] in era.flags


def can_batch(era: Era) -> bool:
    """Whether this tuningRunner tunes a list of configs in one call, writing each config's row
    as it finishes (E3, E4; E2 writes its file only at the end)."""
    return era.name in BATCH_ERAS


def tool_space(ctx: TuneContext) -> str:
    """The --tuning-space tuningRunner.py gets for a job (space_of its session's space)."""
    return space_of(ctx.tuning_space)


def space_of(tuning_space: str) -> str:
    """The tool's space for a session's. A `list:NAME` session runs the tool's `quick` space:
    rocMLIR compiles its quick list in (QuickTuningPerfconfigs.inc), so a list becomes rocMLIR's
    own by writing it with `quick-list --format inc` into the source and rebuilding."""
    return "quick" if tuning_space.startswith("list:") else tuning_space


def check_space(ctx: TuneContext, era: Era) -> None:
    """Unsupported when this era does not offer the session's space (no retry can help)."""
    if era.tuning_spaces and tool_space(ctx) not in era.tuning_spaces:
        raise Unsupported(  # the same for every job of the session: no retry
            f"this tuningRunner.py ({era.name}) has no tuning space {tool_space(ctx)!r} "
            f"(it has: {', '.join(era.tuning_spaces)})"
        )
