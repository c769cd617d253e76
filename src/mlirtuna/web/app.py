"""The dashboard application: a read-only database handle, templates, static files, routes.

Read-only is enforced by the database, not by discipline: every connection the dashboard opens is
put in read-only mode (SQLite `query_only`, its journal mode left as it is; a read-only
transaction default on the servers), so a bug in a route cannot write. On a server, a read-only
role (docs/ci.md) does the same again.

What a browser gets is data, never markup or a way in (issue 23): every answer carries a CSP with
no inline script, `X-Frame-Options: DENY` and `nosniff`; a request whose Host is not a loopback
name (or one given with `serve --allow-host`) is refused, so DNS rebinding cannot read the API;
ids, offsets and query strings out of range are a 400, never a database overflow (500): a job
id up to 2^63-1 (bigint), every other number up to 2^31-1. The
interactive API docs are off (they load their scripts from a CDN); /api/openapi.json stays and
/api lists the endpoints.

Static files (issue 44): the pages name them with a hash of their content (`?v=`), so an answer
to a versioned URL is cached for a year and a changed file is a new URL; answers are gzipped
(plotly's 5 MB bundle is 1.5 MB), and only the pages that draw load plotly, deferred.
"""

from __future__ import annotations

import hashlib
import json
import re
from collections.abc import Iterable
from pathlib import Path
from urllib.parse import parse_qsl

from fastapi import FastAPI, Request
from fastapi.exceptions import RequestValidationError
from fastapi.middleware.gzip import GZipMiddleware
from fastapi.responses import HTMLResponse, JSONResponse, Response
from fastapi.staticfiles import StaticFiles
from fastapi.templating import Jinja2Templates
from sqlalchemy import event
from sqlalchemy.engine import URL

import mlirtuna.web.routes as routes
from mlirtuna import __version__
from mlirtuna.db import Database, resolve_url
from mlirtuna.errors import DatabaseError, NotFound, UserError

HERE = Path(__file__).parent
DEFAULT_HOST, DEFAULT_PORT = "127.0.0.1", 8765
POLL_MS = 2000  # how often the farm page asks for fresh numbers
LOOPBACK_HOSTS = ("localhost", "127.0.0.1", "::1")
MAX_INT = 2**31 - 1  # ids, offsets, limits: the servers' session and problem ids are int4
MAX_BIG_ID = 2**63 - 1  # a job id: bigint since migration 0019 (db.models.BigId)
BIG_ID_PATHS = ("jobs",)  # /api/jobs/ID and /jobs/ID: the segment after one of these is a bigint
MAX_PARAM_CHARS = 1000  # a query parameter (`q`, a tag, a threshold)
SECURITY_HEADERS = [
    (b"content-security-policy",
     b"default-src 'self'; script-src 'self'; style-src 'self' 'unsafe-inline'; "
     b"img-src 'self' data:; object-src 'none'; base-uri 'none'; form-action 'self'; "
     b"frame-ancestors 'none'"),
    (b"x-frame-options", b"DENY"),
    (b"x-content-type-options", b"nosniff"),
    (b"referrer-policy", b"no-referrer"),
]  # fmt: skip
_INT = re.compile(r"[-+]?\d+")
GZIP_FROM = 1024  # bytes: smaller answers are sent as they are
GZIP_LEVEL = 6  # zlib's default: 9 costs twice the CPU on plotly's bundle for 1 % less
CACHE_VERSIONED = "public, max-age=31536000, immutable"  # a URL whose ?v= is the content's hash
CACHE_OTHER = "no-cache"  # an unversioned or stale URL: revalidated (ETag) on each use

_READ_ONLY = {
    "sqlite": "PRAGMA query_only = ON",
    "postgresql": "SET SESSION CHARACTERISTICS AS TRANSACTION READ ONLY",
    "mysql": "SET SESSION TRANSACTION READ ONLY",
    "mariadb": "SET SESSION TRANSACTION READ ONLY",
}


def open_read_only(url: str | URL | None) -> Database:
    """The database at `url`, every connection read-only; never creates or upgrades a schema."""
    resolved = url if isinstance(url, URL) else resolve_url(url)
    if resolved.get_backend_name() == "sqlite":
        path = resolved.database or ""
        if path in ("", ":memory:") or not Path(path).expanduser().is_file():
            raise DatabaseError(
                f"no database file {path or '(none)'}: "
                "`mlirtuna run` or `mlirtuna import` makes one"
            )
    db = Database(resolved, check_schema=False, create=False, read_only=True)
    statement = _READ_ONLY[db.backend]

    @event.listens_for(db.engine, "connect")
    def _read_only(dbapi_conn, _record) -> None:
        cur = dbapi_conn.cursor()
        cur.execute(statement)
        cur.close()
        if db.backend != "sqlite":
            dbapi_conn.commit()  # the SET must not sit in an open transaction

    try:
        db.check_schema()  # at head, or one line naming `mlirtuna db upgrade`; creates nothing
    except BaseException:
        db.dispose()
        raise
    return db


