"""compare: old vs new tuning on hand-made cases, sessions and .tsv files, on every backend."""

from __future__ import annotations

import math
from pathlib import Path

import pytest
from support.clitools import cli
from support.results import gemm, new_session, put_results, tune

from mlirtuna import catalog
from mlirtuna.errors import InputError, UserError
from mlirtuna.history import compare
from mlirtuna.problems import ExpandOptions
from mlirtuna.queue import jobs

V = [gemm(m) for m in (16, 32, 64, 128)]
JSON_KEYS = {"common", "same_winner", "geomean_ratio", "regressions", "only_a", "only_b"}


def v3_file(path, rows: dict[str, tuple[str, float]], arch: str = "gfx942") -> str:
    path.write_text(
        "# arch\tnumCUs\tnumChiplets\ttestVector\tperfConfig\tTFlops\ttuningSpace\tcommitId"
        "\ttimestamp\tdurationSec\n"
        + "".join(
            f"{arch}\t304\t8\t{tv}\t{pc}\t{tf}\tfull\tx\t2025-01-01T00:00:00Z\t1.0\n"
            for tv, (pc, tf) in rows.items()
        )
    )
    return str(path)


def test_identical_session_and_its_export(db, db_url, tmp_path):
    sid = new_session(db)
    tune(db, tmp_path, sid, V)
    out = tmp_path / "db.tsv"
    assert cli(db_url, "export", "--session", str(sid), "-o", str(out)).code == 0
    run = cli(db_url, "compare", str(sid), str(out), "--json", "--fail-on-regression")
    assert run.code == 0, run.stderr
    got = run.json()
    assert set(got) >= JSON_KEYS
    assert (got["common"], got["same_winner"], got["only_a"], got["only_b"]) == (4, 4, 0, 0)
    # The file holds what the database gave back (FLOAT on MariaDB), so the ratio is 1.
    assert got["geomean_ratio"] == pytest.approx(1.0) and got["regressions"] == []
    assert got["same_winner_pct"] == 100.0
    human = cli(db_url, "compare", str(sid), str(out))
    assert human.code == 0 and "same winner" in human.stdout and "4 (100.0%)" in human.stdout


def test_one_regression_between_sessions(db, db_url):
    a, b = new_session(db), new_session(db)
    put_results(db, a, {V[0]: ("pa", 2.0), V[1]: ("same", 1.0), V[2]: ("pc", 1.0)})
    put_results(db, b, {V[0]: ("pb", 1.0), V[1]: ("same", 1.0), V[2]: ("pc2", 0.97)})
    run = cli(db_url, "compare", str(a), str(b), "--json")
    assert run.code == 0
    got = run.json()
    assert (got["common"], got["same_winner"]) == (3, 1)
    assert got["geomean_ratio"] == pytest.approx((0.5 * 1.0 * 0.97) ** (1 / 3), rel=1e-5)
    assert got["min_ratio"] == pytest.approx(0.5) and got["max_ratio"] == pytest.approx(1.0)
    (reg,) = got["regressions"]  # 0.97 is within the default 5%
    assert (reg["test_vector"], reg["perf_config_a"], reg["perf_config_b"]) == (V[0], "pa", "pb")
    assert reg["ratio"] == pytest.approx(0.5)
    failing = cli(db_url, "compare", str(a), str(b), "--fail-on-regression")
    assert failing.code == 1 and "pa" in failing.stdout and "pb" in failing.stdout
    strict = cli(db_url, "compare", str(a), str(b), "--threshold", "2%", "--json").json()
    assert [r["perf_config_b"] for r in strict["regressions"]] == ["pb", "pc2"]  # worst first


def test_disjoint_problems_are_an_error_not_a_pass(db, db_url, tmp_path):
    a = new_session(db)
    put_results(db, a, {V[0]: ("p", 1.0), V[1]: ("p", 1.0)})
    b = v3_file(tmp_path / "b.tsv", {V[2]: ("p", 1.0), V[3]: ("p", 1.0), gemm(256): ("p", 1.0)})
    for extra in ([], ["--json", "--fail-on-regression"]):
        run = cli(db_url, "compare", str(a), b, *extra)
        assert run.code == 2 and run.stdout == "", run.stdout
        assert "no problem in common" in run.stderr and run.stderr.count("\n") == 1


