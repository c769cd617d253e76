"""Conformance tier, E4 part (issue 33): rocmlirTriton's REAL two-stage scripts over GPU-less fakes.

Opt-in, like the E3 part (test_conformance.py). Set MLIRTUNA_ROCMLIR_E4_SCRIPTS=DIR, DIR holding
rocmlirTriton's own `mlir/utils/performance/` files at the commits of E4_SET (they agree by
imports and call signatures; shared/reference/rocmlir-real-tool.md). Never commit them. The real
tool needs numpy, pandas, tqdm and scipy: MLIRTUNA_ROCMLIR_PYTHON names an interpreter that has
them if this one does not.

The scripts are copied into a git repository of the test's own (their commitId is `git rev-parse
HEAD` of their directory, which the benchmark phase checks a bundle against) and run with the
fakes in the stand-in build's below/ (mlirtuna.standin.BUILD): rocmlir-gen and
rocmlir-tuning-driver under `--mlir-build-dir`, rocm-smi under ROCM_PATH, the `hip` module and
`amd_arch_db` on PYTHONPATH.
Each case compares what mlirtuna recorded with the tool's own files of the same configs (the
fakes' times are deterministic): gemm one-stage, `--batch 4`, split one job per call, split with
`--batch 4` compile and benchmark, a fault in a batch, the export read by E4's own perfRunner,
and conv, attention and fusion where this set can run them.
"""

from __future__ import annotations

import json
import os
import shutil
import statistics
import subprocess
from pathlib import Path

import pytest
from support.conformance import (
    BELOW,
    FAKE_GPU,
    PYTHON,
    assert_same_row,
    open_session,
    recorded,
    tier_marks,
)
from support.standin import with_overlay

from mlirtuna import keys
from mlirtuna.defaults import ENV_ROCMLIR_PYTHON, ENV_ROCMLIR_SCRIPT_DIR, ENV_TOOL_ENV

SCRIPTS = os.environ.get("MLIRTUNA_ROCMLIR_E4_SCRIPTS", "")
TESTS = Path(__file__).parent
FUSION = TESTS / "data" / "fusion"
# file -> (ROCm/rocmlirTriton commit, characters): the set the reference page names
E4_SET = {
    "tuningRunner.py": ("520c8752832a9f2c9eb0712ff7b09e16c9525738", 122164),
    "perfRunner.py": ("eb003bed6c3f605bfb112f584e015a19fdc9b278", 114743),
    "perfCommonUtils.py": ("64b524102d5ca6477704037451210b989f9ffd42", 1216),
    "tuningArgumentUtils.py": ("398d69a381dfc7ecf4ea622d44d4e4aaebafa9a6", 5818),
    "reportUtils.py": ("046da074c5d409680c4ff7d8645b7f2e948f9598", 7468),
}
HOW = (
    "E4 conformance tier: set MLIRTUNA_ROCMLIR_E4_SCRIPTS=DIR to a directory holding "
    "rocmlirTriton's mlir/utils/performance/ " + ", ".join(f"{f}@{c[:8]}" for f, (c, _) in
    E4_SET.items()) + "; never commit them"
)  # fmt: skip

pytestmark = tier_marks(
    SCRIPTS, HOW, "rocmlirTriton's tuningRunner.py", ("numpy", "pandas", "tqdm", "scipy")
)

ARCH = "gfx942:sramecc+:xnack-"
G = [
    f"-t f16 -out_datatype f16 -transA false -transB false -g 1 -m {m} -n 512 -k 128"
    for m in (64, 128, 256, 512)
]
C1 = (
    "conv -F 1 -f NCHW -I NCHW -O NCHW -n 64 -c 64 -H 56 -W 56 -k 64 -y 3 -x 3 -p 1 -q 1 "
    "-u 1 -v 1 -l 1 -j 1 -m conv -g 1 -t 1"
)
ATTN = (
    "-t f16 -transQ false -transK false -transV false -transO false -causal false "
    "-return_lse false -split_kv 1 -g 1 -seq_len_q 256 -seq_len_k 256 -num_heads_q 1 "
    "-num_heads_kv 1 -head_dim_qk 64 -head_dim_v 64 -with-attn-scale false "
    "-with-attn-bias false -transBias false"
)
RESNET_CONV = FUSION / "resnet50" / "mixr-resnet-fusion-case-2.mlir"
# A one-stage session re-measures its top 3 with the tool's own --two-stage-topk (the others
# Discarded); a --benchmark-artifacts call measures once (E4 ignores top k there).
TOPK = ("--two-stage-topk", "3")


