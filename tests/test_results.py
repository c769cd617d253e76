"""The winners table of a session (`mlirtuna results`)."""

from __future__ import annotations

import csv
import io

import sqlalchemy as sa
from support.clitools import cli
from support.results import gemm, m_of, new_session, put_results, tune

from mlirtuna.db.models import COMPLETED, NEW, Job, Problem
from mlirtuna.formats.csvcells import read_cell
from mlirtuna.history import winners
from mlirtuna.problems import parse


def test_winners_of_the_real_path_with_candidate_counts(db, tmp_path):
    sid = new_session(db)
    tune(db, tmp_path, sid, [gemm(m) for m in (64, 128, 256)], perf=m_of)
    rows = winners.winners(db, sid)
    assert [r.test_vector for r in rows] == sorted(gemm(m) for m in (64, 128, 256))
    for r in rows:
        assert r.op == "gemm" and r.candidates == 2 and r.kernel_time == 1e5
        assert r.perf_config == m_of(r.test_vector)
        # Relative 1e-5: the schema's Float is FLOAT on MariaDB, read back with 6 digits.
        expected = parse("gemm", r.test_vector).flops() / 1e5 / 1e3
        assert abs(r.tflops / expected - 1) < 1e-5


def test_winners_is_one_query_whatever_the_row_count(db, tmp_path):
    sid = new_session(db)
    tune(db, tmp_path, sid, [gemm(m) for m in range(1, 31)])
    statements: list[str] = []

    def count(conn, cursor, statement, *args):
        statements.append(statement)

    sa.event.listen(db.engine, "before_cursor_execute", count)
    try:
        assert len(winners.winners(db, sid)) == 30
    finally:
        sa.event.remove(db.engine, "before_cursor_execute", count)
    selects = [x for x in statements if x.lstrip().upper().startswith("SELECT")]
    assert len(selects) == 2  # the session check and the winners with their counts


def test_imported_results_count_zero_candidates_and_op_filter(db):
    sid = new_session(db)
    put_results(db, sid, {gemm(8): ("pc", 1.0)})
    (row,) = winners.winners(db, sid, op="gemm")
    assert row.candidates == 0 and row.kernel_time is None
    assert winners.winners(db, sid, op="conv") == []


def test_a_requeued_job_hides_its_winner_until_it_completes_again(db, db_url, tmp_path):
    """One winners rule (winners.counted) for `results` as for export: a job put back to new
    by a requeue is being redone, its old result is not a winner meanwhile."""
    sid = new_session(db)
    tune(db, tmp_path, sid, [gemm(64), gemm(128)])
    with db.session() as s:
        job_id, vector = s.execute(
            sa.select(Job.id, Problem.test_vector)
            .join(Problem, Problem.id == Job.problem_id)
            .where(Job.session_id == sid)
            .order_by(Job.id)
            .limit(1)
        ).one()
        s.execute(sa.update(Job).where(Job.id == job_id).values(state=NEW))
    assert [r.test_vector for r in winners.winners(db, sid)] == sorted(
        {gemm(64), gemm(128)} - {vector}
    )
    listed = cli(db_url, "results", "--session", str(sid), "--json").json()
    assert [r["test_vector"] for r in listed] == [r.test_vector for r in winners.winners(db, sid)]
    with db.session() as s:
        s.execute(sa.update(Job).where(Job.id == job_id).values(state=COMPLETED))
    assert len(winners.winners(db, sid)) == 2


def test_cli_results_csv_and_json(db, db_url, tmp_path):
    sid = new_session(db)
    tune(db, tmp_path, sid, [gemm(64), gemm(128)])
    run = cli(db_url, "results", "--session", str(sid), "--csv")
    assert run.code == 0, run.stderr
    rows = list(csv.DictReader(io.StringIO(run.stdout)))
    assert list(rows[0]) == [
        "op",
        "test_vector",
        "perf_config",
        "tflops",
        "kernel_time",
        "candidates",
        "winner_margin",
        "winner_noise",
    ]
    # A test vector starts with -: written as text for a spreadsheet (formats.csvcells).
    assert {read_cell(r["test_vector"]) for r in rows} == {gemm(64), gemm(128)}
    assert all(r["candidates"] == "2" and r["perf_config"] == "v4:best" for r in rows)
    data = cli(db_url, "results", "--session", str(sid), "--json").json()
    assert len(data) == 2 and {
        "test_vector",
        "perf_config",
        "tflops",
        "kernel_time",
        "candidates",
    } <= set(data[0])
    table = cli(db_url, "results", "--session", str(sid))
    assert table.code == 0 and "v4:best" in table.stdout and "2 winners" in table.stderr


def test_cli_results_errors_are_one_line_exit_2(db, db_url):
    run = cli(db_url, "results", "--session", "99")
    assert run.code == 2 and run.stderr.strip().count("\n") == 0 and "no session 99" in run.stderr
    sid = new_session(db)
    both = cli(db_url, "results", "--session", str(sid), "--json", "--csv")
    assert both.code == 2 and "--json" in both.stderr
    bad_op = cli(db_url, "results", "--session", str(sid), "--op", "fft")
    assert bad_op.code == 2 and "unknown op" in bad_op.stderr
