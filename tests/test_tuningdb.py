"""mlirtuna.formats.tuningdb: reading every tuning-DB layout, writing E2/E3 files for perfRunner."""

from __future__ import annotations

import datetime as dt
import io
import math
from dataclasses import replace
from pathlib import Path

import pytest
from support import perfrunner_reader

from mlirtuna.errors import InputError
from mlirtuna.formats import tuningdb
from mlirtuna.formats.tuningdb import TuningRow

DATA = Path(__file__).parent / "data"
V3_EXAMPLE = DATA / "example-tuning-db-v3.from-test_tuningRunner.tsv"
LEGACY_EXAMPLE = DATA / "example-tuning-db-legacy.from-test_perfRunner.tsv"

ARCH = "gfx942:sramecc+:xnack-"
GEMM = "-t f16 -out_datatype f16 -transA false -transB false -g 1 -m 1024 -n 512 -k 768"
CONV = (
    "convfp16 -F 1 -f NCHW -I NCHW -O NCHW -n 256 -c 1024 -H 14 -W 14 -k 256 -y 1 -x 1 "
    "-p 0 -q 0 -u 1 -v 1 -l 1 -j 1 -m conv -g 1 -t 1"
)
V2_HEADER = "# arch\tnumCUs\ttestVector\tperfConfig\tTFlops (exhaustive)"
V3_HEADER = (
    "# arch\tnumCUs\tnumChiplets\ttestVector\tperfConfig\tTFlops\ttuningSpace\tcommitId"
    "\ttimestamp\tdurationSec"
)


def parse(text: str, path: str = "db.tsv") -> tuningdb.TuningFile:
    return tuningdb.parse_tuning_db(io.StringIO(text), path)


def row(**changes: object) -> TuningRow:
    base = TuningRow(
        arch=ARCH,
        num_cu=304,
        num_chiplets=8,
        test_vector=GEMM,
        perf_config="v4:64,64,8,32,32,32,8,1,1,2,0,0,1,1",
        tflops=123.5,
        tuning_space="full",
        commit_id="0123abcd",
        timestamp="2026-01-02T03:04:05Z",
        duration_s=12.34,
        lineno=0,
    )
    return replace(base, **changes)


# --- reading the literal examples from rocMLIR's tests ---------------------------------------


def test_reads_v3_example_from_rocmlir_tests() -> None:
    db = tuningdb.read_tuning_db(V3_EXAMPLE)
    assert db.kinds == {"v3"}
    first, second = db.rows
    assert first == TuningRow(
        arch="gfx900",
        num_cu=64,
        num_chiplets=1,
        test_vector="-t f32 -out_datatype f32 -transA false -transB false -g 1 -m 1024 -n 512 "
        "-k 769",
        perf_config="perf_best",
        tflops=1.5,
        tuning_space="full",
        commit_id="abc123",
        timestamp="2025-01-01T00:00:00Z",
        duration_s=10.0,
        lineno=2,
    )
    assert (second.arch, second.num_cu, second.test_vector, second.lineno) == (
        "gfx1030",
        72,
        "-g 1 -m 1024",
        3,
    )


def test_reads_legacy_example_with_its_blank_line() -> None:
    db = tuningdb.read_tuning_db(LEGACY_EXAMPLE)
    assert db.kinds == {"legacy"}
    assert [(r.arch, r.test_vector, r.perf_config, r.lineno) for r in db.rows] == [
        ("gfx900", "-g 1 -m 1024", "perf_1", 2),
        ("gfx900", "-g 1 -m 2048", "perf_2", 4),
    ]
    assert all(r.num_cu is None and r.tflops is None and r.tuning_space is None for r in db.rows)


# --- the other layouts ------------------------------------------------------------------------


def test_v2_with_tflops_takes_the_space_from_the_header() -> None:
    db = parse(f"{V2_HEADER}\n{ARCH}\t304\t{CONV}\tv2:64,128,4,64,32,4,2,1,1\t141.25\n")
    (r,) = db.rows
    assert db.kinds == {"v2"}
    assert (r.arch, r.num_cu, r.num_chiplets, r.test_vector) == (ARCH, 304, None, CONV)
    assert (r.perf_config, r.tflops, r.tuning_space) == (
        "v2:64,128,4,64,32,4,2,1,1",
        141.25,
        "exhaustive",
    )


