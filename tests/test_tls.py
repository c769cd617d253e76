"""TLS to the database: a server of the test's own with a certificate from a CA the test made;
`?sslmode=verify-full&sslrootcert=…` (PostgreSQL) and `?ssl_ca=…` (MariaDB) connect, verified,
and a client that trusts another CA is refused with one line."""

from __future__ import annotations

import os
import shutil

import pytest
import sqlalchemy as sa
from support.clitools import run_cli
from support.ownservers import OwnMariadb, OwnPostgres, self_signed_certs

from mlirtuna.db import Database

pytestmark = pytest.mark.slow


def _user(name: str) -> str:
    import pwd

    return name if os.geteuid() == 0 else pwd.getpwuid(os.getuid()).pw_name


def test_postgresql_verify_full_with_a_self_signed_ca():
    d, ca, crt, key = self_signed_certs(_user("postgres"))
    other, other_ca, _, _ = self_signed_certs(_user("postgres"))
    server = OwnPostgres({"ssl": "on", "ssl_cert_file": f"'{crt}'", "ssl_key_file": f"'{key}'"})
    try:
        base = f"postgresql://postgres@localhost:{server.port}/postgres"
        url = f"{base}?sslmode=verify-full&sslrootcert={ca}"
        assert run_cli(url, "db", "upgrade").code == 0
        db = Database(url)
        with db.session() as s:
            assert s.scalar(sa.text("SELECT ssl FROM pg_stat_ssl WHERE pid = pg_backend_pid()"))
        db.dispose()
        assert run_cli(url, "status").code == 0
        refused = run_cli(f"{base}?sslmode=verify-full&sslrootcert={other_ca}", "status")
        assert refused.code == 2 and len(refused.stderr.strip().splitlines()) == 1
        assert "certificate verify failed" in refused.stderr
    finally:
        server.close()
        shutil.rmtree(d, ignore_errors=True)
        shutil.rmtree(other, ignore_errors=True)


def test_mariadb_ssl_ca_with_a_self_signed_ca():
    d, ca, crt, key = self_signed_certs(_user("mysql"))
    other, other_ca, _, _ = self_signed_certs(_user("mysql"))
    server = OwnMariadb((f"--ssl-cert={crt}", f"--ssl-key={key}", f"--ssl-ca={ca}"))
    try:
        admin = sa.create_engine(f"mysql+pymysql://root@127.0.0.1:{server.port}/mysql")
        with admin.begin() as conn:
            conn.exec_driver_sql("CREATE DATABASE tuna CHARACTER SET utf8mb4")
        admin.dispose()
        url = f"mysql://root@localhost:{server.port}/tuna?ssl_ca={ca}"
        assert run_cli(url, "db", "upgrade").code == 0
        db = Database(url)
        with db.session() as s:
            cipher = s.execute(sa.text("SHOW SESSION STATUS LIKE 'Ssl_cipher'")).one()[1]
        db.dispose()
        assert cipher  # the connection is encrypted
        refused = run_cli(f"mysql://root@localhost:{server.port}/tuna?ssl_ca={other_ca}", "status")
        assert refused.code == 2 and len(refused.stderr.strip().splitlines()) == 1
    finally:
        server.close()
        shutil.rmtree(d, ignore_errors=True)
        shutil.rmtree(other, ignore_errors=True)
