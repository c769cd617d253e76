"""The dashboard application: a read-only database handle, templates, static files, routes.

Read-only is enforced by the database, not by discipline: every connection the dashboard opens is
put in read-only mode (SQLite `query_only`, a read-only transaction default on the servers), so
a bug in a route cannot write. On a server, a read-only role (docs/ci.md) does the same again.
"""

from __future__ import annotations

from pathlib import Path

from fastapi import FastAPI, Request
from fastapi.responses import HTMLResponse, JSONResponse, Response
from fastapi.staticfiles import StaticFiles
from fastapi.templating import Jinja2Templates
from sqlalchemy import event
from sqlalchemy.engine import URL

from mlirtuna import __version__
from mlirtuna.db import Database, resolve_url
from mlirtuna.errors import DatabaseError, NotFound, UserError
from mlirtuna.web import routes

HERE = Path(__file__).parent
DEFAULT_HOST, DEFAULT_PORT = "127.0.0.1", 8765
POLL_MS = 2000  # how often the farm page asks for fresh numbers

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
    db = Database(resolved, check_schema=False)
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


def create_app(db: Database, poll_ms: int = POLL_MS) -> FastAPI:
    app = FastAPI(
        title="mlirtuna dashboard",
        version=__version__,
        docs_url="/api/docs",
        redoc_url=None,
        openapi_url="/api/openapi.json",
    )
    app.state.db = db
    app.state.poll_ms = poll_ms
    app.state.templates = Jinja2Templates(directory=str(HERE / "templates"))
    app.state.templates.env.globals.update(version=__version__, db_url=db.display_url)
    app.mount("/static", StaticFiles(directory=str(HERE / "static")), name="static")
    app.include_router(routes.api)
    app.include_router(routes.pages)
    app.add_exception_handler(UserError, _user_error)
    return app


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
