"""Lists from any candidate matrix (quick.Matrix, across units, leave-one-out), the one reader of
Kernel Tuner caches (bench/kerneltuner.py) and bench/bench_quick_real.py on caches written here."""

from __future__ import annotations

import gzip
import json
import math
import os
import subprocess
import sys
from pathlib import Path

import numpy as np
import pytest

from mlirtuna.history import quick

ROOT = Path(__file__).resolve().parent.parent
BENCH = ROOT / "bench"
sys.path.insert(0, str(BENCH))
import bench_quick_real as bqr  # noqa: E402
import kerneltuner as kt  # noqa: E402  (bench/ is not a package)

REAL = ROOT.parent / "shared" / "data" / "real-tuning" / "kernel-tuner-hub"
NAN = math.nan


def cache(path: Path, times: dict[str, object], device: str = "GPU") -> Path:
    """A Kernel Tuner cache file: `times` values go into each entry's `time` as given
    (a number, an error name, or the MISSING marker for no `time` at all)."""
    entries = {}
    for key, t in times.items():
        entry: dict[str, object] = {"block_size_x": key.split(",")[0]}
        if t is not MISSING:
            entry["time"] = t
        entries[key] = entry
    data = {"device_name": device, "tune_params_keys": ["a", "b"], "cache": entries}
    path.parent.mkdir(parents=True, exist_ok=True)
    opener = gzip.open if path.name.endswith(".gz") else open
    with opener(path, "wt", encoding="utf-8") as f:
        json.dump(data, f)
    return path


MISSING = object()


# --- the reader -------------------------------------------------------------------------------


def test_reader_keeps_failed_configs_as_failed(tmp_path):
    got = kt.read_cache(
        cache(tmp_path / "A.json.gz", {"1,0": 2.0, "2,0": "RuntimeFailedConfig", "3,1": 1.0})
    )
    assert got.times["1,0"] == 2.0 and got.times["3,1"] == 1.0
    assert math.isnan(got.times["2,0"]) and got.failed == 1
    m = kt.matrix({"A": got})
    # a failed config is never fast: ratio 0, whatever its error string
    assert m.ratios()[0].tolist() == [0.5, 0.0, 1.0]


def test_reader_counts_a_missing_or_odd_time_as_failed(tmp_path):
    got = kt.read_cache(
        cache(tmp_path / "B.json", {"1,0": MISSING, "2,0": None, "3,0": True, "4,0": -1, "5,0": 3})
    )
    assert [k for k, t in got.times.items() if not math.isnan(t)] == ["5,0"]


@pytest.mark.parametrize(
    ("content", "message"),
    [
        ("", "empty file"),
        ("   \n", "empty file"),
        ("{", "not JSON"),
        ("[1, 2]", "no `cache` object"),
        ('{"cache": {}}', "no configs"),
    ],
)
def test_reader_rejects_bad_files_naming_them(tmp_path, content, message):
    path = tmp_path / "bad.json"
    path.write_text(content)
    with pytest.raises(kt.CacheError, match=message) as err:
        kt.read_cache(path)
    assert str(path) in str(err.value)


def test_an_empty_gzip_file_is_an_error_too(tmp_path):
    path = tmp_path / "E.json.gz"
    with gzip.open(path, "wt"):
        pass
    with pytest.raises(kt.CacheError, match="empty file"):
        kt.read_cache(path)


def test_a_config_one_gpu_lacks_is_failed_there(tmp_path):
    a = kt.read_cache(cache(tmp_path / "A.json", {"1,0": 1.0, "2,0": 2.0}))
    b = kt.read_cache(cache(tmp_path / "B.json", {"1,0": 3.0}))
    m = kt.matrix({"A": a, "B": b})
    assert m.rows == ["A", "B"] and m.configs == ["1,0", "2,0"]
    assert m.ratios()[1].tolist() == [1.0, 0.0]


def test_debug_rows_are_what_quick_tuning_gen_reads(tmp_path):
    a = kt.read_cache(cache(tmp_path / "A.json", {"1,0": 2.0, "2,0": "CompilationFailedConfig"}))
    kt.write_debug(tmp_path / "t.debug", {"A": a})
    lines = (tmp_path / "t.debug").read_text().splitlines()
    head = lines[0].split("\t")
    assert head[:2] == ["Chip", "numCU"] and head[-2:] == ["PerfConfig", "TFlops"]
    rows = [dict(zip(head, line.split("\t"), strict=True)) for line in lines[1:]]
    assert [(r["PerfConfig"], r["TFlops"]) for r in rows] == [("1,0", "0.5"), ("2,0", "NaN")]


