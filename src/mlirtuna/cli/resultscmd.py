"""`mlirtuna export`, `import-tsv`, `compare` and `results`: what comes out of the database."""

from __future__ import annotations

from typing import TYPE_CHECKING

import typer

import mlirtuna.cli.common as common
from mlirtuna.errors import UserError
from mlirtuna.problems import CONFIG_LIST_OPS

if TYPE_CHECKING:
    from mlirtuna.history import compare as comparing
    from mlirtuna.history import winners

SHOWN_REGRESSIONS = 20


def export(
    ctx: typer.Context,
    arch: str = typer.Option(
        None,
        "--arch",
        help="Chip (gfx942) or exact arch_full "
        "(gfx942:sramecc+:xnack-); needed unless --session is given.",
    ),
    num_cu: int = typer.Option(None, "--num-cu", help="Only sessions with this many CUs."),
    num_chiplets: int = typer.Option(
        None, "--num-chiplets", help="Only sessions with this many chiplets."
    ),
    session: list[int] = typer.Option(
        None,
        "--session",
        help="Export these sessions (repeat the flag); the newest wins per problem.",
    ),
    op: str = typer.Option(None, "--op", help="Only problems of this op."),
    tuning_space: str = typer.Option(
        None,
        "--tuning-space",
        help="Only sessions of this space (quick for perfRunner's --quick_tuning_db).",
    ),
    fmt: str = typer.Option(
        "v3",
        "--format",
        help="v3 (tuningRunner E3, 10 columns), v2 "
        "(E2, 5 columns), t4 (T4 results JSON of one session) or debug (every candidate as "
        "rocMLIR's .debug TSV, for quickTuningGen.py and tuning_eval; one op per file).",
    ),
    key_format: str = typer.Option(
        None,
        "--key-format",
        help="plain, split-k (keys end -supportsSplitK true|false) for rocMLIR's newest "
        "perfRunner, or e4 (gemm keys spell -transO) for rocmlirTriton's "
        "[the form of the newest session's build].",
    ),
    output: str = typer.Option(
        None,
        "-o",
        "--output",
        help="File to write (atomically); - for stdout. Required, except with --op fusion: "
        "tuning_fusion_<arch>.tsv, as rocMLIR's weekly job names it.",
    ),
    as_json: bool = typer.Option(
        False, "--json", help="Print {rows, sessions, format} on stdout (not with -o -)."
    ),
) -> None:
    """Write the tuning DB perfRunner reads: per problem, the newest matching session's winner."""
    if as_json and output == "-":
        raise UserError("--json and -o - both write to stdout: choose one")
    from mlirtuna.history import export as exporting

    query = exporting.ExportQuery(
        arch=arch,
        num_cu=num_cu,
        num_chiplets=num_chiplets,
        sessions=tuple(session or ()),
        op=op,
        tuning_space=tuning_space,
        key_format=key_format,
    )
    if output is None and op != "fusion":
        raise UserError("give -o FILE (or -o - for stdout)")
    db = common.database(ctx)
    done = exporting.render(db, query, fmt)
    output = output or exporting.fusion_file_name(db, done.sessions)
    exporting.write_text(output, done.text)
    for note in done.notes + done.key_notes:
        common.err(f"note: {note}")
    if as_json:
        common.print_json(done.as_dict())
    else:
        where = "stdout" if output == "-" else output
        common.err(
            f"{done.rows} rows from session(s) {', '.join(map(str, done.sessions))} "
            f"written to {where} ({done.format})"
        )


