"""Driving every era of tuningRunner (E2, E2.5, E3, E4) through the stand-in: each era gets
exactly its flags, E4's session settings pass through, its GPU-run timeouts and Discarded
candidates are recorded as such, sessions refuse what a build lacks, and the `.debug` export of
the recorded candidates reads back exactly."""

from __future__ import annotations

import json
import math
import os
import shutil
import subprocess
import sys

import pytest
import sqlalchemy as sa
from support.clitools import cli
from support.debug_reader import best_per_problem, read_debug
from support.rocmlir import (
    GEMM,
    calls,
    context,
    rocmlir_session,
    tuner,
    tuning_calls,
    work,
)

from mlirtuna import keys, sessions
from mlirtuna.db.models import Candidate, Job, Result
from mlirtuna.errors import TunerError, Unsupported, UserError
from mlirtuna.history import export
from mlirtuna.history.export import ExportQuery
from mlirtuna.problems import parse
from mlirtuna.sessions import SessionSpec
from mlirtuna.tuners import rocmlir

# The flow over whole workers: each backend in .ci/run, SQLite in the quick loop (the
# queue, claim and settle SQL it runs is tested on all three there too).
pytestmark = pytest.mark.backends(fast=("sqlite",))

ALL_ERAS = ["E2", "E2.5", "E3", "E4"]
SPACES = {
    "E2": ("quick", "full", "exhaustive"),
    "E2.5": ("quick", "full", "greedy", "exhaustive"),
    "E3": ("quick", "full", "greedy", "exhaustive"),
    "E4": ("quick", "full", "exhaustive"),  # rocmlirTriton 520c8752: no greedy, no lfbo
}
COMMON = {"--op", "--config", "--tuning-space", "--mlir-build-dir", "--output", "--debug"}
FLAGS = {
    "E2": COMMON | {"--tflops", "--rocmlir_gen_flags"},
    "E2.5": COMMON | {"--tflops", "--rocmlir_gen_flags"},
    "E3": COMMON | {"--gpus", "--timeout", "--abort-on-error"},
    "E4": COMMON | {"--gpus", "--timeout", "--abort-on-error"},
}
E4_SETTINGS = dict(rep_ms=50, warmup_ms=10, gpu_run_timeout_s=30)


def flag_names(argv: list[str]) -> set[str]:
    return {a.split("=", 1)[0] for a in argv if a.startswith("--")}


# --- the tuner -----------------------------------------------------------------------------------


@pytest.mark.parametrize("era", ALL_ERAS)
def test_every_era_is_detected_with_its_spaces(build, monkeypatch, era) -> None:
    detected = tuner(build, era, monkeypatch).era
    assert (detected.name, detected.tuning_spaces) == (era, SPACES[era])


@pytest.mark.parametrize("era", ALL_ERAS)
def test_each_era_gets_exactly_its_flags(build, monkeypatch, era) -> None:
    t = tuner(build, era, monkeypatch)
    settings = E4_SETTINGS if era == "E4" else {}
    t.tune(parse("gemm", GEMM), context(tuning_space="quick", **settings))
    (call,) = tuning_calls(build)
    want = FLAGS[era] | ({"--rep", "--warmup", "--gpu-run-timeout"} if settings else set())
    if era == "E4":  # it re-measures the session's top k itself (issue 17)
        want |= {"--two-stage-topk"}
    assert flag_names(call["argv"]) == want
    assert flag_names(call["argv"]) <= t.era.flags  # never a flag this version lacks
    if era == "E4":
        assert {"--rep=50", "--warmup=10", "--gpu-run-timeout=30",
                "--two-stage-topk=3"} <= set(call["argv"])  # fmt: skip
        # rocmlirTriton canonicalizes a gemm with -transO: mlirtuna's line is already that form
        assert f"--config={keys.e4_vector('gemm', GEMM)}" in call["argv"]


@pytest.mark.parametrize("era", ["E2", "E2.5", "E3"])
def test_a_setting_the_era_lacks_is_an_error_not_dropped(build, monkeypatch, era) -> None:
    with pytest.raises(TunerError, match=f"no --rep .*lacks the rep-warmup capability .*{era}:"):
        tuner(build, era, monkeypatch).tune(parse("gemm", GEMM), context(rep_ms=50))
    assert tuning_calls(build) == []


