"""`mlirtuna serve`: the read-only web dashboard (docs/dashboard.md)."""

from __future__ import annotations

import typer

import mlirtuna.cli.common as common
from mlirtuna.errors import UserError


def serve(
    ctx: typer.Context,
    host: str = typer.Option(
        "127.0.0.1",
        "--host",
        help="Address to listen on; one that is not loopback (0.0.0.0) needs --public.",
    ),
    port: int = typer.Option(8765, "--port", help="TCP port to listen on."),
    public: bool = typer.Option(
        False, "--public", help="Allow a --host that other machines reach (no login: read-only)."
    ),
    allow_host: list[str] = typer.Option(
        None,
        "--allow-host",
        help="A Host name browsers may use besides localhost (repeatable), e.g. this machine's.",
    ),
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
    if not _loopback(host):
        if not public:
            raise UserError(
                f"--host {host} opens the dashboard to other machines: add --public to mean it"
            )
        common.err(
            f"warning: the dashboard listens on {host}, open to every machine that reaches it "
            "(no login); browsers must use a name given with --allow-host"
        )
    _check_port(host, port)
    db = open_read_only(common.state(ctx).db_url)
    ctx.find_root().call_on_close(db.dispose)
    url = f"http://{_netloc(host, port)}/"
    common.err(f"mlirtuna dashboard of {db.display_url} (read-only) at {url}")
    # The access log shows paths only; the database URL (and any password) is never logged.
    app = create_app(db, allow_hosts=allow_host or ())
    uvicorn.run(app, host=host, port=port, log_level="warning")


def _check_port(host: str, port: int) -> None:
    """A port that cannot be listened on, said in one line before uvicorn (whose own answer is
    a traceback or its raw error) is started."""
    import errno
    import socket

    if not 1 <= port <= 65535:
        raise UserError(f"--port {port}: a TCP port is 1 to 65535")
    try:
        infos = socket.getaddrinfo(host.strip("[]"), port, type=socket.SOCK_STREAM)
    except socket.gaierror as exc:
        raise UserError(f"--host {host}: not an address of this machine ({exc.strerror})") from None
    family, _, _, _, address = infos[0]
    with socket.socket(family, socket.SOCK_STREAM) as probe:
        probe.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
        try:
            probe.bind(address)
        except OSError as exc:
            if exc.errno == errno.EADDRINUSE:
                raise UserError(
                    f"port {port} on {host} is in use: stop what listens there, or give "
                    "another --port"
                ) from None
            raise UserError(f"cannot listen on {host}:{port} ({exc.strerror})") from None


def _loopback(host: str) -> bool:
    import ipaddress

    if host.lower() == "localhost":
        return True
    try:
        return ipaddress.ip_address(host.strip("[]")).is_loopback
    except ValueError:
        return False


def _netloc(host: str, port: int) -> str:
    return f"[{host}]:{port}" if ":" in host else f"{host}:{port}"


def register(app: typer.Typer) -> None:
    app.command()(serve)
