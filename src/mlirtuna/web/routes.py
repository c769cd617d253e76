"""The dashboard's routes: a JSON API under /api/ and the pages that draw it.

Handlers only read parameters, call the API modules (farm, explore, compare, jobs, sessions) and
return their objects; the pages are shells whose script fetches the same /api/ answers that
scripts and monitoring read (docs/dashboard.md lists them).
"""

from __future__ import annotations

import io
from collections.abc import Iterable
from dataclasses import asdict
from typing import Any

from fastapi import APIRouter, Query, Request
from fastapi.responses import HTMLResponse, RedirectResponse, Response

import mlirtuna.web.explore as explore
import mlirtuna.web.farm as farm
import mlirtuna.web.importance as importance
from mlirtuna import sessions
from mlirtuna.db import Database
from mlirtuna.errors import UserError
from mlirtuna.formats.csvcells import write_csv
from mlirtuna.history import compare, perffields, winners
from mlirtuna.queue import jobs

api = APIRouter(prefix="/api")
pages = APIRouter()

TABLE_LIMIT = 100  # rows of a compare table a page shows at first


def _db(request: Request) -> Database:
    return request.app.state.db


# ---------------------------------------------------------------- the JSON API


def _csv(name: str, header: list[str], rows: Iterable[Iterable[Any]]) -> Response:
    """A table as a CSV download (the same columns the CLI's --csv writes, where it has one;
    a cell a spreadsheet would evaluate made text: formats.csvcells)."""
    out = io.StringIO()
    write_csv(out, header, rows)
    return Response(
        out.getvalue(),
        media_type="text/csv; charset=utf-8",
        headers={"Content-Disposition": f'attachment; filename="{name}"'},
    )


@api.get("/farm")
def api_farm(
    request: Request, offset: int = 0, limit: int = farm.DEFAULT_PAGE, q: str | None = None
) -> dict[str, Any]:
    """Sessions (newest first, one page; `q`: a search) with progress, and every worker busy
    now."""
    db = _db(request)
    out = farm.farm(db, offset, limit, q).as_dict()
    out["workers"] = [w.as_dict() for w in farm.workers(db)]
    return out


@api.get("/farm.csv")
def api_farm_csv(request: Request, q: str | None = None) -> Response:
    """Every session (or those `q` finds) with its counts by state, as CSV."""
    db, rows, offset = _db(request), [], 0
    states = ("new", "waiting", "running", "completed", "error", "cancelled")
    keys = ("id", "name", "arch_full", "num_cu", "num_chiplets", "rocm_v", "mlir_v",
            "tuning_space", "tuner", "reason", "ticket", "created_at")  # fmt: skip
    while True:
        page = farm.farm(db, offset, farm.MAX_PAGE, q)
        rows += [
            [getattr(p.session, k) for k in keys] + [p.counts.get(s, 0) for s in states]
            for p in page.sessions
        ]
        offset += farm.MAX_PAGE
        if offset >= page.total_sessions:
            return _csv("sessions.csv", [*keys, *states], rows)


@api.get("/sessions/{session_id}/winners.csv")
def api_winners_csv(request: Request, session_id: int) -> Response:
    """Every counted winner of the session, as `mlirtuna results --csv` writes them."""
    fields = ["op", *winners.FIELDS]
    best = winners.winners(_db(request), session_id)
    return _csv(
        f"winners-{session_id}.csv", fields, ([getattr(w, f) for f in fields] for w in best)
    )


@api.get("/problems/{problem_id}/candidates.csv")
def api_candidates_csv(request: Request, problem_id: int, session: int) -> Response:
    """Every candidate of the tuning: perf config, its fields, the time statistics, marks."""
    db, rows, offset = _db(request), [], 0
    where = explore.CandidateFilter()
    while True:
        page = explore.candidate_page(db, session, problem_id, where, offset, farm.MAX_PAGE)
        rows += page.rows
        offset += farm.MAX_PAGE
        if offset >= page.total:
            break
    fields = perffields.columns([r.perf_config for r in rows])
    head = ["perf_config", *fields, "tflops", "kernel_time_ns", "time_min_ns", "time_iqr_ns",
            "samples", "remeasured", "dropped", "winner", "error", "round"]  # fmt: skip
    return _csv(
        f"candidates-{session}-{problem_id}.csv",
        head,
        (
            [r.perf_config, *(r.fields.get(f, "") for f in fields), r.tflops, r.kernel_time,
             r.time_min, r.time_iqr, r.samples, r.remeasured, r.dropped, r.winner, r.error,
             r.search_round]
            for r in rows
        ),
    )  # fmt: skip


