"""The dashboard's JSON API and pages through FastAPI's test client, on every backend, over a farm
made by real tuning (tests/webfarm.py). Expected values come from the database and the CLI."""

from __future__ import annotations

import contextlib
import html
import os
import re
import sqlite3
import subprocess
import time
from pathlib import Path

import httpx
import pytest
import sqlalchemy as sa
from fastapi.testclient import TestClient
from support.clitools import cli, mlirtuna_argv, subprocess_env
from support.webfarm import GPU_COMMIT, Farm, make, run_folder

from mlirtuna import catalog, queue, sessions
from mlirtuna.db import Database
from mlirtuna.db.models import (
    COMPLETED,
    NEW,
    Candidate,
    FusionConfig,
    Job,
    Result,
    TuningSession,
)
from mlirtuna.errors import DatabaseError
from mlirtuna.history import compare, perffields, winners
from mlirtuna.problems import parse
from mlirtuna.queue import jobs
from mlirtuna.sessions import SessionSpec
from mlirtuna.web import explore
from mlirtuna.web.app import create_app, open_read_only
from mlirtuna.worker import Worker, WorkerSettings

# The farm is tuned for real once per test run and backend, then copied (tests/support/webfarm.py):
# cheap enough for the quick loop on SQLite (it cost the quick loop 34 s when each of its
# processes tuned one).
pytestmark = pytest.mark.backends(fast=("sqlite",))

PAGES = ("/", "/sessions/{a}", "/problems/{p}?session={g}", "/jobs/{j}", "/compare?a={a}&b={b}")


@pytest.fixture
def farm(db: Database, tmp_path, tmp_path_factory) -> Farm:
    return make(db, tmp_path, run_folder(tmp_path_factory))


@pytest.fixture
def client(db_url, farm) -> TestClient:
    ro = open_read_only(db_url)
    yield TestClient(create_app(ro), base_url="http://127.0.0.1")
    ro.dispose()


def get(client: TestClient, path: str, status: int = 200):
    res = client.get(path)
    assert res.status_code == status, (path, res.text)
    return res.json() if path.startswith("/api/") else res.text


def test_sessions_and_farm_match_the_queue(client, db, farm):
    listed = get(client, "/api/sessions")
    assert listed["total_sessions"] == 4
    ids = [p["session"]["id"] for p in listed["sessions"]]
    assert ids == sorted([farm.cpu_a, farm.cpu_b, farm.gpu, farm.failed], reverse=True)
    counts = jobs.counts(db)
    for p in listed["sessions"]:
        sid = p["session"]["id"]
        assert p["counts"] == counts[sid] and p["total"] == 3 and p["done"] == 3
        assert not p["active"]
    gpu = next(p for p in listed["sessions"] if p["session"]["id"] == farm.gpu)["session"]
    assert (gpu["arch_full"], gpu["num_cu"], gpu["mlir_v"], gpu["ticket"]) == (
        "gfx942:sramecc+:xnack-", 304, GPU_COMMIT, "TKT-1"
    )  # fmt: skip
    assert get(client, "/api/farm")["workers"] == [] == get(client, "/api/workers")
    paged = get(client, "/api/sessions?offset=1&limit=2")
    assert [p["session"]["id"] for p in paged["sessions"]] == ids[1:3]


