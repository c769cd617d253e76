"""Database servers a test owns: its own PostgreSQL cluster or MariaDB instance, in a temp dir,
on a port of its own, so that it may stop, crash and restart it without touching the shared
servers on 5432/3306. Each runs as a non-root user (postgres / mysql) as the servers require.
"""

from __future__ import annotations

import contextlib
import glob
import os
import pwd
import shutil
import signal
import socket
import subprocess
import tempfile
import time
from pathlib import Path

import pytest


def free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def _as_user(user: str) -> list[str]:
    if os.geteuid() != 0:
        return []  # already a non-root user: run the server as ourselves
    if shutil.which("runuser") is None:
        pytest.skip("no runuser to run a server as a non-root user")
    return ["runuser", "-u", user, "--"]


def _owned_dir(user: str, prefix: str) -> Path:
    """A temp dir the server's user owns (pytest's tmp_path is private to root)."""
    path = Path(tempfile.mkdtemp(prefix=prefix, dir="/tmp"))
    if os.geteuid() == 0:
        pw = pwd.getpwnam(user)
        os.chown(path, pw.pw_uid, pw.pw_gid)
    path.chmod(0o700)
    return path


def _wait_port(port: int, timeout: float = 60.0) -> None:
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        with contextlib.suppress(OSError), socket.create_connection(("127.0.0.1", port), 0.5):
            return
        time.sleep(0.1)
    raise AssertionError(f"server on port {port} did not come up")


class OwnPostgres:
    """`initdb` into a temp dir, `pg_ctl start` on a free port; `restart(mode)` stops it with
    `pg_ctl stop -m fast|immediate` (immediate: a crash, recovered at the next start).
    `hba` lines come after initdb's (trust for everyone), `hba_first` before them (the first
    line that matches a connection decides: e.g. a password for one user)."""

    def __init__(
        self,
        conf: dict[str, str] | None = None,
        hba: tuple[str, ...] = (),
        hba_first: tuple[str, ...] = (),
    ) -> None:
        bins = sorted(glob.glob("/usr/lib/postgresql/*/bin/initdb"))
        if not bins:
            pytest.skip("no PostgreSQL server binaries under /usr/lib/postgresql")
        self.bin = Path(bins[-1]).parent
        self.user = "postgres" if os.geteuid() == 0 else pwd.getpwuid(os.getuid()).pw_name
        self.prefix = _as_user(self.user)
        self.dir = _owned_dir(self.user, "mlirtuna-pg-")
        self.data = self.dir / "data"
        self.port = free_port()
        self._run("initdb", "-D", str(self.data), "-A", "trust", "-U", "postgres", "-E", "UTF8",
                  "--no-sync")  # fmt: skip
        settings = {"fsync": "off", "listen_addresses": "'127.0.0.1'", "port": str(self.port),
                    "unix_socket_directories": f"'{self.dir}'", **(conf or {})}  # fmt: skip
        with open(self.data / "postgresql.conf", "a") as f:
            f.writelines(f"{k} = {v}\n" for k, v in settings.items())
        rules = self.data / "pg_hba.conf"
        rules.write_text("".join(f"{line}\n" for line in (*hba_first, rules.read_text(), *hba)))
        self.start()

    def _run(self, tool: str, *args: str) -> None:
        argv = [*self.prefix, str(self.bin / tool), *args]
        subprocess.run(argv, check=True, capture_output=True, timeout=120)

    def url(self, database: str = "postgres", user: str = "postgres") -> str:
        return f"postgresql://{user}@127.0.0.1:{self.port}/{database}"

    def start(self) -> None:
        self._run("pg_ctl", "-D", str(self.data), "-l", str(self.dir / "log"), "-w", "start")

    def stop(self, mode: str = "fast") -> None:
        self._run("pg_ctl", "-D", str(self.data), "-m", mode, "-w", "stop")

    def restart(self, mode: str, down_s: float = 1.0) -> None:
        self.stop(mode)
        time.sleep(down_s)
        self.start()

    def close(self) -> None:
        with contextlib.suppress(Exception):
            self.stop("immediate")
        shutil.rmtree(self.dir, ignore_errors=True)