@api.get("/sessions")
def api_sessions(
    request: Request, offset: int = 0, limit: int = farm.DEFAULT_PAGE
) -> dict[str, Any]:
    """Sessions, newest first, with context, counts by state, jobs/min and ETA."""
    return farm.farm(_db(request), offset, limit).as_dict()


@api.get("/workers")
def api_workers(request: Request, session: int | None = None) -> list[dict[str, Any]]:
    """Jobs held now: machine, GPU, problem, runtime, heartbeat age, stale/expired flags."""
    return [w.as_dict() for w in farm.workers(_db(request), session)]


@api.get("/sessions/{session_id}")
def api_session(request: Request, session_id: int) -> dict[str, Any]:
    db = _db(request)
    out = farm.session_progress(db, session_id).as_dict()
    out["stages"] = farm.stage_progress(db, session_id)  # two-stage sessions: per stage
    out["notes"] = [asdict(n) for n in sessions.notes(db, session_id)]
    return out


@api.get("/sessions/{session_id}/winners")
def api_winners(
    request: Request,
    session_id: int,
    op: str | None = None,
    tag: str | None = None,
    data_type: str | None = None,
    q: str | None = Query(None, description="substring of the test vector or perf config"),
    sort: str = "test_vector",
    desc: bool = False,
    offset: int = 0,
    limit: int = 50,
) -> dict[str, Any]:
    """One page of the session's winners, filtered and sorted on the server."""
    where = explore.WinnerFilter(op or None, tag or None, data_type or None, q or None, sort, desc)
    return explore.winners_page(_db(request), session_id, where, offset, limit).as_dict()


@api.get("/sessions/{session_id}/parallel")
def api_parallel(
    request: Request, session_id: int, op: str, data_type: str = "", limit: int = 5000
) -> dict[str, Any]:
    """The session's valid candidates of one op and data type as parallel coordinates: one
    axis per perf-config field, coloured by TFlops over the problem's best."""
    return explore.parallel(_db(request), session_id, op, data_type, limit).as_dict()


@api.get("/sessions/{session_id}/importance")
def api_importance(
    request: Request, session_id: int, op: str, data_type: str = "", limit: int = 5000
) -> dict[str, Any]:
    """How much each perf-config field explains the candidates' TFlops over their problem's
    best (the candidates of /parallel; a random forest's impurity importance)."""
    return importance.importance(_db(request), session_id, op, data_type, limit).as_dict()


@api.get("/sessions/{session_id}/edf")
def api_edf(request: Request, session_id: int) -> dict[str, Any]:
    """The empirical distribution of TFlops / the problem's best over the valid candidates."""
    return explore.edf(_db(request), session_id).as_dict()


@api.get("/sessions/{session_id}/facets")
def api_facets(request: Request, session_id: int) -> dict[str, Any]:
    """The ops, data types and tags the winners can be filtered by."""
    return explore.facets(_db(request), session_id).as_dict()


@api.get("/sessions/{session_id}/tflops")
def api_tflops(request: Request, session_id: int) -> dict[str, Any]:
    """The winners' TFlops, binned."""
    return explore.tflops_distribution(_db(request), session_id).as_dict()


@api.get("/sessions/{session_id}/job-times")
def api_job_times(request: Request, session_id: int) -> dict[str, Any]:
    """Seconds per completed job, binned."""
    return explore.job_times(_db(request), session_id).as_dict()


@api.get("/sessions/{session_id}/errors")
def api_errors(request: Request, session_id: int) -> list[dict[str, Any]]:
    """Failed jobs grouped by the first line of their error, most frequent first."""
    return [g.__dict__ for g in explore.error_groups(_db(request), session_id)]


