"""How soon a worker reacts, on every backend: a workflow's next step, a
cancel of a running task, a busy inbox, and a shutdown with thread handlers.

The worker runs with a poll interval and a lease far longer than the test
waits, so a reaction that depends on the next poll or the next heartbeat
(instead of the wake-up channel) cannot pass.
"""

from __future__ import annotations

import asyncio
import threading
import time
from dataclasses import dataclass

import pytest

import conveyor
from conveyor import Outcome, RetryPolicy, TaskContext, TaskState
from conveyor.backends.params import ClaimParams
from tests.worker.helpers import RunningWorker, wait_for, wait_terminal

LONG_POLL = 60.0
"""A poll interval no test here may wait for."""
LONG_LEASE = 90.0
"""A lease whose heartbeat (every 30 s) no test here may wait for."""
WAIT = 15.0


@pytest.fixture
def app(any_app: conveyor.App) -> conveyor.App:
    return any_app


async def test_a_workflow_takes_its_next_steps_without_waiting_for_a_poll(
    app: conveyor.App,
) -> None:
    flow = app.workflow("hops")

    @flow.step
    @dataclass
    class Hop:
        left: int

        async def run(self, ctx: TaskContext) -> conveyor.Next | conveyor.Done:
            return conveyor.next(Hop(self.left - 1)) if self.left else conveyor.done("landed")

    async with app, RunningWorker(app, poll_interval=LONG_POLL) as worker:
        await wait_for(_listening(worker))
        handle = await flow.start_async(Hop(4))
        [task] = await wait_terminal(app, [handle.id], timeout=WAIT)
    assert (task.state, task.result) == (TaskState.SUCCEEDED, "landed")
    assert [a.outcome for a in task.attempts] == [Outcome.SUCCEEDED] * 5


def _listening(worker: conveyor.Worker) -> object:
    async def connected() -> bool:
        return worker.claims_made >= 2  # the listener's first wake-up made a claim

    return connected


@pytest.mark.parametrize("kind", ["async", "thread"])
async def test_a_cancel_stops_a_running_handler_long_before_its_next_heartbeat(
    app: conveyor.App, kind: str
) -> None:
    started = threading.Event()

    @app.task(name="waits_async")
    async def waits_async() -> None:
        started.set()
        await asyncio.sleep(LONG_LEASE)

    @app.task(name="waits_in_thread")
    def waits_in_thread(ctx: TaskContext) -> None:
        started.set()
        ctx.wait_for_stop(LONG_LEASE)
        ctx.check()

    task_def = waits_async if kind == "async" else waits_in_thread
    async with app, RunningWorker(app, poll_interval=LONG_POLL, lease=LONG_LEASE):
        handle = await task_def.enqueue_async()
        assert await asyncio.to_thread(started.wait, WAIT)
        assert await app.cancel_async(handle.id) is TaskState.IN_PROGRESS
        [task] = await wait_terminal(app, [handle.id], timeout=WAIT)
    assert task.state is TaskState.CANCELLED
    assert [a.outcome for a in task.attempts] == [Outcome.CANCELLED]


async def test_shutdown_waits_for_a_thread_handler_before_its_task_can_run_again(
    app: conveyor.App,
) -> None:
    """A thread handler that ignores the order to stop but returns within
    ``stop_timeout``: ``run()`` returns after it, and its task is never
    handed to another worker while it runs."""
    started = threading.Event()
    runs: list[tuple[int, float, float]] = []

    @app.task(retry=RetryPolicy(max_attempts=3, initial_interval=0, jitter=0))
    def stubborn(ctx: TaskContext) -> str:
        began = time.monotonic()
        started.set()
        time.sleep(1.5)  # never looks at ctx.should_stop
        runs.append((ctx.attempt, began, time.monotonic()))
        return "finished"

    async with app:
        handle = await stubborn.enqueue_async()
        async with RunningWorker(app, grace=0, stop_timeout=30):
            assert await asyncio.to_thread(started.wait, WAIT)
        # run() has returned: the handler must have returned before it.
        assert [attempt for attempt, _, _ in runs] == [1]
        stopped_at = time.monotonic()
        async with RunningWorker(app, poll_interval=0.05):
            [task] = await wait_terminal(app, [handle.id], timeout=WAIT)
    assert runs[0][2] <= stopped_at
    assert (task.state, task.result) == (TaskState.SUCCEEDED, "finished")
    assert [a.outcome for a in task.attempts] == [Outcome.SUCCEEDED]
    assert len(runs) == 1


async def test_a_thread_handler_that_outlives_stop_timeout_is_given_up_not_released(
    app: conveyor.App,
) -> None:
    started, let_go, ended = threading.Event(), threading.Event(), threading.Event()

    @app.task()
    def deaf(ctx: TaskContext) -> str:
        started.set()
        let_go.wait(WAIT)
        ended.set()
        return "too late"

    async with app:
        handle = await deaf.enqueue_async()
        try:
            async with RunningWorker(app, grace=0, stop_timeout=0.5, lease=LONG_LEASE):
                assert await asyncio.to_thread(started.wait, WAIT)
            assert not ended.is_set()  # still running: given up, not waited for
            task = await handle.get_async()
            # Not released while it may still run: in progress, its lease left to expire.
            assert task.state is TaskState.IN_PROGRESS
            assert [a.outcome for a in task.attempts] == [Outcome.IN_PROGRESS]
            backend = await app.backend()
            stolen = await backend.claim(
                ClaimParams(worker_id="other", names=["deaf"], queues=["default"], limit=1, lease=5)
            )
            assert stolen == []
        finally:
            let_go.set()
        assert await asyncio.to_thread(ended.wait, WAIT)
        await asyncio.sleep(0.3)  # what it returned is written nowhere
        task = await handle.get_async()
    assert task.state is TaskState.IN_PROGRESS
    assert task.result is None


async def test_a_message_that_came_during_a_poll_is_read_without_waiting_for_a_poll(
    app: conveyor.App,
) -> None:
    """The poll suspends without seeing it; its store wakes the task at once
    (announced on the wake-up channel), not at the worker's next poll."""
    polling = threading.Event()

    @app.coroutine("listener")
    async def listener(poll: conveyor.Poll) -> conveyor.Suspend | conveyor.Done:
        if any(m.body == "late" for m in poll.inbox):
            return conveyor.done("heard")
        polling.set()
        await asyncio.sleep(0.5)  # the message arrives meanwhile
        return conveyor.suspend()

    async with app, RunningWorker(app, poll_interval=LONG_POLL) as worker:
        await wait_for(_listening(worker))
        handle = await listener.start_async({})
        assert await asyncio.to_thread(polling.wait, WAIT)
        await app.send_async(handle.id, "late")
        [task] = await wait_terminal(app, [handle.id], timeout=WAIT)
    assert (task.state, task.result) == (TaskState.SUCCEEDED, "heard")
