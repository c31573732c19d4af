"""The worker on the in-memory backend: what users' unit tests rely on."""

from __future__ import annotations

import asyncio
import uuid

import conveyor
from conveyor import Outcome, RetryPolicy, TaskContext, TaskState
from tests.worker.helpers import RunningWorker, run_all, wait_terminal


async def test_memory_app_runs_retries_and_cancels() -> None:
    app = conveyor.App(f"memory://{uuid.uuid4().hex}")
    started = asyncio.Event()

    @app.task(retry=RetryPolicy(max_attempts=2, initial_interval=0.01, jitter=0))
    async def flaky(ctx: TaskContext) -> int:
        if ctx.attempt == 1:
            raise RuntimeError("first time")
        return ctx.attempt

    @app.task()
    def shout(text: str) -> str:
        return text.upper()

    @app.task()
    async def forever() -> None:
        started.set()
        await asyncio.sleep(60)

    async with app:
        handles = [await flaky.enqueue_async(), await shout.enqueue_async(text="hi")]
        done = await run_all(app, handles, lease=1.0)
        assert [t.result for t in done] == [2, "HI"]
        assert [a.outcome for a in done[0].attempts] == [Outcome.FAILED, Outcome.SUCCEEDED]

        handle = await forever.enqueue_async()
        async with RunningWorker(app, lease=1.0):
            await asyncio.wait_for(started.wait(), 10)
            await app.cancel_async(handle.id)
            [task] = await wait_terminal(app, [handle.id])
    assert task.state is TaskState.CANCELLED
    assert task.attempts[0].outcome is Outcome.CANCELLED


async def test_memory_stores_are_shared_by_url_and_separate_otherwise() -> None:
    name = uuid.uuid4().hex
    first, second, other = (
        conveyor.App(f"memory://{n}", allow_unregistered=True)
        for n in (name, name, uuid.uuid4().hex)
    )
    async with first, second, other:
        handle = await first.enqueue_async("job", {"x": 1})
        assert (await second.get_async(handle.id)) is not None
        assert (await other.get_async(handle.id)) is None
