"""Run an in-process worker until some tasks are terminal."""

from __future__ import annotations

import asyncio
from datetime import timedelta
from typing import Any

import conveyor
from conveyor.backends.params import ClaimParams, Completion
from conveyor.model import Task
from conveyor.worker import outcomes


async def wait_terminal(app: conveyor.App, ids: list[int], timeout: float = 20) -> list[Task]:
    deadline = asyncio.get_running_loop().time() + timeout
    while True:
        tasks = [await app.get_async(i) for i in ids]
        if all(t is not None and t.state.is_terminal for t in tasks):
            return [t for t in tasks if t is not None]
        if asyncio.get_running_loop().time() > deadline:
            raise AssertionError(f"not terminal in time: {[(t.id, t.state) for t in tasks if t]}")
        await asyncio.sleep(0.02)


async def wait_for(predicate: Any, timeout: float = 10) -> None:
    deadline = asyncio.get_running_loop().time() + timeout
    while not await predicate():
        if asyncio.get_running_loop().time() > deadline:
            raise AssertionError("condition not met in time")
        await asyncio.sleep(0.02)


class RunningWorker:
    """``async with RunningWorker(app, **config) as worker:`` runs it in the background."""

    def __init__(self, app: conveyor.App, **config: Any) -> None:
        config.setdefault("poll_interval", 0.05)
        config.setdefault("handle_signals", False)
        self.worker = app.worker(**config)
        self._task: asyncio.Task[None] | None = None

    async def __aenter__(self) -> conveyor.Worker:
        self._task = asyncio.create_task(self.worker.run())
        return self.worker

    async def __aexit__(self, *exc: object) -> None:
        self.worker.request_stop(immediate=True)
        assert self._task is not None
        await asyncio.wait_for(self._task, 30)


async def run_all(
    app: conveyor.App, handles: list[conveyor.TaskHandle], **config: Any
) -> list[Task]:
    async with RunningWorker(app, **config):
        return await wait_terminal(app, [h.id for h in handles])


async def steal(app: conveyor.App, task_id: int, thief: str) -> Completion:
    """Claim a running task as another worker, as if its lease had expired:
    the thief's claim runs with the clock moved past the lease (any backend).

    The victim's worker must run with a long poll interval and have its
    listener connected (whose first wake-up triggers a claim), or its own
    claim loop may reclaim the task first.
    """
    backend = await app.backend()
    task = await backend.get_task(task_id, with_attempts=False)
    assert task is not None and task.lease_expires_at is not None
    [claimed] = await backend.claim(
        ClaimParams(
            worker_id=thief,
            names=list(app.tasks),
            queues=["default"],
            limit=1,
            lease=30,
            now=task.lease_expires_at + timedelta(seconds=1),
        )
    )
    assert claimed.token.task_id == task_id
    return outcomes.succeeded(claimed, '"thief"')


async def listening(worker: conveyor.Worker) -> bool:
    # The second claim is the one the listener asks for once connected.
    return worker.claims_made >= 2
