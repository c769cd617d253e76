"""The `.debug` file as rocMLIR's real tuningRunner.py (3fc5be9e) writes it, read by its header:
files from tests/data/rocmlir-real (written by the real tool over GPU-less fakes)."""

from __future__ import annotations

import json
import shutil
from pathlib import Path

import pytest

from mlirtuna import problems, stats
from mlirtuna.errors import TunerError
from mlirtuna.tuners.rocmlir import outcome, read_debug_file
from mlirtuna.tuners.rocmlir.batch import BatchTail
from mlirtuna.tuners.rocmlir.debugfile import IQR_PER_STDDEV, parse_stats

REAL = Path(__file__).parent / "data" / "rocmlir-real"


def stdin_lines(case: str) -> list[str]:
    """The configs a case gave the tool on stdin (command.txt)."""
    text = (REAL / case / "command.txt").read_text().splitlines()
    start = text.index("stdin:") + 1
    return [line for line in text[start:] if line and not line.startswith("exit status")]


def blocks(path: Path) -> list[list[tuple[str, float | None]]]:
    """The file's runs of rows with one problem, as (perf config, TFlops)."""
    out: list[list[tuple[str, float | None]]] = []
    last = None
    for row in read_debug_file(path):
        if row.problem != last:
            out.append([])
            last = row.problem
        out[-1].append((row.perf_config, row.tflops))
    return out


def test_the_real_gemm_debug_file_is_one_block_with_its_stats() -> None:
    rows = read_debug_file(REAL / "gemm" / "out.tsv.debug")
    assert len(rows) == 8 and len({r.problem for r in rows}) == 1
    first = rows[0]
    assert first.perf_config == "v2:16,16,4,16,16,8,1,1,1"
    assert first.tflops == pytest.approx(0.3339613432330752)
    # {'total_cpu_time': 1.00474, 'iterations': 10}: the legacy mode's one timer (ms) over 10
    # runs of a sub-ms kernel; its mean is the time column (100474 ns), and nothing else is known.
    assert first.spread is not None
    assert first.spread.median == pytest.approx(100474.0)
    assert (first.spread.min, first.spread.iqr, first.spread.samples) == (None, None, None)
    assert dict(first.problem)["numChiplets"] == "8" and "Stats" not in dict(first.problem)


def test_real_na_candidates_have_no_tflops_and_no_stats() -> None:
    rows = read_debug_file(REAL / "gemm-batch" / "out.tsv.debug")
    na = [r for r in rows if r.tflops is None]
    assert len(rows) == 24 and len(na) == 2 and all(r.spread is None for r in na)
    assert all(r.spread is not None for r in rows if r.tflops is not None)


def test_the_quick_tune_data_layout_has_no_stats() -> None:
    rows = read_debug_file(REAL / "gemm-quick-tune-data" / "out.tsv.debug")
    assert rows and all(r.spread is None for r in rows) and len({r.problem for r in rows}) == 1


@pytest.mark.parametrize(
    "case", ["gemm", "conv", "attention", "gemm_gemm", "conv_gemm", "rdna-gemm"]
)
def test_every_real_op_is_one_block_whose_winner_is_the_rows(case: str) -> None:
    path = REAL / case / "out.tsv.debug"
    (block,) = blocks(path)
    winner_row = (REAL / case / "out.tsv").read_text().splitlines()[1].split("\t")
    best = max((t, pc) for pc, t in block if t is not None)
    assert best == (float(winner_row[5]), winner_row[4])


def test_stats_read_as_python_repr_or_json() -> None:
    repr_text = "{'min': 1.0, 'median': 2.0, 'max': 3.0, 'stddev': 0.5, 'cv': 25.0}"
    json_text = '{"min": 1.0, "median": 2.0, "max": 3.0, "stddev": 0.5, "cv": 25.0, "count": 10}'
    a, b = parse_stats(repr_text), parse_stats(json_text)
    assert a is not None and b is not None
    assert (a.median, a.min, a.samples) == (2e6, 1e6, None)  # ms in the cell, ns read
    assert (b.median, b.samples) == (2e6, 10) and b.noise > 0
    for bad in ("", "nan", "[1, 2]", "{'median': 'x'}", "{'min': 1"):
        assert parse_stats(bad) is None
    for bad in (
        "{'total_cpu_time': 1.0}",
        "{'total_cpu_time': 0.0, 'iterations': 10}",
        "{'total_cpu_time': 1.0, 'iterations': 0}",
        "{'total_cpu_time': 'x', 'iterations': 1}",
    ):
        assert parse_stats(bad) is None


