"""What an operator meets on the command line: read commands that never create a database, the
database named in verbose mode, uncut tables, paging, guarded cancel, exit codes, --json."""

from __future__ import annotations

import pytest
from clitools import cli

READ_COMMANDS = [
    ["status"],
    ["session", "list"],
    ["session", "show", "1"],
    ["jobs", "list", "--session", "1"],
    ["jobs", "show", "1"],
    ["wait", "--session", "1"],
    ["results", "--session", "1"],
    ["export", "--arch", "gfx942", "-o", "out.tsv"],
    ["compare", "1", "2"],
    ["db", "current"],
]


@pytest.mark.parametrize("args", READ_COMMANDS, ids=" ".join)
def test_read_commands_never_create_a_database(tmp_path, args):
    path = tmp_path / "missing.db"
    run = cli(f"sqlite:///{path}", *args)
    assert run.code == 2 and not path.exists()
    assert run.stderr.count("\n") == 1 and str(path) in run.stderr, run.stderr
    assert not list(tmp_path.iterdir())  # nothing else either (-wal, -shm, out.tsv)


def test_commands_that_write_still_create_one(tmp_path):
    path = tmp_path / "new.db"
    configs = tmp_path / "configs"
    configs.write_text("-t f32 -transA false -transB false -g 1 -m 16 -n 16 -k 16\n")
    run = cli(f"sqlite:///{path}", "import", "--op", "gemm", "--no-expand", str(configs))
    assert run.code == 0 and path.exists(), run.stderr
    assert cli(f"sqlite:///{path}", "status").code == 0


def test_verbose_and_debug_name_the_database_first(db_url):
    for flag in ("--verbose", "-v", "--debug"):
        run = cli(db_url, flag, "session", "list", "--json")
        assert run.code == 0
        first = run.stderr.splitlines()[0]
        assert first.startswith("database: ") and db_url.split("://")[1].split("@")[-1] in first
    assert "database" not in cli(db_url, "session", "list", "--json").stderr


def test_the_database_line_masks_the_password():
    url = "postgresql://tuna:hunter2@127.0.0.1:1/x?connect_timeout=2"
    run = cli(url, "-v", "db", "current")
    assert run.code == 2 and "hunter2" not in run.stderr
    assert (
        run.stderr.splitlines()[0]
        == "database: postgresql+psycopg://tuna:***@127.0.0.1:1/x?connect_timeout=2"
    )
