"""import-tsv reads a tuning DB of several ops, each row's op from its test vector: `run` over
GEMMs, convolutions and a gemm_gemm, its .tsv imported back, compared: the same winners."""

from __future__ import annotations

import pytest
from support.clitools import cli, run_cli

# The flow over whole workers: each backend in .ci/run, SQLite in the quick loop (the
# queue, claim and settle SQL it runs is tested on all three there too).
pytestmark = pytest.mark.backends(fast=("sqlite",))

GEMM = "-t f32 -out_datatype f32 -transA false -transB false -g 1 -m 32 -n 32 -k 16\n"
CONV = (
    "conv -F 1 -f NCHW -I NCHW -O NCHW -n 1 -c 8 -H 8 -W 8 -k 8 -y 3 -x 3 -p 1 -q 1 -u 1 -v 1 "
    "-l 1 -j 1 -g 1\n"
)
GEMM_GEMM = (
    "-t f32 -transA false -transB false -transC false -transO false -g 1 -m 16 -k 16 -n 16 "
    "-gemmO 16\n"
)


def test_run_export_import_compare_round_trip(db_url, tmp_path):
    for name, text in (("gemms", GEMM), ("convs", CONV), ("gemm_gemms", GEMM_GEMM)):
        (tmp_path / name).write_text(text)
    out = tmp_path / "tuning.tsv"
    run = run_cli(
        db_url, "run", "--op", "auto", "--tuning-space", "quick", "-o", str(out), "--json",
        *(str(tmp_path / n) for n in ("gemms", "convs", "gemm_gemms")), timeout=600,
    )  # fmt: skip
    assert run.code == 0, run.stderr
    tuned = run.json()
    assert tuned["counts"]["completed"] == 3 and tuned["exported"] == 3

    imported = cli(db_url, "import-tsv", str(out), "--json")
    assert imported.code == 0, imported.stderr
    report = imported.json()
    assert (report["results"], report["problems"], report["new_problems"]) == (3, 3, 0)
    (session,) = report["sessions"]
    compared = cli(db_url, "compare", str(tuned["session"]), str(session["id"]), "--json")
    assert compared.code == 0, compared.stderr
    c = compared.json()
    assert (c["common"], c["same_winner"], c["only_a"], c["only_b"]) == (3, 3, 0, 0)
    assert c["regressions"] == [] and c["within_noise"] == []

    # --op keeps that op's rows and says how many it left out.
    gemm_only = cli(db_url, "import-tsv", str(out), "--op", "gemm", "--again")
    assert gemm_only.code == 0, gemm_only.stderr
    assert "2 of another op than gemm left out" in gemm_only.stderr
    assert "1 problems, 0 new" in gemm_only.stderr
    listed = cli(db_url, "session", "list", "--json").json()
    assert [s["ops"] for s in listed] == [
        ["conv", "gemm", "gemm_gemm"], ["conv", "gemm", "gemm_gemm"], ["gemm"]
    ]  # fmt: skip


def test_a_row_whose_op_cannot_be_told_is_one_line(db_url, tmp_path):
    bad = tmp_path / "bad.tsv"
    bad.write_text(
        "# arch\tnumCUs\ttestVector\tperfConfig\tTFlops\ngfx942\t304\t-x 1 -y 2\tv2:1\t1.0\n"
    )
    run = cli(db_url, "import-tsv", str(bad))
    assert run.code == 2 and run.stderr.count("\n") == 1
    assert f"{bad}:2:" in run.stderr and "give --op" in run.stderr


def test_an_import_that_fails_leaves_no_database(tmp_path):
    target = tmp_path / "fresh.db"
    bad = tmp_path / "bad.tsv"
    bad.write_text(
        "# arch\tnumCUs\ttestVector\tperfConfig\tTFlops\ngfx942\t304\t-x 1 -y 2\tv2:1\t1.0\n"
    )
    run = cli(f"sqlite:///{target}", "import-tsv", str(bad))
    assert run.code == 2 and f"{bad}:2:" in run.stderr
    assert not target.exists()