@api.get("/jobs/{job_id}")
def api_job(request: Request, job_id: int) -> dict[str, Any]:
    """A job with its whole text and every attempt (as `mlirtuna jobs show`)."""
    return jobs.show(_db(request), job_id).as_dict()


@api.get("/problems/{problem_id}")
def api_problem(request: Request, problem_id: int) -> dict[str, Any]:
    db = _db(request)
    out = explore.problem(db, problem_id).as_dict()
    out["session_ids"] = explore.sessions_of_problem(db, problem_id)
    return out


@api.get("/problems/{problem_id}/trend")
def api_trend(request: Request, problem_id: int) -> list[dict[str, Any]]:
    """The winner in every session that tuned the problem, oldest first, with its context."""
    return [p.__dict__ for p in explore.trend(_db(request), problem_id)]


@api.get("/problems/{problem_id}/candidates")
def api_candidates(request: Request, problem_id: int, session: int) -> dict[str, Any]:
    """The perf configs tried in one session: the best valid ones first, the failed and the
    dropped ones apart (at most explore.CANDIDATES_SHOWN each; `totals` counts them all)."""
    return explore.candidates(_db(request), session, problem_id).as_dict()


@api.get("/problems/{problem_id}/history")
def api_history(request: Request, problem_id: int, session: int) -> dict[str, Any]:
    """The tuning's candidates in the order tried, with the best TFlops so far."""
    return explore.history(_db(request), session, problem_id).as_dict()


@api.get("/problems/{problem_id}/table")
def api_candidate_table(
    request: Request,
    problem_id: int,
    session: int,
    q: str | None = Query(None, description="substring of the perf config"),
    show: str = Query("all", description="all | valid | invalid | remeasured | dropped"),
    sort: str = "tflops",
    desc: bool = True,
    offset: int = 0,
    limit: int = 50,
) -> dict[str, Any]:
    """One page of the tuning's candidates (sorted, filtered, paged on the server), with the
    perf configs' fields, the time statistics, the re-measured and winner marks, and the rule
    that chose the winner."""
    where = explore.CandidateFilter(q or None, show, sort, desc)
    return explore.candidate_page(_db(request), session, problem_id, where, offset, limit).as_dict()


@api.get("/compare")
def api_compare(
    request: Request, a: int, b: int, threshold: str = "5%", limit: int = TABLE_LIMIT
) -> dict[str, Any]:
    """Session A against session B: the numbers of `mlirtuna compare`, improvements, and every
    common problem's TFlops pair (the scatter)."""
    db = _db(request)
    side_a, side_b = compare.load_sides(str(a), str(b), None, lambda: db)
    cut = compare.parse_threshold(threshold)
    result = compare.compare(side_a, side_b, cut)
    out = result.as_dict()  # `verdicts`: every finding's verdict, the gate's default options
    limit = max(limit, 0)
    out["regressions_total"] = len(result.regressions)
    better = compare.improvements(side_a, side_b, cut)
    out["improvements_total"] = len(better)
    # The CLI's split, by verdict: regression and slower fail the gate, noise never does,
    # missing (problems of A that B lacks) does unless --allow-missing.
    by = {
        v: [r for r in result.regressions if r.verdict == v]
        for v in (compare.REGRESSION, compare.SLOWER)
    }
    groups = {
        "regressions": result.regressions[:limit],
        "regressions_changed": by[compare.REGRESSION][:limit],
        "regressions_same": by[compare.SLOWER][:limit],
        "within_noise": result.within_noise[:limit],
        "improvements": better[:limit],
    }
    out["within_noise_total"] = len(result.within_noise)
    out["missing_total"] = len(result.missing_in_b)
    out["gate"] = {
        "fails": result.fails(),
        "failing": len(result.failing()),
        "meaning": compare.VERDICT_MEANING,
    }
    out.update(explore.compare_rows(db, groups, side_a.entries, side_b.entries))
    out["missing"] = explore.missing_rows(db, result.missing_in_b[:limit], side_a.entries)
    points = compare.pairs(side_a, side_b)
    out["points"] = {
        "tflops_a": [p.tflops_a for p in points],
        "tflops_b": [p.tflops_b for p in points],
        "test_vector": [p.test_vector for p in points],
    }
    return out


