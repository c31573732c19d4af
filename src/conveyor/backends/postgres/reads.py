"""The listings of the PostgreSQL store: tasks whole, tasks summarized, and
running tasks counted by worker.

A mixin of :class:`~conveyor.backends.postgres.backend.PostgresBackend`:
each method is one statement of ``sql/reads.sql``, run through the backend's
``_fetchall``, or in a transaction of its own where it needs a planner
setting (:data:`IN_INDEX_ORDER`).
"""

from __future__ import annotations

from collections.abc import Mapping
from contextlib import AbstractAsyncContextManager
from typing import Any

from psycopg import AsyncConnection

from conveyor.backends.stored import summary_row, task_row
from conveyor.model import Task, TaskState
from conveyor.records import SUMMARY_ERROR_CHARS, TaskFilter, TaskSummary


def _filter_args(task_filter: TaskFilter) -> dict[str, Any]:
    return {
        "state": task_filter.state.value if task_filter.state else None,
        "name": task_filter.name,
        "queue": task_filter.queue,
        "limit": task_filter.limit,
        "before": task_filter.before,
        "parent": task_filter.parent,
    }


IN_INDEX_ORDER = "set local enable_bitmapscan to off"
"""For the summarized pages that an index holds in order: without statistics
(autovacuum off, or not yet run) the planner guesses that a name or queue
filter, or a state, keeps a handful of rows, so that a LIMIT would not end
the walk early, and it rather reads every row of the state off a bitmap and
sorts them all: a page of pending tasks took 64-134 s so. Without a bitmap
to weigh, the walk of the index in its order, which stops at the page, is
the cheaper plan."""
ORDERED_STATEMENTS = frozenset({"list_summaries", "list_summaries_in_state"})
"""The statements run with :data:`IN_INDEX_ORDER`."""


def _summaries_statement(task_filter: TaskFilter) -> str:
    """The statement of a summarized listing: one for each index a page is
    read from, so that even a generic plan (the one a pooled connection may
    settle on) reads the page off its index."""
    if task_filter.parent is not None:
        return "list_child_summaries"
    if task_filter.state is None:
        return "list_summaries"
    if task_filter.state is TaskState.IN_PROGRESS:
        return "list_running_summaries"
    return "list_summaries_in_state"


class Listings:
    """``list_tasks``, ``list_summaries`` and ``running_by_worker`` (see
    :class:`~conveyor.backends.capabilities.Inspector`)."""

    sql: Mapping[str, bytes]

    async def _fetchall(self, name: str, args: Mapping[str, Any]) -> list[tuple[Any, ...]]:
        raise NotImplementedError  # the backend's own

    def _connection(self) -> AbstractAsyncContextManager[AsyncConnection[Any]]:
        raise NotImplementedError  # the backend's own

    async def list_tasks(self, task_filter: TaskFilter) -> list[Task]:
        name = "list_tasks" if task_filter.parent is None else "list_children"
        rows = await self._fetchall(name, _filter_args(task_filter))
        return [task_row(row, ()) for row in rows]

    async def list_summaries(self, task_filter: TaskFilter) -> list[TaskSummary]:
        """The page's ids off the index that serves the filter (primary key,
        listing index, lease index, a parent's index of children), then only
        those rows' narrow columns and each one's latest attempt by key: the
        payload and result are never read."""
        args = {**_filter_args(task_filter), "error_chars": SUMMARY_ERROR_CHARS}
        name = _summaries_statement(task_filter)
        if name not in ORDERED_STATEMENTS:
            rows = await self._fetchall(name, args)
        else:
            async with self._connection() as conn, conn.transaction():
                await conn.execute(IN_INDEX_ORDER)
                cursor = await conn.execute(self.sql[name], args)
                rows = await cursor.fetchall()
        return [summary_row(row) for row in rows]

    async def running_by_worker(self) -> dict[str, int]:
        """Counted off the lease index, which holds only running tasks."""
        rows = await self._fetchall("running_by_worker", {})
        return {worker_id: count for worker_id, count in rows if worker_id is not None}
