"""The listings of the SQLite store: tasks whole, tasks summarized, and
running tasks counted by worker.

A mixin of :class:`~conveyor.backends.sqlite.backend.SQLiteBackend`: each
method is one statement of ``sql/reads.sql`` read on the backend's connection.
"""

from __future__ import annotations

from typing import Any

from conveyor.backends.sqlite import rows
from conveyor.backends.sqlite.database import Database
from conveyor.backends.sqlite.statements import SQL
from conveyor.model import Task
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


def _summaries_statement(task_filter: TaskFilter) -> str:
    """The statement of a summarized listing: one for each index a page is
    read from."""
    if task_filter.parent is not None:
        return "list_child_summaries"
    return "list_summaries" if task_filter.state is None else "list_summaries_in_state"


class Listings:
    """``list_tasks``, ``list_summaries`` and ``running_by_worker`` (see
    :class:`~conveyor.backends.capabilities.Inspector`)."""

    _db: Database

    async def list_tasks(self, task_filter: TaskFilter) -> list[Task]:
        args = _filter_args(task_filter)
        statement = SQL["list_tasks" if task_filter.parent is None else "list_children"]
        found = await self._db.read(lambda conn: conn.execute(statement, args).fetchall())
        return [rows.task(row, ()) for row in found]

    async def list_summaries(self, task_filter: TaskFilter) -> list[TaskSummary]:
        """The page's ids off the state index, the rowids or a parent's index
        of children, then those rows' narrow columns and each one's latest
        attempt by key: the payload and result are never read."""
        args = {**_filter_args(task_filter), "error_chars": SUMMARY_ERROR_CHARS}
        name = _summaries_statement(task_filter)
        found = await self._db.read(lambda conn: conn.execute(SQL[name], args).fetchall())
        return [rows.summary(row) for row in found]

    async def running_by_worker(self) -> dict[str, int]:
        """Counted off the lease index, which holds only running tasks."""
        found = await self._db.read(lambda conn: conn.execute(SQL["running_by_worker"]).fetchall())
        return {worker_id: count for worker_id, count in found if worker_id is not None}
