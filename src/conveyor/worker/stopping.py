"""Ending a worker's own asyncio tasks for sure.

On Python 3.11, ``asyncio.wait_for`` swallows a cancellation that arrives
in the same turn as the completion of the call it waits for: the task goes
on as if never cancelled. conveyor's own code uses ``asyncio.timeout``
instead (a test keeps ``wait_for`` out of it), but a library it awaits may
still use ``wait_for``; a worker that cancelled such a task once and then
awaited it would wait for ever, and never exit after SIGTERM.
"""

from __future__ import annotations

import asyncio
import contextlib
from typing import Any

RECANCEL_EVERY = 0.5
"""Seconds between cancellations of a task that is still running."""


async def cancel_and_wait(task: asyncio.Task[Any], every: float = RECANCEL_EVERY) -> None:
    """Cancel ``task`` and wait until it has ended, cancelling it again every
    ``every`` seconds while it runs on. Its outcome (a result, an error, the
    cancellation) is dropped; the caller's own cancellation propagates."""
    while not task.done():
        task.cancel()
        await asyncio.wait({task}, timeout=every)
    with contextlib.suppress(asyncio.CancelledError, Exception):
        task.result()


class Background:
    """A worker's loop of its own (the pruner, the scheduler): :meth:`start`
    runs :meth:`_loop` as an asyncio task named ``name``; :meth:`stop` ends
    it for sure (see :func:`cancel_and_wait`)."""

    name = "conveyor-background"
    _task: asyncio.Task[None] | None = None

    def start(self) -> None:
        self._task = asyncio.get_running_loop().create_task(self._loop(), name=self.name)

    async def stop(self) -> None:
        task, self._task = self._task, None
        if task is not None:
            await cancel_and_wait(task)

    async def _loop(self) -> None:
        raise NotImplementedError
