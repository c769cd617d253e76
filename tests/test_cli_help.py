"""Every command has help text and is named in the README (the CLI is the product's surface)."""

from __future__ import annotations

import re
import subprocess
import sys
from pathlib import Path

import click
import typer
from support.clitools import subprocess_env
from typer.testing import CliRunner

from mlirtuna import __version__
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


def _rendered_help(path: str) -> str:
    result = CliRunner().invoke(app, [*path.split(), "--help"], catch_exceptions=True)
    assert result.exception is None, f"`mlirtuna {path} --help`: {result.exception!r}"
    assert result.exit_code == 0, f"`mlirtuna {path} --help` exit {result.exit_code}"
    return " ".join(result.stdout.split())  # wrapping aside


def test_every_help_page_renders_as_written_with_its_defaults():
    """Brackets in help (`[detected]`, `[/opt/rocm/.info/version]`) are text, never Rich markup,
    and every option's default is shown (after its environment variable, where it reads one)."""
    root = typer.main.get_command(app)
    pages = {"": root, **dict(_commands(root))}
    for path, cmd in pages.items():
        page = _rendered_help(path)
        for param in cmd.params:
            if not isinstance(param, click.Option) or param.hidden:
                continue
            for bracketed in re.findall(r"\[[^\]]*\]", param.help or ""):
                assert bracketed in page, f"`mlirtuna {path} --help` lost {bracketed}"
            if param.show_default and param.default not in (None, False, "") and not param.is_flag:
                # An option that reads an environment variable names it first, in the brackets.
                envvar = f"env var: {param.envvar}; " if param.show_envvar and param.envvar else ""
                shown = f"[{envvar}default: {param.default}]"
                assert shown in page, f"`mlirtuna {path} --help` lacks {shown}"


def test_session_new_help_names_where_each_field_comes_from():
    page = _rendered_help("session new")
    assert "[/opt/rocm/.info/version]" in page
    assert "--num-chiplets INTEGER Chiplets (XCDs) [detected]." in page
    assert "[default: cpu]" in page


def test_version_and_shell_completion():
    result = CliRunner().invoke(app, ["--version"])
    assert result.exit_code == 0 and result.stdout.strip() == f"mlirtuna {__version__}"
    # Run from bash, as a user would: Typer finds the shell among the process's parents.
    shown = subprocess.run(
        ["bash", "-c", '"$0" -m mlirtuna --show-completion; exit $?', sys.executable],
        env=subprocess_env("sqlite:///unused.db"),
        capture_output=True,
        text=True,
        timeout=60,
        check=False,
    )
    assert shown.returncode == 0, shown.stderr
    assert "complete -o default -F _mlirtuna_completion mlirtuna" in shown.stdout
    assert "--install-completion" in _rendered_help("")


def test_docs_install_from_the_repository_not_an_index():
    """mlirtuna is on no package index: no doc may tell to `pip install mlirtuna`."""
    root = Path(__file__).parent.parent
    for path in [root / "README.md", *root.glob("docs/*.md"), *root.glob("examples/*")]:
        if path.is_file():
            assert "pip install mlirtuna" not in path.read_text(), path
    assert "pip install ./mlirtuna" in (root / "docs" / "ci.md").read_text()


def test_a_typo_is_suggested_once():
    for argv, right in ((["rnu"], "'run'"), (["session", "lst"], "'list'")):
        result = CliRunner().invoke(app, argv)
        assert result.exit_code == 2
        assert result.stderr.count(f"Did you mean {right}?") == 1, result.stderr


def test_a_mistyped_option_suggests_the_closest_one_only():
    result = CliRunner().invoke(app, ["results", "--sesion", "3"])
    assert result.exit_code == 2
    assert "Did you mean '--session'?" in result.stderr and "--json" not in result.stderr