def e4(line: str) -> str:
    """A gemm line as E4's perfRunner canonicalizes it (mlirtuna's e4 key form)."""
    return keys.e4_vector("gemm", line)


@pytest.fixture(scope="module")
def scripts(tmp_path_factory) -> Path:
    """The downloaded set, checked and committed to a repository of its own."""
    for name, (_, chars) in E4_SET.items():
        text = (Path(SCRIPTS) / name).read_text(encoding="utf-8")
        assert len(text) == chars, f"{name}: {len(text)} characters, the set has {chars}"
    repo = tmp_path_factory.mktemp("e4scripts")
    for name in E4_SET:
        shutil.copy(Path(SCRIPTS) / name, repo / name)
    git = ["git", "-C", str(repo), "-c", "user.email=t@example.com", "-c", "user.name=t"]
    subprocess.run([*git, "init", "-q"], check=True)
    subprocess.run([*git, "add", "-A"], check=True)
    subprocess.run([*git, "commit", "-qm", "rocmlirTriton E4 set"], check=True)
    SCRIPT_REPO[:] = [repo]
    return repo


SCRIPT_REPO: list[Path] = []  # the module's scripts repository, once made


def commit_of(repo: Path) -> str:
    run = subprocess.run(["git", "-C", str(repo), "rev-parse", "HEAD"], capture_output=True,
                         text=True, check=True)  # fmt: skip
    return run.stdout.strip()


def tool_env(scripts: Path, workdir: Path, **fake: str) -> dict[str, str]:
    env = {k: v for k, v in os.environ.items() if not k.startswith("FAKE_")}
    env.update(fake)
    env["PATH"] = f"{BELOW / 'bin'}:{env.get('PATH', '')}"
    env["PYTHONPATH"] = f"{scripts}:{BELOW / 'python'}"
    env["ROCM_PATH"] = str(BELOW)  # $ROCM_PATH/bin/rocm-smi: the topology E4 reads
    env["WORKSPACE"] = str(workdir)  # find_mlir_build_dir's search, kept small
    return with_overlay(env)  # first on PYTHONPATH: the fakes' FAKE_ROCMLIR_* faults are its


def run_tool(scripts: Path, workdir: Path, *args: str, stdin: str | None = None, **fake: str):
    """The real tuningRunner.py in `workdir`, writing out.tsv there."""
    workdir.mkdir(parents=True, exist_ok=True)
    argv = [PYTHON, str(scripts / "tuningRunner.py"), *args, "-o", "out.tsv"]
    argv += ["--mlir-build-dir", str(BELOW)]
    return subprocess.run(
        argv, cwd=workdir, env=tool_env(scripts, workdir, **fake), input=stdin,
        capture_output=True, text=True, timeout=300, check=False,
    )  # fmt: skip


def read_debug(path: Path) -> list[dict[str, str]]:
    lines = path.read_text().splitlines()
    header = lines[0].split("\t")
    return [dict(zip(header, line.split("\t"), strict=True)) for line in lines[1:]]


def tool_rows(workdir: Path) -> list[list[str]]:
    return [line.split("\t") for line in (workdir / "out.tsv").read_text().splitlines()[1:]]


def tool_blocks(workdir: Path) -> dict[str, tuple[str, float, dict[str, tuple]]]:
    """{stored test vector: (winner, TFlops, {perf config: (TFlops, median ns)})} from the
    tool's .tsv and .debug; the median is MeasurementsMs' (milliseconds) times 1e6."""
    rows = tool_rows(workdir)
    debug = read_debug(workdir / "out.tsv.debug")
    size = len(debug) // len(rows)
    out = {}
    for i, row in enumerate(rows):
        cands = {}
        for r in debug[i * size : (i + 1) * size]:
            runs = json.loads(r["MeasurementsMs"]) if r["MeasurementsMs"] else None
            assert r["Status"] == ("Measured" if runs else r["Status"])
            median = statistics.median(runs) * 1e6 if runs else None
            cands[r["PerfConfig"]] = (float(r["TFlops"]) if r["TFlops"] else None, median)
        out[keys.stored_vector(row[3], "gemm")] = (row[4], float(row[5]), cands)
    return out


