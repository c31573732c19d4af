"""Run an in-process worker until some tasks are terminal."""

from __future__ import annotations

import asyncio
from typing import Any

import conveyor
from conveyor.model import Task


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
