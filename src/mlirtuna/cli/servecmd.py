"""`mlirtuna serve`: the read-only web dashboard (docs/dashboard.md)."""

from __future__ import annotations

import typer

from mlirtuna.cli import common
from mlirtuna.errors import UserError


def serve(
    ctx: typer.Context,
    host: str = typer.Option(
        "127.0.0.1", "--host", help="Address to listen on; 0.0.0.0 opens it to the network."
    ),
    port: int = typer.Option(8765, "--port", help="TCP port to listen on."),
) -> None:
    """Serve a read-only web dashboard of the farm: sessions, live workers, winners, problem
    trends, comparisons, and the same as JSON under /api/."""
    try:
        import uvicorn

        from mlirtuna.web.app import create_app, open_read_only
    except ImportError as exc:  # the [web] extra is not installed
        raise UserError(
            f"the dashboard needs the web extra: pip install 'mlirtuna[web]' ({exc})"
        ) from None
    db = open_read_only(common.state(ctx).db_url)
    ctx.find_root().call_on_close(db.dispose)
    url = f"http://{_netloc(host, port)}/"
    common.err(f"mlirtuna dashboard of {db.display_url} (read-only) at {url}")
    # The access log shows paths only; the database URL (and any password) is never logged.
    uvicorn.run(create_app(db), host=host, port=port, log_level="warning")


def _netloc(host: str, port: int) -> str:
    return f"[{host}]:{port}" if ":" in host else f"{host}:{port}"


def register(app: typer.Typer) -> None:
    app.command()(serve)