def test_e25_written_error_line_is_the_job_error(build, monkeypatch) -> None:
    monkeypatch.setenv("FAKE_TUNINGRUNNER_FAULT", "fail")
    with pytest.raises(
        TunerError, match=r"Tuning failed for '-t f16.*rocmlir-tuning-driver failed"
    ):
        tuner(build, "E2.5", monkeypatch).tune(parse("gemm", GEMM), context())


def test_e4_gpu_run_timeout_is_said_so(build, monkeypatch) -> None:
    monkeypatch.setenv("FAKE_TUNINGRUNNER_FAULT", "gpu_timeout")
    with pytest.raises(TunerError, match=r"^GPU run timed out") as info:
        tuner(build, "E4", monkeypatch).tune(parse("gemm", GEMM), context())
    assert "Exit code: 3" in (info.value.detail or "")


def test_e4_lfbo_variant_candidates_discarded_named_and_split_k(build, monkeypatch) -> None:
    monkeypatch.setenv("FAKE_TUNINGRUNNER_E4", "lfbo")  # its driver drops some without a top k
    problem = parse("gemm", GEMM)
    outcome = tuner(build, "E4", monkeypatch).tune(problem, context(tuning_space="full"))
    discarded = [c for c in outcome.candidates if c.error == rocmlir.DISCARDED]
    not_applicable = [c for c in outcome.candidates if c.error and "N/A" in c.error]
    assert discarded and not_applicable and len(outcome.candidates) == 40
    assert all(keys.perf_config_format(c.perf_config) == "gemm:named" for c in outcome.candidates)
    # its "-transO false ... -supportsSplitK true" key matched
    assert outcome.winner.valid and outcome.notes == []


# --- sessions: spaces and settings against the build ---------------------------------------------


def spec(build_dir, space="full", **changes) -> SessionSpec:
    values = dict(
        tuner="rocmlir",
        tuning_space=space,
        arch_full="gfx942:sramecc+:xnack-",
        num_cu=304,
        num_chiplets=8,
        rocm_v="7.0",
        mlir_v="abc",
        mlir_build_dir=str(build_dir),
    )
    values.update(changes)
    return SessionSpec(**values)


@pytest.mark.parametrize(("era", "form"), [("E3", "plain"), ("E4", "e4")])
def test_session_records_its_build_key_form_and_lfbo(db, build, monkeypatch, era, form) -> None:
    monkeypatch.setenv("FAKE_TUNINGRUNNER_ERA", era)
    monkeypatch.setenv("FAKE_TUNINGRUNNER_E4", "lfbo")  # the E4 line that has the lfbo space
    made = sessions.create(db, spec(build))
    assert made.key_form == form
    if era == "E4":
        lfbo = sessions.create(db, spec(build, "lfbo", lfbo_effort="quick", rep_ms=40))
        assert (lfbo.tuning_space, lfbo.lfbo_effort, lfbo.rep_ms) == ("lfbo", "quick", 40)


def test_session_new_refuses_what_the_build_lacks(db, db_url, build, monkeypatch) -> None:
    monkeypatch.setenv("FAKE_TUNINGRUNNER_ERA", "E3")
    with pytest.raises(UserError, match=r"tuning space 'lfbo' is not offered .*\(E3: .*; spaces "):
        sessions.create(db, spec(build, "lfbo"))
    with pytest.raises(
        UserError,
        match=r"has no --rep, --gpu-run-timeout: it lacks the gpu-run-timeout, rep-warmup "
        r"capability \(E3: gpus, batch, timeout; spaces quick, full, greedy, exhaustive\)",
    ):
        sessions.create(db, spec(build, rep_ms=10, gpu_run_timeout_s=5))
    run = cli(
        db_url,
        "session",
        "new",
        "--tuner",
        "rocmlir",
        "--arch-full",
        "gfx942:sramecc+:xnack-",
        "--num-cu",
        "304",
        "--num-chiplets",
        "8",
        "--tuning-space",
        "smart",
        "--mlir-build-dir",
        str(build),
        env={
            "FAKE_TUNINGRUNNER_ERA": "E3",
            "MLIRTUNA_ROCMLIR_PYTHON": shutil.which("python3") or "python3",
        },
    )
    assert run.code == 2 and run.stderr.count("\n") == 1
    assert "tuning space 'smart' is not offered" in run.stderr
    assert sessions.list_all(db) == []