# --- the list engine on a small matrix --------------------------------------------------------


def small() -> quick.Matrix:
    """Three GPUs, five configs `size,switch`: `8,0` is the best on g1, `16,0` on g2, `8,1`
    on g3; `32,0` is 0.9 of the best everywhere (the robust single pick); `64,1` failed on g1."""
    best = {"g1": 1.0, "g2": 1.0, "g3": 1.0}
    r = {
        "8,0": [1.0, 0.5, 0.4],
        "16,0": [0.5, 1.0, 0.4],
        "8,1": [0.3, 0.3, 1.0],
        "32,0": [0.9, 0.9, 0.9],
        "64,1": [0.0, 0.95, 0.95],
    }
    configs = list(r)
    times = np.array(
        [[best[g] / r[c][i] if r[c][i] else NAN for c in configs] for i, g in enumerate(best)]
    )
    return quick.Matrix(list(best), configs, times)


def test_ratios_are_best_over_time_and_zero_for_failures():
    ratios = small().ratios()
    assert ratios.max(axis=1).tolist() == [1.0, 1.0, 1.0]
    assert ratios[0, 4] == 0.0 and ratios[1, 4] == pytest.approx(0.95)


def test_one_config_is_the_robust_one_not_a_gpu_s_favourite():
    m = small()
    assert quick.across_list(m, 1) == ["32,0"]
    # the failure on g1 keeps `64,1` out although it is 0.95 on the two others
    assert quick.baseline_list(m, 1) == ["32,0"]


def test_the_cover_serves_every_training_gpu_most_gain_first():
    got = quick.across_list(small(), 4)
    # after the robust pick, `64,1` lifts g2 and g3 to 0.95 (more than `8,0` lifts g1 alone)
    assert got[:3] == ["32,0", "64,1", "8,0"]
    scores = quick.unit_scores(small(), got)
    assert scores["g1"] == 1.0 and min(scores.values()) >= 0.95
    assert quick.unit_scores(small(), quick.across_list(small(), 5)) == dict.fromkeys(
        ("g1", "g2", "g3"), 1.0
    )


def test_a_list_never_repeats_and_stops_at_the_number_of_configs():
    got = quick.across_list(small(), 50)
    assert sorted(got) == sorted(small().configs)


def test_each_switch_family_gets_a_config():
    # Two GPUs that agree: the cover needs one config; the second slot goes to the other
    # family (switch = 1), not to the second best of the same family.
    configs = ["8,0", "16,0", "32,0", "8,1"]
    times = np.array([[1.0, 1.01, 1.02, 3.0], [1.0, 1.01, 1.02, 2.5]])
    m = quick.Matrix(["a", "b"], configs, times)
    assert quick.switch_families(configs).tolist() == [0, 0, 0, 1]
    assert quick.across_list(m, 2) == ["8,0", "8,1"]
    assert quick.baseline_list(m, 2) == ["8,0", "16,0"]


def test_leave_one_out_builds_each_list_without_that_unit():
    m = small()
    loo = quick.leave_one_out(m, 1)
    # without g1, `64,1` (0.95 on g2 and g3) is the robust pick, and it failed on g1: 0, exact
    assert loo == {"g1": 0.0, "g2": pytest.approx(0.9), "g3": pytest.approx(0.9)}
    loo2 = quick.leave_one_out(m, 2)
    # without g3 the list is `32,0` then `8,0`: g3's own favourite `8,1` is not in it
    assert loo2["g1"] == 0.5 and loo2["g3"] == pytest.approx(0.9)


def test_units_weigh_the_same_whatever_their_number_of_rows():
    # Arch x has 3 problems preferring `a`, arch y has 1 preferring `b`: each arch weighs half.
    times = np.array([[1.0, 1.5], [1.0, 1.5], [1.0, 1.5], [1.9, 1.0]])
    m = quick.Matrix(["x1", "x2", "x3", "y1"], ["a", "b"], times, ["x", "x", "x", "y"])
    # per arch: a = (1, 0.526), b = (0.667, 1): a's mean log is lower than b's
    assert quick.baseline_list(m, 1) == ["b"]


