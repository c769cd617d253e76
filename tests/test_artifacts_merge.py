"""merge_artifacts reads problem names from a bundle's index.json (data from the database):
a name that leaves `problems/`, a link in a problem folder, or a problem in two bundles is
refused before anything moves (issue 23 item 7)."""

from __future__ import annotations

import json
import os
from pathlib import Path

import pytest

from mlirtuna.errors import TunerError
from mlirtuna.tuners.rocmlir import merge_artifacts, read_index

HEADER = {"arch": "gfx942", "numCUs": 304, "numChiplets": 8, "tuningSpace": "quick",
          "rocmlirGenFlags": ""}  # fmt: skip


def compiled(root: Path, name: str, digests: list[str], make: bool = True) -> Path:
    d = root / name
    (d / "problems").mkdir(parents=True)
    problems = {}
    for digest in digests:
        if make:
            (d / "problems" / digest).mkdir()
            (d / "problems" / digest / "manifest.json.z").write_bytes(b"m")
        problems[digest] = {"commitId": "abc"}
    (d / "index.json").write_text(json.dumps({**HEADER, "lastRunId": 1, "problems": problems}))
    return d


def snapshot(root: Path) -> list[str]:
    return sorted(str(p.relative_to(root)) for p in root.rglob("*"))


def test_plain_bundles_merge(tmp_path):
    a = compiled(tmp_path, "a", ["h1"])
    b = compiled(tmp_path, "b", ["h2"])
    merge_artifacts([a, b], tmp_path / "m")
    assert sorted(read_index(tmp_path / "m")["problems"]) == ["h1", "h2"]
    assert (tmp_path / "m" / "problems" / "h2" / "manifest.json.z").read_bytes() == b"m"


@pytest.mark.parametrize("digest", ["../../victim", "/etc", "..", ".", "", "a/b", "x\ny", "é"])
def test_a_problem_name_out_of_its_folder_is_refused(tmp_path, digest):
    victim = tmp_path / "victim"
    victim.mkdir()
    (victim / "keep").write_text("precious")
    a = compiled(tmp_path, "a", ["h1"])
    index = json.loads((a / "index.json").read_text())
    index["problems"][digest] = {"commitId": "abc"}
    (a / "index.json").write_text(json.dumps(index))
    before = snapshot(tmp_path)
    with pytest.raises(TunerError, match="not a plain name"):
        merge_artifacts([a], tmp_path / "m")
    assert (victim / "keep").read_text() == "precious"
    assert [p for p in snapshot(tmp_path) if not p.startswith("m")] == before


@pytest.mark.parametrize("where", ["folder", "file", "inner"])
def test_a_link_in_a_problem_folder_is_refused(tmp_path, where):
    victim = tmp_path / "victim"
    victim.mkdir()
    a = compiled(tmp_path, "a", ["h1"], make=where != "folder")
    folder = a / "problems" / "h1"
    if where == "folder":
        folder.symlink_to(victim)
    elif where == "file":
        (folder / "x.hsaco.z").symlink_to(victim / "secret")
    else:
        (folder / "configs").mkdir()
        os.symlink("/", folder / "configs" / "root")
    with pytest.raises(TunerError, match="is a link"):
        merge_artifacts([a], tmp_path / "m")
    assert folder.exists() or folder.is_symlink()  # nothing moved


def test_a_problem_in_two_bundles_is_refused(tmp_path):
    a = compiled(tmp_path, "a", ["h1"])
    b = compiled(tmp_path, "b", ["h1"])
    with pytest.raises(TunerError, match="in two bundles"):
        merge_artifacts([a, b], tmp_path / "m")
    assert (a / "problems" / "h1").is_dir() and (b / "problems" / "h1").is_dir()


def test_a_listed_problem_without_a_folder_is_refused(tmp_path):
    a = compiled(tmp_path, "a", ["h1"], make=False)
    with pytest.raises(TunerError, match="has no folder"):
        merge_artifacts([a], tmp_path / "m")