def test_winners_page_filters_sorts_and_pages_on_the_server(client, db, farm):
    every = {w.test_vector: w for w in winners.winners(db, farm.cpu_a)}
    page = get(client, f"/api/sessions/{farm.cpu_a}/winners")
    assert page["total"] == 3 and len(page["rows"]) == 3
    for row in page["rows"]:
        w = every[row["test_vector"]]
        assert (row["perf_config"], row["tflops"], row["candidates"]) == (
            w.perf_config, w.tflops, w.candidates
        )  # fmt: skip
    by_tflops = get(client, f"/api/sessions/{farm.cpu_a}/winners?sort=tflops&desc=true")["rows"]
    assert [r["tflops"] for r in by_tflops] == sorted(
        (w.tflops for w in every.values()), reverse=True
    )
    first = get(client, f"/api/sessions/{farm.cpu_a}/winners?sort=tflops&limit=2")
    rest = get(client, f"/api/sessions/{farm.cpu_a}/winners?sort=tflops&limit=2&offset=2")
    assert first["total"] == rest["total"] == 3 and len(first["rows"]) == 2
    assert [r["tflops"] for r in first["rows"] + rest["rows"]] == sorted(
        w.tflops for w in every.values()
    )
    f16 = get(client, f"/api/sessions/{farm.cpu_a}/winners?data_type=f16")["rows"]
    assert [r["test_vector"] for r in f16] == [v for v in every if v.startswith("-t f16")]
    found = get(client, f"/api/sessions/{farm.cpu_a}/winners?q=-g%202")["rows"]
    assert [r["test_vector"] for r in found] == [v for v in every if "-g 2 " in v]
    assert get(client, f"/api/sessions/{farm.cpu_a}/winners?tag=web")["total"] == 3
    assert get(client, f"/api/sessions/{farm.cpu_a}/winners?tag=other")["total"] == 0
    assert get(client, f"/api/sessions/{farm.cpu_a}/winners?op=conv")["total"] == 0
    assert get(client, f"/api/sessions/{farm.cpu_a}/winners?q=100%25_")["total"] == 0
    facets = get(client, f"/api/sessions/{farm.cpu_a}/facets")
    assert facets == {"ops": ["gemm"], "data_types": ["f16", "f32"], "tags": ["web"]}
    bad = get(client, f"/api/sessions/{farm.cpu_a}/winners?sort=nonsense", 400)
    assert "unknown sort" in bad["error"]


def test_winners_page_hides_a_requeued_jobs_result_until_it_completes(client, db, farm):
    """The dashboard lists the winners `mlirtuna results` lists (winners.counted)."""
    job_id = jobs.list_jobs(db, farm.cpu_a)[0].id
    with db.session() as s:
        s.execute(sa.update(Job).where(Job.id == job_id).values(state=NEW))
    page = get(client, f"/api/sessions/{farm.cpu_a}/winners")
    assert page["total"] == 2 == len(winners.winners(db, farm.cpu_a))
    assert {r["job_id"] for r in page["rows"]} == {
        j.id for j in jobs.list_jobs(db, farm.cpu_a) if j.id != job_id
    }
    with db.session() as s:
        s.execute(sa.update(Job).where(Job.id == job_id).values(state=COMPLETED))
    assert get(client, f"/api/sessions/{farm.cpu_a}/winners")["total"] == 3


def test_distributions_and_errors(client, db, farm):
    hist = get(client, f"/api/sessions/{farm.cpu_a}/tflops")
    assert hist["count"] == 3 and sum(hist["counts"]) == 3
    assert len(hist["edges"]) == len(hist["counts"]) + 1
    times = get(client, f"/api/sessions/{farm.cpu_a}/job-times")
    assert times["count"] == 3 and times["total"] > 0
    assert get(client, f"/api/sessions/{farm.cpu_a}/errors") == []
    failed = jobs.list_jobs(db, farm.failed, state="error")
    # The same failure after a different number of attempts is still one group.
    with db.session() as s:
        text = failed[-1].result.replace("attempt 1/1 failed:", "attempt 3/3 failed:", 1)
        s.execute(sa.update(Job).where(Job.id == failed[-1].id).values(result=text))
    groups = get(client, f"/api/sessions/{farm.failed}/errors")
    assert len(groups) == 1 and groups[0]["count"] == 3
    assert failed[0].first_line == f"attempt 1/1 failed: {groups[0]['first_line']}"
    assert groups[0]["job_ids"] == [j.id for j in failed]
    # Lines that differ only in their numbers are one group, shown with the numbers masked.
    with db.session() as s:
        for n, j in enumerate(failed[:2]):
            text = f"attempt 1/1 failed: timed out after {2**n} candidates in 1.{n} s"
            s.execute(sa.update(Job).where(Job.id == j.id).values(result=text))
    groups = get(client, f"/api/sessions/{farm.failed}/errors")
    assert [(g["first_line"], g["count"]) for g in groups] == [
        ("timed out after N candidates in N s", 2), (groups[1]["first_line"], 1)
    ]  # fmt: skip
    assert "N" not in groups[1]["first_line"].split()  # a lone line keeps its numbers
    with db.session() as s:  # as the farm made it
        for j in failed:
            s.execute(sa.update(Job).where(Job.id == j.id).values(result=j.result))
    job = get(client, f"/api/jobs/{failed[0].id}")
    assert job["state"] == "error" and len(job["attempts"]) == 1 and job["result"]
    page = get(client, f"/sessions/{farm.failed}")
    assert "Errors" in page