def test_matrix_of_the_farm_history_uses_every_arch_as_a_unit():
    hists = [
        quick.History(quick.Group(arch, "gemm", "f32"), perf, {p: f"p{p}" for p in perf})
        for arch, perf in (
            ("gfx90a", {1: {"v1": 10.0, "v2": 5.0}, 2: {"v1": 8.0}}),
            ("gfx942", {1: {"v2": 20.0, "v1": 10.0}}),
        )
    ]
    m = quick.matrix_of(hists)
    assert m.units == ["gfx90a", "gfx90a", "gfx942"] and m.configs == ["v1", "v2"]
    assert m.ratios().tolist() == [[1.0, 0.5], [1.0, 0.0], [0.5, 1.0]]
    assert set(quick.leave_one_out(m, 1)) == {"gfx90a", "gfx942"}


# --- the transfer ceiling (bench/bench_quick_real.py) -------------------------------------------


def test_dominators_count_strict_dominance_within_a_group():
    # two GPUs; `2,0` (.5,.5) is below all; `4,1` (.7,.7) below `1,0` and `3,1`; `5,1` (.6,.9)
    # only below `1,0` (1,1); an equal column does not dominate
    r = np.array([[1.0, 0.5, 0.8, 0.7, 0.6, 0.6], [1.0, 0.5, 0.8, 0.7, 0.9, 0.9]])
    assert bqr.dominators(r).tolist() == [0, 5, 1, 2, 1, 1]
    fam = [0, 0, 1, 1, 1, 1]  # within families: `2,0` below `1,0` only, `4,1` below `3,1`
    assert bqr.dominators(r, fam).tolist() == [0, 1, 0, 1, 0, 0]
    assert bqr.dominators(r, chunk=4).tolist() == [0, 5, 1, 2, 1, 1]  # chunks change nothing


def test_the_ceiling_of_a_held_out_gpu_by_hand():
    # small() trained on g1, g2 (ratios `8,0` (1,.5), `16,0` (.5,1), `8,1` (.3,.3), `32,0`
    # (.9,.9), `64,1` (0,.95)) and tested on g3 (.4, .4, 1, .9, .95)
    m = small()
    view = bqr.training_view(m.take([0, 1]))
    # baseline order: `32,0`, then `8,0` and `16,0` (equal: stable), `8,1`, `64,1` (failed)
    assert view["rank"].tolist() == [2, 3, 4, 1, 5]
    # `8,1` is below `8,0`, `16,0`, `32,0`; `64,1` below `16,0`; families `x,0` and `x,1`:
    # `8,1` and `64,1` do not dominate each other
    assert view["closed"].tolist() == [0, 0, 3, 0, 1]
    assert view["in-family"].tolist() == [0, 0, 0, 0, 0]
    got = m.take([2]).ratios()[0]
    # >= 0.90 on g3: `8,1`, `32,0` (rank 1, undominated), `64,1`; >= 0.99: `8,1` alone
    assert bqr.near_best(got, view, 0.90) == (3, 1, 0, 0)
    assert bqr.near_best(got, view, 0.99) == (1, 4, 3, 0)
    closed = [bqr.ceiling(got, view, "closed", k) for k in (1, 2, 3, 4)]
    assert closed == pytest.approx([0.9, 0.95, 0.95, 1.0])
    assert bqr.ceiling(got, view, "in-family", 1) == 1.0
    # a list holding `8,1` at k=2 leaves out two of its three dominators: not closed
    assert not bqr.bounded(view, ["32,0", "8,1"], "closed", [1, 2])
    assert bqr.bounded(view, ["32,0", "8,1"], "in-family", [1, 2])
    assert bqr.bounded(view, ["32,0", "64,1"], "closed", [1, 2])


def test_one_config_for_every_gpu_is_the_best_geomean_not_the_best_worst_case():
    # `a` (1, .6) geomean .775, `b` (.65, .65) the best worst GPU, `c` (.5, 1) geomean .707
    r = np.array([[1.0, 0.65, 0.5], [0.6, 0.65, 1.0]])
    m = quick.Matrix(["g1", "g2"], ["a", "b", "c"], 1 / r)
    cfg, geo, worst, maximin, n = bqr.one_for_every_gpu(m)
    assert (cfg, n) == ("a", 2)
    assert (geo, worst, maximin) == pytest.approx((0.6**0.5, 0.6, 0.65))


# --- the bench --------------------------------------------------------------------------------


def bench(*args: str, timeout: float = 240) -> subprocess.CompletedProcess:
    env = dict(os.environ, PYTHONPATH=str(ROOT / "src"))
    return subprocess.run(
        [sys.executable, str(BENCH / "bench_quick_real.py"), *args],
        capture_output=True,
        text=True,
        timeout=timeout,
        env=env,
        check=False,
    )