# ---------------------------------------------------------------- pages


def _page(request: Request, name: str, **context: Any) -> HTMLResponse:
    templates = request.app.state.templates
    context["poll_ms"] = request.app.state.poll_ms
    return templates.TemplateResponse(request, name, context)


@pages.get("/", response_class=HTMLResponse)
def page_farm(request: Request) -> HTMLResponse:
    return _page(request, "farm.html")


# A browser that asks for the collections gets the farm page, which shows both (the JSON is
# under /api/).
@pages.get("/sessions", response_class=RedirectResponse)
def page_sessions() -> RedirectResponse:
    return RedirectResponse("/#sessions", status_code=307)


@pages.get("/workers", response_class=RedirectResponse)
def page_workers() -> RedirectResponse:
    return RedirectResponse("/#workers", status_code=307)


@pages.get("/api", response_class=HTMLResponse)
def page_api(request: Request) -> HTMLResponse:
    """The JSON API's endpoints, each with the first paragraph of what it answers (the nav's
    "API")."""
    paths = request.app.openapi()["paths"]  # read off the app: never out of date
    endpoints = [
        (path, " ".join((item["get"].get("description") or "").strip().split("\n\n")[0].split()))
        for path, item in paths.items()
        if path.startswith("/api/") and "get" in item
    ]
    return _page(request, "api.html", endpoints=endpoints)


@pages.get("/sessions/{session_id}", response_class=HTMLResponse)
def page_session(request: Request, session_id: int) -> HTMLResponse:
    db = _db(request)
    info = sessions.get(db, session_id)
    return _page(request, "session.html", session=info, notes=sessions.notes(db, session_id))


@pages.get("/problems/{problem_id}", response_class=HTMLResponse)
def page_problem(request: Request, problem_id: int, session: int | None = None) -> HTMLResponse:
    db = _db(request)
    info = explore.problem(db, problem_id)
    return _page(request, "problem.html", problem=info, chosen=session)


@pages.get("/jobs/{job_id}", response_class=HTMLResponse)
def page_job(request: Request, job_id: int) -> HTMLResponse:
    return _page(request, "job.html", job=jobs.show(_db(request), job_id))


@pages.get("/compare", response_class=HTMLResponse)
def page_compare(
    request: Request, a: str | None = None, b: str | None = None, threshold: str = "5%"
) -> HTMLResponse:
    for value in (a, b):
        if value and not value.isdigit():
            raise UserError(f"compare takes session ids, not {value!r} (import a .tsv first)")
    db = _db(request)
    chosen = [sessions.get(db, int(v)) for v in (a, b) if v]
    return _page(
        request,
        "compare.html",
        a=a or "",
        b=b or "",
        threshold=threshold,
        choices=sessions.list_all(db)[::-1][:PICKER_SESSIONS],
        contexts=_context_rows(*chosen) if len(chosen) == 2 else [],
    )


# What a compare's two sessions were tuned with: a field that differs explains a changed winner.
CONTEXT_FIELDS = (("arch", "arch_full"), ("CUs", "num_cu"), ("chiplets", "num_chiplets"),
                  ("ROCm", "rocm_v"), ("rocMLIR", "mlir_v"), ("space", "tuning_space"),
                  ("tuner", "tuner"), ("stand-in", "standin"), ("search", "search"),
                  ("budget", "search_budget"), ("host", "host"),
                  ("opened", "created_at"))  # fmt: skip
PICKER_SESSIONS = 500  # the newest sessions the compare page's pickers offer
NONE_SHOWN = "\N{EN DASH}"  # an empty field, as the other pages show it


def _shown(value: Any) -> str:
    if isinstance(value, bool):
        return "yes" if value else "no"
    return str(value) if value not in (None, "") else NONE_SHOWN


def _context_rows(a: sessions.Session, b: sessions.Session) -> list[tuple[str, str, str, bool]]:
    """(label, A's value, B's value, whether they differ) per context field; the opening time
    always differs and is not marked."""
    rows = []
    for label, key in CONTEXT_FIELDS:
        va, vb = (_shown(getattr(side, key)) for side in (a, b))
        rows.append((label, va, vb, va != vb and key != "created_at"))
    return rows