@pytest.fixture
def through(scripts, monkeypatch, tmp_path):
    """mlirtuna's rocmlir tuner pointed at the real scripts (MLIRTUNA_ROCMLIR_SCRIPT_DIR) over
    the fakes' build; the FAKE_* settings passed on to the tool."""
    env = tool_env(scripts, tmp_path)
    for name in ("PATH", "PYTHONPATH", "ROCM_PATH", "WORKSPACE"):
        monkeypatch.setenv(name, env[name])
    monkeypatch.setenv(ENV_ROCMLIR_SCRIPT_DIR, str(scripts))
    monkeypatch.setenv(ENV_ROCMLIR_PYTHON, PYTHON)
    monkeypatch.setenv(ENV_TOOL_ENV, "FAKE_*,ROCM_PATH,WORKSPACE")
    calls: list[list[str]] = []  # every tool call (process.run starts it through start)
    import mlirtuna.tuners.process as process

    real_start = process.start

    def start(argv, *args, **kwargs):
        calls.append(list(argv))
        return real_start(argv, *args, **kwargs)

    monkeypatch.setattr(process, "start", start)
    return calls


def session_of(db, tmp_path, op: str, lines: list[str], split: str | None = None) -> int:
    """A rocmlir session on the fakes' build whose commit is the scripts' (what the tool
    writes as commitId and checks a bundle against), its jobs loaded."""
    tag = f"{op}-{len(lines)}-{split or 'one'}"
    return open_session(db, tmp_path, op, lines, tag, mlir_v=commit_of(SCRIPT_REPO[0]), split=split)


def drain(db, sid: int, role: str = "gpu", batch: int = 1):
    from support.rocmlir import work

    return work(
        db, sid, BELOW, role, batch=batch, job_timeout_s=120, max_retries=0, gpu_identity=FAKE_GPU
    )


def assert_same(db_side: dict, tool_side: dict) -> None:
    """Winners, TFlops and every candidate equal row by row; a measured candidate's stored time
    is the median of its MeasurementsMs in ns (the unit read right)."""
    assert set(db_side) == set(tool_side)
    for key, want in tool_side.items():
        assert_same_row(db_side[key], want, median_rel=1e-5)


def jobs_of(db, sid) -> list[tuple[str, str, int, str]]:
    import sqlalchemy as sa

    from mlirtuna.db.models import Job

    with db.session() as s:
        rows = s.execute(sa.select(Job).where(Job.session_id == sid).order_by(Job.id)).scalars()
        return [(j.stage, j.state, j.retries, j.result or "") for j in rows]


def with_flag(calls: list[list[str]], prefix: str) -> list[list[str]]:
    return [c for c in calls if any(a.startswith(prefix) for a in c)]


# --- the real tool alone ---------------------------------------------------------------------


def test_e4_canonicalizes_gemm_with_trans_o_and_doubles_lines_without_it(scripts, tmp_path):
    one = run_tool(scripts, tmp_path / "one", "--op", "gemm", "--config", G[0], "-d")
    assert one.returncode == 0, one.stderr
    ((row),) = tool_rows(tmp_path / "one")
    assert row[3] == e4(G[0])  # always -transO, as GemmConfiguration.to_command_line prints
    debug = read_debug(tmp_path / "one" / "out.tsv.debug")
    assert "TransO" in debug[0] and "Stats" not in debug[0]
    assert {r["Status"] for r in debug} <= {"Measured", "N/A"}
    for r in debug:  # MeasurementsMs: every run in ms; the row's TFlops from their median
        if r["MeasurementsMs"]:
            runs = json.loads(r["MeasurementsMs"])
            ns = statistics.median(runs) * 1e6  # --use-median: the row's time
            assert float(r["TFlops"]) == pytest.approx(2 * 64 * 512 * 128 / (ns * 1e3), rel=1e-5)
            assert min(runs) <= statistics.median(runs) and 1e-3 < ns / 1e6 < 10  # ms, not ns
    # -c - lines without -transO: get_gemm_configurations adds both values: K lines, 2K rows
    doubled = run_tool(scripts, tmp_path / "twice", "--op", "gemm", "-c", "-", stdin=G[0] + "\n")
    assert doubled.returncode == 0, doubled.stderr
    assert sorted(r[3] for r in tool_rows(tmp_path / "twice")) == sorted(
        [e4(G[0]), e4(G[0]).replace("-transO false", "-transO true")]
    )


def test_e4_help_reads_as_e4_with_two_stage_and_no_lfbo(scripts, through):
    from mlirtuna.tuners.rocmlir import RocmlirTuner, build_key_form

    tuner = RocmlirTuner(str(BELOW))
    era = tuner.era
    assert era.name == "E4" and "two-stage" in era.capabilities and "lfbo" not in era.capabilities
    assert era.tuning_spaces == ("quick", "full", "exhaustive")
    assert build_key_form(scripts, era) == keys.E4  # its perfRunner: gemm keys with -transO


