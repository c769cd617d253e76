"""Several hosts, one database: workers in network namespaces of their own, each joined to the
database host by a veth pair; one is cut off mid-job (its link dropped), its job comes back after
the lease, nothing doubles, and the cut-off worker records nothing when its link returns.

Needs root and network namespaces (`ip netns`); skipped with the reason where not permitted.
"""

from __future__ import annotations

import os
import shutil
import subprocess
import uuid

import pytest
import sqlalchemy as sa
from support.ownservers import OwnPostgres
from support.workers import (
    assert_done_exactly_once,
    env_for,
    job_states,
    make_session,
    stderr_of,
    wait_for,
)

from mlirtuna.db import Database
from mlirtuna.db.models import Attempt, Job

pytestmark = pytest.mark.slow


def _ip(*args: str) -> None:
    subprocess.run(["ip", *args], check=True, capture_output=True, timeout=30)


class Hosts:
    """Namespaces ns1…nsN; host side of veth k is 10.211.k.1/24, the namespace side 10.211.k.2."""

    def __init__(self, n: int) -> None:
        if os.geteuid() != 0 or shutil.which("ip") is None:
            pytest.skip("network namespaces need root and iproute2")
        self.tag = uuid.uuid4().hex[:5]
        self.names: list[str] = []
        try:
            for k in range(1, n + 1):
                ns, host, peer = f"mt{self.tag}{k}", f"mth{self.tag}{k}", f"mtn{self.tag}{k}"
                _ip("netns", "add", ns)
                self.names.append(ns)
                _ip("link", "add", host, "type", "veth", "peer", "name", peer)
                _ip("link", "set", peer, "netns", ns)
                _ip("addr", "add", f"10.211.{k}.1/24", "dev", host)
                _ip("link", "set", host, "up")
                _ip("-n", ns, "addr", "add", f"10.211.{k}.2/24", "dev", peer)
                _ip("-n", ns, "link", "set", peer, "up")
                _ip("-n", ns, "link", "set", "lo", "up")
        except subprocess.CalledProcessError as exc:
            self.close()
            pytest.skip(f"network namespaces not permitted here: {exc.stderr.decode().strip()}")

    def link(self, k: int, up: bool) -> None:
        _ip("link", "set", f"mth{self.tag}{k}", "up" if up else "down")

    def close(self) -> None:
        for k, ns in enumerate(self.names, 1):
            subprocess.run(["ip", "link", "del", f"mth{self.tag}{k}"], capture_output=True)
            subprocess.run(["ip", "netns", "del", ns], capture_output=True)


def _worker_in(ns: str, url: str, sid: int, log, *extra: str):
    from support.clitools import mlirtuna_argv

    argv = ["ip", "netns", "exec", ns, *mlirtuna_argv("worker", "--session", str(sid),
            "--tuner", "plugins.claimlog:Logging", *extra)]  # fmt: skip
    errlog = log.with_name(f"{ns}.err")
    with open(errlog, "w") as err:
        proc = subprocess.Popen(argv, env=env_for(url, log, 1.0), stdout=subprocess.DEVNULL,
                                stderr=err)  # fmt: skip
    proc.errlog = errlog
    return proc


def test_a_host_cut_off_mid_job_records_nothing_and_its_job_comes_back(tmp_path):
    hosts = Hosts(2)
    server = None
    try:
        server = OwnPostgres({"listen_addresses": "'*'"}, hba=("host all all 10.211.0.0/16 trust",))
        db = Database(server.url(), check_schema=False)
        db.upgrade()
        n = 12
        sid = make_session(db, tmp_path, n)
        log = tmp_path / "claims.log"
        args = ("--until-empty", "--lease", "4", "--wait-for-db", "30")
        urls = [f"postgresql://postgres@10.211.{k}.1:{server.port}/postgres" for k in (1, 2)]
        cut = _worker_in(hosts.names[0], urls[0], sid, log, *args)
        wait_for(lambda: _held_by(db, cut.pid), timeout=90)
        hosts.link(1, up=False)  # the host drops off the network mid-job
        other = _worker_in(hosts.names[1], urls[1], sid, log, *args)
        assert other.wait(timeout=240) == 0, stderr_of(other)
        assert job_states(db, sid) == {"completed": n}
        hosts.link(1, up=True)  # back: its late record must be fenced out
        assert cut.wait(timeout=240) == 0, stderr_of(cut)
        assert_done_exactly_once(db, sid, n)
        with db.session() as s:
            outcomes = s.scalars(sa.select(Attempt.outcome).where(Attempt.pid == cut.pid)).all()
        assert "expired" in outcomes and "completed" not in outcomes
        assert "lease lost" in stderr_of(cut)
        db.dispose()
    finally:
        if server is not None:
            server.close()
        hosts.close()


def _held_by(db: Database, pid: int) -> bool:
    with db.session() as s:
        return bool(
            s.scalar(
                sa.select(sa.func.count())
                .select_from(Job)
                .join(Attempt, Attempt.lease_token == Job.lease_token)
                .where(Job.state == "running", Attempt.pid == pid)
            )
        )
