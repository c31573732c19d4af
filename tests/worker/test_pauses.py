"""A running worker and a pause, on every backend: it stops starting the
paused work within about a second, lets running attempts finish, and starts
at once when the pause is lifted."""

from __future__ import annotations

import asyncio

import pytest

import conveyor
from conveyor import TaskState
from conveyor.errors import ConfigurationError
from tests.worker.helpers import RunningWorker, wait_for, wait_terminal


@pytest.fixture
def app(any_app: conveyor.App) -> conveyor.App:
    return any_app


async def test_a_worker_stops_starting_paused_work_and_resumes(app: conveyor.App) -> None:
    release = asyncio.Event()
    started: list[int] = []

    @app.task(queue="mail")
    async def send(n: int) -> int:
        started.append(n)
        await release.wait()
        return n

    async with app:
        first = await send.enqueue_async(n=1)
        # Poll rarely: only the wake-up channel can make the resume prompt.
        async with RunningWorker(app, poll_interval=30, concurrency=4):

            async def running() -> bool:
                return started == [1]

            await wait_for(running)
            assert await app.pause_async(queue="mail")
            held = [await send.enqueue_async(n=n) for n in (2, 3)]
            await asyncio.sleep(1.0)
            assert started == [1]  # nothing new started while paused
            release.set()
            [done] = await wait_terminal(app, [first.id])
            assert done.state is TaskState.SUCCEEDED  # the running attempt went on
            assert [p.name for p in await app.pauses_async()] == ["mail"]
            assert await app.resume_async(queue="mail")
            tasks = await wait_terminal(app, [h.id for h in held], timeout=10)
    assert {t.state for t in tasks} == {TaskState.SUCCEEDED}


async def test_pause_a_task_object(app: conveyor.App) -> None:
    @app.task()
    async def job() -> None:
        return None

    async with app:
        assert await app.pause_async(task=job)
        [pause] = await app.pauses_async()
        assert (pause.kind.value, pause.name) == ("task", job.name)
        with pytest.raises(ConfigurationError, match="one queue= or one task="):
            await app.pause_async()
        with pytest.raises(ConfigurationError):
            await app.resume_async(queue="a", task=job)