# --- through mlirtuna -------------------------------------------------------------------------


def test_gemm_one_stage_equals_the_tools_files(db, tmp_path, scripts, through):
    sid = session_of(db, tmp_path, "gemm", [G[0]])
    assert drain(db, sid).stats.completed == 1
    (call,) = with_flag(through, "--config=")
    assert f"--config={e4(G[0])}" in call  # spelled as E4 canonicalizes it
    ref = run_tool(scripts, tmp_path / "ref", "--op", "gemm", "--config", e4(G[0]), "-d", *TOPK)
    assert ref.returncode == 0, ref.stderr
    assert_same(recorded(db, sid), tool_blocks(tmp_path / "ref"))


def test_gemm_batch_of_four_keeps_every_result(db, tmp_path, scripts, through):
    sid = session_of(db, tmp_path, "gemm", G)
    worker = drain(db, sid, batch=4)
    assert worker.stats.completed == 4
    assert [s for _, s, _, _ in jobs_of(db, sid)] == ["completed"] * 4  # 0 in error
    assert len(with_flag(through, "--configs-file=-")) == 1  # one call, four lines, no twin
    ref = run_tool(scripts, tmp_path / "ref", "--op", "gemm", "-c", "-", "-d", *TOPK,
                   stdin="".join(e4(g) + "\n" for g in G))  # fmt: skip
    assert ref.returncode == 0, ref.stderr
    assert len(tool_rows(tmp_path / "ref")) == 4
    assert_same(recorded(db, sid), tool_blocks(tmp_path / "ref"))


def test_a_fault_in_a_batch_fails_only_its_job(db, tmp_path, scripts, through, monkeypatch):
    monkeypatch.setenv("FAKE_ROCMLIR_FAIL_COMPILE", "-m 128 ")
    sid = session_of(db, tmp_path, "gemm", G)
    drain(db, sid, batch=4)
    got = jobs_of(db, sid)
    assert [s for _, s, _, _ in got] == ["completed", "error", "completed", "completed"]
    assert "failed" in got[1][3] and all(r == 0 for _, s, r, _ in got if s == "completed")
    ref = run_tool(scripts, tmp_path / "ref", "--op", "gemm", "-c", "-", "-d", *TOPK,
                   stdin="".join(e4(g) + "\n" for g in G[:1] + G[2:]))  # fmt: skip
    assert ref.returncode == 0, ref.stderr
    assert_same(recorded(db, sid), tool_blocks(tmp_path / "ref"))


@pytest.mark.parametrize("batch", [1, 4])
def test_split_compile_and_benchmark(db, tmp_path, scripts, through, batch):
    sid = session_of(db, tmp_path, "gemm", G, split="compile,benchmark")
    assert drain(db, sid, "compile", batch=batch).stats.completed == 4
    compiles = with_flag(through, "--compile-only=")
    assert len(compiles) == (4 if batch == 1 else 1)  # a batch: ONE call, split per problem
    assert drain(db, sid, "gpu", batch=batch).stats.completed == 4
    benchmarks = with_flag(through, "--benchmark-artifacts=")
    assert len(benchmarks) == (4 if batch == 1 else 1)
    assert {s for _, s, _, _ in jobs_of(db, sid)} == {"completed"}
    ref = run_tool(scripts, tmp_path / "ref", "--op", "gemm", "-c", "-", "-d",
                   stdin="".join(e4(g) + "\n" for g in G))  # fmt: skip
    assert ref.returncode == 0, ref.stderr
    assert_same(recorded(db, sid), tool_blocks(tmp_path / "ref"))


