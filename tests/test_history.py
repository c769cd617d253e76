"""import-tsv: existing tuning DBs into sessions and results, all or nothing."""

from __future__ import annotations

import datetime as dt

import sqlalchemy as sa
from conftest import DATA
from support.clitools import cli
from support.perfrunner_reader import read_tuning_db
from support.results import gemm

from mlirtuna.db.models import Problem, Result, TuningSession
from mlirtuna.history import export, tsvimport
from mlirtuna.history.export import ExportQuery

V3_EXAMPLE = DATA / "example-tuning-db-v3.from-test_tuningRunner.tsv"
LEGACY_EXAMPLE = DATA / "example-tuning-db-legacy.from-test_perfRunner.tsv"
CONV = (
    "conv -F 1 -f NCHW -I NCHW -O NCHW -n 256 -c 1024 -H 14 -W 14 -k 256 -y 1 -x 1 -p 0 -q 0"
    " -u 1 -v 1 -l 1 -j 1 -m conv -g 1 -t 1"
)


def counts(db) -> tuple[int, int, int]:
    with db.session() as s:
        return tuple(
            s.scalar(sa.select(sa.func.count()).select_from(m))
            for m in (TuningSession, Result, Problem)
        )


def sessions_of(db) -> list[TuningSession]:
    with db.session() as s:
        return list(s.scalars(sa.select(TuningSession).order_by(TuningSession.id)))


def test_rocmlir_v3_example_stops_at_its_placeholder_line(db, db_url):
    # Line 3 of rocMLIR's test literal, `-g 1 -m 1024`, is no gemm: the whole run writes nothing.
    run = cli(db_url, "import-tsv", "--op", "gemm", str(V3_EXAMPLE))
    assert run.code == 2 and run.stderr.startswith(f"error: {V3_EXAMPLE}:3: ")
    assert "missing required flag" in run.stderr and run.stderr.count("\n") == 1
    assert counts(db) == (0, 0, 0)


def test_v3_example_line_imports_with_its_context(db, db_url, tmp_path):
    path = tmp_path / "weekly.tsv"
    path.write_text("".join(V3_EXAMPLE.read_text().splitlines(True)[:2]))
    run = cli(db_url, "import-tsv", "--op", "gemm", str(path), "--json")
    assert run.code == 0, run.stderr
    report = run.json()
    assert (report["rows"], report["results"], report["new_problems"]) == (1, 1, 1)
    (x,) = sessions_of(db)
    assert (
        x.arch,
        x.arch_full,
        x.num_cu,
        x.num_chiplets,
        x.tuning_space,
        x.mlir_v,
        x.tuner,
        x.reason,
    ) == ("gfx900", "gfx900", 64, 1, "full", "abc123", "imported", "weekly.tsv")
    assert x.created_at == dt.datetime(2025, 1, 1)
    with db.session() as s:
        r = s.scalars(sa.select(Result)).one()
        assert (r.perf_config, r.tflops, r.duration_s, r.job_id) == ("perf_best", 1.5, 10.0, None)
        assert r.tuned_at == dt.datetime(2025, 1, 1)
    # And back out: the same line, byte for byte.
    again = export.render(db, ExportQuery(arch="gfx900"))
    assert again.text == path.read_text()


def test_legacy_file_needs_num_cu(db, db_url, tmp_path):
    run = cli(db_url, "import-tsv", "--op", "gemm", str(LEGACY_EXAMPLE), "--num-cu", "120")
    assert run.code == 2 and f"{LEGACY_EXAMPLE}:2: " in run.stderr  # `-g 1 -m 1024` again
    path = tmp_path / "legacy.tsv"  # the same layout, with real gemm vectors
    path.write_text(
        f"# arch\tconfig\tperfconfig\ngfx900\t{gemm(1024)}\tperf_1\n\n"
        f"gfx900\t{gemm(2048)}\tperf_2\n"
    )
    run = cli(db_url, "import-tsv", "--op", "gemm", str(path))
    assert run.code == 2 and f"{path}:2: " in run.stderr and "--num-cu" in run.stderr
    assert counts(db) == (0, 0, 0)
    run = cli(
        db_url,
        "import-tsv",
        "--op",
        "gemm",
        str(path),
        "--num-cu",
        "120",
        "--reason",
        "weekly 2023-05",
    )
    assert run.code == 0, run.stderr
    (x,) = sessions_of(db)
    assert (x.num_cu, x.num_chiplets, x.tuning_space, x.mlir_v, x.reason) == (
        120,
        1,
        "exhaustive",
        "",
        "weekly 2023-05",
    )
    out = tmp_path / "out.tsv"
    export.export(db, ExportQuery(arch="gfx900"), out=str(out))
    assert read_tuning_db(str(out)) == {
        ("gfx900", 120, 1, gemm(1024)): "perf_1",
        ("gfx900", 120, 1, gemm(2048)): "perf_2",
    }
    # No TFlops in a legacy file: exported as nan, and imported back as unknown, not skipped.
    report = tsvimport.import_tsv(db, "gemm", [str(out)])
    assert report.skipped == 0 and report.results == 2


