"""`mlirtuna import`: rocMLIR config lists into the config tables."""

from __future__ import annotations

import typer

import mlirtuna.cli.common as common
import mlirtuna.cli.options as options
from mlirtuna.defaults import DEFAULT_MAX_MODULE_BYTES
from mlirtuna.problems import CONFIG_LIST_OPS, SPECS

MODULE_OPS = tuple(s.name for s in SPECS if not s.config_list)  # read from .mlir modules
OP_HELP = f"{', '.join(CONFIG_LIST_OPS)} or {', '.join(MODULE_OPS)} (.mlir files / directories)."


def import_(
    ctx: typer.Context,
    files: list[str] = typer.Argument(
        ..., metavar="FILE...", help="rocMLIR config lists (fusion: .mlir modules or dirs)."
    ),
    op: str = typer.Option(..., "--op", help=OP_HELP),
    data_type: str = options.data_type_opt(),
    direction: str = options.direction_opt(),
    layout: str = options.layout_opt(),
    no_expand: bool = options.no_expand_opt(),
    tag: str = typer.Option(None, "--tag", help="Label the problems, for `jobs load --tag`."),
    as_json: bool = typer.Option(False, "--json", help="Print {lines, problems, new, existing}."),
    mlir_build_dir: str = options.mlir_build_dir_opt(),
    arch: str = typer.Option(
        None, "--arch", help="Fusion with a build: the chip rocmlir-gen keys for [gfx942]."
    ),
    max_module_mib: int = typer.Option(
        DEFAULT_MAX_MODULE_BYTES >> 20,
        "--max-module-mib",
        help="Fusion: refuse a .mlir module larger than this (MiB), before reading it.",
    ),
) -> None:
    """Import rocMLIR config lists: one canonical problem per expanded line (idempotent).

    With --op fusion: each .mlir module (every *.mlir of a directory) is one problem, keyed by
    rocmlir-gen --emit-tuning-key when a build is given, else from its MIGraphX ops."""
    db = common.database(ctx, create=True)
    if op == "fusion":
        from mlirtuna import catalog

        report = catalog.import_modules(
            db, files, tag, mlir_build_dir, arch, max_bytes=max_module_mib << 20
        )
    else:
        from mlirtuna import catalog

        options = common.expand_options(data_type, direction, layout, no_expand)
        report = catalog.import_files(db, op, files, options, tag)
    for warning in report.warnings:
        common.err(f"warning: {warning}")
    if as_json:
        common.print_json(report.as_dict())
    else:
        print(
            f"{report.lines} {'modules' if op == 'fusion' else 'lines'} read, "
            f"{report.problems} problems{'' if op == 'fusion' else ' after expansion'}: "
            f"{report.new} new, {report.existing} already present"
            + (f" (tag {tag})" if tag else "")
        )


def register(app: typer.Typer) -> None:
    app.command("import")(import_)