# --- a worker drives each era end to end; the .debug export reads back ----------------------------


@pytest.mark.parametrize("era", ALL_ERAS)
def test_worker_drives_each_era_and_debug_export_reads_back(db, tmp_path, build, monkeypatch, era):
    monkeypatch.setenv("FAKE_TUNINGRUNNER_ERA", era)
    sid = rocmlir_session(db, tmp_path, "gemm", "quick" if era != "E4" else "full")
    if era == "E4":
        with db.session() as s:  # the E4 settings of this session, passed through
            from mlirtuna.db.models import TuningSession

            s.get(TuningSession, sid).rep_ms = 60
    assert work(db, sid, build).stats.completed == 1
    argv = next(c["argv"] for c in calls(build) if c["argv"] != ["--help"])
    e4_only = {"--rep", "--two-stage-topk"}  # the session's setting and top k (issue 17)
    assert flag_names(argv) == FLAGS[era] | (e4_only if era == "E4" else set())
    with db.session() as s:
        result = s.scalars(sa.select(Result).where(Result.session_id == sid)).one()
        cands = list(s.scalars(sa.select(Candidate).where(Candidate.session_id == sid)))
        family = {"E2": "v2", "E2.5": "v2", "E3": "v4", "E4": "gemm:named"}[era]
        assert result.perf_family == family and {c.perf_family for c in cands} == {family}
        if era == "E4":
            assert any(c.error == rocmlir.DISCARDED for c in cands)
        recorded = {c.perf_config: c.tflops for c in cands}

    out = tmp_path / "gemm.debug"
    done = export.export(db, ExportQuery(sessions=(sid,)), "debug", str(out))
    rows = read_debug(str(out))
    assert done.rows == len(rows) == len(recorded)
    assert {r["Chip"] for r in rows} == {"gfx942"} and {r["numCU"] for r in rows} == {"304"}
    problem = {
        (r["DataType"], r["OutDataType"], r["TransA"], r["TransB"], r["G"], r["M"], r["K"], r["N"])
        for r in rows
    }
    assert problem == {("f16", "f16", "False", "False", "1", "1024", "768", "512")}
    for r in rows:
        want = recorded[r["PerfConfig"]]
        if want is None:
            assert math.isnan(r["TFlops"])
        else:
            assert r["TFlops"] == want  # repr of the double: exact
    best = best_per_problem(rows, ["DataType", "M", "N", "K"])
    assert list(best.values()) == [result.tflops]


def test_e4_gpu_timeout_through_a_worker(db, tmp_path, build, monkeypatch):
    monkeypatch.setenv("FAKE_TUNINGRUNNER_ERA", "E4")
    monkeypatch.setenv("FAKE_TUNINGRUNNER_FAULT", "gpu_timeout")
    sid = rocmlir_session(db, tmp_path, "gemm")
    assert work(db, sid, build).stats.failed == 1
    with db.session() as s:
        job = s.scalars(sa.select(Job).where(Job.session_id == sid)).one()
    assert job.state == "error" and "failed: GPU run timed out" in job.result.splitlines()[0]


def test_debug_export_of_mixed_ops_needs_op(db, tmp_path, build, monkeypatch):
    monkeypatch.setenv("FAKE_TUNINGRUNNER_ERA", "E3")
    a = rocmlir_session(db, tmp_path, "gemm")
    b = rocmlir_session(db, tmp_path, "attention")
    work(db, a, build)
    work(db, b, build)
    with pytest.raises(UserError, match=r"hold ops attention, gemm: .* give --op"):
        export.render(db, ExportQuery(sessions=(a, b)), "debug")
    text = export.render(db, ExportQuery(sessions=(a, b), op="attention"), "debug").text
    # the real tool's column order (formats/debug.py): the GPU's after the leading DataType
    assert text.splitlines()[0].split("\t")[:5] == [
        "DataType",
        "Chip",
        "numCU",
        "numChiplets",
        "TransQ",
    ]