def import_tsv(
    ctx: typer.Context,
    files: list[str] = typer.Argument(
        ..., metavar="FILE...", help="Tuning DBs: legacy, v2, v3 or MITuna export."
    ),
    op: str = typer.Option(
        "auto",
        "--op",
        help="auto: each row's op from its test vector (a tuning DB of several ops); an op "
        f"({', '.join(CONFIG_LIST_OPS)}) keeps only its rows.",
    ),
    reason: str = typer.Option(None, "--reason", help="Reason of the new sessions [file name]."),
    num_cu: int = typer.Option(
        None, "--num-cu", help="numCUs of rows that lack it (legacy files: required)."
    ),
    num_chiplets: int = typer.Option(
        None, "--num-chiplets", help="numChiplets of rows that lack it [1]."
    ),
    tuning_space: str = typer.Option(
        None, "--tuning-space", help="Space of rows whose file does not say [exhaustive]."
    ),
    again: bool = typer.Option(
        False, "--again", help="Import a file again even if its exact content was imported."
    ),
    as_json: bool = typer.Option(False, "--json", help="Print the report as JSON."),
) -> None:
    """Load existing .tsv tuning DBs: one imported session per file and context (all or nothing).

    A file imported before (same SHA-256) is skipped, and said so, unless --again.
    """
    from mlirtuna.history import tsvimport

    fill = tsvimport.Fill(num_cu=num_cu, num_chiplets=num_chiplets, tuning_space=tuning_space)
    # Opened once every file has been read: a file that does not parse leaves no database.
    report = tsvimport.import_tsv(
        lambda: common.database(ctx, create=True), op, files, reason=reason, fill=fill, again=again
    )
    if as_json:
        common.print_json(report.as_dict())
        return
    for seen in report.already:
        common.err(
            f"{seen.file}: already imported as session {', '.join(map(str, seen.sessions))} "
            f"(same content, sha256 {seen.sha256[:12]}…); nothing added (--again to import it "
            "again)"
        )
    if not report.sessions:
        return
    for x in report.sessions:
        print(
            f"session {x.id}: {x.results} results from {x.file} ({x.arch}, {x.num_cu} CUs, "
            f"{x.num_chiplets} chiplet(s), {x.tuning_space}, commit {x.commit or 'unknown'}"
            + (f", {x.failed} failed jobs" if x.failed else "")
            + (f", {x.key_form} keys" if x.key_form != "plain" else "")
            + ")"
        )
    named = "" if op == "auto" else f"{op} "
    for line in report.errors_unmatched:
        common.err(f"{line} (a ### error line naming no {named}config: not imported)")
    common.err(
        f"{report.rows} rows read, {report.skipped} without a winner skipped; "
        + (f"{report.other_op} of another op than {op} left out; " if report.other_op else "")
        + f"{report.problems} problems, {report.new_problems} new"
        + (f"; {report.failed} ### error lines kept as failed jobs" if report.failed else "")
    )


def compare(
    ctx: typer.Context,
    a: str = typer.Argument(..., metavar="A", help="Old: a session id or a .tsv file."),
    b: str = typer.Argument(..., metavar="B", help="New: a session id or a .tsv file."),
    threshold: str = typer.Option(
        "5%",
        "--threshold",
        help="A TFlops drop past this is a regression: 5% or 0.05 (a fraction).",
    ),
    op: str = typer.Option(None, "--op", help="Only this op; re-canonicalizes .tsv test vectors."),
    as_json: bool = typer.Option(False, "--json", help="Print the comparison as JSON."),
    as_csv: bool = typer.Option(
        False, "--csv", help="Print every finding (its verdict in column kind) as CSV, one a line."
    ),
    fail: bool = typer.Option(
        False,
        "--fail-on-regression",
        help="Exit 1 on a finding whose verdict fails: regression (winner changed, beyond the "
        "threshold and the noise), slower (same winner, beyond them too) or missing (a problem "
        "of A that B lacks, or whose B winner has no TFlops). A row labelled noise never fails.",
    ),
    allow_missing: bool = typer.Option(
        False,
        "--allow-missing",
        help="Problems of A that B lacks, or whose B winner has no TFlops, do not fail the check.",
    ),
    changed_winner_only: bool = typer.Option(
        False,
        "--changed-winner-only",
        help="Rows labelled slower (the same winner measured slower: machine or toolchain, "
        "not a changed tuning) do not fail the check.",
    ),
) -> None:
    """Compare two tunings problem by problem, matched by canonical test vector.

    A, B: session ids or .tsv files (./12 for a file named 12); arch is not part of the key.
    Two sides with no problem in common are an error. With --fail-on-regression, one line on
    stderr says whether the gate passed or failed, and on what.
    """
    from mlirtuna import sessions
    from mlirtuna.history import compare as comparing

    fmt = common.output_format(as_json, as_csv)
    limit = comparing.parse_threshold(threshold)

    def db():
        return common.database(ctx)

    side_a, side_b = comparing.load_sides(a, b, op, db)
    for sid in comparing.standin_sides(a, b, db):
        common.err(f"session {sid} is a stand-in session ({sessions.STANDIN_WHY})")
    result = comparing.compare(side_a, side_b, limit)
    if fmt == "json":
        gate = {"changed_winner_only": changed_winner_only, "allow_missing": allow_missing}
        common.print_json(result.as_dict(**gate))
    elif fmt == "csv":
        _print_comparison_csv(result)
    else:
        _print_comparison(result)
    if fail:  # the gate's verdict either way: a pass says over what it passed
        common.err(comparing.gate_line(result, changed_winner_only, allow_missing))
        if result.fails(changed_winner_only=changed_winner_only, allow_missing=allow_missing):
            raise typer.Exit(1)


