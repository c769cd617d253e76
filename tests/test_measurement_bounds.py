"""A kernel time read from a `.debug` file is bounded like TFlops are (issue 43 §4): one run of a
kernel takes 1 ns to a day (stats.MIN_KERNEL_NS, stats.MAX_KERNEL_NS). A Stats or MeasurementsMs
cell with a time outside is the tool's fault: its candidate keeps the tool's TFlops, its
statistics are dropped, and the outcome's notes say where (FILE:LINE) and why; nothing crashes."""

from __future__ import annotations

import re
from pathlib import Path

import pytest

from mlirtuna import stats
from mlirtuna.tuners.rocmlir import outcome, read_debug_file
from mlirtuna.tuners.rocmlir.debugfile import ImplausibleTime, parse_stats

E4_HEADER = "DataType\tChip\tnumCU\tnumChiplets\tM\tPerfConfig\tTFlops\tMeasurementsMs\tStatus\n"
FLOPS = 2e11  # 2.0 TFlops is 100 ms


def e4_file(tmp_path: Path, *measurements: str) -> Path:
    path = tmp_path / "out.tsv.debug"
    rows = "".join(
        f"f16\tgfx942\t304\t8\t64\tpc{i}\t2.0\t{cell}\tMeasured\n"
        for i, cell in enumerate(measurements)
    )
    path.write_text(E4_HEADER + rows)
    return path


@pytest.mark.parametrize(
    ("cell", "reason"),
    [
        ("[1e-300]", "MeasurementsMs run 1e-300 ms is outside what one kernel run can take"),
        ("[1e303, 1e303]", "MeasurementsMs run 1e+303 ms is outside what one kernel run can take"),
        ("[100.0, 1e-7]", "MeasurementsMs run 1e-07 ms is outside"),  # 0.1 ns: under 1 ns
        ("[100.0, 86400001]", "MeasurementsMs run 8.64e+07 ms is outside"),  # past a day
    ],
)
def test_an_implausible_run_drops_the_rows_statistics_not_its_candidate(
    tmp_path: Path, cell: str, reason: str
) -> None:
    path = e4_file(tmp_path, "[100.0, 101.0, 99.0]", cell)
    good, bad = read_debug_file(path)
    assert good.spread is not None and good.spread.min == pytest.approx(99e6) and not good.dropped
    assert bad.spread is None and bad.tflops == 2.0
    assert bad.dropped.startswith(f"{path}:3: {reason}")
    assert "its statistics are dropped" in bad.dropped
    cands = {c.perf_config: c for c in outcome.debug_candidates([good, bad], FLOPS)}
    assert cands["pc1"].valid and cands["pc1"].kernel_time_ns == pytest.approx(1e8)
    assert cands["pc1"].spread is None and cands["pc0"].spread is not None
    (note,) = outcome.dropped_statistics([good, bad])
    assert note.startswith(f"{path}:3: {reason}") and "keep the tool's TFlops" in note


def test_the_bounds_themselves_are_plausible(tmp_path: Path) -> None:
    # 1 ns and a day exactly are kept: the bounds are inclusive.
    path = e4_file(tmp_path, "[1e-6, 1e-6]", "[86400000]")
    low, high = read_debug_file(path)
    assert low.spread is not None and low.spread.median == pytest.approx(stats.MIN_KERNEL_NS)
    assert high.spread is not None and high.spread.median == pytest.approx(stats.MAX_KERNEL_NS)
    assert outcome.dropped_statistics([low, high]) == []


def test_many_dropped_rows_make_one_note(tmp_path: Path) -> None:
    path = e4_file(tmp_path, "[1e-300]", "[1e303]", "[1e-300]")
    (note,) = outcome.dropped_statistics(read_debug_file(path))
    assert note.startswith(f"{path}:2: ") and "(and 2 more rows)" in note


@pytest.mark.parametrize(
    ("cell", "reason"),
    [
        ("{'min': 1e-300, 'median': 1e-300}", "Stats median 1e-300 ms is outside"),
        ("{'min': 1e303, 'median': 1e303}", "Stats median 1e+303 ms is outside"),
        ("{'min': 1e-300, 'median': 0.1}", "Stats min 1e-300 ms is outside"),
        ("{'min': 0.09, 'median': 0.1, 'stddev': 1e303}", "Stats stddev 1e+303 ms is outside"),
        ("{'total_cpu_time': 1e-300, 'iterations': 10}", "/ iterations 1e-301 ms is outside"),
        ("{'total_cpu_time': 1e303, 'iterations': 10}", "/ iterations 1e+302 ms is outside"),
    ],
)
def test_the_stats_shapes_have_the_same_bounds(tmp_path: Path, cell: str, reason: str) -> None:
    with pytest.raises(ImplausibleTime, match=re.escape(reason)):
        parse_stats(cell)
    path = tmp_path / "out.tsv.debug"
    path.write_text(f"DataType\tPerfConfig\tTFlops\tStats\nf16\tpc\t2.0\t{cell}\n")
    (row,) = read_debug_file(path)
    assert row.spread is None and row.tflops == 2.0 and row.dropped.startswith(f"{path}:2: ")


def test_a_stddev_under_a_nanosecond_is_a_spread_not_a_fault() -> None:
    spread = parse_stats("{'min': 0.0999, 'median': 0.1, 'stddev': 0.0}")
    assert spread is not None and spread.iqr == 0.0
    spread = parse_stats("{'min': 0.0999, 'median': 0.1, 'stddev': 1e-7}")
    assert spread is not None and spread.iqr == pytest.approx(0.1349)


def test_summarize_refuses_a_sample_that_is_not_finite() -> None:
    # Before: inf made the fence nan, no sample was kept, and quartiles([]) raised IndexError.
    with pytest.raises(ValueError, match="not a finite number"):
        stats.summarize([float("inf"), float("inf")])
    assert stats.kernel_time_fault(float("nan")) == "not a number"
    assert stats.kernel_time_fault(float("inf")).startswith("outside")
    assert stats.kernel_time_fault(5e4) == ""
