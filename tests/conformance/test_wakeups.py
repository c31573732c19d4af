"""Wake-ups on every backend: what an idle worker hears, and when.

A task made due at once by a completion (a workflow's next step, a release)
wakes its queue like an enqueue does, or the next step would wait for the
poll interval. So does the end of an attempt of a concurrency key, for the
queue of the key's next task. A cancel of a running task reaches its worker as a
CancelHint, and ``cancel_requested`` tells which held leases it concerns.
"""

from __future__ import annotations

import asyncio
import contextlib
from collections.abc import AsyncIterator
from dataclasses import replace

import pytest

from conveyor import payload as codec
from conveyor.backends.params import (
    CancelHint,
    Completion,
    FinishParams,
    NewTask,
    Transition,
    Wakeup,
)
from conveyor.backends.protocol import Backend
from conveyor.model import Outcome, RetryPolicy, TaskState
from tests.conformance.test_tasks import claim, enqueue, later, new

WAIT = 10.0
"""Seconds to wait for a wake-up that should come at once."""


class Listener:
    """Every wake-up of ``backend`` for the default queue, collected in the
    background from the moment the listener is connected."""

    def __init__(self, backend: Backend) -> None:
        self.heard: list[Wakeup] = []
        self._changed = asyncio.Event()
        self._stream = backend.wakeups(["default"])
        self._task: asyncio.Task[None] | None = None

    async def _collect(self) -> None:
        async for wakeup in self._stream:
            self.heard.append(wakeup)
            self._changed.set()

    async def start(self) -> None:
        self._task = asyncio.create_task(self._collect())
        await self.expect(lambda w: w == "default")  # connected: it says so once
        await asyncio.sleep(0.2)  # and everything it says at connection time is said
        self.heard.clear()

    async def expect(self, wanted: object) -> Wakeup:
        """The first wake-up heard (from now on) for which ``wanted`` holds."""
        deadline = asyncio.get_running_loop().time() + WAIT
        while True:
            for wakeup in self.heard:
                if wanted(wakeup):  # type: ignore[operator]
                    return wakeup
            self._changed.clear()
            left = deadline - asyncio.get_running_loop().time()
            if left <= 0:
                raise AssertionError(f"no such wake-up in {WAIT}s; heard {self.heard}")
            with contextlib.suppress(TimeoutError):
                await asyncio.wait_for(self._changed.wait(), left)

    async def stop(self) -> None:
        if self._task is not None:
            self._task.cancel()
            with contextlib.suppress(asyncio.CancelledError):
                await self._task
        await self._stream.aclose()


@contextlib.asynccontextmanager
async def listening(backend: Backend) -> AsyncIterator[Listener]:
    listener = Listener(backend)
    await listener.start()
    try:
        yield listener
    finally:
        await listener.stop()


def step(name: str) -> NewTask:
    return NewTask(
        name="flow",
        queue="default",
        payload=codec.encode({"n": 1}),
        priority=0,
        max_attempts=3,
        retry=RetryPolicy(max_attempts=3),
        run_at=later(0),
        step=name,
    )


async def test_a_next_step_due_at_once_wakes_its_queue(backend: Backend) -> None:
    [task_id] = await enqueue(backend, step("first"))
    [claimed] = await claim(backend, names=("flow",))
    move = Transition(
        step="second", state=codec.encode({"n": 2}), max_attempts=3, retry=RetryPolicy()
    )
    completion = Completion(claimed.token, Outcome.SUCCEEDED, TaskState.PENDING, transition=move)
    async with listening(backend) as listener:
        result = await backend.finish(FinishParams("w1", [completion], now=later(1)))
        assert result.applied == {claimed.token}
        assert await listener.expect(lambda w: w == "default") == "default"
    [again] = await claim(backend, names=("flow",), at=later(1))
    assert (again.token.task_id, again.step) == (task_id, "second")


async def test_a_release_wakes_its_queue(backend: Backend) -> None:
    await enqueue(backend, new())
    [claimed] = await claim(backend)
    released = Completion(claimed.token, Outcome.INTERRUPTED, TaskState.PENDING, retry_delay=0.0)
    async with listening(backend) as listener:
        await backend.finish(FinishParams("w1", [released], now=later(1)))
        await listener.expect(lambda w: w == "default")


async def test_a_cancel_of_a_running_task_reaches_its_worker(backend: Backend) -> None:
    [task_id] = await enqueue(backend, new())
    [claimed] = await claim(backend)
    token = claimed.token
    foreign = replace(token, worker_id="w2")
    stale = replace(token, attempt=token.attempt - 1)
    assert await backend.cancel_requested("w1", [token]) == frozenset()
    async with listening(backend) as listener:
        assert await backend.cancel(task_id) is TaskState.IN_PROGRESS
        hint = await listener.expect(lambda w: isinstance(w, CancelHint))
    assert isinstance(hint, CancelHint) and hint.task_id in (task_id, None)
    assert await backend.cancel_requested("w1", [token, stale]) == {token}
    assert await backend.cancel_requested("w2", [foreign]) == frozenset()


@pytest.mark.parametrize("outcome", [Outcome.SUCCEEDED, Outcome.FAILED])
@pytest.mark.parametrize("queue", ["default", "mail"])
async def test_a_keyed_attempt_s_end_wakes_the_queue_of_its_key_s_next_task(
    backend: Backend, outcome: Outcome, queue: str
) -> None:
    """The end of an attempt frees a slot of its concurrency key: the queue
    of the key's next due task (here ``default``, whether the attempt's own
    task was of it or of another queue) is woken at once, or that task would
    wait for a poll. Plain successes and the general completion alike."""
    first = replace(new(queue=queue), concurrency_key="k", concurrency_limit=1)
    second = replace(new(), concurrency_key="k", concurrency_limit=1)
    await enqueue(backend, first)
    [claimed] = await claim(backend, queues=(queue,))
    await enqueue(backend, second)
    state = TaskState.SUCCEEDED if outcome is Outcome.SUCCEEDED else TaskState.FAILED
    ended = Completion(
        claimed.token, outcome, state, result="1" if state is TaskState.SUCCEEDED else None
    )
    async with listening(backend) as listener:
        result = await backend.finish(FinishParams("w1", [ended], now=later(1)))
        assert result.applied == {claimed.token}
        await listener.expect(lambda w: w == "default")