def test_problem_trend_and_candidates(client, db, farm):
    pid = farm.problems[0]
    info = get(client, f"/api/problems/{pid}")
    assert info["op"] == "gemm" and info["tags"] == ["web"]
    assert sorted(info["session_ids"]) == sorted([farm.cpu_a, farm.cpu_b, farm.gpu])
    trend = get(client, f"/api/problems/{pid}/trend")
    with db.session() as s:
        stmt = sa.select(Result.session_id, Result.tflops).where(Result.problem_id == pid)
        winners = {sid: tflops for sid, tflops in s.execute(stmt)}
    assert {p["session_id"]: p["tflops"] for p in trend} == winners
    assert len({p["context"] for p in trend}) == 2  # the CPU and the GPU context
    cands = get(client, f"/api/problems/{pid}/candidates?session={farm.gpu}")
    with db.session() as s:
        rows = s.execute(
            sa.select(Candidate.perf_config, Candidate.error).where(
                Candidate.session_id == farm.gpu, Candidate.problem_id == pid
            )
        ).all()
    assert len(cands["valid"]) + len(cands["invalid"]) == len(rows)
    assert len(cands["invalid"]) == sum(e is not None for _, e in rows) > 0
    assert sum(cands["invalid_reasons"].values()) == len(cands["invalid"])
    tflops = [c["tflops"] for c in cands["valid"]]
    assert tflops == sorted(tflops, reverse=True)
    assert cands["winner"] == cands["valid"][0]["perf_config"]
    get(client, f"/api/problems/{pid}/candidates?session=999", 404)
    get(client, "/api/problems/999999/trend", 404)


def test_compare_gives_the_numbers_of_the_cli(client, db, db_url, farm):
    answer = get(client, f"/api/compare?a={farm.cpu_a}&b={farm.cpu_b}&threshold=5%25")
    run = cli(db_url, "compare", str(farm.cpu_a), str(farm.cpu_b), "--json")
    assert run.code == 0, run.stderr
    expected = run.json()
    for key in ("common", "same_winner", "same_winner_pct", "geomean_ratio", "only_a", "only_b"):
        assert answer[key] == expected[key], key
    # the CLI's rows, plus what the page links and shows (problem id, label, noise)
    assert [
        {k: r[k] for k in e}
        for r, e in zip(answer["regressions"], expected["regressions"], strict=True)
    ] == expected["regressions"]
    for r in answer["regressions"] + answer["within_noise"] + answer["improvements"]:
        assert explore.problem(db, r["problem_id"]).test_vector == r["test_vector"] == r["label"]
    assert len(answer["regressions_changed"]) + len(answer["regressions_same"]) == len(
        expected["regressions"]
    ) and len(answer["within_noise"]) == len(expected["within_noise"])
    assert len(answer["points"]["tflops_a"]) == expected["with_tflops"] == 3
    side_a, side_b = compare.load_sides(str(farm.cpu_a), str(farm.cpu_b), None, lambda: db)
    better = compare.improvements(side_a, side_b, 0.05)
    assert answer["improvements_total"] == len(better)
    assert all(r["ratio"] > 1.05 for r in answer["improvements"])
    assert get(client, "/api/compare?a=1&b=999", 404)["error"].startswith("no session 999")


def test_pages_render_and_say_where_things_are_missing(client, farm):
    ids = {"a": farm.cpu_a, "b": farm.cpu_b, "g": farm.gpu, "p": farm.problems[0], "j": 1}
    for path in PAGES:
        html = get(client, path.format(**ids))
        assert "<table" in html and "/static/app.js?v=" in html
    js = client.get("/static/plotly-strict.min.js")
    assert js.status_code == 200 and len(js.content) > 1_000_000
    assert b"plotly.js (strict" in js.content[:2000]
    assert client.get("/static/app.js").status_code == 200
    missing = client.get("/sessions/999")
    assert missing.status_code == 404 and "no session 999" in missing.text
    assert client.get("/compare?a=x.tsv&b=1").status_code == 400


PLOTLY_URL = r'src="(/static/plotly-strict\.min\.js\?v=\w+)"'
DRAWING_PAGES = ("/sessions/{a}", "/problems/{p}?session={g}", "/compare?a={a}&b={b}")


