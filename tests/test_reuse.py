"""Tune less: --skip-tuned / --reuse exactness, --changed-since rules, `session diff`."""

from __future__ import annotations

import sqlalchemy as sa
from support.clitools import cli
from support.results import gemm, new_session, put_results, tune

from mlirtuna import catalog
from mlirtuna.db.models import Job, Result
from mlirtuna.history import export, reuse, winners
from mlirtuna.problems import ExpandOptions
from mlirtuna.queue import jobs

FIVE = [gemm(m) for m in (16, 32, 48, 64, 80)]


def _import(db, tmp_path, vectors, tag="all5"):
    path = tmp_path / f"{tag}.txt"
    path.write_text("".join(v + "\n" for v in vectors))
    catalog.import_files(db, "gemm", [str(path)], ExpandOptions(expand=False), tag=tag)


def _rows(db, sid):
    with db.session() as s:
        return {
            r.problem_id: (r.perf_config, r.tflops, r.kernel_time, r.reused_from)
            for r in s.scalars(sa.select(Result).where(Result.session_id == sid))
        }


def test_skip_tuned_leaves_out_exactly_what_an_equivalent_session_tuned(db, tmp_path):
    a = new_session(db)
    tune(db, tmp_path, a, FIVE[:3], perf=lambda tv: "v4:" + tv.split(" -m ")[1].split()[0])
    _import(db, tmp_path, FIVE)
    b = new_session(db)
    report = reuse.load(db, b, skip_tuned=True, tag="all5")
    assert (report.added, report.skipped, report.reused) == (2, 3, 0)
    assert jobs.counts(db, b)[b]["new"] == 2
    # Loading again changes nothing (idempotent, the skipped stay skipped).
    again = reuse.load(db, b, skip_tuned=True, tag="all5")
    assert (again.added, again.existing, again.skipped) == (0, 2, 3)


def test_reuse_copies_results_exactly_and_marks_their_origin(db, tmp_path):
    a = new_session(db)
    tune(db, tmp_path, a, FIVE[:3], perf=lambda tv: "v4:" + tv.split(" -m ")[1].split()[0])
    _import(db, tmp_path, FIVE)
    b = new_session(db)
    report = reuse.load(db, b, skip_tuned=True, reuse=True, tag="all5")
    assert (report.added, report.skipped, report.reused, report.sources) == (2, 3, 3, {a: 3})
    src, got = _rows(db, a), _rows(db, b)
    assert set(got) == set(src)
    for pid, (pc, tf, ns, origin) in got.items():
        assert (pc, tf, ns) == src[pid][:3] and origin == a
    counts = jobs.counts(db, b)[b]
    assert (counts["completed"], counts["new"]) == (3, 2)
    assert {w.perf_config for w in winners.winners(db, b)} == {pc for pc, *_ in src.values()}
    # A third equivalent session reuses from b but names the session that really tuned them.
    c = new_session(db)
    third = reuse.load(db, c, skip_tuned=True, reuse=True, tag="all5")
    assert third.sources == {a: 3}
    assert {origin for *_, origin in _rows(db, c).values()} == {a}


def test_reused_results_make_the_export_complete(db, tmp_path):
    a = new_session(db)
    tune(db, tmp_path, a, FIVE)
    b = new_session(db, mlir_v="abc123")
    reuse.load(db, b, skip_tuned=True, reuse=True, tag="s" + str(a))
    out = tmp_path / "b.tsv"
    done = export.export(db, export.ExportQuery(sessions=(b,)), "v3", str(out))
    assert done.rows == 5


def test_only_equivalent_contexts_count(db, tmp_path):
    a = new_session(db)
    tune(db, tmp_path, a, FIVE)
    for other in (
        {"mlir_v": "def456"},
        {"num_cu": 80},
        {"num_chiplets": 1},
        {"space": "quick"},
        {"arch_full": "gfx942:sramecc-:xnack-"},
    ):
        b = new_session(db, **other)
        report = reuse.load(db, b, skip_tuned=True, tag=f"s{a}")
        assert (report.added, report.skipped) == (5, 0), other


def test_results_of_unfinished_jobs_do_not_count(db, tmp_path):
    a = new_session(db)
    tune(db, tmp_path, a, FIVE[:2])
    with db.session() as s:
        s.execute(sa.update(Job).where(Job.session_id == a).values(state="new"))
    b = new_session(db)
    assert reuse.load(db, b, skip_tuned=True, tag=f"s{a}").skipped == 0


def test_imported_tsv_results_count_as_rocmlir(db, tmp_path):
    a = new_session(db)
    with db.session() as s:
        s.execute(sa.text("UPDATE session SET tuner = 'imported' WHERE id = :i"), {"i": a})
    put_results(db, a, {v: ("v4:x", 1.0) for v in FIVE[:2]})
    b = new_session(db)
    with db.session() as s:
        s.execute(sa.text("UPDATE session SET tuner = 'rocmlir' WHERE id = :i"), {"i": b})
    _import(db, tmp_path, FIVE)
    assert reuse.load(db, b, skip_tuned=True, reuse=True, tag="all5").reused == 2


