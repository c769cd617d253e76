"""The benchmark scripts of bench/ at smoke size, so that they cannot rot between real runs.

Each runs as a subprocess exactly as documented in bench/README.md, on SQLite and on every server
that MLIRTUNA_TEST_POSTGRES / MLIRTUNA_TEST_MYSQL name. Numbers are not checked, only that each
script finishes and writes its Markdown tables with a row per backend.
"""

from __future__ import annotations

import os
import re
import subprocess
import sys
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parent.parent
BENCH = ROOT / "bench"
# Each runs a benchmark script as a process of its own.
pytestmark = pytest.mark.slow

LABELS = {"sqlite": "SQLite", "postgresql": "PostgreSQL", "mysql": "MariaDB/MySQL"}


def backends() -> list[str]:
    found = ["sqlite"]
    for backend, var in (
        ("postgresql", "MLIRTUNA_TEST_POSTGRES"),
        ("mysql", "MLIRTUNA_TEST_MYSQL"),
    ):
        if os.environ.get(var):
            found.append(backend)
    return found


def run_script(name: str, tmp_path: Path, *args: str) -> str:
    out = tmp_path / f"{name}.md"
    env = dict(os.environ)
    env["PYTHONPATH"] = str(ROOT / "src") + os.pathsep + env.get("PYTHONPATH", "")
    proc = subprocess.run(
        [sys.executable, str(BENCH / f"{name}.py"), "--smoke", "--out", str(out), *args],
        env=env,
        capture_output=True,
        text=True,
        timeout=300,
        check=False,
    )
    assert proc.returncode == 0, proc.stderr[-3000:]
    text = out.read_text()
    assert text == proc.stdout, "--out must hold exactly what was printed"
    assert "Machine: " in text and "|---|" in text
    return text


@pytest.mark.parametrize("name", ["bench_overhead", "bench_scaling"])
def test_queue_benchmarks_run(name: str, tmp_path: Path) -> None:
    chosen = backends()
    text = run_script(name, tmp_path, "--backends", ",".join(chosen))
    for backend in chosen:
        assert f"| {LABELS[backend]} |" in text


def test_server_capacity_runs(tmp_path: Path) -> None:
    servers = [b for b in backends() if b != "sqlite"]
    if not servers:
        pytest.skip("no database server named (MLIRTUNA_TEST_POSTGRES / MLIRTUNA_TEST_MYSQL)")
    text = run_script("bench_server_capacity", tmp_path, "--backends", ",".join(servers))
    for backend in servers:
        assert f"| {LABELS[backend]} | 5 min |" in text


def test_tuning_spread_runs(tmp_path: Path) -> None:
    text = run_script("bench_tuning_spread", tmp_path)
    for op in ("gemm", "conv", "attention"):
        assert f"| {op} |" in text


def test_bulk_benchmark_runs() -> None:
    chosen = backends()
    env = dict(os.environ)
    env["PYTHONPATH"] = str(ROOT / "src") + os.pathsep + env.get("PYTHONPATH", "")
    proc = subprocess.run(
        [sys.executable, str(BENCH / "bench_bulk.py"), "--size", "300", "--repeat", "1",
         "--backends", ",".join(chosen)],
        env=env, capture_output=True, text=True, timeout=300, check=False,
    )  # fmt: skip
    assert proc.returncode == 0, proc.stderr[-3000:]
    for step in ("import", "import-tsv", "export", "compare", "jobs list"):
        assert f"| {step} |" in proc.stdout


def test_quick_tuning_bench_runs(tmp_path: Path) -> None:
    text = run_script("bench_quick_tuning", tmp_path)
    for op in ("gemm", "conv"):
        for space in ("exhaustive", "list:bench-0.93", "list:bench-0.97", "quick"):
            assert f"| {op} | {space} |" in text
    assert "18.07" in text  # rocMLIR's published A/B beside ours


def test_startup_benchmark_runs(tmp_path: Path) -> None:
    text = run_script("bench_startup", tmp_path)
    assert "| mlirtuna --help |" in text and "| mlirtuna status |" in text


def test_bench_dashboard_smoke(tmp_path):
    text = run_script("bench_dashboard", tmp_path, "--backends", ",".join(backends()))
    for backend in backends():
        assert f"### {LABELS[backend]}: " in text
    assert "`/api/sessions?offset=500&limit=50`" in text and "**page total**" in text