def test_plotly_only_where_drawn_gzipped_and_cached(client, farm):
    """Issue 44 §3: every page loaded plotly's 5 MB as a blocking script, uncompressed and
    uncached: the farm page stayed blank for seconds."""
    ids = {"a": farm.cpu_a, "b": farm.cpu_b, "g": farm.gpu, "p": farm.problems[0], "j": 1}
    for path in PAGES:
        page = get(client, path.format(**ids))
        tags = re.findall(r"<script [^>]*plotly[^>]*>", page)
        if path in DRAWING_PAGES:
            (tag,) = tags
            assert " defer" in tag and re.search(PLOTLY_URL, tag)
        else:
            assert tags == [] and "plotly-strict" not in page, path
    url = re.search(PLOTLY_URL, page)
    assert url is not None
    res = client.get(url[1], headers={"Accept-Encoding": "gzip"})
    assert res.status_code == 200 and res.headers["content-encoding"] == "gzip"
    assert res.num_bytes_downloaded < len(res.content) / 2  # sent compressed
    assert b"plotly.js (strict" in res.content[:2000]
    assert "max-age=31536000" in res.headers["cache-control"]
    assert "immutable" in res.headers["cache-control"]
    # Another hash (a stale page) or none: revalidated, never kept for a year.
    for stale in ("/static/plotly-strict.min.js", "/static/plotly-strict.min.js?v=0"):
        assert client.get(stale).headers["cache-control"] == "no-cache"
    # A changed file is a new URL: the hash is the content's.
    css = re.search(r'href="(/static/style\.css\?v=\w+)"', page)
    assert css is not None and client.get(css[1]).headers["cache-control"].endswith("immutable")


def test_the_api_link_and_the_collections_answer_a_browser(client, farm):
    """Issue 44 §3: the nav's "API" (/api/docs) was a 404; /workers and /sessions were JSON 404s."""
    home = get(client, "/")
    assert '<a href="/api">API</a>' in home and "/api/docs" not in home
    listing = html.unescape(get(client, "/api"))
    for endpoint in ("/api/farm", "/api/workers", "/api/sessions/{session_id}/winners",
                     "/api/compare", "/api/openapi.json"):  # fmt: skip
        assert endpoint in listing, endpoint
    assert "One page of the session's winners, filtered and sorted on the server." in listing
    assert "with progress, and every worker busy now." in listing  # a docstring's whole paragraph
    for path, anchor in (("/sessions", "/#sessions"), ("/workers", "/#workers")):
        res = client.get(path, follow_redirects=False)
        assert res.status_code == 307 and res.headers["location"] == anchor
        followed = client.get(path)
        assert followed.status_code == 200 and 'id="sessions"' in followed.text
        assert followed.headers["content-type"].startswith("text/html")


def test_compare_page_picks_sessions_and_marks_what_differs(client, db, farm):
    """Issue 44 §3: the compare page took typed ids and showed no context side by side."""
    page = get(client, "/compare")
    every = [s.id for s in sessions.list_all(db)]
    for side in ("a", "b"):
        picker = re.search(rf'<select name="{side}" id="pick-{side}">(.*?)</select>', page, re.S)
        assert picker is not None
        offered = [int(v) for v in re.findall(r'<option value="(\d+)"', picker[1])]
        assert offered == sorted(every, reverse=True)
    chosen = get(client, f"/compare?a={farm.cpu_a}&b={farm.gpu}")
    assert re.search(rf'<option value="{farm.gpu}" selected>', chosen)
    marked = re.findall(r'<tr class="differs"[^>]*><th>([^<]+) ≠</th>', chosen)
    a, g = sessions.get(db, farm.cpu_a), sessions.get(db, farm.gpu)
    assert "arch" in marked and "tuner" in marked and a.tuner != g.tuner
    assert "opened" not in marked  # two sessions are always opened at different times
    same = get(client, f"/compare?a={farm.cpu_a}&b={farm.cpu_b}")
    assert "tuner ≠" not in same and "arch ≠" not in same


