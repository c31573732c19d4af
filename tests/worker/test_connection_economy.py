"""Server sessions of a worker on PostgreSQL: ``work_connections`` for its
own statements and one session connection (LISTEN, turns, heartbeats),
whatever its concurrency; a handler's own transaction borrows one more
only while it runs."""

from __future__ import annotations

import asyncio
import contextlib
import uuid
from collections.abc import AsyncIterator

import psycopg
import pytest

import conveyor
from conveyor.backends.postgres import pools
from tests.conftest import PG_URL
from tests.worker.helpers import RunningWorker, wait_for, wait_terminal


def _named(name: str) -> str:
    return f"{PG_URL}{'&' if '?' in PG_URL else '?'}application_name={name}"


class Sessions:
    """The server sessions of one application name, sampled every 10 ms."""

    def __init__(self, name: str) -> None:
        self.name = name
        self.seen: list[int] = []

    async def count(self, conn: psycopg.AsyncConnection[object]) -> int:
        cursor = await conn.execute(
            "select count(*) from pg_stat_activity where application_name = %s", (self.name,)
        )
        found = await cursor.fetchone()
        return int(found[0]) if found else 0

    @contextlib.asynccontextmanager
    async def sampled(self) -> AsyncIterator[Sessions]:
        async with await psycopg.AsyncConnection.connect(PG_URL, autocommit=True) as conn:

            async def sample() -> None:
                while True:
                    self.seen.append(await self.count(conn))
                    await asyncio.sleep(0.01)

            sampler = asyncio.get_running_loop().create_task(sample())
            try:
                yield self
            finally:
                sampler.cancel()
                with contextlib.suppress(asyncio.CancelledError):
                    await sampler


@pytest.mark.parametrize(("work_connections", "concurrency"), [(1, 50), (2, 50), (2, 4)])
async def test_a_draining_worker_holds_its_work_connections_and_one_session(
    schema: str, work_connections: int, concurrency: int
) -> None:
    name = f"conveyor-economy-{uuid.uuid4().hex[:8]}"
    worker_app = conveyor.App(_named(name), schema=schema)
    client = conveyor.App(PG_URL, schema=schema)

    @worker_app.task(name="noop")
    async def noop(i: int) -> int:
        await asyncio.sleep(0.001)
        return i

    @client.task(name="noop")
    async def same(i: int) -> int:
        return i

    try:
        await client.migrate_async()
        handles = await client.enqueue_many_async(same, [{"i": i} for i in range(1500)])
        sessions = Sessions(name)
        async with (
            sessions.sampled(),
            RunningWorker(worker_app, concurrency=concurrency, work_connections=work_connections),
        ):
            done = await wait_terminal(client, [h.id for h in handles], timeout=120)
        assert {t.state for t in done} == {conveyor.TaskState.SUCCEEDED}
        assert max(sessions.seen) == work_connections + 1, sessions.seen[-50:]
    finally:
        await worker_app.aclose()
        await client.aclose()


async def test_a_handlers_transaction_borrows_a_connection_only_while_it_runs(
    schema: str, monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.setattr(pools, "TRANSACTION_IDLE", 0.5)
    name = f"conveyor-economy-{uuid.uuid4().hex[:8]}"
    app = conveyor.App(_named(name), schema=schema)
    client = conveyor.App(PG_URL, schema=schema)  # enqueues without a session of the name
    inside, leave = asyncio.Event(), asyncio.Event()

    @app.task()
    async def writes(ctx: conveyor.TaskContext) -> int:
        conn = await ctx.transaction()
        await conn.execute("select 1")
        inside.set()
        await leave.wait()
        return 1

    client.task(name=writes.name)(_never)
    sessions = Sessions(name)
    try:
        await client.migrate_async()
        async with (
            await psycopg.AsyncConnection.connect(PG_URL, autocommit=True) as probe,
            RunningWorker(app, concurrency=4, work_connections=1) as worker,
        ):

            async def settled() -> bool:
                return worker.claims_made > 0 and await sessions.count(probe) == 2

            await wait_for(settled)
            handle = await client.enqueue_async(writes.name)
            await asyncio.wait_for(inside.wait(), 30)
            assert await sessions.count(probe) == 3
            leave.set()
            [task] = await wait_terminal(client, [handle.id], timeout=30)
            assert task.state is conveyor.TaskState.SUCCEEDED

            async def returned() -> bool:
                return await sessions.count(probe) == 2

            await wait_for(returned)
    finally:
        await app.aclose()
        await client.aclose()


async def _never() -> int:
    raise AssertionError("run by the worker's app only")
