"""Every era of tuning DB: E1 legacy, E2, E2.5 (commit sections, ### errors), E3, E4
(split-K and fusion keys, named perf configs) and MITuna's export; import, compare and export
round-trips on every backend (fixtures in tests/data/eras, written from the reference and
rocMLIR's own test literals)."""

from __future__ import annotations

import pytest
import sqlalchemy as sa
from conftest import DATA
from support.clitools import cli
from support.perfrunner_reader import read_tuning_db

from mlirtuna import keys, problems
from mlirtuna.db.models import ERROR, Job, Problem, Result, TuningSession
from mlirtuna.errors import InputError
from mlirtuna.formats import tuningdb
from mlirtuna.history import compare, export, tsvimport
from mlirtuna.history.export import ExportQuery

ERAS = DATA / "eras"
A = "gfx942:sramecc+:xnack-"
G1 = "-t f16 -out_datatype f16 -transA false -transB false -g 1 -m 1024 -n 512 -k 768"
G2 = "-t f32 -out_datatype f32 -transA false -transB true -g 1 -m 256 -n 128 -k 64"
G3 = "-t f16 -out_datatype f16 -transA true -transB false -g 4 -m 64 -n 64 -k 4096"


def with_o(vector: str) -> str:
    """The newest canonical gemm string spells -transO."""
    return vector.replace(" -g ", " -transO false -g ", 1)


# --- pure: families and key forms ---------------------------------------------------------------


@pytest.mark.parametrize(
    ("perf_config", "family"),
    [
        ("128,128,8,64,64,4,1,1", "v1"),
        ("64,32,32,4,2,2", "v1"),
        ("v2:32,256,2,32,32,4,1,1,1", "v2"),
        ("v3:256,128,128,16,4,4,1,1,2", "v3"),
        ("v4:64,64,8,32,32,32,8,1,1,2,0,0,1,1", "v4"),
        ("attn:v1:32,32,64,2,32,32,32,4,1,1,1", "attn:v1"),
        ("attn:v3:32,32,64,2,32,32,32,4,1,1,2,0,1", "attn:v3"),
        ("gemm:v5:64,64,8,32,32,32,8,1,1,2,0,0,1,1,0", "gemm:v5"),
        ("attn:v6:1,2,3", "attn:v6"),
        ("gemm:mPerBlock=64,nPerBlock=64,kPerBlock=8", "gemm:named"),
        ("attn:mPerBlockG0=32,mPerBlockG1=32", "attn:named"),
        ("cpu:v1:64,64,32", "cpu"),
        ("cpu:attn:v1:64,64", "cpu"),
        ("None", ""),
        ("perf_best", "other"),
    ],
)
def test_perf_config_format(perf_config: str, family: str) -> None:
    assert keys.perf_config_format(perf_config) == family


def test_key_forms_split_and_match_as_perfrunner_does() -> None:
    plain = keys.split_key(G1)
    assert (plain.plain, plain.split_k, plain.form, plain.suffix) == (G1, None, "plain", "")
    flagged = keys.split_key(f"{G1} -supportsSplitK false")
    assert (flagged.plain, flagged.split_k, flagged.form) == (G1, False, "split-k")
    fused = keys.split_key(
        f"{G1} -inputFusions=add,relu -outputFusions=convert -supportsSplitK true"
    )
    assert fused.plain == G1 and fused.split_k is True and fused.form == "fusion"
    assert fused.suffix == "-inputFusions=add,relu -outputFusions=convert -supportsSplitK true"
    # A plain key is `true` for gemm and `false` for attention; fusion words are dropped.
    assert keys.match_key("gemm", f"{G1} -supportsSplitK true") == keys.match_key("gemm", G1)
    assert keys.match_key("gemm", f"{G1} -supportsSplitK false") != keys.match_key("gemm", G1)
    assert keys.match_key("attention", "-seq_len_q 8 -supportsSplitK false") == "-seq_len_q 8"
    guessed = problems.op_of_vector("-t f16 -seq_len_q 8 -supportsSplitK true")
    assert keys.match_key(guessed, "-t f16 -seq_len_q 8 -supportsSplitK true").endswith("true")
    assert (
        keys.match_key("gemm", fused.suffix.replace("true", "true") and f"{G1} {fused.suffix}")
        == G1
    )
    for bad in (f"{G1} -supportsSplitK", f"{G1} -supportsSplitK maybe"):
        with pytest.raises(InputError, match="supportsSplitK"):
            keys.split_key(bad)
    assert keys.with_form("gemm", G1, "", "split-k") == f"{G1} -supportsSplitK true"
    assert keys.with_form("attention", "-x 1", "", "split-k") == "-x 1 -supportsSplitK false"
    assert keys.with_form("gemm", G1, "-supportsSplitK false", "split-k").endswith("false")
    assert keys.with_form("gemm", G1, fused.suffix, "plain") == G1


