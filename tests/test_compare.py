"""compare: old vs new tuning on hand-made cases, sessions and .tsv files, on every backend."""

from __future__ import annotations

import math
from pathlib import Path

import pytest
from clitools import cli
from test_results import gemm, new_session, put_results, tune

from mlirtuna import compare
from mlirtuna.errors import InputError, UserError

V = [gemm(m) for m in (16, 32, 64, 128)]
JSON_KEYS = {"common", "same_winner", "geomean_ratio", "regressions", "only_a", "only_b"}


def v3_file(path, rows: dict[str, tuple[str, float]], arch: str = "gfx942") -> str:
    path.write_text(
        "# arch\tnumCUs\tnumChiplets\ttestVector\tperfConfig\tTFlops\ttuningSpace\tcommitId"
        "\ttimestamp\tdurationSec\n"
        + "".join(
            f"{arch}\t304\t8\t{tv}\t{pc}\t{tf}\tfull\tx\t2025-01-01T00:00:00Z\t1.0\n"
            for tv, (pc, tf) in rows.items()
        )
    )
    return str(path)


def test_identical_session_and_its_export(db, db_url, tmp_path):
    sid = new_session(db)
    tune(db, tmp_path, sid, V)
    out = tmp_path / "db.tsv"
    assert cli(db_url, "export", "--session", str(sid), "-o", str(out)).code == 0
    run = cli(db_url, "compare", str(sid), str(out), "--json", "--fail-on-regression")
    assert run.code == 0, run.stderr
    got = run.json()
    assert set(got) >= JSON_KEYS
    assert (got["common"], got["same_winner"], got["only_a"], got["only_b"]) == (4, 4, 0, 0)
    # The file holds what the database gave back (FLOAT on MariaDB), so the ratio is 1.
    assert got["geomean_ratio"] == pytest.approx(1.0) and got["regressions"] == []
    assert got["same_winner_pct"] == 100.0
    human = cli(db_url, "compare", str(sid), str(out))
    assert human.code == 0 and "same winner" in human.stdout and "4 (100.0%)" in human.stdout


def test_one_regression_between_sessions(db, db_url):
    a, b = new_session(db), new_session(db)
    put_results(db, a, {V[0]: ("pa", 2.0), V[1]: ("same", 1.0), V[2]: ("pc", 1.0)})
    put_results(db, b, {V[0]: ("pb", 1.0), V[1]: ("same", 1.0), V[2]: ("pc2", 0.97)})
    run = cli(db_url, "compare", str(a), str(b), "--json")
    assert run.code == 0
    got = run.json()
    assert (got["common"], got["same_winner"]) == (3, 1)
    assert got["geomean_ratio"] == pytest.approx((0.5 * 1.0 * 0.97) ** (1 / 3), rel=1e-5)
    assert got["min_ratio"] == pytest.approx(0.5) and got["max_ratio"] == pytest.approx(1.0)
    (reg,) = got["regressions"]  # 0.97 is within the default 5%
    assert (reg["test_vector"], reg["perf_config_a"], reg["perf_config_b"]) == (V[0], "pa", "pb")
    assert reg["ratio"] == pytest.approx(0.5)
    failing = cli(db_url, "compare", str(a), str(b), "--fail-on-regression")
    assert failing.code == 1 and "pa" in failing.stdout and "pb" in failing.stdout
    strict = cli(db_url, "compare", str(a), str(b), "--threshold", "2%", "--json").json()
    assert [r["perf_config_b"] for r in strict["regressions"]] == ["pb", "pc2"]  # worst first


def test_disjoint_problems(db, db_url, tmp_path):
    a = new_session(db)
    put_results(db, a, {V[0]: ("p", 1.0), V[1]: ("p", 1.0)})
    b = v3_file(tmp_path / "b.tsv", {V[2]: ("p", 1.0), V[3]: ("p", 1.0), gemm(256): ("p", 1.0)})
    got = cli(db_url, "compare", str(a), b, "--json", "--fail-on-regression").json()
    assert (got["common"], got["same_winner"], got["only_a"], got["only_b"]) == (0, 0, 2, 3)
    assert got["geomean_ratio"] is None and got["regressions"] == []


def test_two_files_recanonicalized_with_op(tmp_path):
    a = v3_file(tmp_path / "a.tsv", {V[0]: ("p", 1.0), V[1]: ("q", 2.0)})
    # The same problems written in another flag order, as an older tool might.
    b = v3_file(
        tmp_path / "b.tsv",
        {
            "-transA false -transB false -t f32 -g 1 -m 16 -n 64 -k 32": ("p", 1.0),
            "-transB false -transA false -t f32 -g 1 -m 32 -n 64 -k 32": ("q2", 1.0),
        },
    )
    raw = compare.compare(*compare.load_sides(a, b, None, _no_db))
    assert raw.common == 0  # as written, nothing matches
    got = compare.compare(*compare.load_sides(a, b, "gemm", _no_db))
    assert (got.common, got.same_winner, len(got.regressions)) == (2, 1, 1)
    assert got.regressions[0].ratio == 0.5 and math.isclose(got.geomean_ratio, math.sqrt(0.5))


def test_bad_inputs_are_one_line_exit_2(db, db_url, tmp_path):
    sid = new_session(db)
    put_results(db, sid, {V[0]: ("p", 1.0)})
    two = tmp_path / "two.tsv"
    one = v3_file(tmp_path / "x.tsv", {V[0]: ("p", 1.0)})
    other = f"gfx90a\t110\t1\t{V[0]}\tq\t1.0\tfull\tx\t2025-01-01T00:00:00Z\t1.0\n"
    two.write_text(Path(one).read_text() + other)
    run = cli(db_url, "compare", str(sid), str(two))
    assert run.code == 2 and f"{two}:3: " in run.stderr and "one context" in run.stderr
    bad_tv = v3_file(tmp_path / "bad.tsv", {"-t f32 -m 3": ("p", 1.0)})
    run = cli(db_url, "compare", str(sid), bad_tv, "--op", "gemm")
    assert run.code == 2 and f"{bad_tv}:2: " in run.stderr
    for args in (
        ["99", str(two)],
        [str(sid), str(tmp_path / "none.tsv")],
        [str(sid), str(sid), "--threshold", "lots"],
    ):
        run = cli(db_url, "compare", *args)
        assert run.code == 2 and run.stderr.count("\n") == 1, run.stderr


def test_threshold_parsing():
    assert compare.parse_threshold("5%") == 0.05 and compare.parse_threshold("10") == 0.1
    assert compare.parse_threshold(" 0.5 % ") == 0.005
    for bad in ("-1%", "100%", "x"):
        with pytest.raises(UserError):
            compare.parse_threshold(bad)


def test_tsv_side_keeps_the_last_row_of_one_context(tmp_path):
    path = tmp_path / "twice.tsv"
    v3_file(path, {V[0]: ("first", 1.0)})
    path.write_text(path.read_text() + path.read_text().replace("first", "second"))
    assert compare.tsv_side(str(path), None).entries[V[0]].perf_config == "second"
    with pytest.raises(InputError):
        compare.tsv_side(v3_file(tmp_path / "bad.tsv", {"-m 1": ("p", 1.0)}), "gemm")


def _no_db():
    raise AssertionError("two files need no database")