def test_session_notes_from_the_cli_on_the_page(client, db_url, db, farm):
    """Issue 44 §3: an operator notes why a session was stopped; the session page shows it."""
    sid = farm.gpu
    assert "No notes" in get(client, f"/sessions/{sid}")
    first = cli(db_url, "session", "note", str(sid), "node b lost at 03:10 <b>", "--json")
    assert first.code == 0, first.stderr
    assert first.json()["text"] == "node b lost at 03:10 <b>"
    second = cli(db_url, "session", "note", str(sid), "re-run of TKT-1 queued")
    assert second.code == 0 and f"session {sid}: noted at " in second.stderr
    notes = get(client, f"/api/sessions/{sid}")["notes"]
    assert [n["text"] for n in notes] == ["node b lost at 03:10 <b>", "re-run of TKT-1 queued"]
    assert all(re.fullmatch(r"\d{4}-\d\d-\d\dT\d\d:\d\d:\d\dZ", n["created_at"]) for n in notes)
    page = get(client, f"/sessions/{sid}")
    assert "node b lost at 03:10 &lt;b&gt;" in page and "<b>" not in page.split("Notes")[1]
    assert page.index("node b lost") < page.index("re-run of TKT-1")
    assert f'datetime="{notes[0]["created_at"]}"' in page
    # Refused, one line each, nothing written: an empty note, a log pasted, no such session.
    for args, why in (([str(sid), "  "], "an empty note"),
                      ([str(sid), "x" * 2001], "at most 2000"),
                      (["99999", "text"], "no session 99999")):  # fmt: skip
        bad = cli(db_url, "session", "note", *args)
        assert bad.code != 0 and why in bad.stderr and len(bad.stderr.strip().splitlines()) == 1
    assert len(sessions.notes(db, sid)) == 2
    # A deleted session takes its notes with it.
    gone = cli(db_url, "session", "delete", str(sid), "--yes", "--force")
    assert gone.code == 0, gone.stderr
    assert sessions.notes(db, sid) == []


def test_the_dashboard_cannot_write(db_url, farm):
    ro = open_read_only(db_url)
    try:
        with pytest.raises(sa.exc.DBAPIError), ro.session() as s:
            s.execute(sa.delete(Job))
    finally:
        ro.dispose()


def test_stale_heartbeat_is_flagged_before_the_lease_expires(db, db_url, farm):
    sid = farm.cpu_a
    with db.session() as s:  # one job of a finished session back in the queue, to be held
        first = s.scalar(sa.select(sa.func.min(Job.id)).where(Job.session_id == sid))
        s.execute(sa.update(Job).where(Job.id == first).values(state=NEW))
    lease = queue.claim(db, sid, queue.Claimant("node7", 3, 4242), lease_s=3600)
    assert lease is not None
    ro = open_read_only(db_url)
    client = TestClient(create_app(ro), base_url="http://127.0.0.1")
    (busy,) = get(client, "/api/workers")
    assert (busy["machine_name"], busy["gpu_id"], busy["pid"]) == ("node7", 3, 4242)
    assert busy["job_id"] == lease.job_id and not busy["stale"] and not busy["expired"]
    assert busy["lease_left_s"] > 3000
    # The worker goes quiet: its last heartbeat is 40 minutes old, the lease has 20 left.
    clock = _db_clock(db)
    with db.session() as s:
        s.execute(
            sa.update(Job)
            .where(Job.id == lease.job_id)
            .values(heartbeat_at=clock - _minutes(40), lease_expires_at=clock + _minutes(20))
        )
    (busy,) = get(client, "/api/farm")["workers"]
    assert busy["stale"] and not busy["expired"] and busy["heartbeat_age_s"] >= 40 * 60 - 5
    # The other two jobs were claimed five minutes ago and finished within the rate window (the
    # farm's own times are those of its tuning, which may be older than the window): two jobs in
    # five minutes, 0.4 a minute, and the held third due in 150 s.
    with db.session() as s:
        others = s.scalars(
            sa.select(Job.id).where(Job.session_id == sid, Job.id != lease.job_id).order_by(Job.id)
        ).all()
        for finished, job_id in enumerate(others, start=1):
            s.execute(
                sa.update(Job)
                .where(Job.id == job_id)
                .values(claimed_at=clock - _minutes(5), finished_at=clock - _minutes(5 - finished))
            )
    progress = get(client, f"/api/sessions/{sid}")
    assert progress["active"] and progress["counts"]["running"] == 1
    assert progress["per_minute"] == pytest.approx(0.4, rel=0.02)
    assert progress["eta_s"] == pytest.approx(150, rel=0.02)
    ro.dispose()


def _minutes(n: int):
    import datetime as dt

    return dt.timedelta(minutes=n)


def _db_clock(db: Database):
    from mlirtuna.web import farm as farm_module

    with db.session() as s:
        return farm_module.now(s)