def test_e25_sections_parse_with_their_commit_space_and_errors() -> None:
    parsed = tuningdb.read_tuning_db(ERAS / "e2.5-sections.tsv")
    assert parsed.kinds == {"e2.5"}
    assert [(h.tuning_space, len(h.columns)) for h in parsed.headers] == [
        ("quick", 5),
        ("greedy", 6),
    ]
    rows = [(r.test_vector, r.commit_id, r.tuning_space, r.num_chiplets) for r in parsed.rows]
    assert rows == [
        (G1, "1" * 40, "quick", None),
        (G2, "1" * 40, "quick", None),
        (G1, "2" * 40, "greedy", 8),
    ]
    assert [(e.lineno, e.commit_id, e.tuning_space) for e in parsed.errors] == [
        (4, "1" * 40, "quick"),
        (9, "2" * 40, "greedy"),
        (10, "2" * 40, "greedy"),
    ]
    assert parsed.errors[0].text.startswith("Tuning failed for '-t f16")


# --- import: every era ---------------------------------------------------------------------------


def sessions_of(db) -> list[TuningSession]:
    with db.session() as s:
        return list(s.scalars(sa.select(TuningSession).order_by(TuningSession.id)))


def results_of(db, session_id: int) -> dict[str, tuple[str, str, str]]:
    """canonical vector -> (perf config, family, key suffix)."""
    with db.session() as s:
        rows = s.execute(
            sa.select(
                Problem.test_vector, Result.perf_config, Result.perf_family, Result.key_suffix
            )
            .join(Problem, Problem.id == Result.problem_id)
            .where(Result.session_id == session_id)
        )
        return {tv: (pc, fam, suffix) for tv, pc, fam, suffix in rows}


FIXTURES = {
    # file: (sessions, results, skipped, families)
    "e1-legacy.tsv": (1, 2, 0, {"v1"}),
    "e2-tflops.tsv": (1, 2, 1, {"v2"}),
    "e2.5-sections.tsv": (2, 3, 0, {"v2", "v3", "v4"}),
    "e3.tsv": (1, 3, 0, {"v4"}),
    "e4-splitk.tsv": (1, 3, 0, {"gemm:named", "gemm:v5"}),
    "tuna.tsv": (1, 1, 0, {"v2"}),
}


@pytest.mark.parametrize("name", sorted(FIXTURES))
def test_every_era_imports_with_families(db, name: str) -> None:
    want_sessions, want_results, want_skipped, families = FIXTURES[name]
    fill = tsvimport.Fill(num_cu=110)  # only the legacy file lacks numCUs
    report = tsvimport.import_tsv(db, "gemm", [str(ERAS / name)], fill=fill)
    assert (len(report.sessions), report.results, report.skipped) == (
        want_sessions,
        want_results,
        want_skipped,
    )
    found = {fam for x in report.sessions for _, fam, _ in results_of(db, x.id).values()}
    assert found == families
    # The perf config string is stored exactly as the tool wrote it.
    text = (ERAS / name).read_text()
    written = {cell for line in text.splitlines() for cell in line.split("\t")}
    stored = {pc for x in report.sessions for pc, _, _ in results_of(db, x.id).values()}
    assert stored <= written