def _print_comparison(c: comparing.Comparison) -> None:
    from mlirtuna.history import compare as comparing

    summary = common.TextTable("", "value", title=f"A = {c.a}\nB = {c.b}")
    pct = "" if c.same_winner_pct is None else f" ({c.same_winner_pct:.1f}%)"
    drop = f"{100 * (1 - c.threshold):g}%"
    for label, value in (
        ("common problems", str(c.common)),
        ("same winner", f"{c.same_winner}{pct}"),
        ("TFlops B/A geomean", _fmt(c.geomean_ratio, ".3f")),
        ("TFlops B/A min / max", f"{_fmt(c.min_ratio, '.3f')} / {_fmt(c.max_ratio, '.3f')}"),
        ("with TFlops on both", str(c.with_tflops)),
        (f"regression (< {drop}, winner changed)", str(c.regressions_winner_changed)),
        (f"slower (< {drop}, same winner)", str(c.regressions_same_winner)),
        ("noise (never fails)", str(len(c.within_noise))),
        ("missing (only in A) / only in B", f"{c.only_a} / {c.only_b}"),
        (f"improvement (> {100 * (1 + c.threshold):g}%)", str(len(c.improvements))),
    ):
        summary.add_row(label, value)
    common.print_table(summary)
    for verdict, rows in (
        (comparing.REGRESSION, [r for r in c.regressions if r.verdict == comparing.REGRESSION]),
        (comparing.SLOWER, [r for r in c.regressions if r.verdict == comparing.SLOWER]),
        (comparing.NOISE, c.within_noise),
    ):
        _print_regressions(rows, f"{verdict}: {comparing.VERDICT_MEANING[verdict]}, worst first")
    if c.missing_in_b:
        print(f"{comparing.MISSING}: {comparing.VERDICT_MEANING[comparing.MISSING]}")
        for vector in c.missing_in_b[:SHOWN_REGRESSIONS]:
            print(f"  {vector}")
        if len(c.missing_in_b) > SHOWN_REGRESSIONS:
            common.err(f"… and {len(c.missing_in_b) - SHOWN_REGRESSIONS} more (--json lists all)")
    meaning = comparing.VERDICT_MEANING[comparing.IMPROVEMENT]
    _print_regressions(c.improvements, f"{comparing.IMPROVEMENT}: {meaning}, best first")


COMPARE_CSV = (
    "kind",
    "ratio",
    "test_vector",
    "perf_config_a",
    "perf_config_b",
    "tflops_a",
    "tflops_b",
)