def test_v2_without_tflops() -> None:
    db = parse(f"# arch\tnumCUs\ttestVector\tperfConfig (quick)\n{ARCH}\t304\t{GEMM}\tv2:1\n")
    (r,) = db.rows
    assert (db.kinds, r.tflops, r.tuning_space, r.perf_config) == ({"v2"}, None, "quick", "v2:1")


def test_mituna_export_is_its_own_kind_without_a_tuning_space() -> None:
    db = parse(f"# arch\tnumCUs\ttestVector\tperfConfig (tuna)\n{ARCH}\t110\t{GEMM}\tv2:1\n")
    (r,) = db.rows
    assert db.kinds == {"tuna"}
    assert (r.num_cu, r.tuning_space) == (110, None)


def test_e3_reads_old_style_header_with_space_in_parentheses() -> None:
    # E3's reader accepts "perfConfig (quick)" headers with numChiplets and no tuningSpace column.
    text = (
        "# arch\tnumCUs\tnumChiplets\ttestVector\tperfConfig (quick)\tTFlops\n"
        f"{ARCH}\t304\t8\t{GEMM}\tv4:1\t2.5\n"
    )
    (r,) = parse(text).rows
    assert (r.num_chiplets, r.tuning_space, r.tflops) == (8, "quick", 2.5)


def test_appended_runs_with_different_headers() -> None:
    text = (
        f"{V2_HEADER}\n{ARCH}\t304\t{CONV}\tv2:1\t1.0\n"
        "# arch\tnumCUs\ttestVector\tperfConfig\tTFlops (quick)\n"
        f"{ARCH}\t304\t{GEMM}\tv2:2\t2.0\n"
        "\n"
        f"{V3_HEADER}\n{ARCH}\t304\t8\t{GEMM}\tv4:3\t3.0\tfull\tx\t2026-01-01T00:00:00Z\t1.0\n"
    )
    db = parse(text)
    assert db.kinds == {"v2", "v3"}
    assert [h.lineno for h in db.headers] == [1, 3, 6]
    assert [(r.perf_config, r.tuning_space, r.num_chiplets) for r in db.rows] == [
        ("v2:1", "exhaustive", None),
        ("v2:2", "quick", None),
        ("v4:3", "full", 8),
    ]


def test_rows_before_any_header_are_told_apart_like_perfrunner() -> None:
    text = (
        "gfx900\t-g 1 -m 1024\tperf_1\n"
        f"{ARCH}\t304\t{GEMM}\tv2:1\n"
        f"{ARCH}\t304\t{GEMM}\tv2:2\t7.5\n"
        f"{ARCH}\t304\t8\t{GEMM}\tv4:3\t3.0\tfull\tx\t2026-01-01T00:00:00Z\t1.0\n"
    )
    db = parse(text)
    assert db.kinds == {"legacy", "v2", "v3"}
    assert [(r.num_cu, r.num_chiplets, r.tflops) for r in db.rows] == [
        (None, None, None),
        (304, None, None),
        (304, None, 7.5),
        (304, 8, 3.0),
    ]


def test_none_and_minus_inf_are_parsed_so_callers_can_flag_them() -> None:
    (r,) = parse(f"{V2_HEADER}\n{ARCH}\t304\t{GEMM}\tNone\t-inf\n").rows
    assert r.perf_config == "None" and r.tflops == -math.inf
    assert not r.has_perf_config and not r.has_valid_tflops
    assert row().has_perf_config and row().has_valid_tflops


def test_crlf_line_endings_and_other_comments() -> None:
    text = f"# tuned by hand\r\n{V2_HEADER}\r\n{ARCH}\t304\t{GEMM}\tv2:1\t1.5\r\n"
    db = parse(text)
    assert [(r.perf_config, r.tflops, r.tuning_space) for r in db.rows] == [
        ("v2:1", 1.5, "exhaustive")
    ]


# --- malformed input: one InputError at FILE:LINE ---------------------------------------------


