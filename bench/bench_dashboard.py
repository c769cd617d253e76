"""How fast the dashboard answers over a big farm: every page and API call, timed.

Run (from the repository root):

    python bench/bench_dashboard.py --backends sqlite,postgresql   # generates, times, drops
    python bench/bench_dashboard.py --db sqlite:///big.db           # a farm made already
    python bench/bench_dashboard.py --backends sqlite --smoke

Without --db, each backend gets a scratch database filled by gen_dashboard_data.py at the size
given (default: 100,000 problems, 1,000 sessions, 1,000 problems per session, 5,000,000
candidates). Requests go through the real application (FastAPI's test client: routing, queries,
JSON, templates; no network). Each URL is asked --repeat times after one warm-up; the table gives
the median and the slowest, and each page's total (its HTML plus every /api/ call its script
makes, one after another: an upper bound of what a browser waits for).
"""

from __future__ import annotations

import statistics
import sys
import time
import warnings
from pathlib import Path

import sqlalchemy as sa

sys.path.insert(0, str(Path(__file__).parent))

import common
from gen_dashboard_data import SMOKE, Size, generate

from mlirtuna.db.models import ERROR, Job, Result


def urls(db_url: str, size: Size) -> dict[str, list[str]]:
    """{page: [its HTML, then the API calls its script makes]} for representative ids."""
    from mlirtuna.db import Database

    db = Database(db_url)
    mid = max(size.sessions // 2, 1)
    with db.session() as s:
        problem = s.scalar(
            sa.select(sa.func.min(Result.problem_id)).where(Result.session_id == mid)
        )
        failed = s.execute(
            sa.select(Job.id, Job.session_id).where(Job.state == ERROR).order_by(Job.id).limit(1)
        ).first()
    db.dispose()
    job, with_errors = failed if failed else (1, mid)
    winners = f"/api/sessions/{mid}/winners"
    return {
        "farm": ["/", "/api/farm"],
        "farm, older sessions": ["/api/sessions?offset=500&limit=50"],
        "session": [
            f"/sessions/{mid}", f"{winners}?sort=test_vector&offset=0&limit=50",
            f"/api/sessions/{mid}/facets", f"/api/sessions/{mid}", f"/api/sessions/{mid}/tflops",
            f"/api/sessions/{mid}/job-times", f"/api/sessions/{mid}/errors",
            f"/api/sessions/{mid}/parallel?op=gemm", f"/api/sessions/{mid}/importance?op=gemm",
        ],
        "session, one data type's candidates (parallel, importance)": [
            f"/api/sessions/{mid}/parallel?op=gemm&data_type=f16",
            f"/api/sessions/{mid}/importance?op=gemm&data_type=f16",
        ],
        "session, sorted by TFlops, last page": [f"{winners}?sort=tflops&desc=true&offset=950"],
        "session, filtered (f16, tag, search)": [
            f"{winners}?data_type=f16&tag=tier1&q=-transB%20true&sort=candidates"
        ],
        "session with errors": [f"/api/sessions/{with_errors}/errors"],
        "job": [f"/jobs/{job}", f"/api/jobs/{job}"],
        "problem": [
            f"/problems/{problem}?session={mid}", f"/api/problems/{problem}/trend",
            f"/api/problems/{problem}", f"/api/problems/{problem}/candidates?session={mid}",
            f"/api/problems/{problem}/table?session={mid}",
        ],
        "problem, re-measured candidates by median": [
            f"/api/problems/{problem}/table?session={mid}&sort=kernel_time&desc=false&show=remeasured"
        ],
        "problem, candidates by spread, filtered": [
            f"/api/problems/{problem}/table?session={mid}&sort=time_iqr&desc=false&show=valid&q=1"
        ],
        "compare": [f"/compare?a={mid}&b={mid + 1}", f"/api/compare?a={mid}&b={mid + 1}"],
        "workers": ["/api/workers"],
    }  # fmt: skip


def time_urls(db_url: str, size: Size, repeat: int) -> list[tuple]:
    warnings.filterwarnings("ignore", message="Using `httpx` with `starlette.testclient`")
    from fastapi.testclient import TestClient

    from mlirtuna.web.app import create_app, open_read_only

    db = open_read_only(db_url)
    client = TestClient(create_app(db), base_url="http://127.0.0.1")
    rows = []
    try:
        for page, paths in urls(db_url, size).items():
            total = 0.0
            for path in paths:
                times, length = [], 0
                for i in range(repeat + 1):
                    t = time.perf_counter()
                    res = client.get(path)
                    elapsed = time.perf_counter() - t
                    if res.status_code != 200:
                        raise SystemExit(f"{path}: {res.status_code} {res.text[:200]}")
                    length = len(res.content)
                    if i:  # the first one warms caches and the connection pool
                        times.append(elapsed)
                med = statistics.median(times)
                total += med
                rows.append(
                    (page, f"`{path}`", round(1000 * med, 1), round(1000 * max(times), 1), length)
                )
            if len(paths) > 1:
                rows.append((page, "**page total**", round(1000 * total, 1), "", ""))
    finally:
        db.dispose()
    return rows


def count_rows(db_url: str) -> str:
    from mlirtuna.db import Database

    db = Database(db_url)
    with db.engine.connect() as conn:
        n = {
            t: conn.exec_driver_sql(f"SELECT count(*) FROM {t}").scalar()
            for t in ("problem", "session", "job", "result", "candidate")
        }
    db.dispose()
    return ", ".join(f"{v:,} {k}s" for k, v in n.items())


def main() -> None:
    p = common.parser(__doc__.splitlines()[0])
    p.add_argument("--db", help="time this database (already filled) instead of generating")
    p.add_argument("--repeat", type=int, default=5)
    p.add_argument("--problems", type=int, default=Size.problems)
    p.add_argument("--sessions", type=int, default=Size.sessions)
    p.add_argument("--per-session", type=int, default=Size.per_session)
    p.add_argument("--candidates", type=int, default=Size.candidates)
    args = p.parse_args()
    size = (
        SMOKE
        if args.smoke
        else Size(args.problems, args.sessions, args.per_session, args.candidates)
    )
    repeat = 1 if args.smoke else args.repeat
    chosen = common.backends(args.backends)
    parts = [
        "## Dashboard: every page and API call (`bench/bench_dashboard.py`)",
        common.machine_line() + " " + common.server_versions(chosen),
    ]
    targets = [("given", args.db)] if args.db else [(b, None) for b in chosen]
    for backend, url in targets:
        if url is not None:
            parts += _one(backend, url, size, repeat, None)
            continue
        with common.scratch_db(backend) as scratch:
            t = time.perf_counter()
            generate(scratch, size, log=common.status)
            made = time.perf_counter() - t
            parts += _one(backend, scratch, size, repeat, made)
    common.emit("\n\n".join(parts), args.out)


def _one(backend: str, url: str, size: Size, repeat: int, made: float | None) -> list[str]:
    scheme = url.split(":")[0].split("+")[0]
    scheme = {"postgres": "postgresql", "mariadb": "mysql"}.get(scheme, scheme)
    label = common.LABEL.get(backend) or common.LABEL.get(scheme, scheme)
    data = count_rows(url)
    when = f"; generated in {made:.0f} s" if made is not None else ""
    common.status(f"{label}: timing ({data})")
    rows = time_urls(url, size, repeat)
    slowest = max(r[3] for r in rows if r[1] != "**page total**")
    head = (
        f"### {label}: {data}{when}. Median of {repeat} after a warm-up; slowest call {slowest} ms."
    )
    return [head, common.table(("page", "request", "median ms", "max ms", "bytes"), rows)]


if __name__ == "__main__":
    main()
