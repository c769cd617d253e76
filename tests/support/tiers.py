"""The suite's tiers (docs/ci.md "The tiers"): every test is exactly one of

- `unit`: in this process, no database, no other process (`pytest -m unit`: seconds);
- `database`: uses a test database (the db fixtures: SQLite, and PostgreSQL and MariaDB when
  their servers are given);
- `process`: starts processes (workers, the CLI, the stand-in's tools, servers);
- `browser`: drives Chromium over a served dashboard.

tests/conftest.py marks each collected test from this one table: by the fixtures it uses (a
browser, a database) and by its name (the tests that start processes); the heaviest tier wins.
A test file never marks a tier itself.

Each test is checked as it runs, both ways: a unit test that starts a process or opens a
database connection fails, and so does a database test that starts a process; a process test
that passes without starting one fails too; each names the table to move the test in. What
counts is the test's own doing: its code and its fixtures of function scope (a worker or a
server started for it alone), never setup shared with other tests (a fixture of a module's or a
session's scope, the dashboard's farm tuned once per run), which whichever test comes first
sets up: a verdict that hung on the order the tests run in would come and go."""

from __future__ import annotations

import sys
from collections.abc import Iterator
from contextlib import contextmanager
from pathlib import Path

import pytest

TIERS = ("unit", "database", "process", "browser")  # lightest first