def test_bench_big_tuning_smoke(tmp_path):
    text = run_script("bench_big_tuning", tmp_path, "--backends", "sqlite", "--repeat", "1")
    assert "| sqlite | /api/problems/P/candidates |" in text and "server memory" in text


def test_repeatability_runs(tmp_path: Path) -> None:
    text = run_script("bench_repeatability", tmp_path, "--conditions", "budget-quiet,fixed-busy")
    for condition in ("budget-quiet", "fixed-busy"):
        assert f"| {condition} |" in text


def test_gpu_time_bench_runs(tmp_path: Path) -> None:
    text = run_script("bench_gpu_time", tmp_path)
    assert "| one-stage | 1 | - | 4/4 |" in text  # every job done, each slot measured
    assert "| one-stage batched K=2 | 2 | - | 4/4 |" in text
    assert "| two-stage 1 compile | 2 | 1 | 8/8 |" in text  # a compile and a benchmark job each
    assert "compile workers to feed the GPUs" in text


def test_gpu_time_goal_runs(tmp_path: Path) -> None:
    text = run_script("bench_gpu_time", tmp_path, "--goal")
    assert "benchmark stream | 2 |" in text and "| 8/8 |" in text  # every job done
    assert "Per-slot timeline" in text
    last = text.rstrip("\n").splitlines()[-1]
    assert re.fullmatch(r"goal: mean GPU slot busy \d+\.\d %", last), last


# -- bench_adaptive.py: synthetic Kernel Tuner caches written here --------------------------------


def write_kt_caches(root: Path, with_times: bool = True) -> None:
    """KERNEL/GPU.json.gz for 3 GPUs of one toy kernel: 4 x 4 x 2 configs, 5 repeats each; the
    GPUs differ in where the optimum is. Without times: only the configs (--oracle mode)."""
    import gzip
    import json

    for n, gpu in enumerate(("G1", "G2", "G3")):
        cache = {}
        for bx in range(4):
            for ty in range(4):
                for sw in range(2):
                    ms = (
                        1.0
                        + 0.3 * (bx - n) ** 2
                        + 0.2 * (ty - 2) ** 2
                        + (0.5 if sw != n % 2 else 0)
                    )
                    entry: dict[str, object] = {"bx": bx, "ty": ty, "sw": sw}
                    if with_times:
                        entry["time"] = ms
                        entry["times"] = [ms * (1 + 0.01 * k) for k in range(5)]
                    cache[f"{bx},{ty},{sw}"] = entry
        cache["3,3,1"] = {"bx": 3, "ty": 3, "sw": 1, "time": "RuntimeFailedConfig"}
        for entry in cache.values():  # what Kernel Tuner's simulation mode reads too
            entry.update(compile_time=1.0, verification_time=0, benchmark_time=1.0)
        data = {
            "device_name": gpu,
            "kernel_name": "toy",
            "problem_size": [64],
            "tune_params_keys": ["bx", "ty", "sw"],
            "tune_params": {"bx": [0, 1, 2, 3], "ty": [0, 1, 2, 3], "sw": [0, 1]},
            "objective": "time",
            "cache": cache,
        }
        (root / "toy").mkdir(parents=True, exist_ok=True)
        with gzip.open(root / "toy" / f"{gpu}.json.gz", "wt") as f:
            json.dump(data, f)


def test_adaptive_bench_runs(tmp_path: Path) -> None:
    write_kt_caches(tmp_path / "caches")
    trace = tmp_path / "trace.jsonl"
    text = run_script(
        "bench_adaptive", tmp_path, "--train", str(tmp_path / "caches"), "--trace-out", str(trace)
    )
    for gpu in ("G1", "G2", "G3"):
        assert f"| toy | {gpu} | mlirtuna |" in text and f"| toy | {gpu} | random |" in text
    last = text.rstrip("\n").splitlines()[-1]
    assert re.fullmatch(
        r"goal: worst median measurements to 0\.99 (\d+|>12), geomean after 20 [01]\.\d{3}", last
    ), last
    rows = trace.read_text().splitlines()
    assert rows and all('"run": "mlirtuna:' in r or '"run": "random:' in r for r in rows)