def tiny_tree(root: Path) -> Path:
    for gpu, row in {
        "G1": [1.0, 2.0, 4.0, 1.1],
        "G2": [2.0, 1.0, 4.0, 1.1],
        "G3": [4.0, 2.0, 1.0, 1.2],
    }.items():
        times = dict(zip(["1,0", "2,0", "3,1", "4,1"], row, strict=True))
        cache(root / "kern" / f"{gpu}.json.gz", times, gpu)
    return root


def test_bench_leave_one_gpu_out_prints_the_table_lists_and_goal_line(tmp_path):
    root = tiny_tree(tmp_path / "data")
    out = tmp_path / "lists.json"
    run = bench(
        "--train",
        str(root),
        "--k",
        "1,2",
        "--lists-out",
        str(out),
        "--goal",
        "--peers",
        str(tmp_path / "none"),
    )
    assert run.returncode == 0, run.stderr
    lines = run.stdout.strip().splitlines()
    assert lines[-1].startswith("goal: k=1 ") and "k=10" in lines[-1]
    assert "| kern | G1 | 1 |" in run.stdout and "| kern | G3 | 2 |" in run.stdout
    assert "quickTuningGen: not run: no " in run.stdout
    # the transfer ceiling on G3 (train G1, G2): only `3,1` is within 0.90 of its best there,
    # last in the baseline's order, below the three others on G1 and G2 and below `4,1` in its
    # family; so a closed list reaches 1/1.2 at k=1 and k=2, one closed in family 1 at k=2
    assert "| kern | G3 | 1 / 1 | 4 / 4 | 3 / 3 | 1 / 1 |" in run.stdout
    assert "| kern | G3 | 2 | 0.833 | 1.000 | 0.833 | 0.833 |" in run.stdout
    assert "- above a ceiling: none" in run.stdout
    lists = json.loads(out.read_text())
    assert set(lists) == {"kern"} and set(lists["kern"]) == {"1", "2", "10"}
    # `4,1` is 0.9 of the best on every GPU: the robust single pick
    assert lists["kern"]["1"] == ["4,1"] and lists["kern"]["2"][0] == "4,1"


def test_bench_with_a_test_dir_scores_only_the_test_gpus(tmp_path):
    train = tiny_tree(tmp_path / "train")
    cache(tmp_path / "test" / "kern" / "NEW.json.gz", {"1,0": 1.0, "2,0": 2.0, "4,1": 2.0}, "NEW")
    run = bench(
        "--train",
        str(train),
        "--test",
        str(tmp_path / "test"),
        "--k",
        "1",
        "--peers",
        str(tmp_path / "none"),
    )
    assert run.returncode == 0, run.stderr
    assert "| kern | NEW | 1 | 0.500 | 0.500 |" in run.stdout


def test_bench_names_a_bad_file_and_exits_2(tmp_path):
    root = tiny_tree(tmp_path / "data")
    (root / "kern" / "BAD.json").write_text("")
    run = bench("--train", str(root), "--k", "1")
    assert run.returncode == 2 and "BAD.json: empty file" in run.stderr


def test_bench_skips_saying_so_without_the_data(tmp_path):
    run = bench("--train", str(tmp_path / "absent"))
    assert run.returncode == 0 and run.stdout.startswith("skipped: ")


@pytest.mark.slow
def test_bench_on_the_real_gpus_beats_the_baseline():
    if not REAL.is_dir():
        pytest.skip(f"no {REAL} (the real-GPU data lives in ../shared)")
    run = bench("--train", str(REAL), "--k", "1,10", "--goal", "--peers", "/nonexistent")
    assert run.returncode == 0, run.stderr
    assert "mlirtuna" in run.stdout and "BELOW" not in run.stdout


# --- quick-list --across (the farm's own multi-arch history) -----------------------------------


