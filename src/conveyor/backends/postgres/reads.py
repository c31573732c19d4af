"""The reads of the PostgreSQL store: a task with its attempts, tasks whole
and summarized, counts, activity, backlogs, concurrency keys, the clock.

A mixin of :class:`~conveyor.backends.postgres.backend.PostgresBackend`:
each method is a statement or two of ``sql/reads.sql`` (``next_run_at`` is
in sql/flow.sql), run through ``_fetchall``, or in a transaction of its own
where it needs a planner setting (:data:`IN_INDEX_ORDER`, or the sequential
scans of ``_fetchall_scanning``).
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import replace
from datetime import datetime

from conveyor.backends.params import WorkFilter, read_ids
from conveyor.backends.postgres.pools import Pools
from conveyor.backends.stored import (
    activity_buckets,
    attempt_row,
    check_bucket_seconds,
    dependency_record,
    filter_args,
    progress_of,
    summary_row,
    task_row,
)
from conveyor.model import Attempt, Task, TaskState
from conveyor.records import (
    ACTIVITY_SCAN,
    SUMMARY_ERROR_CHARS,
    ActivityBucket,
    DependencyEdge,
    DependencyRecord,
    KeyInfo,
    QueueBacklog,
    TaskCount,
    TaskFilter,
    TaskSummary,
)

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


class Listings(Pools):
    """``get_task``, the listings, counts, activity, backlogs and keys (see
    :class:`~conveyor.backends.protocol.Backend` and
    :class:`~conveyor.backends.capabilities.Inspector`)."""

    async def list_tasks(self, task_filter: TaskFilter) -> list[Task]:
        name = "list_tasks" if task_filter.parent is None else "list_children"
        rows = await self._fetchall(name, filter_args(task_filter))
        return [task_row(row, ()) for row in rows]

    async def list_summaries(self, task_filter: TaskFilter) -> list[TaskSummary]:
        """The page's ids off the index that serves the filter (primary key,
        listing index, lease index, a parent's index of children), then only
        those rows' narrow columns and each one's latest attempt by key: the
        payload and result are never read."""
        args = {**filter_args(task_filter), "error_chars": SUMMARY_ERROR_CHARS}
        name = _summaries_statement(task_filter)
        if name not in ORDERED_STATEMENTS:
            rows = await self._fetchall(name, args)
        else:
            async with self._connection() as conn, conn.transaction():
                await conn.execute(IN_INDEX_ORDER)
                cursor = await conn.execute(self.sql[name], args)
                rows = await cursor.fetchall()
        return [summary_row(row) for row in rows]

    async def summaries(self, ids: Sequence[int]) -> list[TaskSummary]:
        """Each id off the primary key, then the columns and latest attempt
        :meth:`list_summaries` reads."""
        wanted = read_ids(ids)
        if not wanted:
            return []
        rows = await self._fetchall(
            "summaries", {"ids": wanted, "error_chars": SUMMARY_ERROR_CHARS}
        )
        return [summary_row(row) for row in rows]

    async def running_by_worker(self) -> dict[str, int]:
        """Counted off the lease index, which holds only running tasks."""
        rows = await self._fetchall("running_by_worker", {})
        return {worker_id: count for worker_id, count in rows if worker_id is not None}

    async def get_task(self, task_id: int, with_attempts: bool = True) -> Task | None:
        async with self._connection() as conn:
            cursor = await conn.execute(self.sql["get_task"], {"id": task_id})
            row = await cursor.fetchone()
            if row is None:
                return None
            attempts: tuple[Attempt, ...] = ()
            if with_attempts:
                cursor = await conn.execute(self.sql["get_attempts"], {"id": task_id})
                attempts = tuple(attempt_row(r) for r in await cursor.fetchall())
        *columns, waiting_for, progress, progress_at = row
        task = task_row(tuple(columns), attempts)
        return replace(task, waiting_for=waiting_for, progress=progress_of(progress, progress_at))

    async def dependencies(self, task_id: int) -> list[DependencyRecord]:
        rows = await self._fetchall("dependencies", {"id": task_id})
        return [dependency_record(int(r[0]), bool(r[1]), *r[2:]) for r in rows]

    async def edges(self, ids: Sequence[int]) -> list[DependencyEdge]:
        """One statement: both sides of the edges of ``ids``, off their indexes."""
        wanted = read_ids(ids)
        if not wanted:
            return []
        rows = await self._fetchall("edges", {"ids": wanted})
        return [DependencyEdge(int(r[0]), int(r[1]), int(r[2]), bool(r[3])) for r in rows]

    async def count_tasks(self) -> list[TaskCount]:
        rows = await self._fetchall_scanning("count_tasks", {})
        return [TaskCount(TaskState(r[0]), r[1], r[2], r[3]) for r in rows]

    async def count_unfinished(self, work: WorkFilter) -> int:
        rows = await self._fetchall(
            "count_unfinished",
            {"names": list(work.names), "queues": list(work.queues), "now": work.now},
        )
        return int(rows[0][0])

    async def next_due_at(self, queues: Sequence[str]) -> datetime | None:
        rows = await self._fetchall("next_run_at", {"queues": list(queues)})
        value = rows[0][0] if rows else None
        return value if isinstance(value, datetime) else None

    async def store_clock(self) -> datetime:
        clock: datetime = (await self._fetchall("store_clock", {}))[0][0]
        return clock

    async def list_keys(self, limit: int = 1000, now: datetime | None = None) -> list[KeyInfo]:
        rows = await self._fetchall("list_keys", {"limit": limit, "now": now})
        return [KeyInfo(*row) for row in rows]

    async def queue_backlogs(self, now: datetime | None = None) -> list[QueueBacklog]:
        rows = await self._fetchall("queue_backlogs", {"now": now})
        return [QueueBacklog(*row) for row in rows]

    async def activity(self, since: datetime, bucket_seconds: int) -> list[ActivityBucket]:
        bucket = check_bucket_seconds(bucket_seconds)
        args = {"since": since, "bucket": bucket, "scan": ACTIVITY_SCAN}
        rows = await self._fetchall("activity", args)
        return activity_buckets(since, bucket, rows)

    async def key_holders(self, key: str, limit: int = 20) -> list[int]:
        rows = await self._fetchall("key_holders", {"key": key, "limit": limit})
        return [task_id for (task_id,) in rows]