def test_tuna_export_and_contexts_become_sessions(db, tmp_path):
    path = tmp_path / "tuna.tsv"
    rows = [
        ("gfx90a:sramecc+:xnack-", "110", CONV, "v2:1"),
        ("gfx90a:sramecc+:xnack-", "110", CONV.replace("-n 256", "-n 128"), "v2:2"),
        ("gfx942:sramecc+:xnack-", "304", CONV, "v2:3"),
    ]
    path.write_text(
        "# arch\tnumCUs\ttestVector\tperfConfig (tuna)\n"
        + "".join("\t".join(r) + "\n" for r in rows)
    )
    report = tsvimport.import_tsv(db, "conv", [str(path)], fill=tsvimport.Fill(num_chiplets=8))
    assert [(x.arch, x.num_cu, x.results) for x in report.sessions] == [
        ("gfx90a:sramecc+:xnack-", 110, 2),
        ("gfx942:sramecc+:xnack-", 304, 1),
    ]
    assert report.problems == 2 and report.new_problems == 2
    assert {(x.arch, x.num_chiplets, x.tuning_space) for x in sessions_of(db)} == {
        ("gfx90a", 8, "exhaustive"),
        ("gfx942", 8, "exhaustive"),
    }


def test_v2_none_rows_are_skipped_and_later_rows_win(db, tmp_path):
    path = tmp_path / "e2.tsv"
    path.write_text(
        "# arch\tnumCUs\ttestVector\tperfConfig\tTFlops (quick)\n"
        f"gfx90a\t110\t{gemm(64)}\tv2:old\t1.0\n"
        f"gfx90a\t110\t{gemm(128)}\tNone\t-inf\n"
        "# arch\tnumCUs\ttestVector\tperfConfig\tTFlops (quick)\n"
        f"gfx90a\t110\t-transB false -transA false -t f32 -g 1 -m 64 -n 64 -k 32\tv2:new\t2.0\n"
    )
    report = tsvimport.import_tsv(db, "gemm", [str(path)])
    assert (report.rows, report.skipped, report.results) == (3, 1, 1)
    with db.session() as s:
        r = s.scalars(sa.select(Result)).one()
        assert (r.perf_config, r.tflops) == ("v2:new", 2.0)
        assert s.scalar(sa.select(TuningSession.tuning_space)) == "quick"


def test_bad_row_in_a_later_file_writes_nothing(db, db_url, tmp_path):
    good = tmp_path / "good.tsv"
    good.write_text(f"gfx90a\t110\t{gemm(64)}\tv2:1\t1.0\n")
    bad = tmp_path / "bad.tsv"
    bad.write_text(f"gfx90a\t110\t{gemm(64)}\tv2:1\t1.0\ngfx90a\t110\t{gemm(32)}\tv2:1\tfast\n")
    run = cli(db_url, "import-tsv", "--op", "gemm", str(good), str(bad))
    assert run.code == 2 and run.stderr == f"error: {bad}:2: TFlops 'fast' is not a number\n"
    missing = cli(db_url, "import-tsv", "--op", "gemm", str(good), str(tmp_path / "nope.tsv"))
    assert missing.code == 2 and "no such file" in missing.stderr
    assert counts(db) == (0, 0, 0)


def test_bulk_rows_become_one_session(db, tmp_path):
    # bench/bench_bulk.py times 100,000 rows; this checks the bulk path's counts.
    n = 5_000 if db.backend == "sqlite" else 2_000
    path = tmp_path / "big.tsv"
    path.write_text(
        V3_EXAMPLE.read_text().splitlines(True)[0]
        + "".join(
            f"gfx942\t304\t8\t{gemm(m)}\tv4:{m}\t1.5\tfull\tabc\t2025-01-01T00:00:00Z\t1.0\n"
            for m in range(1, n + 1)
        )
    )
    report = tsvimport.import_tsv(db, "gemm", [str(path)])
    assert report.results == n and counts(db) == (1, n, n)


def test_a_file_imported_before_is_said_so_and_adds_nothing(db, db_url, tmp_path):
    path = tmp_path / "weekly.tsv"
    path.write_text("".join(V3_EXAMPLE.read_text().splitlines(True)[:2]))
    first = cli(db_url, "import-tsv", "--op", "gemm", str(path))
    assert first.code == 0 and counts(db) == (1, 1, 1)
    copy = tmp_path / "copy-of-weekly.tsv"  # the same bytes under another name
    copy.write_bytes(path.read_bytes())
    for name in (path, copy):
        run = cli(db_url, "import-tsv", "--op", "gemm", str(name))
        assert run.code == 0 and run.stdout == ""
        assert f"{name}: already imported as session 1 (same content" in run.stderr
        assert "--again" in run.stderr
    assert counts(db) == (1, 1, 1)
    report = cli(db_url, "import-tsv", "--op", "gemm", str(path), "--json").json()
    assert report["sessions"] == [] and report["already"][0]["sessions"] == [1]
    assert report["already"][0]["sha256"] == tsvimport.file_sha256(str(path))
    forced = cli(db_url, "import-tsv", "--op", "gemm", str(path), "--again")
    assert forced.code == 0 and "session 2:" in forced.stdout and counts(db) == (2, 2, 1)
    # A new file next to an old one: the new one is imported, the old one named.
    other = tmp_path / "other.tsv"
    other.write_text(path.read_text().replace("perf_best", "perf_other"))
    both = cli(db_url, "import-tsv", "--op", "gemm", str(path), str(other), "--json").json()
    assert [x["file"] for x in both["already"]] == [str(path)]
    assert both["already"][0]["sessions"] == [1, 2]
    assert [x["file"] for x in both["sessions"]] == [str(other)] and counts(db)[0] == 3
