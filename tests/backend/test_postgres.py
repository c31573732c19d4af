"""What only the PostgreSQL backend has: migrations, schema names, row locks.

The common contract is in tests/conformance/, run against every backend.
"""

from __future__ import annotations

import psycopg
import pytest

from conveyor.backends.postgres import PostgresBackend, queries
from conveyor.backends.protocol import HeartbeatParams
from conveyor.errors import ConfigurationError
from tests.conformance.test_tasks import LEASE, claim, enqueue, later, new


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
    assert rows == [(version,) for version, _name, _sql in queries.migrations()]


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