def test_e25_sections_are_sessions_and_errors_failed_jobs(db, db_url) -> None:
    run = cli(db_url, "import-tsv", "--op", "gemm", str(ERAS / "e2.5-sections.tsv"))
    assert run.code == 0, run.stderr
    assert "2 ### error lines kept as failed jobs" in run.stderr
    assert "e2.5-sections.tsv:10: ERROR: out of memory" in run.stderr  # names no config: said
    first, second = sessions_of(db)
    assert (first.mlir_v, first.tuning_space, first.num_chiplets) == ("1" * 40, "quick", 1)
    assert (second.mlir_v, second.tuning_space, second.num_chiplets) == ("2" * 40, "greedy", 8)
    assert set(results_of(db, first.id)) == {G1, G2}
    assert set(results_of(db, second.id)) == {G1}
    with db.session() as s:
        failed = s.execute(
            sa.select(Job.session_id, Problem.test_vector, Job.state, Job.result).join(
                Problem, Problem.id == Job.problem_id
            )
        ).all()
    assert sorted(failed) == sorted(
        [
            (first.id, G3, ERROR, f"Tuning failed for '{G3}': rocmlir-tuning-driver exited with 1"),
            (second.id, G2, ERROR, f"Verification failed for '{G2}': [0 0 0]"),
        ]
    )
    # The failed jobs are the session's errors, as `jobs list` and `wait` see them.
    listed = cli(db_url, "jobs", "list", "--session", str(first.id), "--state", "error", "--json")
    assert listed.code == 0 and len(listed.json()) == 1


def test_e4_keys_keep_their_form_and_export_writes_either(db, tmp_path) -> None:
    (x,) = tsvimport.import_tsv(db, "gemm", [str(ERAS / "e4-splitk.tsv")]).sessions
    assert x.key_form == "e4-split-k"  # gemm keys spell -transO and end -supportsSplitK
    stored = results_of(db, x.id)  # one gemm problem: `-transO false` is the default
    assert {tv: suffix for tv, (_, _, suffix) in stored.items()} == {
        G1: "-supportsSplitK true",
        G2: "-supportsSplitK false",
        G3: "-inputFusions=add,relu -outputFusions=convert -supportsSplitK true",
    }
    # Default: the session's form; perfRunner (PR #2248 reader) finds every key.
    out = tmp_path / "new.tsv"
    export.export(db, ExportQuery(sessions=(x.id,)), "v3", str(out))
    found = read_tuning_db(str(out))
    assert set(found) == {
        (A, 304, 8, f"{with_o(G1)} -supportsSplitK true"),
        (A, 304, 8, f"{with_o(G2)} -supportsSplitK false"),
        (A, 304, 8, f"{with_o(G3)} -supportsSplitK true"),  # fusion words stripped, as perfRunner
    }
    # For an older perfRunner: plain keys, whose gemm parser has no -transO.
    old = tmp_path / "old.tsv"
    export.export(db, ExportQuery(sessions=(x.id,), key_format="plain"), "v2", str(old))
    assert {k[3] for k in read_tuning_db(str(old))} == {G1, G2, G3}
    # ... which the E2-era perfRunner reader (key (arch, config)) finds too.
    assert set(read_tuning_db(str(old), version="00267dbf")) == {(A, G1), (A, G2), (A, G3)}


def test_plain_session_exports_split_k_keys_on_request(db, tmp_path) -> None:
    (x,) = tsvimport.import_tsv(db, "gemm", [str(ERAS / "e3.tsv")]).sessions
    assert x.key_form == "e4"  # its gemm keys spell -transO false, no -supportsSplitK
    out = tmp_path / "for-newest.tsv"
    export.export(db, ExportQuery(sessions=(x.id,), key_format="split-k"), "v3", str(out))
    assert all(k[3].endswith(" -supportsSplitK true") for k in read_tuning_db(str(out)))


def test_compare_old_format_against_new_format(db) -> None:
    old, new = compare.load_sides(
        str(ERAS / "e3.tsv"), str(ERAS / "e4-splitk.tsv"), "gemm", lambda: db
    )
    result = compare.compare(old, new)
    # G1 plain == -supportsSplitK true; G3's fusion words are dropped; G2 `false` is another
    # tuning than the plain (true) key: not matched.
    assert (result.common, result.only_a, result.only_b) == (2, 1, 1)
    assert result.geomean_ratio == pytest.approx(((66.0 / 60.0) * (21.0 / 20.0)) ** 0.5)
    # The same through sessions, and without --op (the op read off the vector).
    a = tsvimport.import_tsv(db, "gemm", [str(ERAS / "e3.tsv")]).sessions[0].id
    b = tsvimport.import_tsv(db, "gemm", [str(ERAS / "e4-splitk.tsv")]).sessions[0].id
    by_session = compare.compare(*compare.load_sides(str(a), str(b), None, lambda: db))
    assert (by_session.common, by_session.only_a, by_session.only_b) == (2, 1, 1)
    no_op = compare.compare(
        *compare.load_sides(str(ERAS / "e3.tsv"), str(ERAS / "e4-splitk.tsv"), None, lambda: db)
    )
    assert no_op.common == 2