def _print_comparison_csv(c: comparing.Comparison) -> None:
    """Kind: the verdict (regression, slower, noise, missing or improvement), as the text and
    JSON say."""
    from mlirtuna.history import compare as comparing

    def row(r: comparing.Regression) -> tuple[object, ...]:
        return (r.verdict, r.ratio, r.test_vector, r.perf_config_a, r.perf_config_b,
                r.tflops_a, r.tflops_b)  # fmt: skip

    rows = [row(r) for r in c.regressions + c.within_noise]
    rows += [(comparing.MISSING, "", vector, "", "", "", "") for vector in c.missing_in_b]
    rows += [row(r) for r in c.improvements]
    common.print_csv(COMPARE_CSV, rows)


def _print_regressions(rows: list[comparing.Regression], title: str) -> None:
    if not rows:
        return
    table = common.TextTable(
        "B/A",
        "test vector",
        "perf config A",
        "perf config B",
        "TFlops A",
        "TFlops B",
        "A's config in B",
        title=title,
    )
    for r in rows[:SHOWN_REGRESSIONS]:
        table.add_row(
            f"{r.ratio:.3f}",
            r.test_vector,
            r.perf_config_a,
            r.perf_config_b,
            f"{r.tflops_a:.3g}",
            f"{r.tflops_b:.3g}",
            _fmt(r.tflops_a_in_b, ".3g"),
        )
    common.print_table(table)
    if len(rows) > SHOWN_REGRESSIONS:
        common.err(f"… and {len(rows) - SHOWN_REGRESSIONS} more (--json lists all)")


def results_(
    ctx: typer.Context,
    session: int = typer.Option(..., "--session", help="Session id."),
    op: str = typer.Option(None, "--op", help="Only problems of this op."),
    as_json: bool = typer.Option(False, "--json", help="Print JSON."),
    as_csv: bool = typer.Option(False, "--csv", help="Print CSV."),
) -> None:
    """The winners of a session: perf config, TFlops, kernel time (ns), candidates tried, and
    the margin over the runner-up ("(noise)" when the two are within measurement noise)."""
    fmt = common.output_format(as_json, as_csv)
    from mlirtuna import sessions
    from mlirtuna.history import winners

    db = common.database(ctx)
    if sessions.get(db, session).standin:
        common.err(f"session {session} is a stand-in session ({sessions.STANDIN_WHY})")
    rows = winners.winners(db, session, op)
    if fmt == "json":
        common.print_json([r.as_dict() for r in rows])
    elif fmt == "csv":
        print_winners_csv(rows)
    else:
        common.print_table(winners_table(rows))
        common.err(f"{len(rows)} winners in session {session}")


def print_winners_csv(rows: list[winners.Winner]) -> None:
    from mlirtuna.history import winners

    fields = ("op", *winners.FIELDS)
    common.print_csv(fields, ([getattr(r, f) for f in fields] for r in rows))


def winners_table(rows: list[winners.Winner]) -> common.TextTable:
    """The winners as a person reads them (also what `mlirtuna run` ends with)."""
    table = common.TextTable(
        "op", "test vector", "perf config", "TFlops", "kernel ns", "tried", "margin"
    )
    for r in rows:
        table.add_row(
            r.op,
            r.test_vector,
            r.perf_config,
            _fmt(r.tflops, ".4g"),
            _fmt(r.kernel_time, ".0f"),
            str(r.candidates),
            _margin(r),
        )
    return table


def _margin(r: winners.Winner) -> str:
    """How far the winner is ahead of the runner-up: `+4.1%`, or `+0.3% (noise)` when the two
    are within their measurement noise."""
    if r.winner_margin is None:
        return "-"
    text = f"{r.winner_margin:+.1%}"
    return f"{text} (noise)" if r.within_noise else text


def _fmt(value: float | None, spec: str) -> str:
    return "-" if value is None else format(value, spec)


def register(app: typer.Typer) -> None:
    app.command()(export)
    app.command("import-tsv")(import_tsv)
    app.command()(compare)
    app.command("results")(results_)