BROWSER_FIXTURES = frozenset({"browser"})
DATABASE_FIXTURES = frozenset(
    {"test_databases", "db_url", "empty_db_url", "module_db_url", "sqlite_url"}
)
# The test files whose every test starts processes: `mlirtuna` as a subprocess (run_cli, a
# worker), the stand-in's tools, a database server of their own, a pipeline.
PROCESS_FILES = frozenset(
    {
        "test_batch.py", "test_bench_smoke.py", "test_build_commit.py", "test_bundle_cap.py",
        "test_conformance.py", "test_conformance_e4.py", "test_db_password.py",
        "test_dead_worker.py", "test_driver_units.py", "test_eras_rocmlir.py",
        "test_fusion_rocmlir.py", "test_gpu_overlap.py", "test_jenkinsfile.py",
        "test_job_faults.py", "test_lease_lost.py", "test_netns.py", "test_poison.py",
        "test_restarts.py", "test_rocmlir_chosen.py", "test_rocmlir_tuner.py",
        "test_rocmlir_worker.py", "test_storage.py", "test_stream.py", "test_stream_bounds.py",
        "test_supervisor_restarts.py", "test_temp_sweep.py", "test_timeouts.py", "test_tls.py",
        "test_try_rocmlir.py", "test_tuner_plugin.py", "test_two_stage.py", "test_worker.py",
    }
)  # fmt: skip
# Their tests that start none: a parser, the CLI in this process (a refusal, a table), a tuner's
# contract kept in this process.
NOT_PROCESS_TESTS = frozenset(
    {
        "test_batch.py::test_a_batch_claim_whose_reply_was_lost_counts_once",
        "test_batch.py::test_batch_must_be_at_least_one",
        "test_batch.py::test_claim_many_takes_each_job_with_its_own_lease",
        "test_batch.py::test_driver_lines_of_a_config_that_got_no_row_are_skipped",
        "test_batch.py::test_the_real_tools_usage_error_and_parse_failure_are_told_apart",
        "test_db_password.py::test_mariadb_names_the_password_variable_and_the_option_file",
        "test_dead_worker.py::test_take_back_ends_only_the_dead_workers_attempts",
        "test_driver_units.py::test_the_stand_ins_stats_read_back_as_its_time",
        "test_fusion_rocmlir.py::test_the_real_fusion_row_is_read_under_the_key_the_tool_tuned",
        "test_gpu_overlap.py::test_a_negative_batch_wait_is_refused",
        "test_gpu_overlap.py::test_batch_wait_and_prefetch_reach_every_worker_process",
        "test_jenkinsfile.py::test_no_step_evals_or_sources_what_a_parameter_wrote",
        "test_jenkinsfile.py::test_the_pipeline_is_parsed_in_the_order_jenkins_runs_it",
        "test_poison.py::test_cut_text_counts_bytes_and_replaces_what_no_database_takes",
        "test_poison.py::test_poison_output_is_stored_on_every_backend",
        "test_rocmlir_chosen.py::test_the_rocmlir_tuner_is_a_searchable_tuner",
        "test_rocmlir_tuner.py::test_build_dir_from_environment",
        "test_rocmlir_tuner.py::test_candidates_keep_the_best_of_repeated_measurements",
        "test_rocmlir_tuner.py::test_detect_era_from_help_text",
        "test_rocmlir_tuner.py::test_missing_build_dir_names_the_flag_and_the_variable",
        "test_rocmlir_tuner.py::test_read_debug_file_e2_layout_with_index_column",
        "test_rocmlir_tuner.py::test_read_debug_file_e3_layout_with_measurements",
        "test_rocmlir_tuner.py::test_read_debug_file_malformed",
        "test_rocmlir_tuner.py::test_reconcile_adds_a_winner_the_debug_file_lacks",
        "test_rocmlir_tuner.py::test_reconcile_records_the_tools_choice_and_notes_a_disagreement",
        "test_rocmlir_tuner.py::test_tools_own_timeout_is_a_timeout",
        "test_storage.py::test_a_file_that_is_not_a_database",
        "test_stream.py::test_no_stream_reaches_every_worker_process",
        "test_stream_bounds.py::test_a_sample_count_past_an_integer_column_is_dropped",
        "test_temp_sweep.py::test_temp_dirs_are_named_for_their_owner",
        "test_try_rocmlir.py::test_setup_only_prints_what_a_pipeline_exports",
        "test_try_rocmlir.py::test_the_packages_stand_in_names_no_test_knob",
    }
)  # fmt: skip
# The tests that start processes in files whose other tests start none: a worker, the CLI as a
# subprocess, the stand-in's tools, a fake rocminfo on PATH.
PROCESS_TESTS = frozenset(
    {
        "test_adaptive_session.py::test_a_searched_run_measures_the_budget_in_rounds_and_exports",
        "test_adaptive_session.py::test_a_worker_killed_mid_search_loses_nothing_and_measures_nothing_twice",
        "test_adaptive_session.py::test_the_search_starts_from_the_farms_history_of_the_op",
        "test_bundle_safety.py::test_a_forged_token_or_id_names_no_file",
        "test_bundle_safety.py::test_a_row_naming_another_file_never_deletes_it",
        "test_bundle_safety.py::test_a_symlink_in_the_store_is_not_followed",
        "test_bundle_safety.py::test_sweep_and_session_delete_never_delete_a_named_file",
        "test_cli_help.py::test_version_and_shell_completion",
        "test_cli_ops.py::test_a_worker_of_a_session_that_is_not_searched_loads_no_numpy",
        "test_cli_ops.py::test_run_prints_its_winners_as_csv",
        "test_cli_ops.py::test_start_up_imports_only_what_the_command_uses",
        "test_dbfaults.py::test_a_database_error_that_waiting_cannot_cure_stops_the_worker",
        "test_dbfaults.py::test_a_refused_login_stops_at_once_even_when_told_to_wait",
        "test_dbfaults.py::test_a_worker_waits_for_a_database_that_is_not_up_yet",
        "test_dbfaults.py::test_a_wrong_url_stops_at_once_even_when_told_to_wait",
        "test_fused_tuning.py::test_run_op_fusion_on_the_example",
        "test_fused_tuning.py::test_the_plain_tuning_db_run_writes_does_not_depend_on_run_order",
        "test_fuzz_hostile.py::test_a_1gib_file_is_refused_within_a_memory_limit",
        "test_gpu_exclusive.py::test_a_second_worker_on_a_held_gpu_says_who_and_exits_2",
        "test_gpu_exclusive.py::test_a_worker_waiting_for_its_gpu_says_for_what_and_until_when",
        "test_gpu_lock_safety.py::test_a_bad_lock_dir_or_gpu_is_one_line_and_exit_2",
        "test_gpus_auto_race.py::test_auto_with_every_gpu_held_says_so_in_one_line",
        "test_gpus_auto_race.py::test_two_auto_workers_started_together_share_the_gpus",
        "test_measurement.py::test_rocmlir_e3_small_kernels_store_no_spread",
        "test_measurement.py::test_rocmlir_e3_stats_become_candidate_statistics",
        "test_measurement.py::test_rocmlir_two_stage_topk_where_the_tool_has_it",
        "test_operator_told.py::test_run_names_its_session_with_name",
        "test_operator_told.py::test_status_watch_ends_on_a_finished_session_with_waits_exit_status",
        "test_operator_wording.py::test_a_plain_run_says_nothing_of_fusion_modules_a_fusion_run_does",
        "test_operator_wording.py::test_cpu_workers_say_their_names_and_the_job_page_names_the_worker",
        "test_quick.py::test_one_problem_on_two_chips_is_two_groups_and_stdout_stays_clean",
        "test_quick_real.py::test_bench_leave_one_gpu_out_prints_the_table_lists_and_goal_line",
        "test_quick_real.py::test_bench_names_a_bad_file_and_exits_2",
        "test_quick_real.py::test_bench_on_the_real_gpus_beats_the_baseline",
        "test_quick_real.py::test_bench_skips_saying_so_without_the_data",
        "test_quick_real.py::test_bench_with_a_test_dir_scores_only_the_test_gpus",
        "test_quick_real.py::test_farm_bench_runs_at_smoke_size",
        "test_rdna.py::test_rdna_jobs_are_recorded",
        "test_rdna.py::test_session_new_on_rdna_needs_no_num_cu",
        "test_reuse.py::test_run_skip_tuned_reuse_exports_complete_without_tuning",
        "test_role_limits.py::test_the_worker_role_still_runs_two_stage_sessions",
        "test_run.py::test_run_end_to_end_twice",
        "test_run.py::test_run_interrupted_then_resumed",
        "test_run.py::test_runtime_failure_is_exit_1",
        "test_run_flow.py::test_example_runs_as_the_readme_says",
        "test_run_flow.py::test_gemm_then_conv_run_keeps_both_ops_in_the_tuning_db",
        "test_run_flow.py::test_run_skips_what_the_cpu_tuner_cannot_run",
        "test_session_tuner.py::test_worker_without_tuner_runs_the_sessions_tuner",
        "test_sessions.py::test_rocmlir_session_detected_from_rocminfo",
        "test_sessions.py::test_rocmlir_session_with_gpu_but_no_chiplet_count_asks_for_it",
        "test_standin_provenance.py::test_runs_own_export_leaves_a_stand_in_session_of_its_context_out",
        "test_standin_provenance.py::test_session_new_marks_the_stand_in_from_the_environments_build",
        "test_standin_provenance.py::test_try_rocmlir_leaves_the_farm_of_mlirtuna_db_untouched",
        "test_trans_o.py::test_each_build_gets_lines_in_its_own_spelling",
        "test_trans_o.py::test_run_refuses_what_the_build_cannot_tune_before_writing_anything",
        "test_tsv_roundtrip.py::test_run_export_import_compare_round_trip",
        "test_tuner_contract.py::TestRocmlir::test_a_batch_gives_each_problem_one_outcome",
        "test_tuner_contract.py::TestRocmlir::test_a_timeout_in_its_context_is_honoured",
        "test_tuner_contract.py::TestRocmlir::test_its_candidates_perf_configs_are_its_own",
        "test_tuner_contract.py::TestRocmlir::test_tune_returns_a_valid_winner_among_its_candidates",
        "test_tuner_contract.py::TestRocmlirE4::test_a_batch_gives_each_problem_one_outcome",
        "test_tuner_contract.py::TestRocmlirE4::test_a_timeout_in_its_context_is_honoured",
        "test_tuner_contract.py::TestRocmlirE4::test_compile_then_benchmark_gives_a_valid_winner",
        "test_tuner_contract.py::TestRocmlirE4::test_its_candidates_perf_configs_are_its_own",
        "test_tuner_contract.py::TestRocmlirE4::test_tune_returns_a_valid_winner_among_its_candidates",
        "test_tuner_contract.py::test_the_plugins_own_suite_subclasses_the_contract_and_passes",
        "test_web_api.py::test_serve_command_binds_localhost_and_prints_its_url",
        "test_web_views.py::test_the_cli_does_not_import_sklearn",
    }
)  # fmt: skip
# Tests that open a database of their own (a SQLite file they make, a server that is down)
# without a db fixture.
DATABASE_TESTS = frozenset(
    {
        "test_cli_ops.py::test_a_page_of_jobs_walks_the_index_instead_of_sorting_them_all",
        "test_cli_ops.py::test_commands_that_write_still_create_one",
        "test_db.py::test_new_sqlite_file_is_created_on_first_use",
        "test_db.py::test_sqlite_file_of_something_else_is_not_touched",
        "test_dbfaults.py::test_a_server_that_is_down_is_unavailable_not_fatal",
        "test_dbfaults.py::test_sqlite_busy_and_locked_are_unavailable",
        "test_dbfaults.py::test_sqlite_lock_past_the_busy_timeout_is_waited_out",
        "test_fuzz_input.py::test_an_error_line_quotes_at_most_80_characters",
        "test_roles.py::test_sqlite_has_no_roles",
        "test_storage.py::test_a_file_that_is_not_a_database",
        "test_web_api.py::test_serve_needs_an_existing_database_and_writes_nothing",
        "test_web_safety.py::test_serving_a_sqlite_file_changes_nothing",
        "test_web_views.py::test_farm_ops_of_a_database_made_again_at_the_same_url",
    }
)