# --- the driver's units (issue 42 §2): each shape as rocmlir-tuning-driver prints it -------------
# rocmlir-tuning-driver.cpp (rocMLIR 03581f0a, benchmarkKernels): every run is a hipEventElapsedTime
# or CPU timer in ms, printed with llvm::raw_ostream's %e; only the returned time is ns (msToNs).
# tuningRunner.py (3fc5be9e, find_best_perfconfig) json.loads the middle field into the entry's
# Stats, which pandas writes as the dict's repr.


def tuning_runner_cell(driver_line: str) -> str:
    """The Stats cell tuningRunner (3fc5be9e) writes for one driver line."""
    parts = driver_line.split("\t")
    return repr(json.loads(parts[1])) if len(parts) == 3 else ""


def test_the_drivers_full_stats_are_milliseconds() -> None:
    line = (
        'v2:16,16,4,16,16,8,1,1,1\t{"min":9.850870e-02,"median":1.004740e-01,'
        '"max":1.044045e-01,"stddev":9.826000e-04,"cv":9.779644e-01}\t1.004740e+05'
    )
    spread = parse_stats(tuning_runner_cell(line))
    assert spread is not None
    time_ns = float(line.split("\t")[-1])
    assert spread.median == pytest.approx(time_ns, rel=1e-6)  # --use-median: the time itself
    assert spread.min == pytest.approx(98508.7, rel=1e-6)
    assert spread.iqr == pytest.approx(IQR_PER_STDDEV * 982.6, rel=1e-6)
    assert spread.samples is None  # the driver prints no count: the noise is unknown


def test_the_drivers_one_timer_stats_are_a_mean_without_a_spread() -> None:
    # The legacy mode (--num-iterations=10 --warmup-iterations=1) and a 50 µs kernel:
    # max(10, ceil(1 ms / 0.05 ms)) = 20 iterations under one CPU timer.
    line = 'v2:32,16,4,16,16,8,1,1,1\t{"total_cpu_time":1.000000e+00,"iterations":20}\t5.000000e+04'
    cell = tuning_runner_cell(line)
    assert cell == "{'total_cpu_time': 1.0, 'iterations': 20}"
    spread = parse_stats(cell)
    assert spread is not None and spread.median == pytest.approx(50_000.0)
    # One timer over all runs: no fastest run, no spread (unknown, not 0).
    assert (spread.min, spread.iqr, spread.samples) == (None, None, None)
    assert stats.noise(spread.iqr, spread.samples) == 0.0 and spread.samples is None


def test_stats_without_a_stddev_have_an_unknown_spread() -> None:
    spread = parse_stats("{'min': 0.09, 'median': 0.1}")
    assert spread is not None and spread.iqr is None  # unknown, not a spread of 0


def test_the_drivers_measurements_are_milliseconds(tmp_path: Path) -> None:
    # rocmlirTriton (E4): --show-all-measurements' list, stored as MeasurementsMs.
    path = tmp_path / "out.tsv.debug"
    path.write_text(
        "DataType\tChip\tnumCU\tnumChiplets\tM\tPerfConfig\tTFlops\tMeasurementsMs\tStatus\n"
        "f16\tgfx942\t304\t8\t64\ta\t2.0\t[0.1, 0.102, 0.098]\tMeasured\n"
    )
    (row,) = read_debug_file(path)
    assert row.spread is not None and row.spread.median == pytest.approx(100_000.0)
    assert row.spread.min == pytest.approx(98_000.0) and row.spread.samples == 3


def test_a_one_timer_candidate_gets_no_spread_columns() -> None:
    # The stored candidate: kernel time from the row, no time_min / time_iqr invented.
    rows = read_debug_file(REAL / "gemm" / "out.tsv.debug")
    flops = 2 * 256 * 512 * 128
    (cand, *_) = outcome.debug_candidates(rows[:1], flops)
    assert cand.spread is not None and cand.kernel_time_ns is not None
    assert cand.spread.median == pytest.approx(cand.kernel_time_ns, rel=1e-5)
    assert cand.spread.min is None and cand.spread.iqr is None


def test_an_unknown_column_is_ignored_and_status_understood(tmp_path: Path) -> None:
    path = tmp_path / "out.tsv.debug"
    path.write_text(
        "DataType\tChip\tnumCU\tnumChiplets\tM\tPerfConfig\tTFlops\tStats\tStatus\tNewThing\n"
        "f16\tgfx942\t304\t8\t64\ta\t2.0\t{'min': 9.0, 'median': 10.0}\tok\tx1\n"
        "f16\tgfx942\t304\t8\t64\tb\t\t\tDiscarded\tx2\n"
        "f16\tgfx942\t304\t8\t64\tc\t\t\tN/A\tx3\n"
    )
    rows = read_debug_file(path)
    assert len({r.problem for r in rows}) == 1  # NewThing differs per row, yet one block
    assert [r.status for r in rows] == ["ok", "Discarded", "N/A"]
    cands = {c.perf_config: c for c in outcome.debug_candidates(rows, 1e12)}
    assert cands["a"].valid and cands["a"].spread is not None
    assert cands["b"].error == outcome.DISCARDED
    assert cands["c"].error is not None and "N/A" in cands["c"].error


