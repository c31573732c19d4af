"""Rows written around conveyor, and handlers that ignore every order to stop."""

from __future__ import annotations

import asyncio

import psycopg

import conveyor
from conveyor import Outcome, RetryPolicy, TaskState
from tests.worker.helpers import RunningWorker, run_all


async def _sql(app: conveyor.App, statement: psycopg.sql.Composable, *args: object) -> None:
    backend = await app.backend()
    async with backend.pool.connection() as conn:  # type: ignore[attr-defined]
        await conn.execute(statement, args)


async def test_a_payload_that_is_not_an_object_fails_without_retry(
    app: conveyor.App, schema: str
) -> None:
    @app.task(retry=RetryPolicy(max_attempts=5))
    async def job(x: int = 0) -> int:
        return x

    async with app:
        handle = await job.enqueue_async(x=1)
        await _sql(
            app,
            psycopg.sql.SQL("update {} set payload = '[1, 2]' where id = %s").format(
                psycopg.sql.Identifier(schema, "tasks")
            ),
            handle.id,
        )
        [task] = await run_all(app, [handle])
    assert task.state is TaskState.FAILED
    assert len(task.attempts) == 1
    assert "not a JSON object" in (task.attempts[0].error_message or "")


async def test_a_corrupt_retry_policy_does_not_lose_the_claimed_batch(
    app: conveyor.App, schema: str
) -> None:
    @app.task()
    async def job(x: int) -> int:
        return x

    async with app:
        handles = await app.enqueue_many_async(job, [{"x": i} for i in range(3)])
        await _sql(
            app,
            psycopg.sql.SQL(
                "update {} set retry_policy = '{{\"nonsense\": true}}' where id = %s"
            ).format(psycopg.sql.Identifier(schema, "tasks")),
            handles[1].id,
        )
        tasks = await run_all(app, handles)
    assert [t.result for t in tasks] == [0, 1, 2]


async def test_shutdown_gives_up_on_a_handler_that_ignores_cancellation(
    app: conveyor.App,
) -> None:
    started = asyncio.Event()

    @app.task()
    async def stubborn() -> None:
        started.set()
        for _ in range(20):
            try:
                await asyncio.sleep(0.1)
            except asyncio.CancelledError:
                continue  # refuses to stop

    async with app:
        handle = await stubborn.enqueue_async()
        runner = RunningWorker(app, stop_timeout=0.5, grace=0)
        async with runner:
            await asyncio.wait_for(started.wait(), 10)
        # __aexit__ returned: the worker shut down although the handler never stopped.
        task = await handle.get_async()
    assert task.state is TaskState.IN_PROGRESS
    assert task.attempts[0].outcome is Outcome.IN_PROGRESS
