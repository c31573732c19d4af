"""Every backend writes the very texts of ``conveyor.backends.stored`` in the
attempt log when it ends an attempt itself: a reclaim, a spent crash budget,
a cancel found at a reclaim and a quarantine (Redis: also of a task whose
fields do not read, which the SQL stores' columns refuse)."""

from __future__ import annotations

import sqlite3
from datetime import UTC, datetime, timedelta

import pytest
import redis.asyncio as aioredis
from psycopg import sql

from conveyor import payload as codec
from conveyor.backends.params import ClaimParams, EnqueueParams, NewTask
from conveyor.backends.protocol import Backend
from conveyor.backends.redis import keys
from conveyor.backends.stored import (
    CANCELLED_MEANWHILE,
    CORRUPT_TASK_ERROR,
    LEASE_EXPIRED,
    LEASE_EXPIRED_ERROR,
    corrupt_counter_message,
    corrupt_field_message,
    lease_lost_message,
)
from conveyor.model import Attempt, Outcome, RetryPolicy, TaskState
from tests.conftest import REDIS_URL

T0 = datetime(2030, 1, 1, tzinfo=UTC)
LEASE = 10.0
LIMIT = 2_147_483_646
"""An attempt counter standing here cannot be claimed: the next would not fit."""


async def enqueue(backend: Backend, max_attempts: int = 3) -> int:
    new = NewTask("job", "q", codec.encode({}), 0, max_attempts, RetryPolicy(max_attempts))
    [task_id] = await backend.enqueue(EnqueueParams([new], now=T0))
    return task_id


async def claim(backend: Backend, worker: str, seconds: float = 0.0) -> list[int]:
    at = T0 + timedelta(seconds=seconds)
    found = await backend.claim(ClaimParams(worker, ["job"], ["q"], 5, LEASE, now=at))
    return [c.token.task_id for c in found]


async def attempts(backend: Backend, task_id: int) -> tuple[TaskState, list[Attempt]]:
    task = await backend.get_task(task_id)
    assert task is not None
    return task.state, list(task.attempts)


async def test_a_reclaim_logs_the_shared_text(backend: Backend) -> None:
    task_id = await enqueue(backend)
    assert await claim(backend, "w1") == [task_id]
    assert await claim(backend, "w2", LEASE) == [task_id]
    state, [lost, _running] = await attempts(backend, task_id)
    assert state is TaskState.IN_PROGRESS
    assert (lost.outcome, lost.error_type, lost.error_message) == (
        Outcome.LEASE_LOST,
        LEASE_EXPIRED_ERROR,
        LEASE_EXPIRED,
    )


async def test_a_spent_crash_budget_logs_the_shared_text(backend: Backend) -> None:
    task_id = await enqueue(backend, max_attempts=2)
    assert await claim(backend, "w1") == [task_id]
    assert await claim(backend, "w2", LEASE) == [task_id]
    assert await claim(backend, "w3", 2 * LEASE) == []
    state, [_first, last] = await attempts(backend, task_id)
    assert state is TaskState.FAILED
    assert (last.outcome, last.error_type, last.error_message) == (
        Outcome.LEASE_LOST,
        LEASE_EXPIRED_ERROR,
        lease_lost_message(False, 2, 2),
    )
    assert last.error_message == (
        "lease expired and the crash budget is spent (2 of 2 attempts): "
        "the worker stopped heartbeating (crash, kill or stall)"
    )


async def test_a_cancel_found_at_a_reclaim_logs_the_shared_text(backend: Backend) -> None:
    task_id = await enqueue(backend)
    assert await claim(backend, "w1") == [task_id]
    assert await backend.cancel(task_id, now=T0) is TaskState.IN_PROGRESS
    assert await claim(backend, "w2", LEASE) == []
    state, [last] = await attempts(backend, task_id)
    assert state is TaskState.CANCELLED
    assert (last.outcome, last.error_type, last.error_message) == (
        Outcome.LEASE_LOST,
        LEASE_EXPIRED_ERROR,
        CANCELLED_MEANWHILE,
    )
    assert lease_lost_message(True, 1, 3) == CANCELLED_MEANWHILE