def test_a_header_changing_mid_file_is_an_error(tmp_path: Path) -> None:
    real = (REAL / "gemm" / "out.tsv.debug").read_text()
    conv = (REAL / "conv" / "out.tsv.debug").read_text()
    path = tmp_path / "out.tsv.debug"
    path.write_text(real + conv)  # another op's schema appended
    with pytest.raises(TunerError, match=r"out.tsv.debug:10: the .debug header changed"):
        read_debug_file(path)
    path.write_text(real + real)  # the same header again is not a change
    assert len(read_debug_file(path)) == 16


def reorder_blocks(src: Path, dest: Path, order: list[int]) -> None:
    """Copy a .debug file with its blocks in another order (completion order may differ)."""
    lines = src.read_text().splitlines(keepends=True)
    header, rows = lines[0], lines[1:]
    runs: list[list[str]] = []
    for line in rows:
        key = line.split("\t")[:16]
        if not runs or runs[-1][0].split("\t")[:16] != key:
            runs.append([])
        runs[-1].append(line)
    dest.write_text(header + "".join(line for i in order for line in runs[i]))


def batch_candidates(
    case: str, tmp_path: Path, op: str, lines: list[str], order: list[int] | None = None
) -> dict[str, list[tuple[str, float | None]]]:
    """Each config's (perf config, TFlops) as a batch reads the case's real files."""
    work = tmp_path / case
    work.mkdir(parents=True)
    shutil.copy(REAL / case / "out.tsv", work / "out.tsv")
    if order is None:
        shutil.copy(REAL / case / "out.tsv.debug", work / "out.tsv.debug")
    else:
        reorder_blocks(REAL / case / "out.tsv.debug", work / "out.tsv.debug", order)
    batch = [problems.parse(op, line) for line in lines]
    tail = BatchTail(work / "out.tsv", batch)
    got = {}
    for index, _row, block, _discarded in tail.poll(exited=True):
        assert block is not None
        got[lines[index]] = [(r.perf_config, r.tflops) for r in block]
    assert tail.missing() == []
    return got


def test_each_job_of_a_real_gemm_batch_gets_exactly_its_own_block(tmp_path: Path) -> None:
    lines = stdin_lines("gemm-batch")
    expected = dict(zip(lines, blocks(REAL / "gemm-batch" / "out.tsv.debug"), strict=True))
    assert all(len(b) == 8 for b in expected.values())
    # In the batch's order, in another order of problems, and with the blocks reordered.
    assert batch_candidates("gemm-batch", tmp_path / "a", "gemm", lines) == expected
    assert batch_candidates("gemm-batch", tmp_path / "b", "gemm", lines[::-1]) == expected
    reordered = batch_candidates("gemm-batch", tmp_path / "c", "gemm", lines, order=[2, 0, 1])
    assert reordered == expected


def test_each_module_of_a_real_fusion_batch_gets_its_own_conv_block(tmp_path: Path) -> None:
    # The tool tuned the modules' conv keys (fusion_config_file) as plain conv configs.
    case = "fusion-test-dir-resnet50"
    lines = (REAL / case / "fusion_config_file").read_text().splitlines()
    real = blocks(REAL / case / "out.tsv.debug")
    assert len(lines) == len(real) == 9
    got = batch_candidates(case, tmp_path, "conv", lines)
    assert got == dict(zip(lines, real, strict=True))
    # every job's winner is in its own block
    rows = (REAL / case / "out.tsv").read_text().splitlines()[1:]
    for line, row in zip(lines, rows, strict=True):
        assert row.split("\t")[4] in {pc for pc, _ in got[line]}


def test_a_row_waiting_for_its_driver_lines_keeps_its_block(tmp_path: Path) -> None:
    # While a row waits for its driver lines on stderr (E4), its block stays its own: the next
    # poll hands it out whole (found against the real tool: the first rows got no candidates).
    shutil.copy(REAL / "gemm-batch" / "out.tsv", tmp_path / "out.tsv")
    shutil.copy(REAL / "gemm-batch" / "out.tsv.debug", tmp_path / "out.tsv.debug")
    lines = stdin_lines("gemm-batch")
    tail = BatchTail(tmp_path / "out.tsv", [problems.parse("gemm", x) for x in lines], driver=[])
    assert tail.poll(exited=False) == []  # the first row waits for its driver lines
    ready = tail.poll(exited=True)
    assert [(i, block and len(block)) for i, _row, block, _ in ready] == [(0, 8), (1, 8), (2, 8)]
