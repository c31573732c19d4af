"""The PostgreSQL backend against a real server, with an injected clock.

Each test moves the database clock through ``now`` instead of sleeping.
"""

from __future__ import annotations

from datetime import UTC, datetime, timedelta

import psycopg
import pytest

from conveyor import payload as codec
from conveyor.backends.postgres import PostgresBackend
from conveyor.backends.protocol import (
    ClaimParams,
    Completion,
    EnqueueParams,
    HeartbeatParams,
    NewTask,
)
from conveyor.errors import ConfigurationError
from conveyor.model import LeaseToken, Outcome, RetryPolicy, TaskState

T0 = datetime(2030, 1, 1, tzinfo=UTC)
LEASE = 10.0


def new(
    name: str = "job",
    *,
    queue: str = "default",
    priority: int = 0,
    run_at: datetime | None = T0,
    max_attempts: int = 3,
    payload: object = None,
) -> NewTask:
    return NewTask(
        name=name,
        queue=queue,
        payload=codec.encode(payload if payload is not None else {}),
        priority=priority,
        max_attempts=max_attempts,
        retry=RetryPolicy(max_attempts=max_attempts),
        run_at=run_at,
    )


async def enqueue(backend: PostgresBackend, *tasks: NewTask) -> list[int]:
    return await backend.enqueue(EnqueueParams(tasks=tasks, now=T0))


async def claim(
    backend: PostgresBackend,
    worker: str = "w1",
    *,
    limit: int = 10,
    at: datetime = T0,
    names: tuple[str, ...] = ("job",),
    queues: tuple[str, ...] = ("default",),
):
    return await backend.claim(
        ClaimParams(worker_id=worker, names=names, queues=queues, limit=limit, lease=LEASE, now=at)
    )


def success(token: LeaseToken, result: object = "ok") -> Completion:
    return Completion(token, Outcome.SUCCEEDED, TaskState.SUCCEEDED, result=codec.encode(result))


def later(seconds: float) -> datetime:
    return T0 + timedelta(seconds=seconds)


async def test_migrations_are_recorded_and_idempotent(backend: PostgresBackend) -> None:
    assert await backend.migrate() == []
    async with backend.pool.connection() as conn:
        rows = await (
            await conn.execute(
                psycopg.sql.SQL("select version from {}.migrations").format(
                    psycopg.sql.Identifier(backend.schema)
                )
            )
        ).fetchall()
    assert rows == [(1,)]


def test_schema_names_are_validated() -> None:
    for bad in ("Conveyor", "1abc", "a-b", "x; drop table y", "", "a" * 41):
        with pytest.raises(ConfigurationError):
            PostgresBackend("postgresql://127.0.0.1/test", schema=bad)


async def test_heartbeat_skips_a_locked_row_without_calling_it_lost(
    backend: PostgresBackend,
) -> None:
    await enqueue(backend, new(), new())
    busy, free = await claim(backend)
    tasks = psycopg.sql.Identifier(backend.schema, "tasks")
    async with await psycopg.AsyncConnection.connect(backend.url) as locker:
        await locker.execute(
            psycopg.sql.SQL("select 1 from {} where id = %s for update").format(tasks),
            (busy.token.task_id,),
        )
        result = await backend.heartbeat(
            HeartbeatParams("w1", [busy.token, free.token], LEASE, now=later(1))
        )
        await locker.rollback()
    assert result.renewed == {free.token}
    assert result.lost == frozenset()
    busy_task = await backend.get_task(busy.token.task_id)
    assert busy_task is not None
    assert busy_task.lease_expires_at == later(LEASE)  # untouched, not extended