def test_problems_missing_from_b_fail_unless_allowed(db, db_url, tmp_path):
    """A job of B that failed or was cancelled leaves a problem of A without a winner in B."""
    a, b = new_session(db), new_session(db)
    tune(db, tmp_path, a, V[:3])
    tune(db, tmp_path, b, V[:2])
    (tmp_path / "late").write_text(V[2] + "\n")
    catalog.import_files(db, "gemm", [str(tmp_path / "late")], ExpandOptions(expand=False), "t")
    assert jobs.load(db, b, tag="t").added == 1 and jobs.cancel(db, b, None) == 1
    got = cli(db_url, "compare", str(a), str(b), "--json").json()
    assert got["missing_in_b"] == [V[2]] and got["regressions"] == [] and got["only_a"] == 1
    run = cli(db_url, "compare", str(a), str(b), "--fail-on-regression")
    assert run.code == 1 and V[2] in run.stdout and "1 missing" in run.stderr
    allowed = cli(db_url, "compare", str(a), str(b), "--fail-on-regression", "--allow-missing")
    assert allowed.code == 0, allowed.stderr
    # B holding more than A is no loss.
    assert cli(db_url, "compare", str(b), str(a), "--fail-on-regression").code == 0


def test_same_winner_remeasured_is_counted_apart(db, db_url):
    a, b = new_session(db), new_session(db)
    put_results(db, a, {V[0]: ("same", 2.0), V[1]: ("old", 2.0), V[2]: ("same2", 1.0)})
    put_results(db, b, {V[0]: ("same", 1.0), V[1]: ("old", 2.0), V[2]: ("same2", 1.0)})
    got = cli(db_url, "compare", str(a), str(b), "--json").json()
    assert (got["regressions_same_winner"], got["regressions_winner_changed"]) == (1, 0)
    assert got["regressions"][0]["winner_changed"] is False
    human = cli(db_url, "compare", str(a), str(b), "--fail-on-regression")
    assert human.code == 1 and "slower: the same winner measured slower" in human.stdout
    assert "regression: the winner changed" not in human.stdout
    only = ["--fail-on-regression", "--changed-winner-only"]
    assert cli(db_url, "compare", str(a), str(b), *only).code == 0
    c = new_session(db)  # as b, and a changed winner regresses too
    put_results(db, c, {V[0]: ("same", 1.0), V[1]: ("new", 1.0), V[2]: ("same2", 1.0)})
    got = cli(db_url, "compare", str(a), str(c), "--json").json()
    assert (got["regressions_same_winner"], got["regressions_winner_changed"]) == (1, 1)
    assert cli(db_url, "compare", str(a), str(c), *only).code == 1


def test_two_files_recanonicalized_with_op(tmp_path):
    a = v3_file(tmp_path / "a.tsv", {V[0]: ("p", 1.0), V[1]: ("q", 2.0)})
    # The same problems written in another flag order, as an older tool might.
    b = v3_file(
        tmp_path / "b.tsv",
        {
            "-transA false -transB false -t f32 -g 1 -m 16 -n 64 -k 32": ("p", 1.0),
            "-transB false -transA false -t f32 -g 1 -m 32 -n 64 -k 32": ("q2", 1.0),
        },
    )
    with pytest.raises(compare.NoCommonProblem):  # as written, nothing matches
        compare.compare(*compare.load_sides(a, b, None, _no_db))
    got = compare.compare(*compare.load_sides(a, b, "gemm", _no_db))
    assert (got.common, got.same_winner, len(got.regressions)) == (2, 1, 1)
    assert got.regressions[0].ratio == 0.5 and math.isclose(got.geomean_ratio, math.sqrt(0.5))


