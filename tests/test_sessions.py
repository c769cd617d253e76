"""Opening sessions: detection from the machine, flags, refusal to guess."""

from __future__ import annotations

import os
import stat

import pytest
from conftest import DATA
from support.clitools import cli

from mlirtuna import machine, sessions
from mlirtuna.errors import UserError
from mlirtuna.sessions import SessionSpec


@pytest.fixture
def fake_rocm(tmp_path, monkeypatch):
    """A ROCm install with two MI300X GPUs: rocminfo and .info/version."""
    root = tmp_path / "rocm"
    (root / "bin").mkdir(parents=True)
    (root / ".info").mkdir()
    (root / ".info" / "version").write_text("6.4.1-120\n")
    tool = root / "bin" / "rocminfo"
    tool.write_text(f"#!/bin/sh\ncat {DATA / 'rocm' / 'rocminfo.txt'}\n")
    tool.chmod(tool.stat().st_mode | stat.S_IEXEC)
    monkeypatch.setattr(machine, "ROCM_PATH", root)
    monkeypatch.setenv("PATH", f"{root / 'bin'}{os.pathsep}{os.environ['PATH']}")
    return root


@pytest.fixture
def no_gpu(tmp_path, monkeypatch):
    monkeypatch.setattr(machine, "ROCM_PATH", tmp_path / "nowhere")
    monkeypatch.setattr(machine, "gpus", lambda: [])


def test_parse_rocminfo_lists_gpu_agents_only():
    gpus = machine.parse_rocminfo((DATA / "rocm" / "rocminfo.txt").read_text())
    assert [(g.index, g.arch, g.arch_full, g.num_cu) for g in gpus] == [
        (0, "gfx942", "gfx942:sramecc+:xnack-", 304),
        (1, "gfx942", "gfx942:sramecc+:xnack-", 304),
    ]


def test_rocmlir_session_detected_from_rocminfo(db, fake_rocm):
    s = sessions.create(db, SessionSpec(tuner="rocmlir", num_chiplets=8, reason="weekly"))
    assert (s.arch, s.arch_full, s.num_cu, s.num_chiplets) == (
        "gfx942",
        "gfx942:sramecc+:xnack-",
        304,
        8,
    )
    assert s.rocm_v == "6.4.1-120" and s.reason == "weekly" and s.tuner == "rocmlir"


def test_rocmlir_session_without_gpu_refuses_naming_fields(db, no_gpu):
    with pytest.raises(UserError) as info:
        sessions.create(db, SessionSpec(tuner="rocmlir"))
    assert "--arch" in str(info.value) and "--num-cu" in str(info.value)
    assert sessions.list_all(db) == []


def test_rocmlir_session_from_flags_only(db, no_gpu):
    s = sessions.create(
        db,
        SessionSpec(
            tuner="rocmlir",
            arch_full="gfx90a:sramecc+:xnack-",
            num_cu=110,
            num_chiplets=1,
            mlir_v="abc123",
            tuning_space="quick",
        ),
    )
    assert (s.arch, s.arch_full, s.mlir_v, s.tuning_space) == (
        "gfx90a",
        "gfx90a:sramecc+:xnack-",
        "abc123",
        "quick",
    )


def test_cpu_session_describes_the_cpu(db, no_gpu):
    s = sessions.create(db, SessionSpec(tuner="cpu"))
    assert s.arch.startswith("cpu-") and s.num_cu == (os.cpu_count() or 1)
    assert "cores" in s.host


def test_cli_session_new_json_list_show(db_url, no_gpu):
    run = cli(
        db_url,
        "session",
        "new",
        "--tuner",
        "cpu",
        "--reason",
        "demo",
        "--ticket",
        "T-1",
        "--docker",
        "rocm/mlir:6.4",
        "--tuning-space",
        "quick",
        "--json",
    )
    assert run.code == 0, run.stderr
    row = run.json()
    assert row["reason"] == "demo" and row["ticket"] == "T-1" and row["docker"] == "rocm/mlir:6.4"
    plain = cli(db_url, "session", "new", "--tuner", "cpu")
    assert plain.stdout.strip() == str(row["id"] + 1)
    listed = cli(db_url, "session", "list", "--json").json()
    assert [s["id"] for s in listed] == [row["id"], row["id"] + 1]
    shown = cli(db_url, "session", "show", str(row["id"]), "--json").json()
    assert shown == row


def test_cli_bad_tuning_space_is_one_line(db_url):
    run = cli(db_url, "session", "new", "--tuning-space", "huge")
    assert run.code == 2
    assert run.stderr.strip() == (
        "error: unknown tuning space 'huge' (known: quick, full, greedy, exhaustive, lfbo, "
        "smart, or list:NAME for a stored quick list)"
    )


def test_cli_unknown_session_is_one_line(db_url):
    run = cli(db_url, "session", "show", "99")
    assert run.code == 2 and run.stderr.startswith("error: no session 99")


def test_rocmlir_session_with_gpu_but_no_chiplet_count_asks_for_it(db, fake_rocm, monkeypatch):
    monkeypatch.setattr(machine, "num_chiplets", lambda arch: None)
    with pytest.raises(UserError) as info:
        sessions.create(db, SessionSpec(tuner="rocmlir"))
    assert "--num-chiplets" in str(info.value) and "not exposed" in str(info.value)
    assert "--arch" not in str(info.value)


def test_sessions_tell_apart_by_name_op_created_and_split(db, db_url, tmp_path, no_gpu):
    path = tmp_path / "convs"
    path.write_text("conv -F 1 -f NCHW -I NCHW -O NCHW -n 1 -c 8 -H 8 -W 8 -k 8 -y 3 -x 3\n")
    assert cli(db_url, "import", "--op", "conv", str(path)).code == 0
    named = cli(db_url, "session", "new", "--name", "  resnet   convs  ", "--json").json()
    bare = cli(db_url, "session", "new", "--json").json()
    assert named["name"] == "resnet convs" and bare["name"] == ""
    assert cli(db_url, "jobs", "load", "--session", str(named["id"]), "--all").code == 0
    assert sessions.ops(db, [named["id"], bare["id"]]) == {named["id"]: ["conv"], bare["id"]: []}
    lines = cli(db_url, "session", "list").stdout.splitlines()
    header = lines[0].split()
    assert header[:4] == ["id", "name", "op", "created"] and "split" in header
    by_id = {line.split()[0]: line for line in lines[1:]}
    assert "resnet convs" in by_id[str(named["id"])] and " conv " in by_id[str(named["id"])]
    assert named["created_at"] in by_id[str(named["id"])]
    too_long = cli(db_url, "session", "new", "--name", "x" * 201)
    assert too_long.code == 2 and "at most 200" in too_long.stderr
    assert len(sessions.list_all(db)) == 2  # nothing half-written


def test_session_show_aligns_every_value(db_url, no_gpu):
    sid = cli(db_url, "session", "new", "--json").json()["id"]
    lines = cli(db_url, "session", "show", str(sid)).stdout.splitlines()
    starts = {len(line) - len(line.split(maxsplit=1)[1]) for line in lines if " " in line.strip()}
    assert len(starts) == 1, lines  # gpu_run_timeout_s lines up with the rest