def test_password_never_reaches_a_page_or_an_answer(db_url, farm, request):
    if not db_url.startswith("postgresql"):
        pytest.skip(
            "PostgreSQL only: its test server trusts local users, so a password can ride along"
        )
    secret = "s3cr3t-Passw0rd"
    with_pw = re.sub(r"://([^@/:]+)@", rf"://\1:{secret}@", db_url)
    ro = open_read_only(with_pw)
    try:
        client = TestClient(create_app(ro), base_url="http://127.0.0.1")
        ids = {"a": farm.cpu_a, "b": farm.cpu_b, "g": farm.gpu, "p": farm.problems[0], "j": 1}
        paths = [p.format(**ids) for p in PAGES] + [
            "/api/farm",
            f"/api/sessions/{farm.cpu_a}/winners",
            "/api/openapi.json",
            "/sessions/999",
            "/api/sessions/999",
        ]
        for path in paths:
            assert secret not in client.get(path).text, path
        assert "***" in client.get("/").text
    finally:
        ro.dispose()


def test_serve_needs_an_existing_database_and_writes_nothing(tmp_path):
    path = tmp_path / "none.db"
    with pytest.raises(DatabaseError, match="no database file"):
        open_read_only(f"sqlite:///{path}")
    run = cli(f"sqlite:///{path}", "serve", "--port", "1")
    assert run.code == 2 and "no database file" in run.stderr and not path.exists()
    path.touch()  # an empty file: other commands would create the schema in it, serve does not
    with pytest.raises(DatabaseError, match=r"has no mlirtuna schema.*mlirtuna db upgrade"):
        open_read_only(f"sqlite:///{path}")
    with contextlib.closing(sqlite3.connect(path)) as conn:
        assert conn.execute("SELECT count(*) FROM sqlite_master").fetchone() == (0,)


def test_serve_command_binds_localhost_and_prints_its_url(db, db_url, tmp_path):
    if not db_url.startswith("sqlite"):
        pytest.skip("one backend is enough for the command itself")
    port = 18765 + os.getpid() % 1000
    proc = subprocess.Popen(
        mlirtuna_argv("serve", "--port", str(port)),
        env=subprocess_env(db_url),
        stdout=subprocess.DEVNULL,
        stderr=subprocess.PIPE,
        text=True,
    )
    try:
        line = proc.stderr.readline()
        assert f"at http://127.0.0.1:{port}/" in line and "read-only" in line
        for _ in range(100):
            try:
                res = httpx.get(f"http://127.0.0.1:{port}/api/sessions", timeout=2)
                break
            except httpx.TransportError:
                time.sleep(0.1)
        assert res.status_code == 200 and res.json()["total_sessions"] == 0
    finally:
        proc.terminate()
        proc.wait(timeout=30)
        proc.stderr.close()


def test_a_fusion_problem_shows_its_module_and_key(client, db):
    module = Path(__file__).parent / "data" / "fusion" / "resnet50"
    path = sorted(module.glob("*.mlir"))[0]
    catalog.import_modules(db, [str(path)])
    with db.session() as s:
        pid, key, text = s.execute(
            sa.select(FusionConfig.id, FusionConfig.tuning_key, FusionConfig.module_text)
        ).one()
    info = get(client, f"/api/problems/{pid}")
    assert info["op"] == "fusion"
    assert (info["tuning_key"], info["module"]) == (key, text)
    # The data type is the key's (a conv key's prefix, a GEMM key's -t).
    expected = parse("conv", key).data_type if key.startswith("conv") else key.split()[1]
    assert info["data_type"] == expected != ""
    page = get(client, f"/problems/{pid}")
    assert f"<code>{key}</code>" in page and 'id="module"' in page
    assert "func.func" in page  # the module's text itself, escaped into the page
    # Named as people read it (file @function: key), never the hash as the title.
    assert info["label"].startswith(f"{path.name} @") and info["label"].endswith(f": {key}")
    title = re.search(r"<title>(.*?)</title>", page, re.S).group(1)
    assert path.name in title and "sha256:" not in title
    assert f'<h2 id="label">{html.escape(info["label"])}</h2>' in page


