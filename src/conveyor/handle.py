"""The handle ``enqueue`` returns: the task id, and a way to wait for it.

A handle is generic in its task's result type: ``TaskHandle[int]`` for a
handler declared ``-> int``, whose ``result()`` is an ``int``.
"""

from __future__ import annotations

import asyncio
from collections.abc import Callable, Coroutine
from dataclasses import dataclass, field
from typing import TYPE_CHECKING, Any, Generic, Protocol

from conveyor.errors import ResultTimeoutError, TaskFailedError, TaskNotFoundError
from conveyor.model import Progress, Task, TaskState

if TYPE_CHECKING:
    # A default (PEP 696) makes a bare ``TaskHandle`` mean ``TaskHandle[Any]``;
    # Python 3.11's typing has no defaults, so it exists for type checkers only.
    from typing_extensions import TypeVar

    R = TypeVar("R", default=Any)
else:
    from typing import TypeVar

    R = TypeVar("R")
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
class TaskHandle(Generic[R]):
    """A stored task. ``result`` waits for a terminal state by polling.
    ``client`` is the client (or app) that stored it; ``rebuild_result``, if
    given, rebuilds the stored result into the task's declared return type
    (the handles ``enqueue`` returns have it; a handle built from an id
    returns the result as decoded JSON)."""

    client: TaskReader
    id: int
    rebuild_result: Callable[[Any], R] | None = field(default=None, repr=False, compare=False)

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

    def progress(self) -> Progress | None:
        """The latest progress its attempts reported (``TaskContext.progress``),
        as stored: None if none was. Raises TaskNotFoundError."""
        return self.client.portal.run(self.progress_async())

    async def progress_async(self) -> Progress | None:
        """Async form of :meth:`progress`."""
        return (await self.get_async()).progress

    def result(self, timeout: float | None = None) -> R:
        """Wait for the task to finish and return its stored result, rebuilt
        into the declared return type (see ``rebuild_result``).

        Raises TaskFailedError if it ended failed or cancelled,
        ResultTimeoutError if it is still unfinished after ``timeout``
        seconds, and PayloadError if the stored result no longer fits the
        declared type.
        """
        return self.client.portal.run(self.result_async(timeout))

    async def result_async(self, timeout: float | None = None) -> R:
        """Async form of :meth:`result`."""
        loop = asyncio.get_running_loop()
        deadline = None if timeout is None else loop.time() + timeout
        delay = POLL_START
        while True:
            task = await self.get_async()
            if task.state is TaskState.SUCCEEDED:
                if self.rebuild_result is not None:
                    return self.rebuild_result(task.result)
                result: R = task.result
                return result
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
