"""Query-plan guards: the hot statements stay on their indexes as history grows.

100k finished tasks sit in the table; the claim must reach due work through
the partial indexes, and heartbeat/finish through the primary keys, never by
scanning the table.
"""

from __future__ import annotations

import json
from typing import Any

import psycopg
import pytest

from conveyor.backends.postgres import PostgresBackend
from conveyor.backends.postgres.rows import finish_args
from conveyor.backends.protocol import Completion
from conveyor.model import LeaseToken, Outcome, TaskState

FINISHED = 100_000


def _nodes(plan: dict[str, Any]) -> list[dict[str, Any]]:
    found = [plan]
    for child in plan.get("Plans", []):
        found.extend(_nodes(child))
    return found


async def _plan(backend: PostgresBackend, name: str, args: dict[str, Any]) -> list[dict[str, Any]]:
    async with backend.pool.connection() as conn:
        cursor = await conn.execute(b"explain (format json) " + backend.sql[name], args)
        row = await cursor.fetchone()
    assert row is not None
    document = row[0] if not isinstance(row[0], str) else json.loads(row[0])
    return _nodes(document[0]["Plan"])


@pytest.fixture
async def history(backend: PostgresBackend) -> PostgresBackend:
    tasks = psycopg.sql.Identifier(backend.schema, "tasks")
    async with backend.pool.connection() as conn:
        await conn.execute(
            psycopg.sql.SQL(
                "insert into {} (name, queue, payload, state, max_attempts, retry_policy,"
                " attempt, spent, finished_at)"
                " select 'job', 'default', '{{}}', 'succeeded', 3, '{{}}', 1, 1, now()"
                " from generate_series(1, %s)"
            ).format(tasks),
            (FINISHED,),
        )
        await conn.execute(
            psycopg.sql.SQL(
                "insert into {} (name, queue, payload, max_attempts, retry_policy)"
                " select 'job', 'default', '{{}}', 3, '{{}}' from generate_series(1, 50)"
            ).format(tasks)
        )
        await conn.execute(psycopg.sql.SQL("analyze {}").format(tasks))
    return backend


def _scanned_tables(nodes: list[dict[str, Any]]) -> set[str]:
    return {n.get("Relation Name", "") for n in nodes if n["Node Type"] == "Seq Scan"}


async def test_claim_uses_the_partial_indexes(history: PostgresBackend) -> None:
    nodes = await _plan(
        history,
        "claim",
        {
            "now": None,
            "worker_id": "w",
            "names": ["job"],
            "queues": ["default"],
            "limit": 10,
            "lease": 30.0,
        },
    )
    assert not {"tasks", "attempts"} & _scanned_tables(nodes)
    indexes = {n.get("Index Name") for n in nodes}
    assert "tasks_pending_claim" in indexes
    # The reclaim path reads in-progress rows through one of the partial or
    # state indexes (the planner picks by their size), never the table.
    assert indexes & {"tasks_in_progress_lease", "tasks_state_id"}


async def test_heartbeat_and_finish_use_primary_keys(history: PostgresBackend) -> None:
    common = {"now": None, "worker_id": "w", "ids": [1, 2], "attempts": [1, 1]}
    beat = await _plan(history, "heartbeat", {**common, "lease": 30.0})
    assert "tasks" not in _scanned_tables(beat)
    assert "tasks_pkey" in {n.get("Index Name") for n in beat}
    completions = [
        Completion(LeaseToken(i, 1, "w"), Outcome.SUCCEEDED, TaskState.SUCCEEDED, result="1")
        for i in (1, 2)
    ]
    finish = await _plan(history, "finish", finish_args("w", completions, None))
    assert not {"tasks", "attempts"} & _scanned_tables(finish)
    assert {"tasks_pkey", "attempts_pkey"} <= {n.get("Index Name") for n in finish}


async def test_a_poll_s_ending_and_a_send_use_primary_keys(history: PostgresBackend) -> None:
    """The statements of a coroutine poll's ending and of a send reach their
    rows by id (an OR with a subquery once made the lock scan every row)."""
    ids = {"ids": [1, 2, 3], "own": [1, 2], "now": None}
    deliver = {
        "now": None,
        "channel": "conveyor_x",
        "task_ids": [1, 2],
        "sender_ids": [3, 3],
        "bodies": ["1", "2"],
    }
    for name, args in (
        ("lock_tasks", ids),
        ("recipients", {"ids": [1, 2]}),
        ("deliver", deliver),
        ("rewake", {"ids": [1, 2], "channel": "conveyor_x", "now": None}),
    ):
        plan = await _plan(history, name, args)
        assert "tasks" not in _scanned_tables(plan), name
        assert "tasks_pkey" in {n.get("Index Name") for n in plan}, name
        # Every read of the tasks table is bounded by an index condition, not
        # a walk of a whole index with a filter.
        reads = [n for n in plan if n.get("Relation Name") == "tasks" and "Scan" in n["Node Type"]]
        assert all("Index Cond" in n for n in reads), (name, reads)
