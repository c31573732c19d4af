"""The Inspector's reads on Redis: get, list, summaries, counts, activity,
backlogs, keys, and what is due (``count_unfinished``, ``next_due_at``).

A mixin of :class:`~conveyor.backends.redis.backend.RedisBackend`
(:class:`Listings`). Most reads are a few pipelined round trips on indexes,
never a script and never a walk of the key space: not one atomic snapshot
(a list may see a task move state between two pages, as a SQL read under
READ COMMITTED would). Scripts that only read serve the reads that must
see one moment (``count_unfinished``, ``list_keys``).
"""

from __future__ import annotations

import heapq
from collections import Counter
from collections.abc import AsyncIterator, Sequence
from datetime import datetime
from typing import cast

import redis.asyncio as aioredis

from conveyor.backends.params import WorkFilter, read_ids
from conveyor.backends.redis import keys, rows
from conveyor.backends.redis.flow import listed_keys
from conveyor.backends.redis.store import RedisStore, translated
from conveyor.backends.stored import activity_buckets, check_bucket_seconds
from conveyor.model import Attempt, Task, TaskState
from conveyor.records import (
    ActivityBucket,
    DependencyEdge,
    DependencyRecord,
    KeyInfo,
    QueueBacklog,
    TaskCount,
    TaskFilter,
    TaskSummary,
)

PAGE = 200
"""Task ids a list or a count reads per round trip."""
FINISHED_TIME_SHIFT = 100_000_000_000_000
"""Added to a finish time (ms) in the members of ``{p}:finished:S``
(``lua/lib/indexes.lua``'s ``finished_member``), so that times before 1970 sort too."""
COUNTED_BUCKETS = 2_000
"""At most this many buckets, :func:`activity` counts each in the index; more,
it reads the index's members instead."""
_ENDED = (TaskState.SUCCEEDED.value, TaskState.FAILED.value)


async def list_tasks(client: aioredis.Redis, prefix: str, task_filter: TaskFilter) -> list[Task]:
    """Newest first from the index of the filter's state (``{p}:state:S``),
    else from every state's index, merged by id; a name or queue filter is
    applied to what the indexes give, ``PAGE`` ids per round trip, so a rare
    name or queue costs a walk of that state's tasks (or of all of them) down
    to ``limit`` matches. A task is taken from an index only while its hash
    holds that index's state (or holds no state it could have moved to:
    written around conveyor, it is listed as corrupt): one that moves during
    the read is listed once at most. A ``parent`` filter reads that parent's index of children
    instead (``{p}:children:ID``), the other filters applied to it."""
    found = await _listed(client, prefix, task_filter, None)
    return [rows.task(task_id, fields, ()) for task_id, fields in found]


SUMMARY_FIELDS = (
    "state",
    "name",
    "queue",
    "priority",
    "run_at",
    "attempt",
    "max_attempts",
    "created_at",
    "finished_at",
    "worker_id",
    "cancel_requested",
    "step",
)
"""The fields of a task's hash a summary reads (never ``payload`` or ``result``)."""


async def list_summaries(
    client: aioredis.Redis, prefix: str, task_filter: TaskFilter
) -> list[TaskSummary]:
    """The tasks :func:`list_tasks` lists, from the same indexes, as
    summaries: ``SUMMARY_FIELDS`` of each hash (HMGET), then, for each task
    not running that did not succeed, the last row of its attempt log
    (LINDEX), pipelined. That row holds its traceback, as conveyor's worker
    cut it (32,000 characters at most)."""
    found = await _listed(client, prefix, task_filter, SUMMARY_FIELDS)
    return await _summarized(client, prefix, found)


async def summaries(client: aioredis.Redis, prefix: str, ids: Sequence[int]) -> list[TaskSummary]:
    """The stored tasks among ``ids`` (checked, each once), as summaries,
    highest id first: ``SUMMARY_FIELDS`` of each hash (HMGET, pipelined),
    then the last rows of attempt logs as :func:`list_summaries` reads them."""
    wanted = sorted(ids, reverse=True)
    async with client.pipeline(transaction=False) as pipe:
        for task_id in wanted:
            pipe.hmget(keys.task(prefix, task_id), *SUMMARY_FIELDS)
        hashes = await pipe.execute()
    found = [
        (task_id, _named(SUMMARY_FIELDS, stored))
        for task_id, stored in zip(wanted, hashes, strict=True)
    ]
    return await _summarized(client, prefix, [(i, f) for i, f in found if f])


