"""The handle ``enqueue`` returns: the task id, and a way to wait for it."""

from __future__ import annotations

import asyncio
from collections.abc import Coroutine
from dataclasses import dataclass
from typing import Any, Protocol, TypeVar

from conveyor.errors import ResultTimeoutError, TaskFailedError, TaskNotFoundError
from conveyor.model import Task, TaskState

T = TypeVar("T")

POLL_START = 0.01
POLL_MAX = 0.5


class Portal(Protocol):
    def run(self, coro: Coroutine[Any, Any, T]) -> T: ...


class TaskReader(Protocol):
    """What a handle needs of a client: read a task, and a portal to do it
    from synchronous code."""

    @property
    def portal(self) -> Portal: ...

    async def get_async(self, task_id: int) -> Task | None: ...


@dataclass(frozen=True)
class TaskHandle:
    """A stored task. ``result`` waits for a terminal state by polling.
    ``client`` is the client (or app) that stored it."""

    client: TaskReader
    id: int

    @property
    def app(self) -> TaskReader:
        """The same as ``client`` (the App, for handles an App returned)."""
        return self.client

    def get(self) -> Task:
        """The task with its attempt log; raises TaskNotFoundError."""
        return self.client.portal.run(self.get_async())

    async def get_async(self) -> Task:
        """Async form of :meth:`get`."""
        task = await self.client.get_async(self.id)
        if task is None:
            raise TaskNotFoundError(f"no task with id {self.id}")
        return task

    def result(self, timeout: float | None = None) -> Any:
        """Wait for the task to finish and return its stored result.

        Raises TaskFailedError if it ended failed or cancelled, and
        ResultTimeoutError if it is still unfinished after ``timeout`` seconds.
        """
        return self.client.portal.run(self.result_async(timeout))

    async def result_async(self, timeout: float | None = None) -> Any:
        """Async form of :meth:`result`."""
        loop = asyncio.get_running_loop()
        deadline = None if timeout is None else loop.time() + timeout
        delay = POLL_START
        while True:
            task = await self.get_async()
            if task.state is TaskState.SUCCEEDED:
                return task.result
            if task.state in (TaskState.FAILED, TaskState.CANCELLED):
                last = task.last_attempt
                raise TaskFailedError(
                    task.id, task.state.value, last.error_message if last else None
                )
            if deadline is not None and loop.time() >= deadline:
                raise ResultTimeoutError(f"task {self.id} is still {task.state.value}")
            wait = delay if deadline is None else min(delay, max(deadline - loop.time(), 0))
            await asyncio.sleep(wait)
            delay = min(delay * 2, POLL_MAX)