def test_bad_inputs_are_one_line_exit_2(db, db_url, tmp_path):
    sid = new_session(db)
    put_results(db, sid, {V[0]: ("p", 1.0)})
    two = tmp_path / "two.tsv"
    one = v3_file(tmp_path / "x.tsv", {V[0]: ("p", 1.0)})
    other = f"gfx90a\t110\t1\t{V[0]}\tq\t1.0\tfull\tx\t2025-01-01T00:00:00Z\t1.0\n"
    two.write_text(Path(one).read_text() + other)
    run = cli(db_url, "compare", str(sid), str(two))
    assert run.code == 2 and f"{two}:3: " in run.stderr and "one context" in run.stderr
    bad_tv = v3_file(tmp_path / "bad.tsv", {"-t f32 -m 3": ("p", 1.0)})
    run = cli(db_url, "compare", str(sid), bad_tv, "--op", "gemm")
    assert run.code == 2 and f"{bad_tv}:2: " in run.stderr
    for args in (
        ["99", str(two)],
        [str(sid), str(tmp_path / "none.tsv")],
        [str(sid), str(sid), "--threshold", "lots"],
    ):
        run = cli(db_url, "compare", *args)
        assert run.code == 2 and run.stderr.count("\n") == 1, run.stderr


def test_threshold_parsing():
    assert compare.parse_threshold("5%") == 0.05 and compare.parse_threshold("10 %") == 0.1
    assert compare.parse_threshold(" 0.5 % ") == 0.005
    # Without %, a number is a fraction (never 0.05%); one that cannot be a fraction is refused.
    assert compare.parse_threshold("0.05") == 0.05 and compare.parse_threshold("0") == 0
    for bad in ("-1%", "100%", "x", "5", "1", "-0.1"):
        with pytest.raises(UserError):
            compare.parse_threshold(bad)


def test_tsv_side_keeps_the_last_row_of_one_context(tmp_path):
    path = tmp_path / "twice.tsv"
    v3_file(path, {V[0]: ("first", 1.0)})
    path.write_text(path.read_text() + path.read_text().replace("first", "second"))
    assert compare.tsv_side(str(path), None).entries[V[0]].perf_config == "second"
    with pytest.raises(InputError):
        compare.tsv_side(v3_file(tmp_path / "bad.tsv", {"-m 1": ("p", 1.0)}), "gemm")


def _no_db():
    raise AssertionError("two files need no database")


UNMEASURED, BOTH_UNKNOWN, KEPT = gemm(1024), gemm(2048), gemm(16)


def gate(db_url: str, a: str, b: str, *flags: str) -> tuple[dict[str, tuple[str, bool]], int]:
    """`compare --json --fail-on-regression`: each finding's (verdict, fails), and the exit."""
    run = cli(db_url, "compare", a, b, "--json", "--fail-on-regression", *flags)
    found = {r["test_vector"]: (r["verdict"], r["fails"]) for r in run.json()["verdicts"]}
    return found, run.code


def test_a_b_winner_without_tflops_is_missing_and_fails_the_gate(db, db_url, tmp_path):
    """Issue 43: a B winner whose TFlops is unknown (import-tsv's nan, stored as NULL) was
    skipped, so the gate passed a problem it never compared. It is `missing`, like a problem B
    lacks, and --allow-missing lets it through alike. Unknown on both sides is no finding.
    (test_compare_verdicts.py holds the other verdicts; it needs Chromium to run at all.)"""
    a, b = new_session(db), new_session(db)
    put_results(db, a, {UNMEASURED: ("p1", 10.0), BOTH_UNKNOWN: ("p1", None), KEPT: ("p1", 10.0)})
    put_results(db, b, {UNMEASURED: ("p1", None), BOTH_UNKNOWN: ("p1", None), KEPT: ("p1", 10.0)})
    assert gate(db_url, str(a), str(b)) == ({UNMEASURED: ("missing", True)}, 1)
    assert gate(db_url, str(a), str(b), "--allow-missing") == ({UNMEASURED: ("missing", False)}, 0)
    csv_rows = cli(db_url, "compare", str(a), str(b), "--csv").stdout.splitlines()
    assert [r.split(",")[0] for r in csv_rows[1:]] == ["missing"]
    # B as export writes it (nan for the unknown TFlops), compared as a .tsv: the same verdict.
    out = tmp_path / "b.tsv"
    assert cli(db_url, "export", "--session", str(b), "-o", str(out)).code == 0
    assert "\tnan\t" in out.read_text().lower()
    assert gate(db_url, str(a), str(out)) == ({UNMEASURED: ("missing", True)}, 1)