class OwnMariadb:
    """`mariadb-install-db` into a temp dir, `mariadbd` on a free port (no grant tables: the
    test is its only user); `restart(mode)`: SIGTERM (clean shutdown) or SIGKILL (a crash)."""

    def __init__(self, args: tuple[str, ...] = ()) -> None:
        self.args = args
        install, server = shutil.which("mariadb-install-db"), shutil.which("mariadbd")
        server = server or ("/usr/sbin/mariadbd" if os.path.exists("/usr/sbin/mariadbd") else None)
        if not install or not server:
            pytest.skip("no mariadb-install-db / mariadbd to run a MariaDB of the test's own")
        self.server = server
        self.user = "mysql" if os.geteuid() == 0 else pwd.getpwuid(os.getuid()).pw_name
        self.dir = _owned_dir(self.user, "mlirtuna-my-")
        self.data = self.dir / "data"
        self.port = free_port()
        subprocess.run(
            [install, "--no-defaults", f"--user={self.user}", f"--datadir={self.data}",
             "--auth-root-authentication-method=normal", "--skip-test-db"],
            check=True, stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL, timeout=180,
        )  # fmt: skip
        self.proc: subprocess.Popen | None = None
        self.start()

    def url(self, database: str = "mysql") -> str:
        return f"mysql://root@127.0.0.1:{self.port}/{database}"

    def start(self) -> None:
        argv = [self.server, "--no-defaults", f"--user={self.user}", f"--datadir={self.data}",
                f"--port={self.port}", "--bind-address=127.0.0.1", "--skip-grant-tables",
                f"--socket={self.dir / 'sock'}", f"--pid-file={self.dir / 'pid'}",
                "--innodb-flush-log-at-trx-commit=2", "--skip-log-bin", *self.args]  # fmt: skip
        with open(self.dir / "log", "a") as log:  # the server keeps its own copy of the fd
            self.proc = subprocess.Popen(argv, stdout=log, stderr=log)
        _wait_port(self.port)

    def stop(self, mode: str = "fast") -> None:
        assert self.proc is not None
        self.proc.send_signal(signal.SIGKILL if mode == "immediate" else signal.SIGTERM)
        self.proc.wait(timeout=120)

    def restart(self, mode: str, down_s: float = 1.0) -> None:
        self.stop(mode)
        time.sleep(down_s)
        self.start()

    def close(self) -> None:
        if self.proc is not None and self.proc.poll() is None:
            self.proc.kill()
            self.proc.wait()
        shutil.rmtree(self.dir, ignore_errors=True)


def self_signed_certs(user: str, hostname: str = "localhost") -> tuple[Path, Path, Path, Path]:
    """A CA of the test's own and a server certificate it signed for `hostname` and 127.0.0.1,
    in a dir the server's user owns: (dir, ca.crt, server.crt, server.key)."""
    if shutil.which("openssl") is None:
        pytest.skip("no openssl to make a certificate")
    d = _owned_dir(user, "mlirtuna-tls-")

    def ssl(*args: str) -> None:
        subprocess.run(["openssl", *args], cwd=d, check=True, capture_output=True, timeout=60)

    ssl("req", "-x509", "-newkey", "rsa:2048", "-nodes", "-keyout", "ca.key", "-out", "ca.crt",
        "-subj", "/CN=mlirtuna test CA", "-days", "2")  # fmt: skip
    ssl("req", "-newkey", "rsa:2048", "-nodes", "-keyout", "server.key", "-out", "server.csr",
        "-subj", f"/CN={hostname}")  # fmt: skip
    (d / "san.ext").write_text(f"subjectAltName=DNS:{hostname},IP:127.0.0.1\n")
    ssl("x509", "-req", "-in", "server.csr", "-CA", "ca.crt", "-CAkey", "ca.key",
        "-CAcreateserial", "-out", "server.crt", "-days", "2", "-extfile", "san.ext")  # fmt: skip
    if os.geteuid() == 0:
        pw = pwd.getpwnam(user)
        for f in d.iterdir():
            os.chown(f, pw.pw_uid, pw.pw_gid)
    (d / "server.key").chmod(0o600)
    for f in ("ca.crt", "server.crt"):
        (d / f).chmod(0o644)
    d.chmod(0o755)  # the client (this test, as root or not) reads ca.crt
    return d, d / "ca.crt", d / "server.crt", d / "server.key"