@pytest.mark.parametrize(
    ("text", "line", "fragment"),
    [
        (f"{V2_HEADER}\n{ARCH}\t304\t{GEMM}\tv2:1\n", 2, "4 tab-separated fields"),
        (f"{V2_HEADER}\n\n{ARCH}\tmany\t{GEMM}\tv2:1\t1.0\n", 3, "numCUs 'many'"),
        (f"{V2_HEADER}\n{ARCH}\t304\t{GEMM}\tv2:1\tfast\n", 2, "TFlops 'fast'"),
        (f"{V2_HEADER}\n{ARCH}\t304\t{GEMM}\t\t1.0\n", 2, "empty perfConfig"),
        (
            f"{V3_HEADER}\n{ARCH}\t304\t8\t{GEMM}\tv4:1\t1.0\tfull\tx\t2026-01-01 00:00\t1.0\n",
            2,
            "timestamp",
        ),
        (f"{V3_HEADER}\n{ARCH}\t304\tmany\t{GEMM}\tv4:1\t1.0\tfull\tx\t\t\n", 2, "numChiplets"),
        ("gfx900\tonly-two\n", 1, "2 tab-separated fields"),
        ("# arch\tnumCUs\ttestVector\tperfConfig\tspeed\n", 1, "unknown column 'speed'"),
        ("# arch\tnumCUs\tnumChiplets\ttestVector\n", 1, "no perfConfig column"),
    ],
)
def test_malformed_input_names_file_and_line(text: str, line: int, fragment: str) -> None:
    with pytest.raises(InputError) as info:
        parse(text, "farm/mlir_tuning_gfx942.tsv")
    assert str(info.value).startswith(f"farm/mlir_tuning_gfx942.tsv:{line}: ")
    assert fragment in str(info.value)
    assert (info.value.path, info.value.line) == ("farm/mlir_tuning_gfx942.tsv", line)


def test_read_tuning_db_reports_the_real_path(tmp_path: Path) -> None:
    path = tmp_path / "db.tsv"
    path.write_text(f"{V2_HEADER}\n{ARCH}\t304\n")
    with pytest.raises(InputError, match=rf"^{path}:2: "):
        tuningdb.read_tuning_db(path)


# --- writing ------------------------------------------------------------------------------------


def test_write_v3_reproduces_the_rocmlir_example_byte_for_byte() -> None:
    out = io.StringIO()
    tuningdb.write_v3(tuningdb.read_tuning_db(V3_EXAMPLE).rows, out)
    assert out.getvalue() == V3_EXAMPLE.read_text()


def test_write_v3_formats_like_e3() -> None:
    out = io.StringIO()
    tuningdb.write_v3([row(tflops=12, duration_s=3.25, commit_id=None)], out)
    header, line = out.getvalue().splitlines()
    assert header == V3_HEADER
    assert line.split("\t") == [
        ARCH,
        "304",
        "8",
        GEMM,
        "v4:64,64,8,32,32,32,8,1,1,2,0,0,1,1",
        "12.0",  # str(float)
        "full",
        "unknown",  # what E3 writes when git fails
        "2026-01-02T03:04:05Z",
        "3.2",  # %.1f
    ]


def test_write_v2_formats_like_e2_with_tflops() -> None:
    out = io.StringIO()
    tuningdb.write_v2(
        [row(tflops=141.40134941137134), row(test_vector=CONV, tflops=2)], out, "full"
    )
    assert out.getvalue() == (
        "# arch\tnumCUs\ttestVector\tperfConfig\tTFlops (full)\n"
        f"{ARCH}\t304\t{GEMM}\tv4:64,64,8,32,32,32,8,1,1,2,0,0,1,1\t141.40134941137134\n"
        f"{ARCH}\t304\t{CONV}\tv4:64,64,8,32,32,32,8,1,1,2,0,0,1,1\t2.0\n"
    )


def test_write_v2_without_tflops_is_mitunas_export_layout() -> None:
    out = io.StringIO()
    tuningdb.write_v2([row(tflops=None)], out, "tuna", tflops=False)
    assert out.getvalue().splitlines()[0] == "# arch\tnumCUs\ttestVector\tperfConfig (tuna)"
    assert parse(out.getvalue()).kinds == {"tuna"}


