"""Reading rocMLIR config lists (tier1-conv-configs, gemm-configs, ...) into problems.

The rules, after perfRunner/tuningRunner and the lists in rocMLIR's tree:
- one config per line; blank lines and lines whose stripped text starts with `#` are skipped
  (tier1-gemm-configs has an indented ` # model` line);
- every other line is expanded the way perfRunner does (ExpandOptions) and each result parsed;
  problems are deduplicated by canonical string, the first occurrence kept;
- flags that are not part of a problem, removed before parsing:
  `-perf_priority N` (newer tier1 lists) becomes the entry's priority (default 0);
  `-perf_config X` (perfRunner's from_command_line accepts it) is dropped with a warning;
- any other flag the op does not have is an error, as is a bad value, a missing required flag or
  an unknown data type: the whole read fails with InputError `FILE:LINE: message`.
"""

from __future__ import annotations

import os
from collections.abc import Iterable
from dataclasses import dataclass, field

from mlirtuna.errors import InputError, UserError
from mlirtuna.problems import (
    ExpandOptions,
    Problem,
    check_options,
    expand_problems,
    tool_rejects,
)
from mlirtuna.problems.flags import int_value
from mlirtuna.textinput import check_line, read_lines

PRIORITY_FLAG = "-perf_priority"
DROPPED_FLAGS = ("-perf_config",)


@dataclass(frozen=True, slots=True)
class ConfigEntry:
    """One problem of a config list: the 1-based line it came from and its priority."""

    lineno: int
    problem: Problem
    priority: int = 0


@dataclass
class ConfigList:
    """What one config list holds. `lines` counts config lines (not blanks or comments)."""

    source: str
    op: str
    lines: int = 0
    entries: list[ConfigEntry] = field(default_factory=list)
    warnings: list[str] = field(default_factory=list)
    duplicates: int = 0  # expanded problems dropped because an earlier line gave them


def directory_error(path: str) -> UserError:
    """A directory given where a config list (one file) goes: what it is and what to give
    (its files, or --op fusion for a directory of .mlir modules)."""
    return UserError(
        f"{path}: a directory, not a config list: give the config list files in it "
        f"(e.g. {path.rstrip('/')}/*); only --op fusion takes a directory (of .mlir modules)"
    )


def read_config_list(path: str, op: str, options: ExpandOptions = ExpandOptions()) -> ConfigList:
    """Reads, expands and parses a config list; a bad line raises InputError `path:LINE: …`."""
    check_options(op, options)  # an option error is not any line's fault
    if os.path.isdir(path):
        raise directory_error(path)
    try:
        return read_config_lines(read_lines(path), path, op, options)
    except OSError as error:  # EIO and the like, mid-read
        raise UserError(f"{path}: {error.strerror or error}") from None


def read_config_lines(
    lines: Iterable[str], source: str, op: str, options: ExpandOptions = ExpandOptions()
) -> ConfigList:
    """The same as read_config_list for lines from anywhere (stdin, a string); `source` names
    them in messages."""
    check_options(op, options)
    result = ConfigList(source, op)
    seen: set[str] = set()
    for lineno, raw in enumerate(lines, 1):
        line = raw.strip()
        if not line or line[0] == "#":
            continue
        result.lines += 1
        try:
            check_line(line)  # lines from stdin or a string have not been through read_lines
            line, priority, dropped = _extras(line)
            problems = expand_problems(op, line, options)
            for problem in problems:
                if (why := tool_rejects(problem)) is not None:
                    raise InputError(why)
        except InputError as error:
            raise error.at(source, lineno) from None
        for flag, value in dropped:
            result.warnings.append(f"{source}:{lineno}: ignoring {flag} {value}")
        if not problems:
            result.warnings.append(f"{source}:{lineno}: no problem left after expansion")
        for problem in problems:
            key = problem.canonical()
            if key in seen:
                result.duplicates += 1
                continue
            seen.add(key)
            result.entries.append(ConfigEntry(lineno, problem, priority))
    return result


def _extras(line: str) -> tuple[str, int, list[tuple[str, str]]]:
    """Takes -perf_priority and -perf_config (with their values) out of a line."""
    if "-perf_" not in line:  # the common case: no second split
        return line, 0, []
    tokens = line.split()
    priority, dropped = 0, []
    for flag in (PRIORITY_FLAG, *DROPPED_FLAGS):
        while flag in tokens:
            at = tokens.index(flag)
            if at + 1 == len(tokens):
                raise InputError(f"{flag}: missing value")
            value = tokens[at + 1]
            del tokens[at : at + 2]
            if flag == PRIORITY_FLAG:
                priority = int_value(flag, value)
            else:
                dropped.append((flag, value))
    return " ".join(tokens), priority, dropped
