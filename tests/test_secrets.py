"""Secrets never show: a URL is printed rebuilt from its parts (never its query string or
password), drivers' messages are scrubbed, and the tool gets an allowlisted environment
(issue 23)."""

from __future__ import annotations

import pytest
from support.clitools import cli

from mlirtuna.db import Database, mask, mask_text, resolve_url
from mlirtuna.errors import DatabaseError
from mlirtuna.tuners.process import scrubbed_env

SECRET = "hunter2secret"
UNREACHABLE = "127.0.0.1:1"  # nothing listens: "cannot reach", at once


@pytest.mark.parametrize(
    ("url", "shown"),
    [
        (f"postgresql://tuna@db:5432/farm?password={SECRET}", "postgresql+psycopg://tuna@db:5432/farm"),
        (f"postgresql://tuna:{SECRET}@db/farm?sslmode=require", "postgresql+psycopg://tuna:***@db/farm"),
        ("postgresql://tuna:hunter%402secret@db/farm", "postgresql+psycopg://tuna:***@db/farm"),
        (f"mysql://root:{SECRET}@db:3306/farm?charset=utf8mb4", "mysql+pymysql://root:***@db:3306/farm"),
        ("sqlite:///tmp/farm.db", "sqlite:///tmp/farm.db"),
    ],
)  # fmt: skip
def test_a_url_is_shown_rebuilt_from_its_parts(url, shown):
    assert mask(resolve_url(url)) == shown
    assert "hunter" not in mask_text(url) and "password" not in mask_text(url)


def test_an_unencoded_at_in_the_password_is_refused_without_its_tail():
    for url in (
        f"postgresql://tuna:hunter@{SECRET}@{UNREACHABLE}/x",
        f"mysql://u:a@b@{SECRET}@h/d",
    ):
        with pytest.raises(DatabaseError) as info:
            resolve_url(url)
        text = str(info.value)
        assert "%40" in text and "hunter" not in text and SECRET not in text and "\n" not in text
        run = cli(url, "-v", "db", "current")
        assert run.code == 2 and SECRET not in run.stderr and "hunter" not in run.stderr


@pytest.mark.parametrize(
    "url",
    [
        f"postgresql://tuna@{UNREACHABLE}/x?password={SECRET}&connect_timeout=2",
        f"postgresql://tuna:{SECRET}@{UNREACHABLE}/x?connect_timeout=2",
        f"postgresql://tuna:hunter%402secret@{UNREACHABLE}/x?connect_timeout=2",
    ],
)
def test_cannot_reach_and_verbose_lines_show_no_secret(url):
    db = Database(url, check_schema=False)
    with pytest.raises(DatabaseError) as info:
        db.ensure_schema()
    db.dispose()
    text = str(info.value)
    assert "cannot reach the database" in text
    assert "hunter" not in text and "password" not in text and "connect_timeout" not in text
    run = cli(url, "-v", "db", "current")
    assert run.code == 2 and "hunter" not in run.stderr and "?" not in run.stderr.splitlines()[0]


def test_the_tool_environment_is_an_allowlist():
    env = {
        "PATH": "/usr/bin", "HOME": "/root", "LANG": "C.UTF-8", "LC_ALL": "C", "TMPDIR": "/t",
        "HIP_VISIBLE_DEVICES": "1", "ROCR_VISIBLE_DEVICES": "1", "PYTHONPATH": "/p",
        "DATABASE_URL": f"postgresql://u:{SECRET}@h/d", "SQLALCHEMY_DATABASE_URI": SECRET,
        "MLIRTUNA_DB": SECRET, "MLIRTUNA_DB_PASSWORD": SECRET, "PGPASSWORD": SECRET,
        "MYSQL_PWD": SECRET, "MLIRTUNA_ROLE_PASSWORD_WORKER": SECRET,
        "AWS_SECRET_ACCESS_KEY": SECRET, "GITHUB_TOKEN": SECRET, "SOMETHING_ELSE": "x",
    }  # fmt: skip
    got = scrubbed_env(env)
    assert set(got) == {"PATH", "HOME", "LANG", "LC_ALL", "TMPDIR", "HIP_VISIBLE_DEVICES",
                        "ROCR_VISIBLE_DEVICES", "PYTHONPATH"}  # fmt: skip
    # More may be allowed by name or prefix, never a secret.
    env["MLIRTUNA_TOOL_ENV"] = "SOMETHING_ELSE, DATABASE_URL, PGPASS*, MLIRTUNA_*"
    got = scrubbed_env(env)
    assert "SOMETHING_ELSE" in got and SECRET not in repr(got)