def test_adaptive_bench_runs_kernel_tuner_as_a_peer(tmp_path: Path) -> None:
    pytest.importorskip("kernel_tuner")  # the bench extra
    write_kt_caches(tmp_path / "caches")
    text = run_script(
        "bench_adaptive",
        tmp_path,
        *("--train", str(tmp_path / "caches"), "--strategies", "mlirtuna,kt:random_sample"),
    )
    assert "| toy | G1 | kt:random_sample |" in text and "simulation mode" in text


def test_adaptive_bench_asks_the_oracle(tmp_path: Path) -> None:
    """Test files without times: every time comes from the oracle, started once."""
    write_kt_caches(tmp_path / "train")
    write_kt_caches(tmp_path / "test", with_times=False)
    oracle = tmp_path / "oracle.py"
    log = tmp_path / "oracle.log"
    oracle.write_text(
        "import sys\n"
        f"log = open({str(log)!r}, 'a')\n"
        "for line in sys.stdin:\n"
        "    run, kernel, gpu, key = line.rstrip('\\n').split('\\t')\n"
        "    log.write(line)\n"
        "    bx, ty, sw = map(int, key.split(','))\n"
        "    ms = 'fail' if key == '0,0,0' else 1 + (bx - 1) ** 2 + (ty - 1) ** 2 + sw\n"
        "    print(ms, flush=True)\n"
    )
    text = run_script(
        "bench_adaptive",
        tmp_path,
        *("--train", str(tmp_path / "train"), "--test", str(tmp_path / "test")),
        *("--oracle", f"{sys.executable} {oracle}"),
    )
    assert "answers from the oracle" in text and "| toy | G2 | mlirtuna |" in text
    lines = log.read_text().splitlines()
    assert lines and all(
        re.fullmatch(r"(mlirtuna|random):\d\ttoy\tG\d\t\d,\d,\d", x) for x in lines
    )


def test_adaptive_bench_rejects_a_bad_oracle_answer(tmp_path: Path) -> None:
    write_kt_caches(tmp_path / "caches")
    trace = tmp_path / "trace.jsonl"
    proc = subprocess.run(
        [
            sys.executable,
            str(BENCH / "bench_adaptive.py"),
            *("--smoke", "--train", str(tmp_path / "caches"), "--trace-out", str(trace)),
            *(
                "--oracle",
                f"{sys.executable} -c \"import sys; [print('fast') for _ in sys.stdin]\"",
            ),
        ],
        env={**os.environ, "PYTHONPATH": str(ROOT / "src")},
        capture_output=True,
        text=True,
        timeout=120,
        check=False,
    )
    assert proc.returncode == 2
    assert proc.stderr.strip().splitlines()[-1].startswith("error: oracle answered 'fast'")
    assert not trace.exists(), "nothing half-written"


def test_adaptive_farm_bench_runs_searched_sessions_against_the_exhaustive_one(
    tmp_path: Path,
) -> None:
    """Two gemms, budget 3: each searched session measures exactly its budget, scores a
    fraction of the exhaustive best in (0, 1], and sees only the other problem's history."""
    out = tmp_path / "farm.md"
    proc = subprocess.run(
        [
            sys.executable,
            str(BENCH / "bench_adaptive_farm.py"),
            *("--smoke", "--ops", "gemm", "--budgets", "3", "--out", str(out)),
        ],
        env={**os.environ, "PYTHONPATH": str(ROOT / "src")},
        capture_output=True,
        text=True,
        timeout=300,
        check=False,
    )
    assert proc.returncode == 0, proc.stderr[-3000:]
    assert out.read_text() == proc.stdout
    for strategy in ("adaptive", "random"):
        assert f"  {strategy} --budget 3, history loo (1 units)" in proc.stderr
        assert f"  {strategy} --budget 3, history none (0 units)" in proc.stderr
    rows = re.findall(
        r"^\| all \| (loo|none) \| (\w+) \| 3 \| 2 \| ([\d.]+) \([\d.]+\) \| \d/2 \| ([\d.]+) \|",
        proc.stdout,
        re.M,
    )
    assert len(rows) == 4, proc.stdout
    for _history, _strategy, fraction, measured in rows:
        assert 0 < float(fraction) <= 1
        assert float(measured) == 3