def test_changed_since_rules(db, tmp_path):
    old = new_session(db, mlir_v="old")
    fam = {16: "v2:a", 32: "v2:b", 48: "v4:c", 64: "v4:d", 80: "v2:e"}
    tune(db, tmp_path, old, FIVE, perf=lambda tv: fam[int(tv.split(" -m ")[1].split()[0])])
    # all: every problem the old session tuned.
    new = new_session(db, mlir_v="new")
    assert reuse.load(db, new, changed_since=old).added == 5
    # a sample of 2, reproducible with its seed.
    s1, s2 = new_session(db, mlir_v="new"), new_session(db, mlir_v="new")
    r1 = reuse.load(db, s1, changed_since=old, sample=2, seed=7)
    reuse.load(db, s2, changed_since=old, sample=2, seed=7)
    assert (r1.added, r1.skipped) == (2, 3)
    assert {j.problem_id for j in jobs.list_jobs(db, s1)} == {
        j.problem_id for j in jobs.list_jobs(db, s2)
    }
    # family-changed: the new commit's winners are v4, so the v2 winners are stale.
    fc = new_session(db, mlir_v="new")
    tuned_new = new_session(db, mlir_v="new")
    tune(db, tmp_path, tuned_new, [gemm(48)], perf=lambda tv: "v4:z")
    report = reuse.load(db, fc, changed_since=old, rule="family-changed", reuse=True)
    loaded = {j.test_vector for j in jobs.list_jobs(db, fc) if j.state == "new"}
    assert loaded == {gemm(16), gemm(32), gemm(80)}
    assert (report.skipped, report.reused) == (2, 2)


def test_family_changed_needs_a_winner_at_the_new_commit(db, tmp_path):
    old = new_session(db, mlir_v="old")
    tune(db, tmp_path, old, FIVE[:1])
    new = new_session(db, mlir_v="new")
    r = cli(db.url.render_as_string(False), "jobs", "load", "--session", str(new),
            "--changed-since", str(old), "--rule", "family-changed")  # fmt: skip
    assert r.code == 2 and "--sample" in r.stderr and r.stderr.count("\n") == 1


def test_perf_config_format():
    assert reuse.perf_config_format("v4:64,64,8") == "v4"
    assert reuse.perf_config_format("attn:v3:1,2") == "attn:v3"
    assert reuse.perf_config_format("64,64,8") == "v1"
    assert reuse.perf_config_format("gemm:mPerBlock=64,nPerBlock=32") == "gemm:named"
    assert reuse.perf_config_format("cpu:v1:32,32,32") == "cpu"


def test_session_diff(db, tmp_path):
    a = new_session(db, mlir_v="old")
    tune(db, tmp_path, a, FIVE, perf=lambda tv: "v2:x", ns=lambda tv: 2e5)
    b = new_session(db, mlir_v="new")
    tune(db, tmp_path, b, FIVE[:2], perf=lambda tv: "v4:y", ns=lambda tv: 1e5)
    d = reuse.diff(db, a, b)
    assert d.differences == {"mlir_v": ("old", "new")} and not d.equivalent
    assert (d.only_a, d.only_b, d.both, d.winners_changed) == (3, 0, 2, 2)
    assert len(d.to_retune) == 3 and abs(d.tflops_geomean - 2.0) < 1e-5
    assert d.families == {"a": {"v2": 5}, "b": {"v4": 2}}
    r = cli(db.url.render_as_string(False), "session", "diff", str(a), str(b), "--json")
    assert r.code == 0 and r.json()["to_retune"] == d.to_retune
    text = cli(db.url.render_as_string(False), "session", "diff", str(a), str(b))
    assert "winners changed: 2/2" in text.stdout and "mlir_v" in text.stdout


def test_cli_jobs_load_skip_tuned_reuse_and_bad_flags(db, tmp_path):
    url = db.url.render_as_string(False)
    a = new_session(db)
    tune(db, tmp_path, a, FIVE[:3])
    _import(db, tmp_path, FIVE)
    b = new_session(db)
    r = cli(url, "jobs", "load", "--session", str(b), "--tag", "all5", "--skip-tuned", "--reuse",
            "--json")  # fmt: skip
    assert r.code == 0, r.stderr
    assert {k: r.json()[k] for k in ("added", "skipped", "reused")} == {
        "added": 2,
        "skipped": 3,
        "reused": 3,
    }
    bad = cli(url, "jobs", "load", "--session", str(b), "--tag", "all5", "--reuse")
    assert bad.code == 2 and bad.stderr.startswith("error: --reuse")


def test_run_skip_tuned_reuse_exports_complete_without_tuning(db_url, tmp_path):
    from support.clitools import run_cli

    configs_ = tmp_path / "gemm-configs"
    configs_.write_text(
        "-t f32 -out_datatype f32 -transA false -transB false -g 1 -m 32 -n 32 -k 32\n"
        "-t f32 -out_datatype f32 -transA false -transB true -g 1 -m 16 -n 32 -k 16\n"
    )
    out = tmp_path / "tuning.tsv"
    args = ("run", "--op", "gemm", "--tuning-space", "quick", "-o", str(out), "--json")
    first = run_cli(db_url, *args, str(configs_), timeout=300)
    assert first.code == 0, first.stderr
    second = run_cli(db_url, *args, "--skip-tuned", "--reuse", str(configs_), timeout=300)
    assert second.code == 0, second.stderr
    summary = second.json()
    assert summary["counts"]["completed"] == 2 and summary["exported"] == 2
    before = {w["test_vector"]: (w["perf_config"], w["tflops"]) for w in first.json()["winners"]}
    after = {w["test_vector"]: (w["perf_config"], w["tflops"]) for w in summary["winners"]}
    assert after == before and all(w["candidates"] == 0 for w in summary["winners"])