async def write_around(backend: Backend, statement: str, *args: object) -> None:
    """Raw SQL on the backend's tasks table (``{tasks}``), around conveyor."""
    if type(backend).__name__ == "PostgresBackend":
        schema = backend.schema  # type: ignore[attr-defined]
        text = sql.SQL(statement).format(tasks=sql.Identifier(schema, "tasks"))
        async with backend.pool.connection() as conn:  # type: ignore[attr-defined]
            await conn.execute(text, args)
        return
    conn = sqlite3.connect(backend.path, isolation_level=None)  # type: ignore[attr-defined]
    try:
        conn.execute(statement.format(tasks="conveyor_tasks").replace("%s", "?"), args)
    finally:
        conn.close()


async def test_a_quarantine_logs_the_shared_text(backend: Backend) -> None:
    if type(backend).__name__ == "MemoryBackend":
        pytest.skip("the memory store has no counter limit: nothing to quarantine")
    task_id = await enqueue(backend)
    if type(backend).__name__ == "RedisBackend":
        await set_in_redis(backend, task_id, "attempt", str(LIMIT))
    else:
        await write_around(backend, "update {tasks} set attempt = %s where id = %s", LIMIT, task_id)
    assert await claim(backend, "w1") == []
    state, attempts_ = await attempts(backend, task_id)
    assert state is TaskState.FAILED
    last = attempts_[-1]
    assert (last.outcome, last.error_type, last.error_message) == (
        Outcome.FAILED,
        CORRUPT_TASK_ERROR,
        corrupt_counter_message(LIMIT, 0),
    )


async def set_in_redis(backend: Backend, task_id: int, field: str, value: str) -> None:
    prefix: str = backend.prefix  # type: ignore[attr-defined]
    client = aioredis.Redis.from_url(REDIS_URL, decode_responses=True)
    try:
        await client.hset(keys.task(prefix, task_id), field, value)
    finally:
        await client.aclose()


async def test_redis_sets_a_task_whose_field_does_not_read_aside_with_the_shared_text(
    backend: Backend,
) -> None:
    """A claim that meets a task whose counters do not read sets it aside:
    into ``{p}:corrupt`` (see ``conveyor.backends.redis.keys``), out of
    every claim index, ended failed with the shared text, its other fields
    as they were. It blocks nothing behind it and no claim takes it again."""
    if type(backend).__name__ != "RedisBackend":
        pytest.skip("the SQL stores' columns refuse such values (see test_corrupt_rows)")
    prefix: str = backend.prefix  # type: ignore[attr-defined]
    task_id = await enqueue(backend)
    await set_in_redis(backend, task_id, "attempt", "not a number")
    behind = await enqueue(backend)
    assert await claim(backend, "w1") == [behind]
    assert await claim(backend, "w2", 2 * LEASE) == [behind]  # a reclaim, never task_id
    client = aioredis.Redis.from_url(REDIS_URL, decode_responses=True)
    try:
        assert await client.smembers(f"{keys.base(prefix)}:corrupt") == {str(task_id)}
        assert await client.hget(keys.task(prefix, task_id), "attempt") == "not a number"
        assert await client.zscore(keys.pending(prefix, "q"), str(task_id)) is None
    finally:
        await client.aclose()
    assert await backend.next_due_at(["q"]) is None
    state, [only] = await attempts(backend, task_id)
    assert state is TaskState.FAILED
    assert (only.number, only.outcome, only.error_type, only.error_message) == (
        1,
        Outcome.FAILED,
        CORRUPT_TASK_ERROR,
        corrupt_field_message("attempt", "'not a number'"),
    )