def test_fusion_problems_are_named_in_the_winners_table_and_the_workers(client, db, farm):
    example = Path(__file__).parent.parent / "examples" / "fusion-small"
    catalog.import_modules(db, [str(example)])
    sid = sessions.create(db, SessionSpec(tuner="cpu", tuning_space="quick")).id
    jobs.load(db, sid, op="fusion", all_problems=True)
    settings = WorkerSettings(session_id=sid, tuner="cpu", until_empty=True, job_timeout_s=300)
    Worker(db, settings).run()
    best = {w.problem_id: w.test_vector for w in winners.winners(db, sid)}
    page = get(client, f"/api/sessions/{sid}/winners?limit=500")
    assert {r["problem_id"]: r["test_vector"] for r in page["rows"]} == best
    assert all(" @" in r["test_vector"] and "sha256:" not in r["test_vector"] for r in page["rows"])
    name = next(iter(best.values())).split(" @")[0]  # a file name finds its modules
    found = get(client, f"/api/sessions/{sid}/winners?q={name}")["rows"]
    assert found and all(r["test_vector"].startswith(name) for r in found)
    by_label = get(client, f"/api/sessions/{sid}/winners?sort=test_vector")["rows"]
    assert [r["test_vector"] for r in by_label] == sorted(best.values())
    # The data-type column is filled (the key's type), and filters and facets know it.
    assert all(r["data_type"] for r in by_label)
    types = get(client, f"/api/sessions/{sid}/facets")["data_types"]
    assert types == sorted({r["data_type"] for r in by_label})
    one = get(client, f"/api/sessions/{sid}/winners?data_type={types[0]}")
    assert one["total"] == sum(r["data_type"] == types[0] for r in by_label) > 0
    # a worker holding a fusion job shows the module by name
    with db.session() as s:
        first = s.scalar(sa.select(sa.func.min(Job.id)).where(Job.session_id == sid))
        s.execute(sa.update(Job).where(Job.id == first).values(state=NEW))
    lease = queue.claim(db, sid, queue.Claimant("node7", -1, 4242), lease_s=3600)
    (busy,) = get(client, f"/api/workers?session={sid}")
    assert busy["job_id"] == lease.job_id and busy["test_vector"] == best[busy["problem_id"]]


def _candidates_of(db: Database, sid: int, pid: int):
    with db.session() as s:
        return s.execute(
            sa.select(
                Candidate.perf_config, Candidate.tflops, Candidate.kernel_time,
                Candidate.time_min, Candidate.time_iqr, Candidate.samples,
                Candidate.remeasured, Candidate.error,
            ).where(Candidate.session_id == sid, Candidate.problem_id == pid)
        ).all()  # fmt: skip


def test_candidate_table_sorts_filters_and_pages_on_the_server(client, db, farm):
    pid = farm.problems[0]
    rows = _candidates_of(db, farm.gpu, pid)
    url = f"/api/problems/{pid}/table?session={farm.gpu}"
    page = get(client, f"{url}&limit=500")
    assert page["total"] == len(rows) == len(page["rows"]) > 3
    by_config = {r.perf_config: r for r in rows}
    for row in page["rows"]:
        r = by_config[row["perf_config"]]
        assert (row["kernel_time"], row["time_min"], row["time_iqr"], row["samples"]) == (
            r.kernel_time, r.time_min, r.time_iqr, r.samples
        )  # fmt: skip
        assert row["fields"] == perffields.fields(r.perf_config) and row["fields"]
    assert page["columns"][:3] == ["mPerBlock", "nPerBlock", "kpackPerBlock"]
    # best first by default; NULL TFlops (invalid candidates) last
    tflops = [r["tflops"] for r in page["rows"] if r["tflops"] is not None]
    assert tflops == sorted(tflops, reverse=True)
    assert page["rows"][-1]["tflops"] is None
    by_time = get(client, f"{url}&sort=kernel_time&desc=false&show=valid")["rows"]
    times = [r["kernel_time"] for r in by_time]
    assert times == sorted(times) and len(times) == sum(r.error is None for r in rows)
    invalid = get(client, f"{url}&show=invalid")
    assert invalid["total"] == sum(r.error is not None for r in rows) > 0
    assert all(r["error"] for r in invalid["rows"])
    # a substring of the perf config, and pages that add up
    needle = page["rows"][0]["perf_config"]
    found = get(client, f"{url}&q={needle}")["rows"]
    assert [r["perf_config"] for r in found] == [needle]
    one, two = (get(client, f"{url}&limit=2&offset={o}")["rows"] for o in (0, 2))
    assert [r["perf_config"] for r in one + two] == [r["perf_config"] for r in page["rows"][:4]]
    # the winner is marked once; this tool does not re-measure, and the rule says so
    assert [r["perf_config"] for r in page["rows"] if r["winner"]] == [page["winner"]]
    assert page["remeasured"] == 0 and "no re-measurement" in page["rule"]
    # limits are clamped, bad parameters are one clear 400
    assert len(get(client, f"{url}&limit=100000")["rows"]) == len(rows)
    assert get(client, f"{url}&offset=-5&limit=0")["offset"] == 0
    assert "unknown sort" in get(client, f"{url}&sort=nope", 400)["error"]
    assert "unknown show" in get(client, f"{url}&show=nope", 400)["error"]
    get(client, f"/api/problems/{pid}/table?session=999", 404)


