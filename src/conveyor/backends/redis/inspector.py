"""The Redis backend's reads: tasks with their attempts, lists and counts,
workers, keys, inboxes, schedules, pauses and what is due. Scripts that only
read where a read must see one moment (``count_unfinished``, ``list_keys``,
``count_prunable``); pipelined commands on indexes elsewhere (see
:mod:`.reads`), never a walk of the key space."""

from __future__ import annotations

from collections.abc import Sequence
from datetime import datetime
from typing import cast

from conveyor.backends.params import WorkFilter
from conveyor.backends.redis import (
    concurrency,
    keys,
    reads,
    rows,
    schedules,
)
from conveyor.backends.redis.store import RedisStore, translated
from conveyor.backends.stored import check_bucket_seconds
from conveyor.model import (
    Attempt,
    Message,
    Pause,
    Task,
)
from conveyor.records import (
    ActivityBucket,
    KeyInfo,
    Migration,
    PruneParams,
    PruneResult,
    QueueBacklog,
    StoredSchedule,
    TaskCount,
    TaskFilter,
    TaskSummary,
    WorkerInfo,
)


class RedisInspector(RedisStore):
    """Reads of a Redis store."""

    async def get_task(self, task_id: int, with_attempts: bool = True) -> Task | None:
        """The task and its attempt log, read together (MULTI). Raises
        BackendError for a task whose stored fields do not read."""
        with translated():
            async with self._redis.pipeline(transaction=True) as pipe:
                pipe.hgetall(keys.task(self.prefix, task_id))
                if with_attempts:
                    pipe.lrange(keys.attempts(self.prefix, task_id), 0, -1)
                found = await pipe.execute()
        if not found[0]:
            return None
        attempts: tuple[Attempt, ...] = ()
        if with_attempts:
            attempts = rows.attempts(task_id, found[0], found[1])
        return rows.task(task_id, found[0], attempts)

    async def list_tasks(self, task_filter: TaskFilter) -> list[Task]:
        """Tasks newest first, filtered and paged as :class:`TaskFilter`
        says, without attempt logs: served by the per-state index when the
        filter names a state, else by the index of every task; a name or
        queue filter is applied to what the index gives (see
        :func:`.reads.list_tasks` for its cost)."""
        with translated():
            return await reads.list_tasks(self._redis, self.prefix, task_filter)

    async def list_summaries(self, task_filter: TaskFilter) -> list[TaskSummary]:
        """What :meth:`list_tasks` lists, as summaries: the named fields of
        each hash and the last row of each failed attempt log, never a
        payload or a result (see :func:`.reads.list_summaries`)."""
        with translated():
            return await reads.list_summaries(self._redis, self.prefix, task_filter)

    async def running_by_worker(self) -> dict[str, int]:
        """Running tasks by owner, off the index of running tasks (see
        :func:`.reads.running_by_worker`)."""
        with translated():
            return await reads.running_by_worker(self._redis, self.prefix)

    async def count_tasks(self) -> list[TaskCount]:
        """Tasks by state, queue and name: reads every task's three fields,
        pipelined, as :meth:`Inspector.count_tasks` allows."""
        with translated():
            return await reads.count_tasks(self._redis, self.prefix)

    async def list_workers(self) -> list[WorkerInfo]:
        """Every registered worker, live or stopped, newest start first."""
        with translated():
            return await reads.list_workers(self._redis, self.prefix)

    async def list_keys(self, limit: int = 1000, now: datetime | None = None) -> list[KeyInfo]:
        """The concurrency keys that hold tasks back, by key, at most
        ``limit`` (one script, reads only; it reads every key row). Unique
        keys are not listed here, on any backend."""
        found = await self._run("list_keys", [rows.now_arg(now)])
        return concurrency.listed(found, limit)

    async def queue_backlogs(self, now: datetime | None = None) -> list[QueueBacklog]:
        """Each known queue's pending set (by run time): three reads a
        queue, pipelined, at the server's time."""
        with translated():
            return await reads.queue_backlogs(self._redis, self.prefix, now)

    async def activity(self, since: datetime, bucket_seconds: int) -> list[ActivityBucket]:
        """Tasks finished since ``since`` by bucket: counted in the index of
        finished tasks by finish time, a few reads (see :func:`.reads.activity`)."""
        bucket = check_bucket_seconds(bucket_seconds)
        with translated():
            return await reads.activity(self._redis, self.prefix, since, bucket)

    async def key_holders(self, key: str, limit: int = 20) -> list[int]:
        """The running tasks of key ``key``: its set of leases (reads only)."""
        with translated():
            found = await self._redis.zrange(keys.concurrency_leases(self.prefix, key), 0, -1)
        return sorted(int(cast(str, task_id)) for task_id in found)[:limit]

    async def count_prunable(self, params: PruneParams) -> PruneResult:
        """What :meth:`prune` would delete over all its batches (one script,
        reads only)."""
        found = await self._run("count_prunable", rows.prune_args(params)[1:])
        return PruneResult(tasks=int(found[0]), workers=int(found[1]))

    async def pending_migrations(self) -> list[Migration]:
        """A Redis store has no numbered migrations, only a key layout
        version: one pending "migration" when the prefix holds no store or
        one of an older layout (``conveyor migrate`` marks or converts it,
        see ``lua/open.lua``); none when it is current. One GET; writes
        nothing. Raises ConfigurationError for a store of another layout."""
        found = await self._layout()
        if found == keys.LAYOUT_VERSION:
            return []
        if found is not None and found not in keys.UPGRADED:
            raise self._other_layout(found)
        action = "marks this new store" if found is None else f"converts layout {found} to"
        script = (
            f"-- conveyor migrate {action} key layout {keys.LAYOUT_VERSION} "
            "(lua/open.lua): Redis has no SQL to review\n"
        )
        return [Migration(int(keys.LAYOUT_VERSION), f"layout_{keys.LAYOUT_VERSION}", script)]

    async def count_unfinished(self, work: WorkFilter) -> int:
        queues = list(dict.fromkeys(work.queues))
        if not queues or not work.names:
            return 0
        args = [rows.now_arg(work.now), len(queues), *queues, *dict.fromkeys(work.names)]
        return int(await self._run("count_unfinished", args))

    async def next_due_at(self, queues: Sequence[str]) -> datetime | None:
        """The earliest run time of a pending task of these queues: the head
        of each queue's pending set, read in one pipelined round trip."""
        wanted = list(dict.fromkeys(queues))
        if not wanted:
            return None
        with translated():
            async with self._redis.pipeline(transaction=False) as pipe:
                for queue in wanted:
                    pipe.zrange(keys.pending(self.prefix, queue), 0, 0, withscores=True)
                heads = await pipe.execute()
        found = [int(score) for head in heads for _, score in head]
        return rows.moment(min(found)) if found else None

    async def inbox(self, task_id: int) -> list[Message]:
        """The task's unread messages, oldest first (one ZRANGE); [] for a
        task without messages or without an inbox. Raises BackendError for a
        message that does not read."""
        with translated():
            found = cast(
                list[str], await self._redis.zrange(keys.inbox(self.prefix, task_id), 0, -1)
            )
        return [rows.message(task_id, text) for text in found]

    async def list_schedules(self) -> tuple[datetime, list[StoredSchedule]]:
        """The server's now and every stored schedule by name (one MULTI)."""
        with translated():
            return await schedules.listed(self._redis, self.prefix)

    async def store_clock(self) -> datetime:
        """The server's now (one TIME), to the millisecond as the store keeps time."""
        with translated():
            seconds, micros = await self._redis.time()
        return rows.moment(int(seconds) * 1000 + int(micros) // 1000)

    async def list_pauses(self) -> list[Pause]:
        """Every pause, by kind then name (one HGETALL)."""
        with translated():
            found = cast(dict[str, str], await self._redis.hgetall(keys.pauses(self.prefix)))
        listed = [rows.pause(field, at) for field, at in found.items()]
        return sorted(listed, key=lambda p: (p.kind.value, p.name))