def create_app(db: Database, poll_ms: int = POLL_MS, allow_hosts: Iterable[str] = ()) -> FastAPI:
    """The dashboard; `allow_hosts`: Host names answered besides the loopback ones."""
    app = FastAPI(
        title="mlirtuna dashboard",
        version=__version__,
        docs_url=None,  # Swagger UI loads its scripts from a CDN: off, not served from afar
        redoc_url=None,
        openapi_url="/api/openapi.json",
    )
    app.state.db = db
    app.state.poll_ms = poll_ms
    app.state.templates = Jinja2Templates(directory=str(HERE / "templates"))
    static = VersionedStatic(directory=str(HERE / "static"))
    app.state.templates.env.globals.update(
        version=__version__, db_url=db.display_url, static=static.url
    )
    app.mount("/static", static, name="static")
    app.include_router(routes.api)
    app.include_router(routes.pages)
    app.add_exception_handler(UserError, _user_error)
    app.add_exception_handler(RequestValidationError, _bad_parameter)
    app.add_middleware(GZipMiddleware, minimum_size=GZIP_FROM, compresslevel=GZIP_LEVEL)
    app.add_middleware(Guard, hosts={*LOOPBACK_HOSTS, *(h.lower() for h in allow_hosts)})
    return app


class VersionedStatic(StaticFiles):
    """The static files, each named by the pages as `/static/NAME?v=HASH` (url): a browser keeps
    an answer to the current hash for a year; any other URL it revalidates."""

    def __init__(self, directory: str) -> None:
        super().__init__(directory=directory)
        self.hashes = {
            f.name: hashlib.sha256(f.read_bytes()).hexdigest()[:12]
            for f in Path(directory).iterdir()
            if f.is_file()
        }

    def url(self, name: str) -> str:
        return f"/static/{name}?v={self.hashes[name]}"

    async def get_response(self, path: str, scope) -> Response:
        response = await super().get_response(path, scope)
        version = dict(parse_qsl(scope.get("query_string", b"").decode("latin-1"))).get("v")
        current = version is not None and self.hashes.get(path) == version
        response.headers["cache-control"] = CACHE_VERSIONED if current else CACHE_OTHER
        return response


class Guard:
    """Every answer with the security headers; a request with an unknown Host, or a number or
    text out of range in its path or query, refused with 400 before any route runs."""

    def __init__(self, app, hosts: set[str]) -> None:
        self.app, self.hosts = app, hosts

    async def __call__(self, scope, receive, send) -> None:
        if scope["type"] != "http":
            await self.app(scope, receive, send)
            return

        async def send_with_headers(message) -> None:
            if message["type"] == "http.response.start":
                message["headers"] = [*message.get("headers", []), *SECURITY_HEADERS]
            await send(message)

        why = self._refusal(scope)
        if why is None:
            await self.app(scope, receive, send_with_headers)
            return
        body = json.dumps({"error": why}).encode()
        await send_with_headers(
            {
                "type": "http.response.start",
                "status": 400,
                "headers": [
                    (b"content-type", b"application/json"),
                    (b"content-length", str(len(body)).encode()),
                ],
            }
        )
        await send({"type": "http.response.body", "body": body})

    def _refusal(self, scope) -> str | None:
        headers = dict(scope.get("headers") or [])
        host = _host_name(headers.get(b"host", b"").decode("latin-1"))
        if host not in self.hosts:
            return "unknown Host: serve --allow-host NAME answers another name"
        query = scope.get("query_string", b"").decode("latin-1")
        segments = scope["path"].split("/")
        values = [*segments, *(v for _, v in parse_qsl(query))]
        for i, value in enumerate(values):
            if len(value) > MAX_PARAM_CHARS:
                return f"a parameter longer than {MAX_PARAM_CHARS} characters"
            big = 0 < i < len(segments) and segments[i - 1] in BIG_ID_PATHS
            most = MAX_BIG_ID if big else MAX_INT
            if _INT.fullmatch(value.strip()) and abs(int(value)) > most:
                return f"a number out of range (at most {most})"
        return None


def _host_name(host: str) -> str:
    """The name of a Host header, without its port: `[::1]:8765` is `::1`."""
    host = host.strip().lower()
    if host.startswith("["):
        return host[1 : host.find("]")] if "]" in host else host
    return host.rsplit(":", 1)[0] if host.count(":") == 1 else host


async def _bad_parameter(request: Request, exc: Exception) -> Response:
    """FastAPI's 422 `{"detail": [...]}` for a parameter of the wrong type or a missing one,
    answered as every other bad parameter (docs/dashboard.md): 400, `{"error": "one line"}`."""
    errors = exc.errors() if isinstance(exc, RequestValidationError) else []
    parts = []
    for e in errors[:3]:
        where = ".".join(str(x) for x in e.get("loc", ())[1:]) or "request"
        parts.append(f"{where}: {e.get('msg', 'bad value')}")
    return await _user_error(request, UserError("; ".join(parts) or "bad request"))


async def _user_error(request: Request, exc: Exception) -> Response:
    # 503: the database is unreachable (a restart, a network cut): the next poll may succeed.
    status = 404 if isinstance(exc, NotFound) else 503 if isinstance(exc, DatabaseError) else 400
    if request.url.path.startswith("/api/"):
        return JSONResponse({"error": str(exc)}, status_code=status)
    templates: Jinja2Templates = request.app.state.templates
    return HTMLResponse(
        templates.get_template("error.html").render(message=str(exc), status=status),
        status_code=status,
    )