def tier_of(item: pytest.Item) -> str:
    """The one tier of a collected test: the heaviest that applies."""
    fixtures = set(getattr(item, "fixturenames", ()))
    file = Path(str(item.path)).name
    if fixtures & BROWSER_FIXTURES:
        return "browser"
    names = names_of(item)
    if (file in PROCESS_FILES and not names & NOT_PROCESS_TESTS) or names & PROCESS_TESTS:
        return "process"
    if fixtures & DATABASE_FIXTURES or names & DATABASE_TESTS:
        return "database"
    return "unit"


def names_of(item: pytest.Item) -> set[str]:
    """The names the tables may give the test: its file, its class if any and its function
    (`test_x.py::TestCpu::test_y`), and that with its parameters (`test_y[mysql]`), for the
    one parametrization of several that does what the others do not."""
    cls = getattr(item, "cls", None)
    function = getattr(item, "originalname", item.name)
    name = "::".join([Path(str(item.path)).name, *([cls.__name__] if cls else []), function])
    callspec = getattr(item, "callspec", None)
    return {name, f"{name}[{callspec.id}]"} if callspec else {name}


def mark(items: list[pytest.Item]) -> None:
    for item in items:
        item.add_marker(getattr(pytest.mark, tier_of(item)))


# What a test of a light tier must not do, as audit events (sys.addaudithook: they are seen
# wherever they happen in this process): a unit test neither starts a process nor opens a
# database (sqlite3, or a socket: a server's driver; one in C, libpq, connects unseen, and its
# tests use the db fixtures); a database test starts no process.
PROCESS_EVENTS = ("subprocess.Popen", "os.fork", "os.forkpty", "os.posix_spawn", "os.spawn",
                  "os.exec", "os.system")  # fmt: skip