def test_terminal_tables_wrap_between_tokens_never_inside_one():
    import io

    from rich.console import Console

    from mlirtuna.cli import common

    vector = "-t f32 -out_datatype f32 -transA false -transB false -g 1 -m 1024 -n 1024 -k 1024"
    perf = "v4:256,256,8,64,64,32,8,1,1,1,2,64,1,1"
    table = common.TextTable("test vector", "perf config", "TFlops")
    table.add_row(vector, perf, "4.21")
    table.add_row("-t f16 -m 8", "v4:16,16,4,16,16,16,4,1,1,0,1,1,1,1", "0.00312")
    allowed = set(vector.split()) | {"-t", "f16", "-m", "8", "test", "vector", "perf", "config"}
    allowed |= {perf, "v4:16,16,4,16,16,16,4,1,1,0,1,1,1,1", "TFlops", "4.21", "0.00312"}
    for width in (50, 72, 100, 200):
        console = Console(file=io.StringIO(), width=width, color_system=None)
        common.print_rich(table, console)
        text = console.file.getvalue()
        if width == 50:  # the two perf configs and the longest flag cannot sit side by side
            assert text == common.plain_table(table)
            continue
        assert max(map(len, text.splitlines())) <= width
        words = re.sub("[\u2500-\u257f]", " ", text).split()
        assert set(words) <= allowed, set(words) - allowed  # every token whole
        assert perf in words and "-out_datatype" in words


def test_top_level_help_groups_the_commands_by_what_they_are_for():
    """`mlirtuna --help` lists its commands under panels (tune here, the farm, results, admin),
    each in the order of the work, and every command sits in a panel (issue 44)."""
    from mlirtuna.cli import HELP_PANELS

    result = CliRunner().invoke(app, ["--help"])
    assert result.exit_code == 0
    lines = result.stdout.splitlines()
    listed: dict[str, list[str]] = {}
    panel = None
    for line in lines:
        if line.endswith(":") and not line.startswith(" "):
            panel = line[:-1]
            listed[panel] = []
        elif panel in HELP_PANELS and line.startswith("  ") and line.split():
            listed[panel].append(line.split()[0])
    assert list(listed) == ["Options", *HELP_PANELS], list(listed)
    for name, commands in HELP_PANELS.items():
        assert listed[name] == list(commands)
    root = typer.main.get_command(app)
    assert sorted(root.commands) == sorted(c for cs in HELP_PANELS.values() for c in cs)
    assert HELP_PANELS["Tune on this machine"][0] == "run"
    assert {"compare", "export", "results"} <= set(HELP_PANELS["Results"])


#: Options of the same name that `run`, `worker` and `session new` each mean their own way:
#: --tuner (a new session's tuner; `run`'s auto; the one a worker checks against its session's),
#: --session (`run` resumes one; a worker drains one), --json (what each prints).
OWN_MEANING = {"--tuner", "--session", "--json"}


def _option_facts(param: click.Option) -> dict[str, object]:
    """What a user sees of an option and what it parses to: one definition gives one of these."""
    return {
        "name": param.name,
        "opts": sorted(param.opts + param.secondary_opts),
        "help": param.help,
        "default": param.default,
        "type": repr(param.type),
        "envvar": param.envvar,
        "show_envvar": param.show_envvar,
        "metavar": param.metavar,
        "hidden": param.hidden,
        "is_flag": param.is_flag,
    }


def test_run_worker_and_session_new_share_one_definition_of_each_common_option():
    """Issue 46: an option two of these commands have is declared once (cli/options.py), so its
    help, default and type never drift apart (--job-timeout, --gpus, --tuning-space did)."""
    root = typer.main.get_command(app)
    found = dict(_commands(root))
    options = {
        path: {p.opts[0]: p for p in found[path].params if isinstance(p, click.Option)}
        for path in ("run", "worker", "session new")
    }
    common: dict[str, list[str]] = {}
    for path, opts in options.items():
        for name in opts:
            common.setdefault(name, []).append(path)
    shared = {name: paths for name, paths in common.items() if len(paths) > 1}
    assert {"--job-timeout", "--gpus", "--tuning-space", "--mlir-build-dir"} <= set(shared)
    for name, paths in shared.items():
        if name in OWN_MEANING:
            continue
        facts = [_option_facts(options[path][name]) for path in paths]
        assert all(f == facts[0] for f in facts), f"{name} differs across {paths}: {facts}"
    # The exceptions are real (each differs), so the list cannot keep a name that no longer does.
    for name in OWN_MEANING:
        facts = [_option_facts(options[path][name]) for path in shared[name]]
        assert any(f != facts[0] for f in facts), f"{name} is the same everywhere: share it"
