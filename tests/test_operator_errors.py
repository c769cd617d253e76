"""Errors a person can act on (issue 35): one line that says what to do, exit 2, nothing left
behind. `run` and `import` of a file with no config, `serve` on a port it cannot have, a
database URL of an unknown kind or driver, and the API's parameter errors."""

from __future__ import annotations

import socket

import pytest
import sqlalchemy as sa
from fastapi.testclient import TestClient
from support.clitools import cli, one_line

from mlirtuna.db.models import Problem, ProblemTag, TuningSession
from mlirtuna.web.app import create_app, open_read_only


def counts(db) -> tuple[int, int, int]:
    with db.session() as s:
        return tuple(
            s.scalar(sa.select(sa.func.count()).select_from(t))
            for t in (TuningSession, Problem, ProblemTag)
        )


@pytest.mark.parametrize("content", ["", "# a comment\n\n   \n# another\n"])
def test_run_and_import_of_a_file_without_configs(db, db_url, tmp_path, content):
    path = tmp_path / "configs.txt"
    path.write_text(content)
    for args in (["run", "--op", "gemm", str(path)], ["import", "--op", "gemm", str(path)]):
        one_line(cli(db_url, *args), f"{path}: no gemm config in it", "one config per line")
        assert counts(db) == (0, 0, 0)  # no empty session, no tag


def test_a_directory_given_as_a_config_list_is_named_a_directory(db, db_url, tmp_path):
    """Not "no such file" (issue 44): it is a directory; give its files, or --op fusion for a
    directory of .mlir modules. Nothing is written."""
    lists = tmp_path / "configs"
    lists.mkdir()
    (lists / "gemm-configs").write_text("-t f32 -transA false -transB false -g 1 -m 8 -n 8 -k 8\n")
    said = (f"{lists}: a directory, not a config list: give the config list files in it "
            f"(e.g. {lists}/*); only --op fusion takes a directory (of .mlir modules)")  # fmt: skip
    for command in ("run", "import"):
        one_line(cli(db_url, command, "--op", "gemm", str(lists)), said)
        assert counts(db) == (0, 0, 0)
    # --op auto takes a directory for fusion modules: one without any says what it read it for.
    one_line(
        cli(db_url, "run", "--op", "auto", str(lists)),
        f"no .mlir modules in {lists}: a directory is read for fusion modules (*.mlir) only; "
        "a config list is given as its file",
    )
    assert counts(db) == (0, 0, 0)


def test_serve_on_a_port_it_cannot_have(db_url):
    one_line(cli(db_url, "serve", "--port", "99999"), "--port 99999: a TCP port is 1 to 65535")
    with socket.socket() as taken:
        taken.bind(("127.0.0.1", 0))
        taken.listen()
        port = taken.getsockname()[1]
        one_line(cli(db_url, "serve", "--port", str(port)), f"port {port}", "in use", "--port")


@pytest.mark.parametrize(
    ("url", "says"),
    [
        ("foo://bar", "unknown database 'foo'; give sqlite:///FILE, postgresql://"),
        ("mysql+mysqldb://u@h/db", "its driver is not installed (MySQLdb)"),
    ],
)
def test_a_database_url_of_an_unknown_kind(url, says):
    one_line(cli(url, "status"), says)


def test_api_parameter_errors_are_400_with_the_documented_body(db_url):
    ro = open_read_only(db_url)
    try:
        client = TestClient(create_app(ro), base_url="http://127.0.0.1")
        for path, where in (
            ("/api/sessions/abc", "session_id"),
            ("/api/problems/1/candidates", "session"),
            ("/api/farm?limit=many", "limit"),
        ):
            answer = client.get(path)
            assert answer.status_code == 400, (path, answer.text)
            body = answer.json()
            assert set(body) == {"error"} and where in body["error"] and "\n" not in body["error"]
        page = client.get("/sessions/abc")
        assert page.status_code == 400 and "session_id" in page.text
    finally:
        ro.dispose()