FORBIDDEN = {
    "unit": frozenset((*PROCESS_EVENTS, "sqlite3.connect", "socket.connect")),
    "database": frozenset(PROCESS_EVENTS),
}
_watched: list[str] = []  # the forbidden events the test now running raised
_forbidden: list[frozenset[str]] = [frozenset()]  # what the test now running must not do
_started = [0]  # the processes started in this process outside shared setup, so far
_shared = [0]  # how deep in shared setup (a fixture wider than one test: set up once for many)


def _audit(event: str, _args: tuple) -> None:
    if event in _forbidden[-1]:
        _watched.append(event)
    if event in PROCESS_EVENTS and not _shared[0]:
        _started[0] += 1


def install_check() -> None:
    sys.addaudithook(_audit)  # for the process's life: a hook cannot be removed


def started() -> int:
    """How many processes this process has started so far, shared setup left out: read before
    a test's setup, it tells whether the test started one itself or in a fixture of its own."""
    return _started[0]


@contextmanager
def shared_setup(shared: bool = True) -> Iterator[None]:
    """Around setup done once for many tests (a fixture of a module's or a session's scope, the
    dashboard's farm tuned once per run): the processes it starts are no test's own."""
    _shared[0] += shared
    try:
        yield
    finally:
        _shared[0] -= shared


@contextmanager
def tier_check(tier: str, before: int | None = None, set_up: int | None = None) -> Iterator[None]:
    """Around a test of `tier`: fails it if it did what its tier must not (nested, as in the
    check's own test, the outer check goes on as before), or if it is a process test that
    passed without starting a process. `before` and `set_up`: started() before and after its
    setup (its own fixtures); unknown, the test's code alone counts."""
    before = started() if before is None else before
    set_up = before if set_up is None else set_up
    start = len(_watched)
    _forbidden.append(FORBIDDEN.get(tier, frozenset()))
    try:
        yield  # a test that fails or skips raises here, and is not checked
    finally:
        _forbidden.pop()
        seen = _watched[start:]
        del _watched[start:]
    if seen or (tier in FORBIDDEN and set_up != before):
        what = repr(seen[0]) if seen else "start a process in a fixture of its own"
        pytest.fail(
            f"a {tier} test must not {what}: give it the fixture of its tier, or name it in "
            "PROCESS_TESTS or DATABASE_TESTS (or not in NOT_PROCESS_TESTS) in "
            "tests/support/tiers.py",
            pytrace=False,
        )
    if tier == "process" and started() == before:
        pytest.fail(
            "a process test that starts no process, itself or in a fixture of its own: name "
            "it in NOT_PROCESS_TESTS in tests/support/tiers.py, or take it out of PROCESS_TESTS",
            pytrace=False,
        )