@pytest.mark.parametrize("name", sorted(FIXTURES))
@pytest.mark.parametrize("fmt", ["v3", "v2"])
def test_every_era_round_trips(db, tmp_path, name: str, fmt: str) -> None:
    """import -> export -> import again: the same winners under the same keys."""
    fill = tsvimport.Fill(num_cu=110)
    report = tsvimport.import_tsv(db, "gemm", [str(ERAS / name)], fill=fill)
    for x in report.sessions:
        out = tmp_path / f"{x.id}.tsv"
        export.export(db, ExportQuery(sessions=(x.id,)), fmt, str(out))
        (again,) = tsvimport.import_tsv(db, "gemm", [str(out)], fill=fill).sessions
        assert results_of(db, again.id) == {
            tv: (pc, fam, without_fusions(suffix))
            for tv, (pc, fam, suffix) in results_of(db, x.id).items()
        }
        assert again.key_form == x.key_form
        side = compare.compare(*compare.load_sides(str(x.id), str(out), "gemm", lambda: db))
        assert side.common == side.same_winner == x.results and not side.only_a + side.only_b


def without_fusions(suffix: str) -> str:
    """Fusion words are not exported (perfRunner drops them); the split-K flag is."""
    key = keys.split_key(suffix)
    return keys.Key("", key.split_k, "").suffix


def test_bad_key_format_is_one_line(db_url) -> None:
    run = cli(db_url, "export", "--arch", "gfx942", "--key-format", "fancy", "-o", "-")
    assert run.code == 2 and run.stderr.strip() == (
        "error: unknown key format 'fancy' (known: plain, split-k, e4, e4-split-k)"
    )


def test_upgrade_in_place_fills_families_and_key_forms(empty_db_url) -> None:
    """A database of the schema before this revision, with results, upgrades in place."""
    from mlirtuna import migrations
    from mlirtuna.db import Database, utcnow

    db = Database(empty_db_url, check_schema=False)
    migrations.upgrade(db.engine, "0001")
    now = utcnow()
    with db.engine.begin() as conn:
        conn.execute(
            sa.text(
                "INSERT INTO session (id, arch, arch_full, num_cu, num_chiplets, tuning_space,"
                " tuner, created_at) VALUES (1, 'gfx942', :a, 304, 8, 'full', 'imported', :t)"
            ),
            {"a": A, "t": now},
        )
        conn.execute(
            sa.text(
                "INSERT INTO problem (id, op, test_vector, created_at) VALUES (1, 'gemm', :v, :t)"
            ),
            {"v": G1, "t": now},
        )
        conn.execute(
            sa.text(
                "INSERT INTO result (session_id, problem_id, perf_config)"
                " VALUES (1, 1, 'v4:64,64,8,32,32,32,8,1,1,2,0,0,1,1')"
            )
        )
    db.upgrade()
    with db.session() as s:
        assert s.scalars(sa.select(Result.perf_family)).one() == "v4"
        assert s.scalars(sa.select(Result.key_suffix)).one() == ""
        assert s.scalars(sa.select(TuningSession.key_form)).one() == "plain"
    db.dispose()


def test_attention_plain_key_is_split_k_false(db, tmp_path) -> None:
    """For attention a key without the flag means `-supportsSplitK false` (its kernels never
    split K): the E3 row and the E4 row are the same problem, compared and exported so."""
    old, new = (str(ERAS / n) for n in ("e3-attention.tsv", "e4-attention.tsv"))
    result = compare.compare(*compare.load_sides(old, new, "attention", lambda: db))
    assert (result.common, result.only_a, result.only_b) == (1, 0, 0)
    assert result.geomean_ratio == pytest.approx(99.0 / 90.0)
    (x,) = tsvimport.import_tsv(db, "attention", [new]).sessions
    assert x.key_form == "split-k"
    ((_, family, suffix),) = results_of(db, x.id).values()
    assert (family, suffix) == ("attn:named", "-supportsSplitK false")
    (y,) = tsvimport.import_tsv(db, "attention", [old]).sessions
    out = tmp_path / "attn.tsv"
    export.export(db, ExportQuery(sessions=(y.id,), key_format="split-k"), "v3", str(out))
    ((key, perf),) = ((k[3], v) for k, v in read_tuning_db(str(out)).items())
    assert key.endswith("-transBias false -supportsSplitK false")
    assert perf == "attn:v3:64,64,64,8,32,32,32,4,1,1,2,0,1"
