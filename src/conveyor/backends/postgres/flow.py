"""Flow control and retention on PostgreSQL: pauses, schedules and pruning.

A mixin of :class:`~conveyor.backends.postgres.backend.PostgresBackend`:
each method is one statement of the ``sql`` folder run through the backend's
``_fetchall``. The claims read the ``pauses`` table themselves (see
``part_served_queues``), so a pause holds from its commit on.
"""

from __future__ import annotations

from collections.abc import Mapping
from contextlib import AbstractAsyncContextManager
from datetime import datetime
from typing import Any

from psycopg import AsyncConnection, sql

from conveyor.backends.params import FireParams, ScheduleSync
from conveyor.backends.postgres.inboxes import insert_tasks
from conveyor.backends.stored import (
    activity_buckets,
    check_bucket_seconds,
    delete_refused,
    schedule_args,
    transition_result,
)
from conveyor.model import Pause, PauseKind, TaskState, check_pause
from conveyor.records import (
    ACTIVITY_SCAN,
    ActivityBucket,
    CancelMany,
    DeleteMany,
    KeyInfo,
    PruneParams,
    PruneResult,
    QueueBacklog,
    RetryMany,
    StoredSchedule,
    TaskSelection,
)


class FlowControl:
    """Pause, resume, list pauses, prune (see :class:`~conveyor.backends.protocol.Backend`)."""

    sql: Mapping[str, bytes]
    schema: str

    async def _fetchall(self, name: str, args: Mapping[str, Any]) -> list[tuple[Any, ...]]:
        raise NotImplementedError  # the backend's own

    async def _fetchall_scanning(self, name: str, args: Mapping[str, Any]) -> list[tuple[Any, ...]]:
        raise NotImplementedError  # the backend's own

    def _connection(self) -> AbstractAsyncContextManager[AsyncConnection[Any]]:
        raise NotImplementedError  # the backend's own

    async def sync_schedules(self, params: ScheduleSync) -> bool:
        release = {
            "release": params.release,
            "tasks": list(dict.fromkeys(params.tasks)),
            "now": params.now,
            "lifetime": params.lifetime,
        }
        async with self._connection() as conn, conn.transaction():
            cursor = await conn.execute(self.sql["sync_release"], release)
            generation, superseded = (await cursor.fetchall())[0]
            if superseded:
                return False
            fence = {**release, "generation": generation}
            for stored in params.schedules:
                await conn.execute(
                    self.sql["sync_schedule"], {**schedule_args(stored, params.now), **fence}
                )
            await conn.execute(
                self.sql["drop_schedules"], {**fence, "names": [s.name for s in params.schedules]}
            )
            return True

    async def list_schedules(self) -> tuple[datetime, list[StoredSchedule]]:
        rows = await self._fetchall("list_schedules", {})
        if not rows:
            return (await self._fetchall("store_clock", {}))[0][0], []
        return rows[0][-1], [StoredSchedule(*row[:-1]) for row in rows]

    async def store_clock(self) -> datetime:
        clock: datetime = (await self._fetchall("store_clock", {}))[0][0]
        return clock

    async def fire_schedule(self, params: FireParams) -> list[int]:
        if not params.slots:
            return []
        args = {
            "name": params.name,
            "fingerprint": params.fingerprint,
            "first": params.slots[0],
            "last": params.slots[-1],
        }
        async with self._connection() as conn, conn.transaction():
            cursor = await conn.execute(self.sql["fire_schedule"], args)
            if await cursor.fetchone() is None:
                return []
            ids = await insert_tasks(conn, self.sql, params.tasks, None)
            if ids:
                await conn.execute(
                    self.sql["fired_task"], {"name": params.name, "task_id": ids[-1]}
                )
            return ids

    async def run_now(self, task_id: int, now: datetime | None = None) -> TaskState:
        rows = await self._fetchall("run_now", {"id": task_id, "now": now})
        if rows:
            return TaskState(rows[0][0])
        current = await self._fetchall("task_state", {"id": task_id})
        return transition_result(task_id, "run now", None, current[0][0] if current else None)

    async def delete(self, task_id: int) -> None:
        if await self._fetchall("delete_task", {"id": task_id}):
            return
        found = await self._fetchall("delete_blocker", {"id": task_id})
        raise delete_refused(task_id, *(found[0] if found else (None, None)))

    async def retry_many(self, selection: RetryMany) -> list[int]:
        return list((await self._fetchall("retry_many", _selected(selection)))[0][0])

    async def cancel_many(self, selection: CancelMany) -> list[int]:
        return list((await self._fetchall("cancel_many", _selected(selection)))[0][0])

    async def delete_many(self, selection: DeleteMany) -> list[int]:
        return list((await self._fetchall("delete_many", _selected(selection)))[0][0])

    async def pause(self, kind: PauseKind, name: str, now: datetime | None = None) -> bool:
        kind, name = check_pause(kind, name)
        rows = await self._fetchall("pause", {"kind": kind.value, "name": name, "now": now})
        return bool(rows)

    async def resume(self, kind: PauseKind, name: str) -> bool:
        kind, name = check_pause(kind, name)
        rows = await self._fetchall("resume", {"kind": kind.value, "name": name})
        return bool(rows and rows[0][0])

    async def list_pauses(self) -> list[Pause]:
        rows = await self._fetchall("list_pauses", {})
        return [Pause(PauseKind(kind), name, paused_at) for kind, name, paused_at in rows]

    async def prune(self, params: PruneParams) -> PruneResult:
        held, tasks, workers = (await self._fetchall("prune", _prune_args(params)))[0]
        return PruneResult(tasks=tasks, workers=workers, busy=not held)

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

    async def count_prunable(self, params: PruneParams) -> PruneResult:
        args = _prune_args(params)
        counts = await self._fetchall_scanning("count_prunable", args)
        tasks = sum(count for _state, count in counts)
        workers = 0
        if params.workers_before is not None:
            workers = (await self._fetchall("count_prunable_workers", args))[0][0]
        return PruneResult(tasks=tasks, workers=workers)

    async def vacuum(self) -> list[str]:
        done = []
        for (table,) in await self._fetchall("tables_to_vacuum", {"schema": self.schema}):
            target = sql.Identifier(self.schema, table)
            async with self._connection() as conn:
                await conn.execute(sql.SQL("vacuum (skip_locked, analyze) {}").format(target))
            done.append(str(table))
        return done


def _prune_args(params: PruneParams) -> dict[str, Any]:
    return {
        "states": [state.value for state in params.before],
        "befores": list(params.before.values()),
        "limit": params.limit,
        "workers_before": params.workers_before,
    }


def _selected(selection: TaskSelection) -> dict[str, Any]:
    """The arguments of a bulk action's statement (``part_selected``)."""
    return {
        "states": [s.value for s in selection.states],
        "ids": None if selection.ids is None else list(selection.ids),
        "name": selection.name,
        "queue": selection.queue,
        "since": selection.since,
        "until": selection.until,
        "after": selection.after,
        "limit": selection.limit,
        "now": selection.now,
    }
