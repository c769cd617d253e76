"""The candidate table with real rocMLIR perf configs (issue 35), in Chromium at 1280x800, on
every backend: v4 (14 fields), v3 (9) and attn:v3 (13). One line per row whatever the config's
length, the config ellipsized with its full text on hover, the fields behind a horizontal
scroller, the winner line within the page; beside the rule, the numbers it decided on; the
history of the tuning (order tried, best so far) and the session's EDF."""

from __future__ import annotations

from dataclasses import replace

import pytest
import sqlalchemy as sa
from support.browser import VIEWPORT, fixture_browser, served_page  # noqa: F401 (the browser and page fixtures)
from support.results import cand, gemm, new_session, record

from mlirtuna.db.models import Candidate, Problem
from mlirtuna.problems import parse
from mlirtuna.tuners.base import Candidate as Cand
from mlirtuna.web import explore

pytestmark = pytest.mark.slow

ATTENTION = parse(
    "attention",
    "-t f16 -transQ false -transK true -transV false -transO false -g 2 -seq_len_q 256 "
    "-seq_len_k 256 -head_dim_qk 64 -head_dim_v 64",
).canonical()
V4 = [f"v4:{m},{n},8,32,32,16,4,1,2,0,2,0,1,1" for m in (64, 128, 256) for n in (32, 64, 128)]
V3 = [f"v3:256,{m},{n},16,4,4,1,1,0" for m in (32, 64, 128) for n in (32, 64)]
ATTN = [f"attn:v3:{m},64,{n},8,32,32,32,4,1,1,2,0,1" for m in (32, 64, 128) for n in (32, 64)]
LONG_ERROR = "rocmlir-gen: error: perf config not applicable: " + "x" * 300


def tuned(configs: list[str], tv: str, op: str, remeasure: int) -> list:
    """Candidates, the i-th slower than the one before; the first `remeasure` re-measured, one
    more failed with a long message."""
    out = [
        replace(cand(tv, pc, 1e5 * (1 + 0.07 * i), 0.01 + 0.004 * i, 20 + i, op),
                remeasured=i < remeasure)
        for i, pc in enumerate(configs)
    ]  # fmt: skip
    return [*out, Cand(configs[0].rsplit(",", 1)[0] + ",9", error=LONG_ERROR)]


@pytest.fixture
def farm(db, tmp_path) -> tuple[int, dict[str, int]]:
    sid = new_session(db)
    tv4, tv3 = gemm(256, 256, 128), gemm(512, 128, 64, "f16")
    record(db, tmp_path, sid, {tv4: tuned(V4, tv4, "gemm", 3), tv3: tuned(V3, tv3, "gemm", 0)},
           {tv4: V4[0], tv3: V3[0]})  # fmt: skip
    record(db, tmp_path, sid, {ATTENTION: tuned(ATTN, ATTENTION, "attention", 3)},
           {ATTENTION: ATTN[0]}, op="attention")  # fmt: skip
    with db.session() as s:
        ids = dict(s.execute(sa.select(Problem.test_vector, Problem.id)).all())
    return sid, {"v4": ids[tv4], "v3": ids[tv3], "attn:v3": ids[ATTENTION]}


def us(ns: float | None) -> str:
    """The page's 3 significant digits of a time in µs."""
    return f"{float(f'{ns / 1000:.3g}'):g}"


