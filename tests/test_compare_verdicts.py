"""compare says one thing per row (issue 35): the CLI's CSV kind, the JSON's verdict, the page's
row and the exit code of `--fail-on-regression` agree on every finding, on every backend. A row
labelled noise never fails the gate; problems missing from B are listed on the page too.

Sessions are tuned through the real queue with candidates that carry a measured spread."""

from __future__ import annotations

import csv
import io
from collections.abc import Iterator

import pytest
from support.browser import Page, fixture_browser  # noqa: F401 (the browser fixture)
from support.clitools import cli
from support.results import cand, gemm, new_session, record
from support.webserve import serving

from mlirtuna.formats.csvcells import read_cell
from mlirtuna.history.compare import IMPROVEMENT, VERDICT_MEANING

NOISE, SLOWER, CHANGED, MISSING, SAME = gemm(64), gemm(128), gemm(256), gemm(512), gemm(32)


def tune_pair(db, tmp_path) -> tuple[int, int, int]:
    """A, B (one finding of each verdict) and C (only a drop within noise, against A)."""
    a, b, c = new_session(db), new_session(db), new_session(db)
    tight = {tv: [cand(tv, "p1", 1e5)] for tv in (SLOWER, CHANGED, MISSING, SAME)}
    record(
        db, tmp_path, a, {NOISE: [cand(NOISE, "p1", 1e5, 0.2)], **tight},
        {tv: "p1" for tv in (NOISE, *tight)},
    )  # fmt: skip
    # B: noise 6 % slower under a 20 % IQR; slower: the same winner 30 % slower (2 % IQR);
    # changed: another winner 20 % slower; missing: not tuned; same: as in A.
    record(
        db, tmp_path, b,
        {NOISE: [cand(NOISE, "p1", 1.06e5, 0.2)], SLOWER: [cand(SLOWER, "p1", 1.3e5)],
         CHANGED: [cand(CHANGED, "p2", 1.2e5)], SAME: [cand(SAME, "p1", 1e5)]},
        {NOISE: "p1", SLOWER: "p1", CHANGED: "p2", SAME: "p1"},
    )  # fmt: skip
    record(
        db, tmp_path, c,
        {NOISE: [cand(NOISE, "p1", 1.06e5, 0.2)], **tight},
        {tv: "p1" for tv in (NOISE, *tight)},
    )  # fmt: skip
    return a, b, c


def verdicts_of_cli(db_url: str, a: int, b: int, *gate: str) -> tuple[dict, dict, int]:
    """(CSV kind per vector, JSON verdict per vector with its fails flag, the gate's exit)."""
    rows = list(csv.DictReader(io.StringIO(cli(db_url, "compare", str(a), str(b), "--csv").stdout)))
    kinds = {read_cell(r["test_vector"]): r["kind"] for r in rows}  # formats.csvcells
    run = cli(db_url, "compare", str(a), str(b), "--json", "--fail-on-regression", *gate)
    verdicts = {r["test_vector"]: (r["verdict"], r["fails"]) for r in run.json()["verdicts"]}
    return kinds, verdicts, run.code


def test_the_gate_fails_on_what_it_labels_failing(db, db_url, tmp_path):
    a, b, c = tune_pair(db, tmp_path)
    kinds, verdicts, code = verdicts_of_cli(db_url, a, b)
    assert kinds == {NOISE: "noise", SLOWER: "slower", CHANGED: "regression", MISSING: "missing"}
    assert {tv: v for tv, (v, _) in verdicts.items()} == kinds
    failing = {tv for tv, (_, fails) in verdicts.items() if fails}
    assert failing == {SLOWER, CHANGED, MISSING} and code == 1
    # The options move rows out of the gate by their verdict, never anything else.
    _, only, code = verdicts_of_cli(db_url, a, b, "--changed-winner-only", "--allow-missing")
    assert {tv for tv, (_, fails) in only.items() if fails} == {CHANGED} and code == 1
    # A row labelled noise never fails: A against C has nothing but a drop within noise.
    kinds, verdicts, code = verdicts_of_cli(db_url, a, c)
    assert kinds == {NOISE: "noise"} and verdicts == {NOISE: ("noise", False)} and code == 0
    human = cli(db_url, "compare", str(a), str(b), "--fail-on-regression")
    text = " ".join(human.stdout.split())
    for verdict in ("regression:", "slower:", "noise:", "missing:"):
        assert verdict in text
    assert "noise, not tuning" not in text and human.code == 1