def test_written_files_read_back_equal() -> None:
    rows = [row(lineno=2), row(test_vector=CONV, tflops=99.0, lineno=3)]
    out = io.StringIO()
    tuningdb.write_v3(rows, out)
    assert parse(out.getvalue()).rows == [replace(r, duration_s=12.3) for r in rows]
    out = io.StringIO()
    tuningdb.write_v2(rows, out, "full")
    expected = [
        replace(r, num_chiplets=None, commit_id=None, timestamp=None, duration_s=None) for r in rows
    ]
    assert parse(out.getvalue()).rows == expected


@pytest.mark.parametrize(
    ("changes", "fragment"),
    [
        ({"num_chiplets": None}, "no num_chiplets"),
        ({"tflops": None}, "no tflops"),
        ({"timestamp": None}, "no timestamp"),
        ({"test_vector": "-t f16\t-m 1"}, "tab/newline"),
        ({"perf_config": ""}, "empty"),
    ],
)
def test_write_v3_refuses_rows_it_cannot_write(changes: dict, fragment: str) -> None:
    with pytest.raises(ValueError, match=fragment):
        tuningdb.write_v3([row(**changes)], io.StringIO())


def test_format_timestamp_is_utc_with_z() -> None:
    when = dt.datetime(2026, 1, 2, 4, 4, 5, 999, tzinfo=dt.timezone(dt.timedelta(hours=1)))
    assert tuningdb.format_timestamp(when) == "2026-01-02T03:04:05Z"
    assert tuningdb.format_timestamp(dt.datetime(2026, 1, 2, 3, 4, 5)) == "2026-01-02T03:04:05Z"


# --- what we write is what perfRunner finds -----------------------------------------------------


@pytest.fixture
def rows() -> list[TuningRow]:
    return [row(), row(test_vector=CONV, perf_config="v4:1", tflops=7.0)]


def test_perfrunner_finds_v3_rows(tmp_path: Path, rows: list[TuningRow]) -> None:
    path = tmp_path / "mlir_tuning_gfx942.tsv"
    with open(path, "w") as out:
        tuningdb.write_v3(rows, out)
    full = perfrunner_reader.read_tuning_db(str(path), "2248")
    assert full == {(ARCH, 304, 8, r.test_vector): r.perf_config for r in rows}
    assert perfrunner_reader.read_tuning_db(str(path), "2219") == {
        (ARCH, r.test_vector): r.perf_config for r in rows
    }
    # The E2-era perfRunner only knows 3/4/5 fields: a v3 DB needs perfRunner from 2026 on.
    assert perfrunner_reader.read_tuning_db(str(path), "00267dbf") == {}


@pytest.mark.parametrize("tflops", [True, False])
def test_perfrunner_finds_v2_rows_in_every_version(
    tmp_path: Path, rows: list[TuningRow], tflops: bool
) -> None:
    path = tmp_path / "mlir_tuning_gfx942.tsv"
    with open(path, "w") as out:
        tuningdb.write_v2(rows, out, "exhaustive", tflops=tflops)
    by_arch = {(ARCH, r.test_vector): r.perf_config for r in rows}
    assert perfrunner_reader.read_tuning_db(str(path), "00267dbf") == by_arch
    assert perfrunner_reader.read_tuning_db(str(path), "2219") == by_arch
    full = perfrunner_reader.read_tuning_db(str(path), "2248", fallback_num_chiplets=8)
    assert full == {(ARCH, 304, 8, r.test_vector): r.perf_config for r in rows}


def test_perfrunner_finds_rows_in_an_appended_file(tmp_path: Path, rows: list[TuningRow]) -> None:
    path = tmp_path / "mlir_tuning_gfx942.tsv"
    with open(path, "a") as out:
        tuningdb.write_v3(rows[:1], out)
    with open(path, "a") as out:
        tuningdb.write_v3(rows[1:], out)
    assert len(tuningdb.read_tuning_db(path).headers) == 2
    full = perfrunner_reader.read_tuning_db(str(path), "2248")
    assert set(full) == {(ARCH, 304, 8, GEMM), (ARCH, 304, 8, CONV)}