def test_candidate_table_marks_the_remeasured_and_states_the_rule(client, db, farm):
    pid = farm.problems[0]
    rows = _candidates_of(db, farm.cpu_a, pid)
    again = [r for r in rows if r.remeasured]
    assert again  # the CPU tuner re-measures its top k
    page = get(client, f"/api/problems/{pid}/table?session={farm.cpu_a}&show=remeasured")
    assert sorted(r["perf_config"] for r in page["rows"]) == sorted(r.perf_config for r in again)
    assert all(r["remeasured"] for r in page["rows"]) and page["remeasured"] == len(again)
    with db.session() as s:
        topk = s.scalar(sa.select(TuningSession.topk).where(TuningSession.id == farm.cpu_a))
    n = min(topk, len(again))
    assert page["rule"] == f"re-measured top {n} side by side; winner by median time"
    (winner,) = (r for r in page["rows"] if r["winner"])
    assert winner["perf_config"] == page["winner"]
    # the winner has the best median among the re-measured
    assert winner["kernel_time"] == min(r.kernel_time for r in again)
    scatter = get(client, f"/api/problems/{pid}/candidates?session={farm.cpu_a}")
    assert sum(c["remeasured"] for c in scatter["valid"]) == len(again)
    # the plot's hover names the same fields as the table (one parser: history/perffields)
    assert all(c["fields"] == perffields.fields(c["perf_config"]) for c in scatter["valid"])
    assert {tuple(c["fields"]) for c in scatter["valid"]} == {
        ("mPerBlock", "nPerBlock", "kPerBlock")
    }


def test_farm_rows_say_what_each_session_tunes_and_when(client, db, farm):
    listed = get(client, "/api/farm")["sessions"]
    for p in listed:
        assert p["ops"] == ["gemm"]  # every session of the farm tunes the three GEMMs
        assert p["session"]["created_at"] == sessions.get(db, p["session"]["id"]).created_at
        assert "name" in p["session"] and "split" in p["session"]
    assert get(client, f"/api/sessions/{farm.gpu}")["ops"] == ["gemm"]


def test_parallel_coordinates_of_one_op_and_data_type(client, db, farm):
    sid = farm.gpu
    with db.session() as s:
        rows = s.execute(
            sa.select(Candidate.problem_id, Candidate.perf_config, Candidate.tflops).where(
                Candidate.session_id == sid, Candidate.error.is_(None)
            )
        ).all()
    best = {}
    for pid, _, tf in rows:
        best[pid] = max(best.get(pid, 0.0), tf)
    p = get(client, f"/api/sessions/{sid}/parallel?op=gemm")
    assert p["total"] == len(rows) == len(p["score"]) == len(p["perf_configs"]) > 3
    assert sorted(p["score"]) == sorted(tf / best[pid] for pid, _, tf in rows)
    assert max(p["score"]) == 1.0 and all(0 < x <= 1 for x in p["score"])
    # Every numeric field is an axis or, with one value in every candidate, named as constant.
    fields = [perffields.fields(pc) for pc in p["perf_configs"]]
    numeric = [n for n in perffields.columns(p["perf_configs"]) if n in fields[0]]
    assert [n for n in numeric if n in p["axes"] or n in p["constant"]] == numeric
    assert p["constant"] and all(len({f[n] for f in fields}) == 1 for n in p["constant"])
    assert p["axes"]["kpackPerBlock"] == [float(f["kpackPerBlock"]) for f in fields]
    assert all(len(set(values)) > 1 for values in p["axes"].values())
    f16 = get(client, f"/api/sessions/{sid}/parallel?op=gemm&data_type=f16")
    assert 0 < f16["total"] < p["total"]
    assert get(client, f"/api/sessions/{sid}/parallel?op=gemm&limit=2")["score"] == p["score"][:2]
    assert get(client, f"/api/sessions/{sid}/parallel?op=conv")["total"] == 0
    assert "unknown op" in get(client, f"/api/sessions/{sid}/parallel?op=nope", 400)["error"]