@pytest.fixture
def site(db_url) -> Iterator[str]:
    with serving(db_url) as url:
        yield url


@pytest.mark.slow
def test_the_page_shows_the_same_verdict_per_row(db, db_url, tmp_path, browser, site):
    a, b, c = tune_pair(db, tmp_path)
    _, verdicts, _ = verdicts_of_cli(db_url, a, b)
    page = Page(browser, site)
    try:
        page.open(f"/compare?a={a}&b={b}")
        page.tab.wait_for_selector("#missing tbody tr")
        shown = page.tab.eval_on_selector_all(
            "tr[data-verdict]:not([data-verdict=improvement])",
            "trs => trs.map(tr => [tr.dataset.vector, tr.dataset.verdict, tr.closest('table').id])",
        )
        assert {tv: v for tv, v, _ in shown} == {tv: v for tv, (v, _) in verdicts.items()}
        assert len(shown) == len(verdicts)  # one row per finding
        tables = {v: t for _, v, t in shown}
        assert tables == {
            "regression": "regressions", "slower": "same-winner", "noise": "within-noise",
            "missing": "missing",
        }  # fmt: skip
        assert page.rows("#missing")[0][1] == "missing"
        gate = page.tab.inner_text("#gate")
        assert "fails: 3 findings" in gate
        page.shot("compare-verdicts")
        page.open(f"/compare?a={a}&b={c}")
        page.tab.wait_for_selector("#within-noise tbody tr")
        assert "passes" in page.tab.inner_text("#gate")
    finally:
        page.close()


def test_a_passing_gate_says_so_and_improvements_are_listed(db, db_url, tmp_path):
    """The gate's pass is one line on stderr naming what it passed over (issue 44), and a
    problem B tunes faster beyond the threshold is an `improvement` in the text, the CSV and the
    JSON, like every other verdict, and never fails the gate."""
    a, b = new_session(db), new_session(db)
    record(
        db, tmp_path, a, {tv: [cand(tv, "p1", 1e5)] for tv in (SAME, CHANGED)},
        {SAME: "p1", CHANGED: "p1"},
    )  # fmt: skip
    record(
        db, tmp_path, b, {SAME: [cand(SAME, "p1", 1e5)], CHANGED: [cand(CHANGED, "p2", 0.5e5)]},
        {SAME: "p1", CHANGED: "p2"},
    )  # fmt: skip
    gate = cli(db_url, "compare", str(a), str(b), "--fail-on-regression")
    assert gate.code == 0, gate.stderr
    assert gate.stderr.count("\n") == 1, gate.stderr
    assert gate.stderr.startswith(
        "gate passed: 0 findings fail it (0 regression, 0 slower, 0 missing) in 2 common "
        "problems (threshold 5%); not counted: 0 noise; 1 improvement"
    ), gate.stderr
    text = " ".join(gate.stdout.split())
    assert f"improvement: {VERDICT_MEANING[IMPROVEMENT]}, best first" in text
    listed = gate.stdout[gate.stdout.index("improvement: ") :]
    assert CHANGED in " ".join(listed.split()) and SAME not in " ".join(listed.split())
    kinds, verdicts, code = verdicts_of_cli(db_url, a, b)
    assert kinds == {CHANGED: "improvement"} and verdicts == {CHANGED: ("improvement", False)}
    assert code == 0
    # No gate asked: no gate line.
    assert cli(db_url, "compare", str(a), str(b)).stderr == ""
