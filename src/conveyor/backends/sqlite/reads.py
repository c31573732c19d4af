"""The reads of the SQLite store: a task whole, tasks listed and
summarized, counts, backlogs, activity, keys and the store's clock.

:class:`Listings` is the section of
:class:`~conveyor.backends.sqlite.backend.SQLiteBackend` that reads: each
method reads on the backend's connection outside a transaction, with the
statements of ``sql/reads.sql`` (and the clock's and the next due time's).
"""

from __future__ import annotations

import json
import sqlite3
from collections.abc import Sequence
from datetime import datetime
from typing import Any

from conveyor.backends.params import WorkFilter, read_ids
from conveyor.backends.sqlite import rows
from conveyor.backends.sqlite.database import Database
from conveyor.backends.sqlite.statements import SQL, clock
from conveyor.backends.stored import (
    activity_buckets,
    check_bucket_seconds,
    dependency_record,
    filter_args,
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


def _summaries_statement(task_filter: TaskFilter) -> str:
    """The statement of a summarized listing: one for each index a page is
    read from."""
    if task_filter.parent is not None:
        return "list_child_summaries"
    return "list_summaries" if task_filter.state is None else "list_summaries_in_state"


class Listings:
    """``get_task``, ``dependencies``, ``edges``, ``count_unfinished``, ``next_due_at`` and
    ``store_clock`` (see :class:`~conveyor.backends.protocol.Backend`);
    ``list_tasks``, ``list_summaries``, ``summaries``, ``running_by_worker``,
    ``count_tasks``, ``list_keys``, ``key_holders``, ``queue_backlogs`` and
    ``activity`` (see :class:`~conveyor.backends.capabilities.Inspector`)."""

    _db: Database

    async def list_tasks(self, task_filter: TaskFilter) -> list[Task]:
        args = filter_args(task_filter)
        statement = SQL["list_tasks" if task_filter.parent is None else "list_children"]
        found = await self._db.read(lambda conn: conn.execute(statement, args).fetchall())
        return [rows.task(row, ()) for row in found]

    async def list_summaries(self, task_filter: TaskFilter) -> list[TaskSummary]:
        """The page's ids off the state index, the rowids or a parent's index
        of children, then those rows' narrow columns and each one's latest
        attempt by key: the payload and result are never read."""
        args = {**filter_args(task_filter), "error_chars": SUMMARY_ERROR_CHARS}
        name = _summaries_statement(task_filter)
        found = await self._db.read(lambda conn: conn.execute(SQL[name], args).fetchall())
        return [rows.summary(row) for row in found]

    async def summaries(self, ids: Sequence[int]) -> list[TaskSummary]:
        """Each id off the rowids, then the columns and latest attempt
        :meth:`list_summaries` reads."""
        wanted = read_ids(ids)
        if not wanted:
            return []
        args = {"ids": json.dumps(wanted), "error_chars": SUMMARY_ERROR_CHARS}
        found = await self._db.read(lambda conn: conn.execute(SQL["summaries"], args).fetchall())
        return [rows.summary(row) for row in found]

    async def running_by_worker(self) -> dict[str, int]:
        """Counted off the lease index, which holds only running tasks."""
        found = await self._db.read(lambda conn: conn.execute(SQL["running_by_worker"]).fetchall())
        return {worker_id: count for worker_id, count in found if worker_id is not None}

    async def get_task(self, task_id: int, with_attempts: bool = True) -> Task | None:
        def fetch(conn: sqlite3.Connection) -> Task | None:
            row = conn.execute(SQL["get_task"], {"id": task_id}).fetchone()
            if row is None:
                return None
            attempts: tuple[Attempt, ...] = ()
            if with_attempts:
                found = conn.execute(SQL["get_attempts"], {"id": task_id}).fetchall()
                attempts = tuple(rows.attempt(r) for r in found)
            return rows.task(row, attempts)

        return await self._db.read(fetch)

    async def dependencies(self, task_id: int) -> list[DependencyRecord]:
        """One read of the dependent's edges, in position order (see
        :class:`DependencyRecord`)."""
        found = await self._db.read(
            lambda conn: conn.execute(SQL["dependencies"], {"id": task_id}).fetchall()
        )
        return [dependency_record(row[0], bool(row[1]), *row[2:]) for row in found]

    async def edges(self, ids: Sequence[int]) -> list[DependencyEdge]:
        """One statement: both sides of the edges of ``ids``, off their indexes."""
        wanted = read_ids(ids)
        if not wanted:
            return []
        args = {"ids": json.dumps(wanted)}
        found = await self._db.read(lambda conn: conn.execute(SQL["edges"], args).fetchall())
        return [DependencyEdge(int(r[0]), int(r[1]), int(r[2]), bool(r[3])) for r in found]

    async def count_tasks(self) -> list[TaskCount]:
        found = await self._db.read(lambda conn: conn.execute(SQL["count_tasks"]).fetchall())
        return [TaskCount(TaskState(r[0]), r[1], r[2], r[3]) for r in found]

    async def count_unfinished(self, work: WorkFilter) -> int:
        def count(conn: sqlite3.Connection) -> int:
            args = {
                "now": clock(conn, work.now),
                "queues": json.dumps(list(work.queues)),
                "names": json.dumps(list(work.names)),
            }
            value: int = conn.execute(SQL["count_unfinished"], args).fetchone()[0]
            return value

        return await self._db.read(count)

    async def next_due_at(self, queues: Sequence[str]) -> datetime | None:
        args = {"queues": json.dumps(list(queues))}
        value = await self._db.read(
            lambda conn: conn.execute(SQL["next_run_at"], args).fetchone()[0]
        )
        return rows.moment(value)

    async def store_clock(self) -> datetime:
        def read(conn: sqlite3.Connection) -> datetime:
            return rows.moment(clock(conn, None)) or rows.EARLIEST

        return await self._db.read(read)

    async def list_keys(self, limit: int = 1000, now: datetime | None = None) -> list[KeyInfo]:
        def read(conn: sqlite3.Connection) -> list[KeyInfo]:
            moment = clock(conn, now)
            found = conn.execute(SQL["list_keys"], {"now": moment, "limit": limit}).fetchall()
            return [key_info(row, moment) for row in found]

        return await self._db.read(read)

    async def queue_backlogs(self, now: datetime | None = None) -> list[QueueBacklog]:
        def read(conn: sqlite3.Connection) -> list[QueueBacklog]:
            found = conn.execute(SQL["queue_backlogs"], {"now": clock(conn, now)}).fetchall()
            return [QueueBacklog(q, int(d), int(la), rows.moment(o)) for q, d, la, o in found]

        return await self._db.read(read)

    async def activity(self, since: datetime, bucket_seconds: int) -> list[ActivityBucket]:
        bucket = check_bucket_seconds(bucket_seconds)
        args = {"since": since.timestamp(), "bucket": bucket, "scan": ACTIVITY_SCAN}

        def read(conn: sqlite3.Connection) -> list[ActivityBucket]:
            found = conn.execute(SQL["activity"], args).fetchall()
            return activity_buckets(since, bucket, found)

        return await self._db.read(read)

    async def key_holders(self, key: str, limit: int = 20) -> list[int]:
        def read(conn: sqlite3.Connection) -> list[int]:
            found = conn.execute(SQL["key_holders"], {"key": key, "limit": limit}).fetchall()
            return [task_id for (task_id,) in found]

        return await self._db.read(read)


def key_info(row: tuple[Any, ...], now: float) -> KeyInfo:
    key, max_running, running, pending, rate, period, tokens = row
    upcoming = None
    if tokens is not None and tokens < 1:
        upcoming = rows.moment(now + (1 - tokens) * period / rate)
    return KeyInfo(key, max_running, running, pending, rate, period, tokens, upcoming)
