"""`mlirtuna quick-list`: quick-tuning lists from the farm's history (logic in history/quick/)."""

from __future__ import annotations

from pathlib import Path
from typing import TYPE_CHECKING

import typer

import mlirtuna.cli.common as common
from mlirtuna.defaults import DEFAULT_QUICK_THRESHOLD
from mlirtuna.errors import UserError

if TYPE_CHECKING:  # history/quick/ pulls in the database layer and the solver: load it when run
    from mlirtuna.history import quick

FORMATS = ("list", "json", "inc")


def quick_list(
    ctx: typer.Context,
    session: list[str] = typer.Option(
        None, "--session", help="Sessions whose candidates to learn from (repeat, or 1,2,3)."
    ),
    op: str = typer.Option(None, "--op", help="Only this op."),
    threshold: float = typer.Option(
        DEFAULT_QUICK_THRESHOLD, "--threshold", help="A config covers a problem at this x best."
    ),
    max_size: int = typer.Option(
        None, "--max-size", help="At most K configs per list (then: the most problems covered)."
    ),
    top_k: int = typer.Option(
        None, "--top-k", help="The per-problem variant: each problem's K best, not a set cover."
    ),
    folds: int = typer.Option(
        0, "--folds", help="Also evaluate by K-fold over problems (coverage@k, regret@k, ratios)."
    ),
    seed: int = typer.Option(0, "--seed", help="Seed of the fold split."),
    name: str = typer.Option(
        None, "--name", help="Store the lists as NAME (for `session new --tuning-space list:NAME`)."
    ),
    fmt: str = typer.Option(
        None,
        "--format",
        help="list, json or inc (QuickTuningPerfconfigs.inc) (default: from -o's suffix).",
    ),
    update: bool = typer.Option(
        False, "--update", help="inc: replace these lists' sections in the existing -o file."
    ),
    output: str = typer.Option("-", "-o", "--output", help="Where to write (default: stdout)."),
    stored: bool = typer.Option(False, "--stored", help="List the stored quick lists instead."),
    as_json: bool = typer.Option(
        False, "--json", help="Print the lists as JSON on stdout (as well as -o FILE)."
    ),
    across: str = typer.Option(
        None,
        "--across",
        help="arch: one list per op and type for an arch none of the sessions' is (problem: "
        "for a problem never tuned), --max-size long (default 10), scored leave-one-out.",
    ),
) -> None:
    """Per (arch, op, data type), the fewest perf configs reaching threshold x best everywhere."""
    from mlirtuna.history import quick
    from mlirtuna.history.export import write_text

    db = common.database(ctx)
    if stored:
        _print_stored(db, "json" if as_json else fmt)
        return
    fmt = fmt or ("json" if as_json and output == "-" else _format_of(output))
    if fmt not in FORMATS:
        raise UserError(f"unknown --format {fmt!r} (known: {', '.join(FORMATS)})")
    if update and (fmt != "inc" or output == "-"):
        raise UserError("--update merges into an existing .inc file: give -o FILE.inc")
    ids = [int(x) for x in _split_ids(session)]
    _say_standin(db, ids)
    opts = quick.Options(threshold=threshold, max_size=max_size, top_k=top_k, across=across)
    if across is not None:
        if top_k is not None or folds:
            raise UserError(
                "--across builds its own lists and evaluation: not with --top-k/--folds"
            )
        lists = quick.build_across(quick.histories(db, ids, op), across, max_size)
    else:
        lists = quick.build(quick.histories(db, ids, op), opts, folds or None, seed)
    write_text(output, _render(lists, fmt, ids, opts, output if update else None))
    if name is not None:
        quick.save(db, name, lists, ids)
    if as_json and output != "-":
        print(_render(lists, "json", ids, opts, None), end="")
    for gl in lists:
        common.err(_summary(gl, name))


def _say_standin(db, ids: list[int]) -> None:
    """Stand-in sessions are read only when named (quick-list reads no other): said."""
    from mlirtuna import sessions

    made_up = [i for i in dict.fromkeys(ids) if sessions.get(db, i).standin]
    if made_up:
        listed = ", ".join(map(str, made_up))
        common.err(f"session(s) {listed}: stand-in ({sessions.STANDIN_WHY}), read as named")


def _split_ids(values: list[str] | None) -> list[str]:
    out = [x.strip() for v in values or [] for x in v.split(",") if x.strip()]
    bad = [x for x in out if not x.isdigit()]
    if bad:
        raise UserError(f"--session takes session ids, not {bad[0]!r}")
    return out


def _format_of(output: str) -> str:
    return {".json": "json", ".inc": "inc"}.get(Path(output).suffix, "list")


def _render(lists, fmt: str, ids: list[int], opts: quick.Options, merge_into: str | None) -> str:
    from mlirtuna.history import quick

    if fmt == "list":
        return quick.render_list(lists)
    if fmt == "json":
        import json

        meta = {"sessions": ids, "threshold": opts.threshold, "max_size": opts.max_size}
        meta |= {"top_k": opts.top_k, "across": opts.across}
        return json.dumps(quick.render_json(lists, meta), indent=1) + "\n"
    existing = None
    if merge_into is not None and Path(merge_into).is_file():
        existing = Path(merge_into).read_text(encoding="utf-8")
    return quick.render_inc(lists, existing)


def _summary(gl: quick.GroupList, name: str | None) -> str:
    from mlirtuna.history import quick

    line = f"{gl.group}: {len(gl.perf_configs)} configs for {gl.problems} problems ({gl.method})"
    if gl.uncovered:
        line += f", {len(gl.uncovered)} uncovered"
    ev = gl.evaluation
    if ev and "leave_one_out" in ev:
        ours, base = ev["leave_one_out"], ev["baseline_leave_one_out"]
        line += f"; leave-one-{ev['across']}-out geomean {quick.geomean(list(ours.values())):.4f}"
        line += f" (baseline {quick.geomean(list(base.values())):.4f})"
        worst = min(ours, key=ours.get)
        line += f", worst {worst} {ours[worst]:.3f}"
    elif ev:
        gm, low = ev["ratio_geomean"], ev["ratio_min"]
        line += (
            f"; {ev['folds']}-fold held-out: coverage {ev['coverage_all']:.2f}, "
            f"TFlops(list)/TFlops(full) geomean {gm:.4f} min {low:.3f}"
            if gm is not None
            else "; too few problems to evaluate"
        )
    return line + (f"; stored as {name}" if name else "")


def _print_stored(db, fmt: str | None) -> None:
    from mlirtuna.history import quick

    rows = quick.stored(db)
    if fmt == "json":
        common.print_json(rows)
        return
    for r in rows:
        print(f"{r['name']}\t{r['arch']}\t{r['op']}\t{r['data_type']}\t{r['size']}\t{r['method']}")


def register(app: typer.Typer) -> None:
    app.command("quick-list")(quick_list)