@pytest.mark.parametrize("op", ["gemm", "conv", "attention"])
def test_debug_export_problem_columns_are_the_tools(db, tmp_path, build, monkeypatch, op):
    """The problem columns of the export, by name, hold what the stand-in's own .debug rows
    (perfRunner's table_entry()) hold for the same problem. Conv layouts excepted: the stand-in
    spells H and W as 0 and 1 where the real perfRunner (3fc5be9e, its *_LAYOUT_MAP) writes
    `kcyx`, as the export does (test_ops_declared checks it against the real tool's files)."""
    from support.rocmlir import LINES, STAND_IN

    monkeypatch.setenv("FAKE_TUNINGRUNNER_ERA", "E3")
    sid = rocmlir_session(db, tmp_path, op)
    work(db, sid, build)
    out = tmp_path / f"{op}.debug"
    export.export(db, ExportQuery(sessions=(sid,)), "debug", str(out))
    rows = read_debug(str(out))
    tools, _ = STAND_IN.describe(op, parse(op, LINES[op]).canonical(), STAND_IN.Gpu(), "E3")
    layouts = ("FilterLayout", "InputLayout", "OutputLayout")
    shared = [c for c in tools if c in rows[0] and c not in ("PerfConfig", "TFlops", *layouts)]
    assert len(shared) >= {"gemm": 9, "conv": 17, "attention": 19}[op]
    for row in rows:  # read_debug takes an empty cell (ScaleADtype) for a missing value
        assert {c: row[c] for c in shared} == {c: str(tools[c]) or None for c in shared}


# --- capabilities, read from --help (issue 22, point 6) -------------------------------------------

# rocMLIR's own newest tuningRunner.py (3fc5be9e, shared/reference/rocmlir-real-tool.md): the E3
# line with --gpu-run-timeout and --triton-benchmark-mode, but no two-stage flags. Flag names
# only, in argparse's usage layout.
ROCMLIR_NEWEST_HELP = """usage: tuningRunner.py [-h] (-c FILE | --config CONFIG | --test-dir DIR)
  --op {conv,gemm,fusion,attention,gemm_gemm,conv_gemm} [-o FILE] [--mlir-build-dir DIR]
  [--tuning-space {quick,full,greedy,exhaustive}] [--data-type TYPE [TYPE ...]]
  [--verify-mode {none,cpu,gpu}] [-d] [--debug-quick-tune-data] [--timeout SECONDS]
  [--verify-timeout SECONDS] [--gpu-run-timeout SECONDS] [--retry STATE [STATE ...]]
  [--retune] [--abort-on-error] [--gpus GPU_ID [GPU_ID ...]] [--num-cpus N]
  [--wait-for-compiles] [--flush-last-level-cache] [--triton-benchmark-mode] [-s] [-q | -v]
  [--tflops]

options:
  -c FILE, --configs-file FILE, --configs_file FILE
  --config CONFIG
  --test-dir DIR, --test_dir DIR
"""


def test_capabilities_name_what_the_build_can_do(build, tmp_path, monkeypatch) -> None:
    newest = rocmlir.detect_era(ROCMLIR_NEWEST_HELP)
    assert newest.name == "E3"  # not E4 because of --gpu-run-timeout
    assert newest.capabilities == ("gpus", "batch", "timeout", "gpu-run-timeout")
    assert not rocmlir.can_split(newest)
    # Labelled E4, its sessions exported `-supportsSplitK` keys, which 3fc5be9e's
    # read_tuning_db skips (its gemm parser knows no such flag): plain keys, as E3's.
    assert rocmlir.build_key_form(tmp_path, newest) == keys.PLAIN
    assert newest.describe() == (
        "E3: gpus, batch, timeout, gpu-run-timeout; spaces quick, full, greedy, exhaustive"
    )
    e4 = tuner(build, "E4", monkeypatch).era
    assert set(e4.capabilities) == {
        "gpus", "batch", "timeout", "gpu-run-timeout", "two-stage", "topk-remeasure",
        "rep-warmup",
    }  # fmt: skip
    assert "greedy" not in e4.tuning_spaces and "lfbo" not in e4.tuning_spaces
    monkeypatch.setenv("FAKE_TUNINGRUNNER_E4", "lfbo")  # the other stored rocmlirTriton line
    assert "lfbo" in rocmlir.RocmlirTuner(str(build)).era.capabilities
    e2 = tuner(build, "E2", monkeypatch).era
    assert e2.capabilities == () and e2.describe().startswith("E2: one-stage only; spaces quick")
    # What a split on a build without it says: the capability and what the build has, never a
    # label contradicting the flags.
    with pytest.raises(UserError) as info:
        rocmlir.check_split_build(str(build))  # still the E2 stand-in
    assert "lacks the two-stage capability (no --compile-only, --benchmark-artifacts, " in str(
        info.value
    )
    assert "(E2: one-stage only;" in str(info.value)


