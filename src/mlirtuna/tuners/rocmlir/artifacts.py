"""Two-stage jobs' artifacts (E4): what `--compile-only DIR` leaves, and merging several.

A compile-only directory holds `index.json` (its table of contents: the target it was compiled
for and one entry per problem, with the rocMLIR commit that compiled it) and a `problems/`
folder per problem hash. `--benchmark-artifacts DIR` benchmarks every problem its index lists.
"""

from __future__ import annotations

import json
import re
import shutil
from pathlib import Path
from typing import Any

from mlirtuna import problems
from mlirtuna.errors import TunerError
from mlirtuna.tuners.process import last_error_line

INDEX = "index.json"  # a --compile-only directory's table of contents
# What every bundle of one --benchmark-artifacts call must share: they were compiled for the
# same target, space and flags (their problem hashes are computed from these).
_INDEX_HEADER = ("arch", "numCUs", "numChiplets", "tuningSpace", "rocmlirGenFlags")
# What the tool says when it refuses a bundle of another commit (no retry can help).
_COMMIT_MISMATCH_RE = re.compile(r"commit.*mismatch|mismatch.*commit", re.IGNORECASE)
_TARGET_MISMATCH_RE = re.compile(r"artifacts compiled for \w+ .* but this host resolved")


def read_index(directory: Path) -> dict[str, Any]:
    """A --compile-only directory's index.json; TunerError when it is missing or unreadable."""
    path = directory / INDEX
    try:
        index: dict[str, Any] = json.loads(path.read_text(encoding="utf-8"))
        problems = index["problems"]
        if not isinstance(problems, dict):
            raise TypeError("problems is not an object")
    except (OSError, ValueError, KeyError, TypeError) as e:
        raise TunerError(f"{path}: not a tuningRunner --compile-only index: {e}") from None
    return index


def index_commits(directory: Path) -> set[str]:
    """The rocMLIR commits that compiled the problems of a --compile-only directory."""
    return {str(p.get("commitId", "")) for p in read_index(directory)["problems"].values()}


def check_bundle(directory: Path) -> None:
    """A --compile-only directory whose every problem may be moved and benchmarked: listed
    under a plain name, a real folder of regular files and directories (see _plain_problem).
    Checked by the compile side before a bundle is stored and by the benchmark side after it
    is unpacked (a stored bundle is data anyone with the worker role can write)."""
    checked: dict[str, Any] = {}
    for digest in read_index(directory)["problems"]:
        _plain_problem(directory, digest, checked)


def merge_artifacts(sources: list[Path], dest: Path) -> None:
    """Several --compile-only directories moved into one, whose index.json lists every problem:
    one --benchmark-artifacts call then benchmarks them all (one tool start-up, not K)."""
    indexes = [read_index(src) for src in sources]
    header = {k: indexes[0].get(k) for k in _INDEX_HEADER}
    for src, index in zip(sources, indexes, strict=True):
        other = {k: index.get(k) for k in _INDEX_HEADER}
        if other != header:
            raise TunerError(f"{src / INDEX} was compiled for {other}, not {header}")
    checked: dict[str, Any] = {}
    for src, index in zip(sources, indexes, strict=True):
        for digest in index["problems"]:
            _plain_problem(src, digest, checked)
    (dest / "problems").mkdir(parents=True, exist_ok=True)
    merged = {**header, "lastRunId": max(i.get("lastRunId", 0) for i in indexes), "problems": {}}
    for src, index in zip(sources, indexes, strict=True):
        for digest, entry in index["problems"].items():
            shutil.move(src / "problems" / digest, dest / "problems" / digest)
            merged["problems"][digest] = entry
    (dest / INDEX).write_text(json.dumps(merged, indent=2), encoding="utf-8")


_DIGEST_RE = re.compile(r"[0-9A-Za-z_][0-9A-Za-z_.-]{0,127}")


def _plain_problem(src: Path, digest: object, merged: dict[str, Any]) -> None:
    """A problem folder that may be moved: its name from index.json (data from a bundle) is a
    plain name, not yet merged, and it is a real directory holding only regular files and
    directories (bundles never hold links: a link would make the move, or the tool, reach
    outside the bundle). TunerError, before anything moved, otherwise."""
    where = src / INDEX
    if not isinstance(digest, str) or not _DIGEST_RE.fullmatch(digest):
        raise TunerError(f"{where}: problem name {ascii(digest)[:80]} is not a plain name")
    if digest in merged:
        raise TunerError(f"{where}: problem {digest} is in two bundles of one batch")
    folder = src / "problems" / digest
    merged[digest] = None  # claimed; the entry itself is filled in by the move
    if not folder.is_symlink() and not folder.is_dir():
        raise TunerError(f"{where}: problem {digest} has no folder")
    for path in (folder, *folder.rglob("*")):
        if path.is_symlink() or not (path.is_dir() or path.is_file()):
            raise TunerError(f"{where}: {path.relative_to(src)} is a link or not plain data")


def split_artifacts(source: Path, wanted: list[str], dests: list[Path]) -> list[bool]:
    """A --compile-only directory of several problems split into one directory per problem
    (the inverse of merge_artifacts): `wanted[i]` (a config, matched to the index's
    testVector by its stored form, problems.stored_vector) moved into `dests[i]` with an
    index.json of its own. Whether each was found: a problem the index lacks is compiled
    again alone by the caller."""
    index = read_index(source)
    header = {k: index.get(k) for k in _INDEX_HEADER}
    by_key = {
        problems.stored_vector(str(entry.get("testVector", ""))): (digest, entry)
        for digest, entry in index["problems"].items()
    }
    found = []
    for config, dest in zip(wanted, dests, strict=True):
        hit = by_key.get(problems.stored_vector(config))
        if (
            hit is None
            or not _DIGEST_RE.fullmatch(hit[0])  # a name that stays inside problems/
            or not (source / "problems" / hit[0]).is_dir()
        ):
            found.append(False)
            continue
        digest, entry = hit
        (dest / "problems").mkdir(parents=True, exist_ok=True)
        shutil.move(source / "problems" / digest, dest / "problems" / digest)
        one = {**header, "lastRunId": index.get("lastRunId", 0), "problems": {digest: entry}}
        (dest / INDEX).write_text(json.dumps(one, indent=2), encoding="utf-8")
        found.append(True)
    return found


def commit_refused(stderr: str) -> bool:
    """Whether the tool's error is a bundle of another commit (E4 without
    --allow-commit-mismatch), or compiled for another target than the one the call resolved
    (`artifacts compiled for arch 'X' but this host resolved 'Y'; pass --target-arch=X`): the
    same on every retry."""
    line = last_error_line(stderr)
    return bool(_COMMIT_MISMATCH_RE.search(line) or _TARGET_MISMATCH_RE.search(line))
