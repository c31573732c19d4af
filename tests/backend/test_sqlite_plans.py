"""Query-plan guards for SQLite: the hot statements stay on their indexes.

100k finished tasks and a few thousand pending ones sit in the file, and
ANALYZE has run (so the planner has statistics to be tempted by). The claim
must read due work from the partial claim index in claim order (no sort of
every pending row), and heartbeat/finish must reach rows by primary key.
"""

from __future__ import annotations

import asyncio
import contextlib
import sqlite3
from collections.abc import Iterable, Iterator
from pathlib import Path
from typing import Any

import pytest

from conveyor.backends.sqlite import SQLiteBackend
from conveyor.backends.sqlite.reads import _summaries_statement as summaries_statement
from conveyor.backends.sqlite.statements import SQL
from conveyor.model import TaskState
from conveyor.records import TaskFilter

FINISHED = 100_000
PENDING = 5_000
ARGS: dict[str, Any] = {
    "now": 2e9,
    "queue": "default",
    "queues": '["default", "mail"]',
    "names": '["job"]',
    "limit": 10,
    "ids": "[1, 2]",
    "worker_id": "w",
    "lease": 30.0,
    "leases": "[[1, 1]]",
    "completions": '[{"id": 1, "attempt": 1}]',
}


async def _create(path: Path) -> None:
    backend = SQLiteBackend(str(path))
    await backend.open()
    await backend.close()


@pytest.fixture(scope="module")
def database(tmp_path_factory: pytest.TempPathFactory) -> Iterator[sqlite3.Connection]:
    path = tmp_path_factory.mktemp("plans") / "plans.db"
    asyncio.run(_create(path))
    with contextlib.closing(sqlite3.connect(path)) as conn:
        row = (
            "insert into conveyor_tasks (name, queue, payload, state, run_at, max_attempts,"
            " retry_policy, created_at, finished_at) values ('job', ?, '{}', ?, ?, 3, '{}', 0, ?)"
        )
        conn.executemany(row, (("default", "succeeded", n, n) for n in range(FINISHED)))
        conn.executemany(row, (("default", "pending", n, None) for n in range(PENDING)))
        conn.executemany(row, (("mail", "pending", n, None) for n in range(PENDING)))
        conn.commit()
        conn.execute("analyze")
        yield conn


def plan(conn: sqlite3.Connection, name: str) -> str:
    rows = conn.execute("explain query plan " + SQL[name], ARGS).fetchall()
    return "\n".join(str(r[3]) for r in rows)


def test_claim_reads_the_claim_index_in_order(database: sqlite3.Connection) -> None:
    due = plan(database, "claim_due")
    assert "USING INDEX conveyor_tasks_pending_claim" in due, due
    assert "TEMP B-TREE" not in due, due  # no sort: the index is in claim order
    expired = plan(database, "claim_expired")
    assert "conveyor_tasks_in_progress_lease" in expired, expired
    assert "conveyor_tasks_in_progress_lease" in plan(database, "end_expired")


@pytest.mark.parametrize(
    ("name", "key"),
    [
        ("claim_take", "INTEGER PRIMARY KEY"),
        ("claim_log", "INTEGER PRIMARY KEY"),
        ("heartbeat", "INTEGER PRIMARY KEY"),
        ("finish", "INTEGER PRIMARY KEY"),
        ("finish_log", "PRIMARY KEY (task_id=? AND number=?)"),
    ],
)
def test_fenced_writes_reach_rows_by_primary_key(
    database: sqlite3.Connection, name: str, key: str
) -> None:
    found = plan(database, name)
    assert key in found, found
    assert "SCAN conveyor_" not in found, found


def _vm_steps(conn: sqlite3.Connection, name: str, args: dict[str, Any]) -> tuple[int, int]:
    """(Rows ``name`` returned, about how many hundred virtual machine steps
    it took), in a transaction rolled back."""
    steps = 0

    def count() -> int:
        nonlocal steps
        steps += 1
        return 0

    conn.set_progress_handler(count, 100)
    try:
        found = len(conn.execute(SQL[name], args).fetchall())
    finally:
        conn.set_progress_handler(None, 0)
        conn.rollback()
    return found, steps


def _insert_finished(conn: sqlite3.Connection, tasks: Iterable[tuple[str, int]]) -> None:
    """Finished tasks, each (state, made at): due then, finished a second later."""
    conn.executemany(
        "insert into conveyor_tasks (name, queue, payload, state, run_at, max_attempts,"
        " retry_policy, created_at, finished_at) values ('job', 'default', '{}',"
        " ?, ?, 3, '{}', ?, ?)",
        ((state, made, made, made + 1) for state, made in tasks),
    )
    conn.commit()


