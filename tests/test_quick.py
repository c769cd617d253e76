"""Quick-tuning lists: set-cover optimality against brute force, top-k, k-fold evaluation, the
QuickTuningPerfconfigs.inc layout, stored lists and the `list:NAME` tuning space end to end."""

from __future__ import annotations

import itertools
import json
import random
import re

import pytest
from support.clitools import cli
from support.results import gemm, new_session

from mlirtuna import catalog, sessions
from mlirtuna.db.models import Candidate
from mlirtuna.errors import UserError
from mlirtuna.history import quick
from mlirtuna.history.quick import cover as quick_cover
from mlirtuna.problems import ExpandOptions, parse
from mlirtuna.queue import jobs
from mlirtuna.sessions import SessionSpec
from mlirtuna.tuners.base import TuneContext
from mlirtuna.tuners.cpu import CpuTuner
from mlirtuna.worker import Worker, WorkerSettings

# --- set cover ----------------------------------------------------------------------------------


def brute_force(covers: dict[int, set[str]], max_size: int | None = None) -> int:
    """Without max_size: the size of a smallest cover; with it: the most problems covered."""
    configs_ = sorted(set().union(*covers.values()))
    if max_size is None:
        for k in range(len(configs_) + 1):
            for combo in itertools.combinations(configs_, k):
                if all(c & set(combo) for c in covers.values()):
                    return k
        raise AssertionError("no cover")
    return max(
        sum(bool(c & set(combo)) for c in covers.values())
        for k in range(max_size + 1)
        for combo in itertools.combinations(configs_, k)
    )