@pytest.mark.parametrize("family", ["v4", "v3", "attn:v3"])
def test_real_configs_read_on_one_line(page, db, farm, family):
    sid, problems = farm
    pid = problems[family]
    expected = explore.candidate_page(db, sid, pid, explore.CandidateFilter())
    page.open(f"/problems/{pid}?session={sid}")
    page.tab.wait_for_function(
        f"() => document.querySelector('#candidates').dataset.total === '{expected.total}'"
    )
    assert {r.family for r in expected.rows if r.error is None} == {family}
    # One line per row: every row as tall as the shortest, the long error too.
    heights = page.tab.eval_on_selector_all(
        "#candidates tbody tr", "trs => trs.map(tr => tr.getBoundingClientRect().height)"
    )
    assert len(heights) == expected.total and max(heights) <= 1.2 * min(heights) < 32
    # The config in a monospace cell with its full text on hover, ellipsized where long.
    cells = page.tab.eval_on_selector_all(
        "#candidates tbody td.config",
        "tds => tds.map(td => [td.title, getComputedStyle(td).textOverflow,"
        " getComputedStyle(td).fontFamily])",
    )
    assert [c[0] for c in cells] == [r.perf_config for r in expected.rows]
    assert all(c[1] == "ellipsis" and "monospace" in c[2] for c in cells)
    # The fields as columns, behind a scroller: the table scrolls, the page does not.
    head = page.tab.eval_on_selector_all("#candidates thead th", "ths => ths.map(t => t.innerText)")
    # The numbers beside the config (issue 44), then the fields.
    assert head[1] == "TFlops ▼" and head.index("winner") < head.index(expected.columns[0])
    first = head.index(expected.columns[0])
    assert head[first : first + len(expected.columns)] == expected.columns
    assert len(expected.columns) == {"v4": 14, "v3": 9, "attn:v3": 13}[family]
    page_width = page.tab.evaluate("() => document.documentElement.scrollWidth")
    assert page_width <= VIEWPORT["width"]
    # The winner line wraps inside the page.
    rule = page.tab.eval_on_selector("#winner-rule", "el => el.getBoundingClientRect().right")
    assert rule <= VIEWPORT["width"] and expected.winner in page.tab.inner_text("#winner-rule")
    # Why it won: the numbers the rule decided on, side by side (median, IQR, samples).
    decided = page.rows("#decided")
    assert [r[0] for r in decided] == [r.perf_config for r in expected.decided_on]
    assert expected.decided_on and all(r.error is None for r in expected.decided_on)
    if expected.remeasured:
        assert all(r.remeasured for r in expected.decided_on) and len(decided) == 3
    for shown, row in zip(decided, expected.decided_on, strict=True):
        assert shown[2:6] == [us(row.kernel_time), us(row.time_min), us(row.time_iqr),
                              str(row.samples)]  # fmt: skip
    assert [r[-1] for r in decided].count("winner") == 1 and decided[0][-1] == "winner"
    page.shot(f"candidates-{family.replace(':', '-')}")


def test_history_and_edf(page, db, farm):
    sid, problems = farm
    pid = problems["v4"]
    with db.session() as s:
        tried = s.execute(
            sa.select(Candidate.tflops, Candidate.error)
            .where(Candidate.session_id == sid, Candidate.problem_id == pid)
            .order_by(Candidate.id)
        ).all()
        valid = s.scalar(
            sa.select(sa.func.count()).where(
                Candidate.session_id == sid, Candidate.error.is_(None), Candidate.tflops > 0
            )
        )
    page.open(f"/problems/{pid}?session={sid}")
    page.tab.wait_for_function(
        f"() => document.querySelector('#tried-plot').dataset.count === '{len(tried)}'"
    )
    points, best = page.plot("#tried-plot")
    assert points["y"] == pytest.approx([t for t, e in tried if e is None])
    so_far, want = None, []
    for t, e in tried:
        so_far = max(so_far or 0.0, t) if e is None else so_far
        want.append(so_far)
    assert best["y"] == pytest.approx(want)
    page.shot("history")
    page.open(f"/sessions/{sid}")
    page.tab.wait_for_function(
        f"() => document.querySelector('#edf-plot').dataset.count === '{valid}'"
    )
    (curve,) = page.plot("#edf-plot")
    assert curve["y"][0] == 0 and curve["y"][-1] == 1
    assert curve["x"] == sorted(curve["x"]) and curve["x"][-1] == pytest.approx(1.0)
    assert 0 < curve["x"][0] < 1
    assert f"{valid} valid candidates" in page.tab.inner_text("#edf-count")
    assert page.drawn("#edf-plot") == 0  # an SVG plot: no WebGL canvas, and no WebGL notice
