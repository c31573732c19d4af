"""The handle ``enqueue`` returns: the task id, and a way to wait for it."""

from __future__ import annotations

import asyncio
from dataclasses import dataclass
from typing import TYPE_CHECKING, Any

from conveyor.errors import ResultTimeoutError, TaskFailedError, TaskNotFoundError
from conveyor.model import Task, TaskState

if TYPE_CHECKING:
    from conveyor.app import App

POLL_START = 0.01
POLL_MAX = 0.5


@dataclass(frozen=True)
class TaskHandle:
    """A stored task. ``result`` waits for a terminal state by polling."""

    app: App
    id: int

    def get(self) -> Task:
        task = self.app.get(self.id)
        if task is None:
            raise TaskNotFoundError(f"no task with id {self.id}")
        return task

    async def get_async(self) -> Task:
        task = await self.app.get_async(self.id)
        if task is None:
            raise TaskNotFoundError(f"no task with id {self.id}")
        return task

    def result(self, timeout: float | None = None) -> Any:
        """Wait for the task to finish and return its stored result.

        Raises TaskFailedError if it ended failed or cancelled, and
        ResultTimeoutError if it is still unfinished after ``timeout`` seconds.
        """
        return self.app.portal.run(self.result_async(timeout))

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