async def _summarized(
    client: aioredis.Redis, prefix: str, found: list[tuple[int, dict[str, str]]]
) -> list[TaskSummary]:
    """Summaries of tasks read with their ``SUMMARY_FIELDS``: the last row
    of the attempt log of each one not running that did not succeed
    (LINDEX, pipelined), then each summary."""
    ended = [task_id for task_id, fields in found if fields.get("state") in _MAY_HAVE_FAILED]
    last: dict[int, str | None] = {}
    if ended:
        async with client.pipeline(transaction=False) as pipe:
            for task_id in ended:
                pipe.lindex(keys.attempts(prefix, task_id), -1)
            last = dict(zip(ended, await pipe.execute(), strict=True))
    return [rows.summary(task_id, fields, last.get(task_id)) for task_id, fields in found]


_MAY_HAVE_FAILED = tuple(
    s.value for s in TaskState if s not in (TaskState.IN_PROGRESS, TaskState.SUCCEEDED)
)


async def _listed(
    client: aioredis.Redis,
    prefix: str,
    task_filter: TaskFilter,
    fields: tuple[str, ...] | None,
) -> list[tuple[int, dict[str, str]]]:
    """The tasks a listing takes (see :func:`list_tasks`), each with its
    hash: whole (``fields`` None) or only the ``fields`` named, which must
    include ``state``, ``name`` and ``queue``."""
    indexes: list[tuple[str, str | None]]  # each index, and the state its tasks hold
    if task_filter.parent is not None:
        wanted = None if task_filter.state is None else task_filter.state.value
        indexes = [(keys.children(prefix, task_filter.parent), wanted)]
    else:
        states = _STATE_NAMES if task_filter.state is None else (task_filter.state.value,)
        indexes = [(keys.state(prefix, state), state) for state in states]
    found: list[tuple[int, dict[str, str]]] = []
    top = f"({task_filter.before}" if task_filter.before is not None else "+inf"
    while len(found) < task_filter.limit:
        async with client.pipeline(transaction=False) as pipe:
            for index, _state in indexes:
                pipe.zrevrangebyscore(index, top, "-inf", start=0, num=PAGE)
            heads = cast(list[list[str]], await pipe.execute())
        page = heapq.nlargest(
            PAGE,
            (
                (int(task_id), state)
                for (_index, state), ids in zip(indexes, heads, strict=True)
                for task_id in ids
            ),
        )
        if not page:
            break
        async with client.pipeline(transaction=False) as pipe:
            for task_id, _state in page:
                if fields is None:
                    pipe.hgetall(keys.task(prefix, task_id))
                else:
                    pipe.hmget(keys.task(prefix, task_id), *fields)
            hashes = await pipe.execute()
        for (task_id, state), stored in zip(page, hashes, strict=True):
            held = stored if fields is None else _named(fields, stored)
            if held and _in_state(held.get("state"), state) and _matches(held, task_filter):
                found.append((task_id, held))
        top = f"({page[-1][0]}"
    return found[: task_filter.limit]


def _named(fields: tuple[str, ...], values: list[str | None]) -> dict[str, str]:
    """An HMGET's answer as the part of the hash it read (absent fields left out)."""
    return {name: value for name, value in zip(fields, values, strict=True) if value is not None}


async def running_by_worker(client: aioredis.Redis, prefix: str) -> dict[str, int]:
    """Running tasks by owner: the index of running tasks, ``PAGE`` ids at a
    time, and of each task only its ``state`` and ``worker_id`` (HMGET)."""
    found: Counter[str] = Counter()
    index = keys.state(prefix, TaskState.IN_PROGRESS.value)
    top = "+inf"
    while True:
        ids = cast(list[str], await client.zrevrangebyscore(index, top, "-inf", start=0, num=PAGE))
        if not ids:
            break
        async with client.pipeline(transaction=False) as pipe:
            for task_id in ids:
                pipe.hmget(keys.task(prefix, int(task_id)), "state", "worker_id")
            owners = await pipe.execute()
        for stored, worker_id in owners:
            if stored == TaskState.IN_PROGRESS.value and worker_id is not None:
                found[worker_id] += 1
        top = f"({ids[-1]}"
    return dict(found)


def _in_state(stored: str | None, state: str | None) -> bool:
    """Whether a task holding ``stored`` found in the index of ``state`` is
    listed from it: it still holds that state, or (written around conveyor)
    no state at all, which no move gives: it is listed where it was found."""
    return state in (None, stored) or stored not in _STATE_NAMES


