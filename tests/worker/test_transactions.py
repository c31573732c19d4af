"""Attempt transactions and transactional enqueue on PostgreSQL.

A handler's writes through ``ctx.transaction()`` commit with its success and
roll back when its lease is lost; an enqueue on the caller's connection
exists only if the caller commits. Transactional enqueue on every backend
that offers it is in tests/conformance/test_transactional_enqueue.py.
"""

from __future__ import annotations

import asyncio
from dataclasses import dataclass

import psycopg

import conveyor
from conveyor import Outcome, RetryPolicy, TaskContext, TaskState
from tests.worker.helpers import RunningWorker, listening, run_all, steal, wait_for


async def test_transactional_handler_commits_with_success(app: conveyor.App, schema: str) -> None:
    table = psycopg.sql.Identifier(schema, "effects")

    @app.task()
    async def charge(ctx: TaskContext, order: int) -> str:
        conn = await ctx.transaction()
        await conn.execute(psycopg.sql.SQL("insert into {} values (%s)").format(table), (order,))
        return "charged"

    async with app:
        backend = await app.backend()
        async with backend.pool.connection() as conn:  # type: ignore[attr-defined]
            await conn.execute(psycopg.sql.SQL("create table {} (order_id int)").format(table))
        [task] = await run_all(app, [await charge.enqueue_async(order=7)])
        async with backend.pool.connection() as conn:  # type: ignore[attr-defined]
            rows = await (
                await conn.execute(psycopg.sql.SQL("select order_id from {}").format(table))
            ).fetchall()
    assert task.state is TaskState.SUCCEEDED
    assert rows == [(7,)]


async def test_transactional_handler_writes_roll_back_when_the_lease_is_lost(
    app: conveyor.App, schema: str
) -> None:
    table = psycopg.sql.Identifier(schema, "effects")
    wrote = asyncio.Event()
    release = asyncio.Event()

    @app.task()
    async def charge(ctx: TaskContext, order: int) -> str:
        conn = await ctx.transaction()
        await conn.execute(psycopg.sql.SQL("insert into {} values (%s)").format(table), (order,))
        wrote.set()
        await release.wait()  # shielded from nothing: the worker will cancel us
        return "charged"

    async with app:
        backend = await app.backend()
        async with backend.pool.connection() as conn:  # type: ignore[attr-defined]
            await conn.execute(psycopg.sql.SQL("create table {} (order_id int)").format(table))
        handle = await charge.enqueue_async(order=7)
        async with RunningWorker(app, lease=1.0, poll_interval=30) as worker:
            await asyncio.wait_for(wrote.wait(), 10)
            await wait_for(lambda: listening(worker), timeout=10)
            await steal(app, handle.id, "thief")
            await wait_for(lambda: _no_running(worker), timeout=5)
        async with backend.pool.connection() as conn:  # type: ignore[attr-defined]
            rows = await (
                await conn.execute(psycopg.sql.SQL("select order_id from {}").format(table))
            ).fetchall()
        task = await handle.get_async()
    assert rows == []
    assert task.worker_id == "thief"
    assert task.attempts[0].outcome is Outcome.LEASE_LOST


async def test_transactional_enqueue_exists_only_if_committed(
    app: conveyor.App, pg_url: str
) -> None:
    @app.task()
    async def noop() -> None:
        return None

    async with app:
        await app.backend()  # migrate
        async with await psycopg.AsyncConnection.connect(pg_url) as conn:
            rolled_back = await app.enqueue_async(noop, connection=conn)
            await conn.rollback()
            committed = await app.enqueue_async(noop, connection=conn)
            await conn.commit()
        assert await app.get_async(rolled_back.id) is None
        assert await app.get_async(committed.id) is not None

    with psycopg.connect(pg_url) as sync_conn:
        gone = app.enqueue(noop, connection=sync_conn)
        sync_conn.rollback()
        kept = app.enqueue(noop, connection=sync_conn)
        sync_conn.commit()
    assert app.get(gone.id) is None
    assert app.get(kept.id) is not None


async def test_sync_handler_transaction_commits_on_success_and_rolls_back_on_failure(
    app: conveyor.App, schema: str
) -> None:
    table = psycopg.sql.Identifier(schema, "effects")

    @app.task(retry=RetryPolicy(max_attempts=1))
    def record(ctx: TaskContext, order: int, fail: bool) -> int:
        conn = ctx.transaction_sync()
        conn.execute(psycopg.sql.SQL("insert into {} values (%s)").format(table), (order,))
        if fail:
            raise RuntimeError("after writing")
        return order

    async with app:
        backend = await app.backend()
        async with backend.pool.connection() as conn:  # type: ignore[attr-defined]
            await conn.execute(psycopg.sql.SQL("create table {} (order_id int)").format(table))
        ok = await record.enqueue_async(order=1, fail=False)
        bad = await record.enqueue_async(order=2, fail=True)
        done, failed = await run_all(app, [ok, bad])
        async with backend.pool.connection() as conn:  # type: ignore[attr-defined]
            rows = await (
                await conn.execute(psycopg.sql.SQL("select order_id from {}").format(table))
            ).fetchall()
    assert done.state is TaskState.SUCCEEDED
    assert failed.state is TaskState.FAILED
    assert rows == [(1,)]


async def _no_running(worker: conveyor.Worker) -> bool:
    return worker.running == []


async def test_a_step_s_writes_commit_with_its_transition(app: conveyor.App, schema: str) -> None:
    table = psycopg.sql.Identifier(schema, "effects")
    flow = app.workflow("payment")

    @flow.step
    @dataclass
    class Pay:
        order: int

        async def run(self, ctx: TaskContext) -> conveyor.Next:
            conn = await ctx.transaction()
            insert = psycopg.sql.SQL("insert into {} values (%s)").format(table)
            await conn.execute(insert, (self.order,))
            return conveyor.next(Receipt(self.order))

    @flow.step
    @dataclass
    class Receipt:
        order: int

        async def run(self, ctx: TaskContext) -> conveyor.Done:
            conn = await ctx.transaction()
            select = psycopg.sql.SQL("select count(*) from {}").format(table)
            [(count,)] = await (await conn.execute(select)).fetchall()
            return conveyor.done(count)

    async with app:
        backend = await app.backend()
        async with backend.pool.connection() as conn:  # type: ignore[attr-defined]
            await conn.execute(psycopg.sql.SQL("create table {} (order_id int)").format(table))
        [task] = await run_all(app, [await flow.start_async(Pay(order=3))])
    assert task.state is TaskState.SUCCEEDED
    assert task.result == 1  # the second step saw the first step's committed write
    assert [a.step for a in task.attempts] == ["Pay", "Receipt"]
