"""Every command has help text and is named in the README (the CLI is the product's surface)."""

from __future__ import annotations

from pathlib import Path

import click
import typer

from mlirtuna.cli import app

README = (Path(__file__).parent.parent / "README.md").read_text()


def _commands(group: click.Group, prefix: str = ""):
    for name, cmd in group.commands.items():
        path = f"{prefix}{name}"
        if isinstance(cmd, click.Group):
            yield from _commands(cmd, path + " ")
        else:
            yield path, cmd


def test_every_command_has_help_and_every_option_too():
    root = typer.main.get_command(app)
    found = dict(_commands(root))
    assert {
        "import",
        "run",
        "worker",
        "status",
        "wait",
        "export",
        "compare",
        "results",
        "import-tsv",
        "session new",
        "jobs load",
        "db upgrade",
    } <= set(found)
    for path, cmd in found.items():
        assert (cmd.help or "").strip(), f"`mlirtuna {path}` has no help text"
        for param in cmd.params:
            if isinstance(param, click.Option) and not param.hidden:
                assert (param.help or "").strip(), f"`mlirtuna {path} {param.opts[0]}` has no help"


def test_readme_names_every_top_level_command():
    root = typer.main.get_command(app)
    for name in root.commands:
        assert f"mlirtuna {name}" in README, f"README does not mention `mlirtuna {name}`"
