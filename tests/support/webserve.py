"""`mlirtuna serve` as a subprocess on a free port, for the browser tests."""

from __future__ import annotations

import contextlib
import socket
import subprocess
import time
from collections.abc import Iterator

import httpx

from support.clitools import mlirtuna_argv, subprocess_env


def free_port() -> int:
    with socket.socket() as sock:
        sock.bind(("127.0.0.1", 0))
        return sock.getsockname()[1]


@contextlib.contextmanager
def serving(db_url: str) -> Iterator[str]:
    """The dashboard of `db_url`, up and answering; its base URL."""
    port = free_port()
    proc = subprocess.Popen(
        mlirtuna_argv("serve", "--port", str(port)),
        env=subprocess_env(db_url),
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