def _matches(fields: dict[str, str], task_filter: TaskFilter) -> bool:
    return task_filter.name in (None, fields.get("name")) and task_filter.queue in (
        None,
        fields.get("queue"),
    )


async def queue_backlogs(
    client: aioredis.Redis, prefix: str, now: datetime | None
) -> list[QueueBacklog]:
    """Each queue of ``{p}:queues`` with pending tasks: its pending set
    counted up to ``now`` (the server's time when None) and past it, and
    the score of its head (the oldest run time) when that is due."""
    if now is None:
        seconds, micros = await client.time()
        now_ms = int(seconds) * 1000 + int(micros) // 1000
    else:
        now_ms = int(now.timestamp() * 1000)
    queues = sorted(cast(set[str], await client.smembers(keys.queues(prefix))))
    async with client.pipeline(transaction=False) as pipe:
        for queue in queues:
            index = keys.pending(prefix, queue)
            pipe.zcount(index, "-inf", now_ms)
            pipe.zcard(index)
            pipe.zrange(index, 0, 0, withscores=True)
        found = await pipe.execute()
    backlogs = []
    for n, queue in enumerate(queues):
        due, total, head = int(found[3 * n]), int(found[3 * n + 1]), found[3 * n + 2]
        if not total:
            continue
        oldest = rows.moment(int(head[0][1])) if due and head else None
        backlogs.append(QueueBacklog(queue, due, total - due, oldest))
    return backlogs


async def count_tasks(client: aioredis.Redis, prefix: str) -> list[TaskCount]:
    """Every task's state, queue and name, read ``PAGE`` at a time from each
    state's index (as the protocol says: no index holds the three together).
    A task is counted under the index it was found in, and only while its
    hash holds that state (or no state: see :func:`list_tasks`): one that
    moves during the read is counted once at most. A queue or name that is
    missing (written around conveyor) counts as ""."""
    found: Counter[tuple[str, str, str]] = Counter()
    for state in _STATE_NAMES:
        top = "+inf"
        while True:
            index = keys.state(prefix, state)
            ids = cast(
                list[str], await client.zrevrangebyscore(index, top, "-inf", start=0, num=PAGE)
            )
            if not ids:
                break
            async with client.pipeline(transaction=False) as pipe:
                for task_id in ids:
                    pipe.hmget(keys.task(prefix, int(task_id)), "state", "queue", "name")
                rows_ = await pipe.execute()
            for stored, queue, name in rows_:
                if _in_state(stored, state):
                    found[(state, queue or "", name or "")] += 1
            top = f"({ids[-1]}"
    return [TaskCount(TaskState(s), q, n, c) for (s, q, n), c in sorted(found.items())]


_STATE_NAMES = tuple(state.value for state in TaskState)


def _finished_bound(ms: int) -> str:
    """The lexical bound before every member ``ms|id`` of a finished index."""
    return f"{ms + FINISHED_TIME_SHIFT:015d}|"


