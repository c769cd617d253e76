"""Importing rocMLIR config lists into the config tables, on every backend."""

from __future__ import annotations

import shutil

import sqlalchemy as sa
from conftest import DATA
from support.clitools import cli

from mlirtuna import catalog
from mlirtuna.db.models import CONFIG_TABLES, Problem, ProblemTag
from mlirtuna.problems import ExpandOptions, from_columns
from mlirtuna.problems.configlist import read_config_list

TIER1 = {op: DATA / f"tier1-{op}-configs" for op in ("conv", "gemm", "attention")}


def _stored(db, op):
    """{test_vector: problem rebuilt from its config row} for one op."""
    table = CONFIG_TABLES[op].__table__
    with db.session() as s:
        rows = s.execute(
            sa.select(Problem.test_vector, table).join(table, table.c.id == Problem.id)
        ).mappings()
        return {
            r["test_vector"]: from_columns(
                op, {c.name: r[c.name] for c in table.c if c.name != "id"}
            )
            for r in rows
        }


def test_tier1_lists_store_exactly_perfrunner_strings(db):
    for op, path in TIER1.items():
        report = catalog.import_files(db, op, [str(path)])
        expected = {e.problem.canonical() for e in read_config_list(str(path), op).entries}
        stored = _stored(db, op)
        assert set(stored) == expected
        assert report.new == report.problems == len(expected)
        # The typed row holds the same problem the canonical string names.
        assert all(p.canonical() == tv for tv, p in stored.items())


def test_second_import_adds_nothing(db):
    first = catalog.import_files(db, "gemm", [str(TIER1["gemm"])], tag="bert")
    second = catalog.import_files(db, "gemm", [str(TIER1["gemm"])], tag="bert")
    assert second.new == 0 and second.existing == first.problems
    with db.session() as s:
        assert s.scalar(sa.select(sa.func.count()).select_from(Problem)) == first.problems
        assert s.scalar(sa.select(sa.func.count()).select_from(ProblemTag)) == first.problems


def test_cli_json_counts(db_url, tmp_path):
    path = tmp_path / "gemm"
    path.write_text(
        "# a comment\n\n-transA false -transB false -g 1 -m 64 -n 32 -k 16\n"
        "  # indented comment\n-t f16 -transA true -transB false -g 1 -m 8 -n 8 -k 8\n"
    )
    run = cli(db_url, "import", "--op", "gemm", "--data-type", "f32,f16", "--json", str(path))
    assert run.code == 0, run.stderr
    # Line 1 names transA/transB but no type: one problem per --data-type; line 2 is complete.
    data = run.json()
    assert data["lines"] == 2
    assert data["problems"] == data["new"] == 2 + 1
    again = cli(db_url, "import", "--op", "gemm", "--data-type", "f32,f16", "--json", str(path))
    assert again.json() == {"lines": 2, "problems": 3, "new": 0, "existing": 3}


def test_bad_line_37_writes_nothing(db_url, tmp_path):
    bad = tmp_path / "conv-configs"
    lines = TIER1["conv"].read_text().splitlines()
    lines[36] = "-F 1 -f NCHW -I NCHW -O NCHW -n abc -c 3 -H 8 -W 8 -k 4 -y 3 -x 3"
    bad.write_text("\n".join(lines) + "\n")
    good = tmp_path / "gemm-configs"
    shutil.copy(TIER1["gemm"], good)
    run = cli(db_url, "import", "--op", "conv", str(bad))
    assert run.code == 2
    assert run.stderr.strip().startswith(f"error: {bad}:37:")
    assert len(run.stderr.strip().splitlines()) == 1
    with configs_db(db_url) as db, db.session() as s:
        assert s.scalar(sa.select(sa.func.count()).select_from(Problem)) == 0


def test_bad_line_in_second_file_writes_nothing_from_first(db_url, tmp_path):
    bad = tmp_path / "bad"
    bad.write_text("-t f16 -transA false -transB false -g 1 -m 8 -n 8 -k 8 -bogus 1\n")
    run = cli(db_url, "import", "--op", "gemm", str(TIER1["gemm"]), str(bad))
    assert run.code == 2 and f"{bad}:1:" in run.stderr
    with configs_db(db_url) as db, db.session() as s:
        assert s.scalar(sa.select(sa.func.count()).select_from(Problem)) == 0


def test_no_expand_imports_lines_as_written(db, tmp_path):
    path = tmp_path / "conv"
    path.write_text(
        "convfp16 -F 1 -f NHWC -I NHWC -O NHWC -n 2 -c 8 -H 8 -W 8 -k 8 -y 3 -x 3 "
        "-p 1 -q 1 -u 1 -v 1 -l 1 -j 1 -g 1\n"
    )
    report = catalog.import_files(db, "conv", [str(path)], ExpandOptions(expand=False))
    assert report.problems == 1


class configs_db:
    """A Database on the URL for a `with` block (the CLI's own handle is closed)."""

    def __init__(self, url):
        from mlirtuna.db import Database

        self.db = Database(url)

    def __enter__(self):
        return self.db

    def __exit__(self, *exc):
        self.db.dispose()