def random_instance(rng: random.Random) -> dict[int, set[str]]:
    names = [f"c{i}" for i in range(rng.randint(3, 9))]
    return {
        p: set(rng.sample(names, rng.randint(1, max(1, len(names) // 2))))
        for p in range(rng.randint(2, 12))
    }


HAND_MADE = [
    # Greedy takes c-big (covers 4) and then needs two more; the optimum is c-left + c-right.
    {
        1: {"big", "left"},
        2: {"big", "left"},
        3: {"left"},
        4: {"big", "right"},
        5: {"big", "right"},
        6: {"right"},
    },
    {1: {"a"}, 2: {"b"}, 3: {"c"}},
    {1: {"a", "b", "c"}, 2: {"a", "b", "c"}},
    {1: {"x", "y"}, 2: {"y", "z"}, 3: {"z", "x"}},
]


@pytest.mark.parametrize("covers", HAND_MADE)
def test_set_cover_is_minimal_on_hand_made_cases(covers):
    cover = quick.set_cover(covers)
    assert len(cover.configs) == brute_force(covers) and cover.uncovered == []
    assert all(c & set(cover.configs) for c in covers.values())
    assert "ilp" in cover.method and "optimal" in cover.method


def test_set_cover_beats_greedy_where_greedy_is_wrong():
    covers = HAND_MADE[0]
    assert set(quick.set_cover(covers).configs) == {"left", "right"}
    assert len(quick.greedy(covers, quick.columns(covers), None)) == 3


def test_set_cover_is_minimal_on_random_cases_against_brute_force():
    rng = random.Random(15)
    for _ in range(25):
        covers = random_instance(rng)
        cover = quick.set_cover(covers)
        assert len(cover.configs) == brute_force(covers), covers
        assert all(c & set(cover.configs) for c in covers.values())


def test_max_size_covers_the_most_problems_and_lists_the_rest():
    rng = random.Random(7)
    for _ in range(15):
        covers = random_instance(rng)
        for k in (1, 2):
            cover = quick.set_cover(covers, max_size=k)
            assert len(cover.configs) <= k
            assert len(covers) - len(cover.uncovered) == brute_force(covers, k), covers


def test_problem_nothing_covers_is_listed():
    cover = quick.set_cover({1: {"a"}, 2: set()})
    assert cover.configs == ["a"] and cover.uncovered == [2]


def test_very_large_instances_fall_back_to_greedy_and_say_so(monkeypatch):
    monkeypatch.setattr(quick_cover, "GREEDY_ABOVE", 3)  # the module that reads it
    cover = quick.set_cover(HAND_MADE[0])
    assert cover.method.startswith("greedy") and "too large" in cover.method


# --- history, top-k, evaluation -----------------------------------------------------------------


def hist(perf: dict[int, dict[str, float]]) -> quick.History:
    return quick.History(quick.Group("gfx942", "gemm", "f16"), perf, {p: f"p{p}" for p in perf})


def test_coverage_uses_the_threshold():
    h = hist({1: {"a": 10.0, "b": 9.4, "c": 9.0}, 2: {"a": 5.0, "c": 10.0}})
    assert h.covers([1, 2], 0.93) == {1: {"a", "b"}, 2: {"c"}}
    assert h.covers([1, 2], 0.9) == {1: {"a", "b", "c"}, 2: {"c"}}
    opts = quick.Options(threshold=0.9)
    configs_, _, method = quick.build_one(h, [1, 2], opts)
    assert configs_ == ["c"] and "0.9" in method


def test_top_k_per_problem():
    h = hist({1: {"a": 3.0, "b": 2.0, "c": 1.0}, 2: {"c": 3.0, "b": 2.0, "a": 0.5}})
    assert quick.top_k(h, [1, 2], 1) == ["a", "c"]
    assert quick.top_k(h, [1, 2], 2) == ["b", "a", "c"]


def test_kfold_evaluation_scores_held_out_problems_against_their_best():
    # Two kinds of problem: "a" wins on even ones, "b" on odd; both kinds are in every fold.
    perf = {p: {"a": 10.0 if p % 2 == 0 else 5.0, "b": 10.0 if p % 2 else 6.0} for p in range(20)}
    ev = quick.k_fold(hist(perf), quick.Options(), folds=4)
    assert ev["held_out"] == 20 and ev["coverage_all"] == 1.0
    assert ev["ratio_geomean"] == pytest.approx(1.0) and ev["ratio_min"] == 1.0
    assert ev["coverage_at"][2] == 1.0 and ev["regret_at"][2] == 0.0
    assert ev["regret_at"][1] > 0  # one config alone is not enough for both kinds
    # A problem whose winner no training problem shares: held out, its ratio shows the loss.
    perf[99] = {"z": 10.0, "a": 2.0, "b": 1.0}
    ev = quick.k_fold(hist(perf), quick.Options(), folds=3)
    assert ev["ratio_min"] == pytest.approx(0.2)


# --- the .inc layout ------------------------------------------------------------------------------


def gl(arch, op, dtype, pcs):
    return quick.GroupList(quick.Group(arch, op, dtype), pcs, 3, [], "set cover")


def test_inc_layout_matches_quick_tuning_gen():
    text = quick.render_inc(
        [
            gl("gfx942", "gemm", "f16", ["v2:1,2", "v2:3,4"]),
            gl("gfx1201", "conv", "f32", ["v2:5"]),
            gl("gfx942", "attention", "bf16", ["attn:v3:1"]),
        ]
    )
    assert text.startswith("// Generated by: mlirtuna quick-list\n\n// clang-format off\n\n")
    assert (
        "#ifdef XDL_DEFINITIONS_GEN\n\n"
        "// BEGIN_GEMM_XDL_f16_gfx942_DEFS\n"
        "const StringRef PopulateParamsXDL::initParametersF16GemmGfx942[] = {\n"
        '    "v2:1,2",\n'
        '    "v2:3,4"\n'
        "};\n"
        "// END_GEMM_XDL_f16_gfx942_DEFS\n\n"
        "#endif  // XDL_DEFINITIONS_GEN\n"
    ) in text
    assert (
        "#ifdef XDL_DECLARATIONS_GEN\n\n"
        "// BEGIN_GEMM_XDL_f16_gfx942_DECS\n"
        "static constexpr size_t nInitParametersF16GemmGfx942 = 2;\n"
        "static const StringRef initParametersF16GemmGfx942[nInitParametersF16GemmGfx942];\n"
        "// END_GEMM_XDL_f16_gfx942_DECS\n\n"
        "#endif  // XDL_DECLARATIONS_GEN\n"
    ) in text
    # gfx1 f32 is not accelerated; attention is GemmGemm.
    assert "// BEGIN_CONV_NonAccel_f32_gfx1201_DEFS\n" in text
    assert "const StringRef PopulateParams::initParametersF32ConvGfx1201[] = {" in text
    assert "// BEGIN_ATTENTION_GemmGemm_bf16_gfx942_DEFS" in text
    assert (
        "#ifdef Accel_LOOKUP_TABLE_GEN\n\n"
        '{"gfx942_gemm_f16", {PopulateParamsXDL::initParametersF16GemmGfx942, '
        "PopulateParamsXDL::nInitParametersF16GemmGfx942}},\n\n"
        "#endif  // Accel_LOOKUP_TABLE_GEN\n"
    ) in text
    assert '{"gfx1201_conv_f32", {PopulateParams::initParametersF32ConvGfx1201, ' in text
    assert '{"gfx942_attention_bf16", {PopulateParamsGemmGemm::' in text
    sections = re.findall(r"#ifdef (\w+)\n", text)
    assert sections == [
        "NonAccel_DEFINITIONS_GEN", "NonAccel_DECLARATIONS_GEN", "XDL_DEFINITIONS_GEN",
        "XDL_DECLARATIONS_GEN", "Wmma_DEFINITIONS_GEN", "Wmma_DECLARATIONS_GEN",
        "GemmGemm_DEFINITIONS_GEN", "GemmGemm_DECLARATIONS_GEN", "NonAccel_LOOKUP_TABLE_GEN",
        "Accel_LOOKUP_TABLE_GEN", "GemmGemm_LOOKUP_TABLE_GEN",
    ]  # fmt: skip
    assert text.endswith("#endif  // GemmGemm_LOOKUP_TABLE_GEN\n")


def test_inc_update_replaces_a_group_in_place_and_keeps_the_others():
    first = quick.render_inc(
        [gl("gfx942", "gemm", "f16", ["v2:old"]), gl("gfx942", "gemm", "i8", ["v2:i8"])]
    )
    second = quick.render_inc([gl("gfx942", "gemm", "f16", ["v2:new", "v2:new2"])], first)
    assert "v2:old" not in second and '"v2:new",\n    "v2:new2"\n' in second
    assert "nInitParametersF16GemmGfx942 = 2;" in second and '"v2:i8"' in second
    assert second.count('{"gfx942_gemm_f16"') == 1 and second.count('{"gfx942_gemm_i8"') == 1
    assert quick.render_inc([gl("gfx942", "gemm", "f16", ["v2:new", "v2:new2"])], second) == second
    with pytest.raises(UserError):
        quick.render_inc([gl("gfx942", "gemm", "f16", ["x"])], "// not an inc file\n")


# --- from the database --------------------------------------------------------------------------


def _candidates(db, sid, table: dict[str, dict[str, float]]):
    """Candidates as a tuner records them: {test vector: {perf config: tflops}} via real jobs."""
    from mlirtuna import queue
    from mlirtuna.queue import Claimant
    from mlirtuna.tuners.base import Candidate as Cand
    from mlirtuna.tuners.base import TuneOutcome

    with db.session() as s:
        catalog.ensure_problems(s, "gemm", [parse("gemm", v) for v in table])
    path_tag = f"q{sid}"
    with db.session() as s:
        ids = catalog.problem_ids(s, "gemm", table)
        catalog.tag_problems(s, path_tag, dict.fromkeys(ids.values(), 0))
    jobs.load(db, sid, tag=path_tag)
    while (lease := queue.claim(db, sid, Claimant("t", 0), 60)) is not None:
        with db.session() as s:
            tv = catalog.load_problem(s, lease.problem_id).canonical()
        cands = [Cand(pc, 1e3 / tf, tf) for pc, tf in table[tv].items()]
        assert queue.record(db, lease, TuneOutcome(cands, max(cands, key=lambda c: c.tflops)))


def test_quick_list_from_sessions_json_inc_and_stored(db, tmp_path):
    sid = new_session(db)
    table = {
        gemm(16): {"v4:a": 10.0, "v4:b": 9.5, "v4:c": 1.0},
        gemm(32): {"v4:a": 2.0, "v4:b": 9.4, "v4:c": 10.0},
        gemm(48): {"v4:a": 5.0, "v4:c": 10.0},
        gemm(64, t="f16"): {"v4:h": 1.0},
    }
    _candidates(db, sid, table)
    url = db.url.render_as_string(False)
    out = tmp_path / "q.json"
    r = cli(url, "quick-list", "--session", str(sid), "--name", "farm", "-o", str(out))
    assert r.code == 0, r.stderr
    data = json.loads(out.read_text())
    lists = {(x["data_type"]): x for x in data["lists"]}
    # 16 needs a or b, 48 needs c (32 takes b or c): two configs, c first (it covers two).
    pcs = lists["f32"]["perf_configs"]
    assert len(pcs) == 2 and pcs[0] == "v4:c" and lists["f32"]["uncovered"] == []
    assert lists["f16"]["perf_configs"] == ["v4:h"]
    inc = tmp_path / "QuickTuningPerfconfigs.inc"
    r = cli(url, "quick-list", "--session", str(sid), "--threshold", "0.9", "-o", str(inc))
    assert r.code == 0 and "initParametersF32GemmGfx942" in inc.read_text()
    stored = sessions.load_quick_list(db, "farm", "gfx942")
    assert stored[("gemm", "f16")] == ("v4:h",)
    listing = cli(url, "quick-list", "--stored", "--format", "json")
    assert {(x["name"], x["data_type"]) for x in listing.json()} == {
        ("farm", "f16"),
        ("farm", "f32"),
    }


def test_quick_list_bad_input_is_one_line(db, tmp_path):
    url = db.url.render_as_string(False)
    sid = new_session(db)
    for args in (
        ["--session", str(sid)],  # nothing measured
        ["--session", "x"],
        ["--session", str(sid), "--threshold", "1.5"],
        ["--session", str(sid), "--top-k", "2", "--max-size", "3"],
        ["--session", str(sid), "--format", "yaml"],
    ):
        r = cli(url, "quick-list", *args)
        assert r.code == 2 and r.stderr.startswith("error:") and r.stderr.count("\n") == 1, args


def test_a_list_session_needs_a_stored_list(db):
    with pytest.raises(UserError, match="no quick list 'nope'"):
        sessions.create(db, SessionSpec(tuner="cpu", tuning_space="list:nope"))
    with pytest.raises(UserError, match="bad quick list name"):
        sessions.create(db, SessionSpec(tuner="cpu", tuning_space="list:a b"))


def test_cpu_tuner_runs_exactly_the_listed_candidates_clipped():
    p = parse("gemm", "-t f32 -transA false -transB false -g 1 -m 40 -n 24 -k 64")
    listed = ("cpu:v1:32,16,64", "cpu:v1:256,256,256", "cpu:v1:64,64,1024", "v4:foreign")
    ctx = TuneContext("cpu", "cpu", 2, 1, "list:x", gpu_id=-1, perf_configs=listed)
    out = CpuTuner(repeats=1).tune(p, ctx)
    # 256,256,256 and 64,64,1024 both clip to 40,24,64: one tiling, measured once.
    assert [c.perf_config for c in out.candidates] == ["cpu:v1:32,16,64", "cpu:v1:40,24,64"]


def test_list_session_end_to_end_with_the_cpu_worker(db, tmp_path):
    vectors = [gemm(m, n=24, k=40) for m in (24, 40, 56)]
    path = tmp_path / "g.txt"
    path.write_text("".join(v + "\n" for v in vectors))
    catalog.import_files(db, "gemm", [str(path)], ExpandOptions(expand=False), tag="g")
    full = sessions.create(db, SessionSpec(tuner="cpu", tuning_space="full"))
    jobs.load(db, full.id, tag="g")
    settings = WorkerSettings(session_id=full.id, until_empty=True)
    Worker(db, settings, CpuTuner(repeats=1)).run()
    lists = quick.build(quick.histories(db, [full.id]), quick.Options(threshold=0.8))
    quick.save(db, "mine", lists, [full.id])
    listed = sessions.create(db, SessionSpec(tuner="cpu", tuning_space="list:mine"))
    jobs.load(db, listed.id, tag="g")
    Worker(db, WorkerSettings(session_id=listed.id, until_empty=True),
           CpuTuner(repeats=1)).run()  # fmt: skip
    assert jobs.counts(db, listed.id)[listed.id]["completed"] == 3
    names = set(lists[0].perf_configs)
    with db.session() as s:
        import sqlalchemy as sa

        tried = s.execute(
            sa.select(Candidate.problem_id, Candidate.perf_config).where(
                Candidate.session_id == listed.id
            )
        ).all()
    problems = {pid: parse("gemm", tv) for pid, tv in _vectors(db).items()}
    from mlirtuna.tuners.cpu import resolver

    for pid, pc in tried:
        assert pc in {resolver(problems[pid])(n) for n in names}
    per_problem = len(tried) / 3
    assert per_problem <= len(names)


def _vectors(db) -> dict[int, str]:
    import sqlalchemy as sa

    from mlirtuna.db.models import Problem

    with db.session() as s:
        return dict(s.execute(sa.select(Problem.id, Problem.test_vector)).all())


def test_cpu_names_are_portable_grid_values():
    from mlirtuna.tuners.cpu import portable, resolver

    p = parse("gemm", "-t f32 -transA false -transB false -g 1 -m 40 -n 24 -k 100")
    names = portable(p)("cpu:v1:40,16,64")
    assert names == [f"cpu:v1:{m},16,64" for m in (64, 128, 256, 512)]
    assert {resolver(p)(n) for n in names} == {"cpu:v1:40,16,64"}
    assert portable(p)("v4:1,2,3") == ["v4:1,2,3"]


def test_the_kind_that_owns_a_perf_config_says_what_a_listed_name_means():
    """quick lists ask the registry by family (TunerKind.listed), never the cpu tuner itself."""
    from mlirtuna.tuners import registry

    p = parse("gemm", "-t f32 -transA false -transB false -g 1 -m 40 -n 24 -k 100")
    cpu = registry.listed_on(p, registry.tuner_of("cpu:v1:40,16,64"))
    assert cpu.expand("cpu:v1:40,16,64") == [f"cpu:v1:{m},16,64" for m in (64, 128, 256, 512)]
    assert cpu.resolve("cpu:v1:256,16,64") == "cpu:v1:40,16,64"
    rocmlir = registry.listed_on(p, registry.tuner_of("v4:1,2,3"))
    assert rocmlir is registry.AS_IS
    assert (rocmlir.resolve("v4:1,2,3"), rocmlir.expand("v4:1,2,3")) == ("v4:1,2,3", ["v4:1,2,3"])
    assert registry.listed_on(p, "no-such-family") is registry.AS_IS


def test_one_problem_on_two_chips_is_two_groups_and_stdout_stays_clean(db, tmp_path):
    from support.clitools import run_cli

    a = new_session(db)
    b = new_session(db, arch="gfx90a", arch_full="gfx90a:sramecc+:xnack-", num_cu=104)
    _candidates(db, a, {gemm(16): {"v4:a": 1.0, "v4:b": 2.0}})
    _candidates(db, b, {gemm(16): {"v4:a": 2.0, "v4:b": 1.0}})
    hists = quick.histories(db, [a, b])
    assert [(h.group.arch, list(h.perf[next(iter(h.perf))])) for h in hists] == [
        ("gfx90a", ["v4:a", "v4:b"]),
        ("gfx942", ["v4:a", "v4:b"]),
    ]
    r = run_cli(db.url.render_as_string(False), "quick-list", "--session", f"{a},{b}", "--json")
    assert r.code == 0, r.stderr
    lists = {x["arch"]: x["perf_configs"] for x in json.loads(r.stdout)["lists"]}
    assert lists == {"gfx90a": ["v4:a"], "gfx942": ["v4:b"]}


def test_lists_learn_from_search_pass_times_not_the_top_k_re_measurement(db):
    """A re-measured candidate keeps its search-pass time (candidate.search_time); collect
    reads every candidate at that time and skips the session's winner row (re-measured)."""
    import sqlalchemy as sa

    from mlirtuna import queue
    from mlirtuna.queue import Claimant
    from mlirtuna.tuners.base import Candidate as Cand
    from mlirtuna.tuners.base import TuneOutcome

    sid = new_session(db)
    with db.session() as s:
        catalog.ensure_problems(s, "gemm", [parse("gemm", gemm(16))])
        ids = catalog.problem_ids(s, "gemm", [gemm(16)])
        catalog.tag_problems(s, "st", dict.fromkeys(ids.values(), 0))
    jobs.load(db, sid, tag="st")
    lease = queue.claim(db, sid, Claimant("t", 0), 60)
    once = Cand("v4:a", 100.0, 10.0)  # search pass only
    # Re-measured faster (12.5 TFlops) than its search pass (8 TFlops at 125 ns).
    again = Cand("v4:b", 80.0, 12.5, remeasured=True, search_time_ns=125.0)
    assert queue.record(db, lease, TuneOutcome([once, again], again))
    with db.session() as s:
        stored = dict(s.execute(sa.select(Candidate.perf_config, Candidate.search_time)).all())
    assert stored == {"v4:a": 100.0, "v4:b": 125.0}
    (hist,) = quick.histories(db, [sid])
    assert {pc: round(tf, 6) for pc, tf in next(iter(hist.perf.values())).items()} == {
        "v4:a": 10.0,
        "v4:b": 8.0,
    }


def test_the_cpu_tuner_keeps_the_search_pass_time_of_what_it_re_measures():
    p = parse("gemm", "-t f32 -transA false -transB false -g 1 -m 40 -n 24 -k 64")
    ctx = TuneContext("cpu", "cpu", 2, 1, "quick", gpu_id=-1, topk=3)
    out = CpuTuner(repeats=1).tune(p, ctx)
    again = [c for c in out.candidates if c.remeasured]
    assert len(again) >= 2
    assert all(c.search_time_ns and c.search_time_ns > 0 for c in again)
    assert all(c.search_time_ns is None for c in out.candidates if not c.remeasured)