async def activity(
    client: aioredis.Redis, prefix: str, since: datetime, bucket_seconds: int
) -> list[ActivityBucket]:
    """Succeeded and failed tasks by the bucket of their finish time, from
    the finished indexes (``{p}:finished:S``, ordered by finish time): one
    read for the newest finish of each, then a count per bucket up to it
    (``ZLEXCOUNT``, pipelined), or past :data:`COUNTED_BUCKETS` buckets, a
    walk of the members since ``since``, ``PAGE`` at a time."""
    since_ms = rows.ms(since)
    width = bucket_seconds * 1000
    start = _finished_bound(since_ms)
    async with client.pipeline(transaction=False) as pipe:
        for state in _ENDED:
            pipe.zrevrangebylex(keys.finished(prefix, state), "+", f"[{start}", start=0, num=1)
        newest = cast(list[list[str]], await pipe.execute())
    ends = [int(head[0].split("|")[0]) - FINISHED_TIME_SHIFT for head in newest if head]
    if not ends:
        return []
    count = (max(ends) - since_ms) // width + 1
    found: dict[int, list[int]] = {}
    if count <= COUNTED_BUCKETS:
        async with client.pipeline(transaction=False) as pipe:
            for state in _ENDED:
                for number in range(count):
                    low = _finished_bound(since_ms + number * width)
                    high = _finished_bound(since_ms + (number + 1) * width)
                    pipe.zlexcount(keys.finished(prefix, state), f"[{low}", f"({high}")
            counted = cast(list[int], await pipe.execute())
        for number in range(count):
            found[number] = [int(counted[number]), int(counted[count + number])]
    else:
        for column, state in enumerate(_ENDED):
            async for member in _members_since(client, keys.finished(prefix, state), start):
                ended = int(member.split("|")[0]) - FINISHED_TIME_SHIFT
                found.setdefault((ended - since_ms) // width, [0, 0])[column] += 1
    return activity_buckets(since, bucket_seconds, ((n, c[0], c[1]) for n, c in found.items()))


async def _members_since(client: aioredis.Redis, index: str, start: str) -> AsyncIterator[str]:
    low = f"[{start}"
    while True:
        page = cast(list[str], await client.zrangebylex(index, low, "+", start=0, num=PAGE))
        for member in page:
            yield member
        if len(page) < PAGE:
            return
        low = f"({page[-1]}"


class Listings(RedisStore):
    """The Inspector's reads, and the reads a worker makes of what is due."""

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

    async def dependencies(self, task_id: int) -> list[DependencyRecord]:
        """The task's dependencies in the order given, read at one moment
        (``dependencies.lua``); [] for a task without any, or not stored."""
        found = await self._run("dependencies", [task_id])
        return [rows.dependency(row) for row in found]

    async def edges(self, ids: Sequence[int]) -> list[DependencyEdge]:
        """Both sides of the edges of ``ids``, read at one moment
        (``edges.lua``: each id's after list and settled set, and its set of
        edges to it, with each one's settled mark), sorted here."""
        wanted = read_ids(ids)
        if not wanted:
            return []
        found = await self._run("edges", [str(task_id) for task_id in wanted])
        return sorted((rows.edge(row) for row in found), key=lambda e: (e.dependent, e.position))

    async def list_tasks(self, task_filter: TaskFilter) -> list[Task]:
        """Tasks newest first, filtered and paged as :class:`TaskFilter`
        says, without attempt logs: served by the per-state index when the
        filter names a state, else by the index of every task; a name or
        queue filter is applied to what the index gives (see
        :func:`.list_tasks` for its cost)."""
        with translated():
            return await list_tasks(self._redis, self.prefix, task_filter)

    async def list_summaries(self, task_filter: TaskFilter) -> list[TaskSummary]:
        """What :meth:`list_tasks` lists, as summaries: the named fields of
        each hash and the last row of each failed attempt log, never a
        payload or a result (see :func:`.list_summaries`)."""
        with translated():
            return await list_summaries(self._redis, self.prefix, task_filter)

    async def summaries(self, ids: Sequence[int]) -> list[TaskSummary]:
        """``SUMMARY_FIELDS`` of each id's hash, then the last row of the
        attempt log of each one not running that did not succeed: two
        pipelined round trips (see :func:`.summaries`)."""
        wanted = read_ids(ids)
        if not wanted:
            return []
        with translated():
            return await summaries(self._redis, self.prefix, wanted)

    async def running_by_worker(self) -> dict[str, int]:
        """Running tasks by owner, off the index of running tasks (see
        :func:`.running_by_worker`)."""
        with translated():
            return await running_by_worker(self._redis, self.prefix)

    async def count_tasks(self) -> list[TaskCount]:
        """Tasks by state, queue and name: reads every task's three fields,
        pipelined, as :meth:`Inspector.count_tasks` allows."""
        with translated():
            return await count_tasks(self._redis, self.prefix)

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

    async def list_keys(self, limit: int = 1000, now: datetime | None = None) -> list[KeyInfo]:
        """The concurrency keys that hold tasks back, by key, at most
        ``limit`` (one script, reads only; it reads every key row). Unique
        keys are not listed here, on any backend."""
        found = await self._run("list_keys", [rows.now_arg(now)])
        return listed_keys(found, limit)

    async def queue_backlogs(self, now: datetime | None = None) -> list[QueueBacklog]:
        """Each known queue's pending set (by run time): three reads a
        queue, pipelined, at the server's time."""
        with translated():
            return await queue_backlogs(self._redis, self.prefix, now)

    async def activity(self, since: datetime, bucket_seconds: int) -> list[ActivityBucket]:
        """Tasks finished since ``since`` by bucket: counted in the index of
        finished tasks by finish time, a few reads (see :func:`.activity`)."""
        bucket = check_bucket_seconds(bucket_seconds)
        with translated():
            return await activity(self._redis, self.prefix, since, bucket)

    async def key_holders(self, key: str, limit: int = 20) -> list[int]:
        """The running tasks of key ``key``: its set of leases (reads only)."""
        with translated():
            found = await self._redis.zrange(keys.concurrency_leases(self.prefix, key), 0, -1)
        return sorted(int(cast(str, task_id)) for task_id in found)[:limit]