def test_a_prune_reads_no_task_made_after_its_cutoff(tmp_path: Path) -> None:
    """A task finishes after it is made: a prune with nothing to delete
    must not walk every task of the state (a minute of them, or a day), as
    it did while the database's one writer waited."""
    path = tmp_path / "prune.db"
    asyncio.run(_create(path))
    with contextlib.closing(sqlite3.connect(path)) as conn:
        _insert_finished(conn, (("succeeded", 1000 + n) for n in range(20_000)))
        args = {"state": "succeeded", "limit": 1000}
        found, steps = _vm_steps(conn, "prune_tasks", {**args, "before": 500.0})
        assert found == 0 and steps < 20, steps  # a search of the ids, no walk
        # The first 1,000 made are the ones taken, and only tasks finished
        # before the cutoff.
        assert _vm_steps(conn, "prune_tasks", {**args, "before": 10_000.0})[0] == 1000
        assert _vm_steps(conn, "prune_tasks", {**args, "before": 1200.5, "limit": 5000})[0] == 200


def test_a_prune_reads_no_task_of_a_state_kept_longer(tmp_path: Path) -> None:
    """Failed tasks are kept longer than succeeded ones, so they lie below
    the succeeded cutoff: the walk for succeeded tasks must not read them
    (every prune, to delete nothing)."""
    path = tmp_path / "prune.db"
    asyncio.run(_create(path))
    with contextlib.closing(sqlite3.connect(path)) as conn:
        _insert_finished(
            conn, (("failed" if n < 20_000 else "succeeded", 1000 + n) for n in range(21_000))
        )
        # The cutoff lies past every failed task, before every succeeded one.
        args = {"state": "succeeded", "limit": 1000, "before": 20_500.0}
        found, steps = _vm_steps(conn, "prune_tasks", args)
        assert found == 0 and steps < 20, steps


SUMMARY_ARGS: dict[str, Any] = {
    "state": None,
    "name": None,
    "queue": None,
    "before": None,
    "parent": None,
    "limit": 50,
    "error_chars": 500,
}
SUMMARY_FILTERS: list[tuple[dict[str, Any], str]] = [
    # (a filter, how the page's ids are found)
    ({}, "SEARCH conveyor_tasks USING INTEGER PRIMARY KEY (rowid<?)"),
    ({"name": "job", "queue": "mail", "before": 500}, "USING INTEGER PRIMARY KEY (rowid<?)"),
    ({"state": "pending"}, "USING INDEX conveyor_tasks_state_id (state=? AND id<?)"),
    ({"state": "succeeded", "before": 500}, "USING INDEX conveyor_tasks_state_id (state=? AND"),
    ({"state": "in_progress", "name": "job"}, "USING INDEX conveyor_tasks_state_id (state=? AND"),
    ({"state": "failed", "queue": "mail"}, "USING INDEX conveyor_tasks_state_id (state=? AND"),
    ({"parent": 1}, "USING INDEX conveyor_tasks_parent (parent_id=? AND rowid<?)"),
    ({"parent": 1, "state": "pending", "name": "job"}, "USING INDEX conveyor_tasks_parent"),
]


@pytest.mark.parametrize(
    ("given", "index"), SUMMARY_FILTERS, ids=[str(g) for g, _ in SUMMARY_FILTERS]
)
def test_a_summarized_page_takes_its_ids_off_an_index(
    database: sqlite3.Connection, given: dict[str, Any], index: str
) -> None:
    """The dashboard's lists and ``conveyor tasks``: the page's ids come off
    the index that serves the filter, in its order; every other read is by
    key, and the only sort is of the page itself."""
    state = TaskState(given["state"]) if "state" in given else None
    name = summaries_statement(TaskFilter(state=state, parent=given.get("parent")))
    rows = database.execute("explain query plan " + SQL[name], {**SUMMARY_ARGS, **given})
    steps = [str(r[3]) for r in rows.fetchall()]
    assert steps[:2] == ["MATERIALIZE page", steps[1]] and index in steps[1], steps
    assert not [s for s in steps if s.startswith("SCAN conveyor_")], steps
    assert [s for s in steps if "TEMP B-TREE" in s] == ["USE TEMP B-TREE FOR ORDER BY"], steps
    assert steps[-1] == "USE TEMP B-TREE FOR ORDER BY", steps  # the page's rows, at the end


def test_running_tasks_are_counted_off_the_lease_index(database: sqlite3.Connection) -> None:
    found = plan(database, "running_by_worker")
    assert "SCAN conveyor_tasks USING INDEX conveyor_tasks_in_progress_lease" in found, found