def test_session_new_names_capabilities_and_refuses_greedy_on_e4(db, db_url, build) -> None:
    args = ["session", "new", "--tuner", "rocmlir", "--arch-full", "gfx942:sramecc+:xnack-",
            "--num-cu", "304", "--num-chiplets", "8", "--mlir-build-dir", str(build)]  # fmt: skip
    env = {"FAKE_TUNINGRUNNER_ERA": "E4"}
    run = cli(db_url, *args, "--tuning-space", "greedy", env=env)
    assert run.code == 2 and run.stderr.count("\n") == 1, run.stderr
    assert "tuning space 'greedy' is not offered" in run.stderr
    assert "(E4: gpus, batch, timeout, gpu-run-timeout, two-stage, " in run.stderr
    assert sessions.list_all(db) == []
    made = cli(db_url, *args, "--tuning-space", "quick", env=env)
    assert made.code == 0, made.stderr
    assert "tuningRunner.py: E4: gpus, batch, " in made.stderr
    assert "spaces quick, full, exhaustive" in made.stderr
    shown = cli(db_url, *args, "--tuning-space", "full", "--json", env=env)
    assert '"capabilities": "E4: gpus, batch, ' in shown.stdout
    # Stored with the session: read back later, without the build, it still names them.
    sid = str(json.loads(shown.stdout)["id"])
    assert (
        '"capabilities": "E4: gpus, batch, ' in cli(db_url, "session", "show", sid, "--json").stdout
    )
    plain = cli(db_url, "session", "show", sid).stdout
    assert any(
        line.startswith("capabilities") and "two-stage" in line for line in plain.splitlines()
    )


def test_e4_checks_a_bundle_against_the_target_it_resolves(build, tmp_path, monkeypatch) -> None:
    t = tuner(build, "E4", monkeypatch)
    problem = parse("gemm", GEMM)
    ctx = context(tuning_space="quick")
    bundle = tmp_path / "bundle"
    t.compile(problem, ctx, bundle)
    assert t.benchmark(problem, ctx, bundle).winner.valid  # the same target in both calls
    (call,) = [
        c for c in tuning_calls(build) if any("--benchmark-artifacts" in a for a in c["argv"])
    ]
    assert "--target-arch=gfx942:sramecc+:xnack-" in call["argv"]
    # A bundle compiled for the bare chip name, benchmarked for the full one: refused by the
    # tool, and final (the same on every retry).
    bare = tmp_path / "bare"
    t.compile(problem, context(tuning_space="quick", arch_full="gfx942"), bare)
    with pytest.raises(Unsupported, match=(
        r"refused the bundle: .*artifacts compiled for arch 'gfx942' but this host resolved "
        r"'gfx942:sramecc\+:xnack-'; pass --target-arch=gfx942"
    )):  # fmt: skip
        t.benchmark(problem, ctx, bare)
    # The stand-in, as rocmlirTriton: --target-* only with the cross-compilation phases.
    run = subprocess.run(
        [sys.executable, str(build / "bin" / "tuningRunner.py"), "--op", "gemm", "--config",
         GEMM, "--target-arch", "gfx942"],
        capture_output=True, text=True, check=False,
        env={**os.environ, "FAKE_TUNINGRUNNER_ERA": "E4"},
    )  # fmt: skip
    assert run.returncode == 2 and "only allowed with --compile-only" in run.stderr
