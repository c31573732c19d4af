"""The SQL engines keep their statements in one file per section of the
floor plan, the same sections on both, each file small; the loader reads
them all as one set of names, and refuses a name found twice."""

from __future__ import annotations

import textwrap
from importlib import resources
from pathlib import Path

import pytest

import conveyor
from conveyor.backends import sqlfiles
from tests.backend.test_floor_plan import SECTIONS as FLOOR_PLAN

SECTIONS = FLOOR_PLAN - {"backend", "rows"}
"""The floor plan's sections that hold SQL, on both SQL engines."""

EXTRAS = {"postgres": {"turns"}, "sqlite": {"database"}}
"""Files of one engine only, beside its engine-specific modules (the wake-up
turns of PostgreSQL; SQLite's clock and change counter)."""

MOST_LINES = 600

STATEMENTS = {
    "postgres": """
        activity applied_migrations cancel cancel_many cancel_requested claim
        claim_keyed claim_reclaim consume count_prunable count_prunable_workers
        count_tasks count_unfinished delete_blocker delete_many delete_task
        deliver drop_schedules drop_unused_keys end_expired enqueue enqueue_handoff
        enqueue_keyed enqueue_one enqueue_uniform ensure_keys fence_check finish
        finish_succeeded fire_schedule fired_task first_messages get_attempts
        get_task guard_endings guard_send heartbeat inbox keep_keys key_holders
        keys_waiting list_child_summaries list_children list_keys list_pauses
        list_running_summaries list_schedules list_summaries
        list_summaries_in_state list_tasks list_workers lock_keys lock_tasks
        lock_unique_keys next_run_at part_claim_due part_claim_inbox
        part_claimed part_finish_fence part_keys_freed part_list_filter
        part_listed part_newer_owner part_selected part_served part_summarized
        part_summary_filter pause prune quarantine queue_backlogs recipients
        record_migration register_worker release_keys replace_pending resume
        retry retry_many rewake run_now running_by_worker sent_keys
        standby_adopt standby_offer standby_withdraw stop_worker store_clock
        stored_keys sync_release sync_schedule tables_to_vacuum take_keys
        task_state turn_give turn_take
    """,
    "sqlite": """
        activity applied_migrations cancel cancel_many cancel_requested
        claim_due claim_expired claim_keyed claim_log claim_take clock
        close_lost_attempt consume count_prunable count_prunable_workers
        count_tasks count_unfinished data_version delete_blocker delete_many
        delete_task deliver drop_attempts drop_message_keys drop_messages
        drop_migrations drop_schedules drop_tasks drop_workers end_expired
        enqueue enqueue_keyed fence finish finish_log fire_schedule fired_task
        first_message get_attempts get_task heartbeat heartbeat_seen inbox
        keep_key key_claimed key_holders keys_emptied latest_migration
        list_child_summaries list_children list_keys list_pauses list_schedules
        list_summaries list_summaries_in_state list_tasks list_workers
        migration_applied migrations_table migrations_table_exists next_run_at
        open_keys part_selected part_summarized part_summary_filter pause paused
        prune_tasks prune_workers quarantine_end quarantine_find quarantine_log
        queue_backlogs recipient record_migration record_migration_script
        register_worker release_key release_superseded replace_pending resume
        retry retry_many rewake run_now running_by_worker sent_key stop_worker
        stored_key sync_release sync_schedule task_state wake
    """,
}
"""Every statement the engines held when they moved into section files."""


def sections(engine: str) -> set[str]:
    folder = resources.files(f"conveyor.backends.{engine}").joinpath("sql")
    return {entry.name.removesuffix(".sql") for entry in folder.iterdir()}


@pytest.mark.parametrize("engine", sorted(EXTRAS))
def test_each_sql_engine_keeps_one_file_per_section(engine: str) -> None:
    assert sections(engine) == SECTIONS | EXTRAS[engine]


@pytest.mark.parametrize("engine", sorted(STATEMENTS))
def test_no_statement_was_lost_to_the_split(engine: str) -> None:
    loaded = sqlfiles.read_folder(f"conveyor.backends.{engine}")
    assert set(STATEMENTS[engine].split()) <= set(loaded)


def test_no_sql_file_in_the_package_is_long() -> None:
    source = Path(conveyor.__file__).parent
    lengths = {
        str(path.relative_to(source)): len(path.read_text(encoding="utf-8").splitlines())
        for path in source.rglob("*.sql")
    }
    assert any(name.endswith("attempts.sql") for name in lengths)
    assert {name: n for name, n in lengths.items() if n > MOST_LINES} == {}


def test_a_block_named_in_two_files_is_refused(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    package = tmp_path / "sections_of_a_test"
    (package / "sql").mkdir(parents=True)
    (package / "__init__.py").write_text("")
    block = textwrap.dedent("""\
        -- name: claim
        select 1;
    """)
    (package / "sql" / "attempts.sql").write_text(block)
    (package / "sql" / "reads.sql").write_text(block.replace("claim", "get_task"))
    (package / "sql" / "notes.txt").write_text(block)
    monkeypatch.syspath_prepend(str(tmp_path))
    assert set(sqlfiles.read_folder("sections_of_a_test")) == {"claim", "get_task"}
    (package / "sql" / "flow.sql").write_text(block)
    with pytest.raises(ValueError, match=r"'claim' in both attempts\.sql and flow\.sql"):
        sqlfiles.read_folder("sections_of_a_test")