def tuned(db, sid: int, table: dict[str, dict[str, float]]) -> None:
    """Candidates recorded through the real queue: {test vector: {perf config: TFlops}}."""
    from mlirtuna import catalog, queue
    from mlirtuna.problems import parse
    from mlirtuna.queue import Claimant, jobs
    from mlirtuna.tuners.base import Candidate, TuneOutcome

    with db.session() as s:
        catalog.ensure_problems(s, "gemm", [parse("gemm", v) for v in table])
        ids = catalog.problem_ids(s, "gemm", table)
        catalog.tag_problems(s, f"x{sid}", dict.fromkeys(ids.values(), 0))
    jobs.load(db, sid, tag=f"x{sid}")
    while (lease := queue.claim(db, sid, Claimant("t", 0), 60)) is not None:
        with db.session() as s:
            tv = catalog.load_problem(s, lease.problem_id).canonical()
        cands = [Candidate(pc, 1e3 / tf, tf) for pc, tf in table[tv].items()]
        assert queue.record(db, lease, TuneOutcome(cands, max(cands, key=lambda c: c.tflops)))


def test_quick_list_across_arch_is_one_list_scored_leave_one_arch_out(db):
    from support.clitools import cli
    from support.results import gemm, new_session

    favourite = {"gfx90a": "v4:a", "gfx942": "v4:b", "gfx950": "v4:c"}
    ids = []
    for arch, fav in favourite.items():
        sid = new_session(db, arch=arch, arch_full=f"{arch}:sramecc+:xnack-")
        table = {
            gemm(m): {"v4:a": 5.0, "v4:b": 5.0, "v4:c": 5.0, fav: 10.0, "v4:r": 9.0}
            for m in (16, 32)
        }
        tuned(db, sid, table)
        ids.append(str(sid))
    url = db.url.render_as_string(False)
    r = cli(
        url,
        "quick-list",
        "--session",
        ",".join(ids),
        "--across",
        "arch",
        "--max-size",
        "2",
        "--json",
    )
    assert r.code == 0, r.stderr
    (got,) = r.json()["lists"]
    assert got["arch"] == "gfx90a+gfx942+gfx950" and got["problems"] == 6
    # the one config good everywhere first; each arch left out then gets 0.9 of its best
    assert got["perf_configs"][0] == "v4:r" and len(got["perf_configs"]) == 2
    loo = got["evaluation"]["leave_one_out"]
    assert loo == {a: pytest.approx(0.9) for a in favourite}
    assert "leave-one-arch-out geomean 0.9000" in r.stderr
    assert r.json()["across"] == "arch"
    for bad in (["--across", "gpu"], ["--across", "arch", "--top-k", "2"]):
        r = cli(url, "quick-list", "--session", ids[0], *bad)
        assert r.code == 2 and r.stderr.startswith("error:") and r.stderr.count("\n") == 1, bad


@pytest.mark.slow
def test_farm_bench_runs_at_smoke_size(tmp_path):
    env = dict(os.environ, PYTHONPATH=str(ROOT / "src"))
    run = subprocess.run(
        [
            sys.executable,
            str(BENCH / "bench_quick_farm.py"),
            "--smoke",
            "--ops",
            "conv",
            "--k",
            "1,2",
            "--peers",
            str(tmp_path / "none"),
            "--out",
            str(tmp_path / "f.md"),
        ],
        capture_output=True,
        text=True,
        timeout=600,
        env=env,
        check=False,
    )
    assert run.returncode == 0, run.stderr
    text = (tmp_path / "f.md").read_text()
    assert "| conv | f32 |" in text and "| all | 2 | 2 |" in text
    assert "quickTuningGen: not run: no " in text


def test_fusion_history_is_read_from_its_config_rows(db):
    """A fusion problem's test vector is its module's hash, which parse() cannot read: quick
    lists load it from its config row, so fusion sessions make lists too."""
    from support.results import new_session

    from mlirtuna import catalog, queue
    from mlirtuna.queue import Claimant, jobs
    from mlirtuna.tuners.base import Candidate, TuneOutcome

    module = ROOT / "tests" / "data" / "fusion" / "mixr-gemm" / "mixr-gemm-add.e2e.mlir"
    problem = catalog.read_problem(module)
    sid = new_session(db)
    with db.session() as s:
        ids, _ = catalog.ensure_problems(s, "fusion", [problem])
        catalog.tag_problems(s, "fz", dict.fromkeys(ids.values(), 0))
    jobs.load(db, sid, tag="fz")
    lease = queue.claim(db, sid, Claimant("t", 0), 60)
    cands = [Candidate("v4:a", 10.0, 2.0), Candidate("v4:b", 20.0, 1.0)]
    assert queue.record(db, lease, TuneOutcome(cands, cands[0]))
    (hist,) = quick.histories(db, [sid], "fusion")
    assert hist.group.op == "fusion"
    assert list(hist.perf.values()) == [{"v4:a": 2.0, "v4:b": 1.0}]