def test_export_is_found_by_e4s_own_perfrunner(db, db_url, tmp_path, scripts, through):
    from support.clitools import cli

    sid = session_of(db, tmp_path, "gemm", G)
    drain(db, sid, batch=4)
    found = {}
    for form in ("e4", "plain"):
        out = tmp_path / f"export-{form}.tsv"
        run = cli(db_url, "export", "--session", str(sid), "--key-format", form, "-o", str(out))
        assert run.code == 0, run.stderr
        probe = (
            "import json, sys, perfRunner\n"
            "db = perfRunner.read_tuning_db(sys.argv[1])\n"
            "hits = {}\n"
            "for line in sys.argv[2:]:\n"
            f"    c = perfRunner.GemmConfiguration.from_command_line(line.split(), {ARCH!r}, "
            "304, 8)\n"
            f"    hits[line] = perfRunner.lookup_tuning_db(db, {ARCH!r}, c, c.to_command_line())\n"
            "print(json.dumps(hits))\n"
        )
        got = subprocess.run(
            [PYTHON, "-c", probe, str(out), *G], env=tool_env(scripts, tmp_path),
            capture_output=True, text=True, check=True,
        )  # fmt: skip
        found[form] = json.loads(got.stdout)
    winners = {k: v[0] for k, v in recorded(db, sid).items()}
    assert found["e4"] == winners  # every exported gemm row found, with its winner
    assert set(found["plain"].values()) == {None}  # the E3 spelling: none (issue 33)


def test_conv_one_stage_equals_the_tools_files(db, tmp_path, scripts, through):
    sid = session_of(db, tmp_path, "conv", [C1])
    assert drain(db, sid).stats.completed == 1
    ref = run_tool(scripts, tmp_path / "ref", "--op", "conv", "--config", C1, "-d", *TOPK)
    assert ref.returncode == 0, ref.stderr
    assert_same(recorded(db, sid), tool_blocks(tmp_path / "ref"))


def test_attention_cannot_run_on_this_set(scripts, tmp_path):
    """reportUtils 046da074's ATTN_TEST_PARAMETERS has SlidingWindowSize, which perfRunner
    eb003bed's AttentionConfiguration.table_entry does not fill: its length assertion fails on
    the first candidate. A mismatch inside the downloaded set, left as it is (never patched)."""
    run = run_tool(scripts, tmp_path / "attn", "--op", "attention", "--config", ATTN, "-d")
    assert run.returncode != 0 and "AssertionError" in run.stderr
    assert not (tmp_path / "attn" / "out.tsv").exists() or len(tool_rows(tmp_path / "attn")) == 0


def test_fusion_through_test_dir(db, tmp_path, scripts, through):
    sid = session_of(db, tmp_path, "fusion", [str(RESNET_CONV)])
    assert drain(db, sid).stats.completed == 1
    modules = tmp_path / "ref" / "modules"
    modules.mkdir(parents=True)
    shutil.copy(RESNET_CONV, modules / RESNET_CONV.name)
    ref = run_tool(scripts, tmp_path / "ref", "--op", "fusion", "--test-dir", "modules", "-d",
                   *TOPK)  # fmt: skip
    assert ref.returncode == 0, ref.stderr
    ((winner, tflops, cands),) = tool_blocks(tmp_path / "ref").values()
    (got,) = recorded(db, sid).values()
    assert got[:2] == (winner, pytest.approx(tflops, rel=1e-9)) and set(got[2]) == set(cands)


def test_chosen_configs_through_e4s_own_perfrunner(scripts, through):
    """Issue 45 §2 over the real E4 set: the problem's rocmlir-gen line comes from E4's own
    perfRunner (chosen.LINE_PROBE), the space from `rocmlir-gen --emit-tuning-space`, and each
    chosen config is one `rocmlir-tuning-driver --benchmark-config=PC` call, read as ns."""
    import dataclasses

    from mlirtuna.problems import parse
    from mlirtuna.tuners.base import TuneContext
    from mlirtuna.tuners.rocmlir import RocmlirTuner

    tuner = RocmlirTuner(str(BELOW))
    problem = parse("gemm", G[0])
    ctx = TuneContext(arch="gfx942", arch_full=ARCH, num_cu=304, num_chiplets=8,
                      tuning_space="full", gpu_id=0, timeout_s=120)  # fmt: skip
    space = tuner.search_space(problem, ctx)
    assert len(space) == 8 and len(set(space)) == 8  # the fakes' full space
    picked = tuple(space[1:4])
    out = tuner.tune(problem, dataclasses.replace(ctx, perf_configs=picked))
    assert [c.perf_config for c in out.candidates] == list(picked)
    drivers = [c for c in through if c[0].endswith("rocmlir-tuning-driver")]
    assert [c[1] for c in drivers] == [f"--benchmark-config={pc}" for pc in picked]
    assert all("--use-median" in c and c[-1] == "-" for c in drivers)
    for cand in out.candidates:
        if cand.valid:  # the fakes' kernels take 20 to 100 µs: ns, not ms
            assert cand.spread is not None and 1e4 < (cand.kernel_time_ns or 0) < 1e6
