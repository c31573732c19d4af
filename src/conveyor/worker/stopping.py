"""A worker's shutdown, and ending its own asyncio tasks for sure.

:func:`shut_down` is the sequence a worker runs once its claim loop ended
(SIGTERM/SIGINT, ``request_stop``, or a burst that found nothing due).

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
import logging
from typing import TYPE_CHECKING, Any

from conveyor.backends.protocol import Backend
from conveyor.errors import WorkerShutdown

if TYPE_CHECKING:
    from conveyor.worker.worker import Worker

log = logging.getLogger("conveyor.worker")

ABANDON_SETTLE = 2.0
"""Seconds a shutdown gives the runners of abandoned handlers to end their
attempt transactions before it goes on."""
LAST_WRITES = 5.0
"""Seconds a shutdown gives, once its handlers have ended or been given up,
to the completions still unwritten, and as much to its exit from the
workers table: what is not written by then is given up (the leases expire
and the tasks are reclaimed)."""

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


async def shut_down(self: Worker, backend: Backend, listener: asyncio.Task[None] | None) -> None:
    """``self``'s shutdown, once its claim loop ended: drain the running
    attempts for up to the grace (unless stopping at once), stop the rest,
    then stop every part, write what completions are left, leave the
    workers table and close ``backend``."""
    if self._runners and not self.immediate:
        log.info(
            "draining %d running attempts (grace %.0fs)", len(self._runners), self.config.grace
        )
        await _drain(self, self.config.grace)
    await _stop_running(self)
    await self.processes.close()
    if self.turn is not None:
        await self.turn.stop()
    if listener is not None:
        await cancel_and_wait(listener)
    if self.pruner is not None:
        await self.pruner.stop()
    if self.scheduler is not None:
        await self.scheduler.stop()
    if self.cancels is not None:
        await self.cancels.stop()
    if self.progress is not None:
        await self.progress.stop()
    if self.completer is not None:
        await self.completer.stop(LAST_WRITES)
    if self.heartbeat is not None:
        self.heartbeat.stop()
    if self._registering is not None:
        await cancel_and_wait(self._registering)
    with contextlib.suppress(Exception):  # TimeoutError included
        # A stranded connection, a store away: given up.
        async with asyncio.timeout(min(self.config.lease, LAST_WRITES)):
            await backend.stop_worker(self.id)
    await backend.close()
    log.info(
        "worker %s stopped: %d claims returned, %d tasks started, %d of them handed off",
        self.id,
        self.claims_made,
        self.claimed_count,
        self.handed_off_count,
    )


async def _stop_running(self: Worker) -> None:
    """Order every running handler to stop and wait up to ``stop_timeout``
    for them, their leases still renewed: a handler that stops in time
    is released (``interrupted``). Handlers that ignore the order are
    given up: their tasks are never released while they may still run;
    each lease is left to expire (the task is then reclaimed), and an
    abandoned thread's attempt transaction is ended so that nothing it
    writes afterwards commits."""
    if self._running:
        log.info("stopping %d attempts still running", len(self._running))
        for running in list(self._running.values()):
            running.stop(WorkerShutdown("the worker is shutting down"))
    if not self._runners:
        return
    _, stuck = await asyncio.wait(set(self._runners), timeout=self.config.stop_timeout)
    if not stuck:
        return
    log.error(
        "%d handlers ignored the order to stop for %.0fs; their tasks stay in progress "
        "until their leases expire, then are reclaimed",
        len(stuck),
        self.config.stop_timeout,
    )
    for running in list(self._running.values()):
        running.abandon()
    # An abandoned thread's runner ends at once, writing nothing; an
    # async handler that swallows cancellation stays stuck.
    await asyncio.wait(stuck, timeout=ABANDON_SETTLE)


async def _drain(self: Worker, grace: float) -> None:
    assert self.stop_event is not None
    deadline = asyncio.get_running_loop().time() + grace
    while self._runners and not self.immediate:
        remaining = deadline - asyncio.get_running_loop().time()
        if remaining <= 0:
            return
        self.stop_event.clear()
        stop_wait = asyncio.ensure_future(self.stop_event.wait())
        await asyncio.wait(
            {*self._runners, stop_wait}, timeout=remaining, return_when=asyncio.FIRST_COMPLETED
        )
        stop_wait.cancel()
