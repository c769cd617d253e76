"""What a session asks of a rocMLIR build, checked against its tuningRunner.py when it is opened
(sessions.py): one clear UserError for anything the build lacks, before any job runs."""

from __future__ import annotations

import logging
from collections.abc import Sequence

from mlirtuna import keys
from mlirtuna.errors import TunerError, UserError
from mlirtuna.problems import GemmProblem, Problem
from mlirtuna.tuners.registry import BuildLimit, SessionBuild
from mlirtuna.tuners.rocmlir.eras import (
    SETTING_CAPABILITY,
    build_key_form,
    can_split,
    lacks_split,
    space_of,
)
from mlirtuna.tuners.rocmlir.tuner import RocmlirTuner

log = logging.getLogger(__name__)


def check_build(build_dir: str, tuning_space: str, settings: Sequence[str]) -> tuple[str, str]:
    """The session's space and E4 setting flags against the build's tuningRunner (read from its
    --help); returns the key form its perfRunner expects and what the build can do
    (Era.describe: label, capabilities, spaces; "" when not read). A build that cannot be read
    here is not checked (keys.PLAIN): the worker checks the same against the build it runs."""
    try:
        tuner = RocmlirTuner(build_dir)
        era = tuner.era
    except (UserError, TunerError) as exc:
        # No tuningRunner.py there, or it cannot run here (E3/E4 need a GPU even for --help).
        log.warning("not checked against the build's tuningRunner.py: %s", exc)
        return keys.PLAIN, ""
    space = space_of(tuning_space)  # a list: session runs the tool's quick space
    if era.tuning_spaces and space not in era.tuning_spaces:
        raise UserError(
            f"tuning space {space!r} is not offered by {tuner.script} ({era.describe()})"
        )
    lacking = [flag for flag in settings if flag not in era.flags]
    if lacking:
        caps = sorted({SETTING_CAPABILITY[flag] for flag in lacking})
        raise UserError(
            f"{tuner.script} has no {', '.join(lacking)}: it lacks the "
            f"{', '.join(caps)} capability ({era.describe()})"
        )
    return build_key_form(tuner.script.parent, era), era.describe()


def check_split_build(build_dir: str) -> None:
    """UserError unless the build's tuningRunner can compile and benchmark apart (E4)."""
    try:
        tuner = RocmlirTuner(build_dir)
        era = tuner.era
    except TunerError as exc:
        raise UserError(
            f"--split: cannot read {build_dir}'s tuningRunner.py --help: {exc}"
        ) from None
    if not can_split(era):
        raise UserError(f"--split: {lacks_split(tuner.script, era)}")


def build_limit(build: SessionBuild) -> BuildLimit | None:
    """A build read when the session was opened (capabilities known) whose perfRunner does not
    spell gemm keys with -transO (key form not e4 or e4-split-k: rocMLIR's own E3 line, whose
    gemm parser has no -transO) fails a `-transO true` line before it tunes anything."""
    if not build.capabilities or keys.spells_trans_o(build.key_form):
        return None
    return BuildLimit(
        why=f"build cannot tune gemm -transO true (its perfRunner's gemm keys have no -transO: "
        f"key form {build.key_form}, {build.capabilities})",
        remedy="open the session on an E4 build",
        refuses=_transposes_output,
    )


def _transposes_output(problem: Problem) -> bool:
    return isinstance(problem, GemmProblem) and problem.trans_o
