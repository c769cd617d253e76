"""The dashboard on a free port for the browser tests: in this process (`serving`), or as the
real `mlirtuna serve` command in a subprocess (`serving_command`).

In this process, because a subprocess starts a fresh Python that imports FastAPI, SQLAlchemy and
uvicorn again (1.5-2.7 s a test on a loaded CI host); the app is the one `serve` runs, over the
same read-only database handle (mlirtuna.web.app.open_read_only), under uvicorn in a thread.
`serving_command` keeps the command itself covered in a real browser (tests/test_web_browser.py).
"""

from __future__ import annotations

import atexit
import contextlib
import socket
import subprocess
import threading
import time
from collections.abc import Iterator

import httpx
import uvicorn

from mlirtuna.web.app import POLL_MS, create_app, open_read_only
from support.clitools import mlirtuna_argv, subprocess_env
from support.ownservers import free_port


class _Origin:
    """One listening socket for the whole test process, lent to one server at a time, so every
    dashboard this process serves has the same origin (http://127.0.0.1:PORT): Chromium's
    caches are per origin, and the V8 code cache of the 5 MB plotly bundle spares 1.5 s of
    compiling it on each page load (support/browser.py). A server started while another holds
    it gets a socket of its own (a cold cache, nothing worse)."""

    def __init__(self) -> None:
        self.listener: socket.socket | None = None
        self.lent = False

    @contextlib.contextmanager
    def socket(self) -> Iterator[socket.socket]:
        if self.lent:
            with _listening() as sock:
                yield sock
            return
        if self.listener is None:
            self.listener = _listening()
            atexit.register(self.listener.close)
        self.lent = True
        try:
            # uvicorn closes the sockets it is given when it stops: give it a duplicate, so the
            # port stays bound (connections wait in its backlog for the next server).
            with self.listener.dup() as sock:
                yield sock
        finally:
            self.lent = False


_ORIGIN = _Origin()


def _listening() -> socket.socket:
    sock = socket.socket()
    sock.bind(("127.0.0.1", 0))
    sock.listen(128)
    return sock


@contextlib.contextmanager
def serving(db_url: str, poll_ms: int = POLL_MS) -> Iterator[str]:
    """The dashboard of `db_url`, up and answering, served from this process; its base URL.
    `poll_ms`: how often the farm page polls (create_app's)."""
    db = open_read_only(db_url)
    try:
        with _ORIGIN.socket() as sock:
            config = uvicorn.Config(
                create_app(db, poll_ms=poll_ms),
                log_config=None,  # leave this process's logging be: pytest captures the server's
                log_level="warning",
                access_log=False,
            )
            server = uvicorn.Server(config)
            thread = threading.Thread(
                target=server.run, kwargs={"sockets": [sock]}, name="dashboard", daemon=True
            )
            thread.start()
            try:
                while not server.started:
                    if not thread.is_alive():
                        raise RuntimeError("the dashboard's server stopped while starting")
                    time.sleep(0.01)
                yield f"http://127.0.0.1:{sock.getsockname()[1]}"
            finally:
                server.should_exit = True
                thread.join(timeout=30)
                if thread.is_alive():
                    raise RuntimeError("the dashboard's server did not stop within 30 s")
    finally:
        db.dispose()


@contextlib.contextmanager
def serving_command(db_url: str, **env: str) -> Iterator[str]:
    """The dashboard of `db_url` as `mlirtuna serve` serves it, up and answering; its base URL.
    `env`: more of the server's environment (a plugin's PYTHONPATH)."""
    port = free_port()
    proc = subprocess.Popen(
        mlirtuna_argv("serve", "--port", str(port)),
        env=subprocess_env(db_url, **env),
        stdout=subprocess.DEVNULL,
        stderr=subprocess.DEVNULL,
    )
    url = f"http://127.0.0.1:{port}"
    try:
        for _ in range(300):
            try:
                httpx.get(f"{url}/api/sessions", timeout=2).raise_for_status()
                break
            except httpx.TransportError:
                time.sleep(0.1)
        yield url
    finally:
        proc.terminate()
        proc.wait(timeout=30)
