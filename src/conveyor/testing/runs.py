"""Run queued tasks in the test's own process: :func:`drain`."""

from __future__ import annotations

from collections.abc import Sequence

from conveyor.app import App
from conveyor.client import check_time_moves
from conveyor.worker.drain import drain_registry


async def drain_async(
    app: App, *, queues: Sequence[str] | None = None, concurrency: int = 1
) -> int:
    """Async form of :func:`drain`, on the running event loop."""
    check_time_moves()
    return await drain_registry(app, queues=queues, concurrency=concurrency)


def drain(app: App, *, queues: Sequence[str] | None = None, concurrency: int = 1) -> int:
    """Run every due task of ``queues`` (default: all the app's queues), and
    the tasks they enqueue, until none is due or running; return how many
    attempts ran.

    It is a real worker in burst mode, in this process: handlers run as in
    production (async ones on its event loop, plain ones in threads), under
    leases, and every attempt is recorded. ``concurrency`` 1 runs them one
    at a time, in claim order. Only due tasks run: a delayed task, or a
    retry waiting out its back-off, stays pending (move a
    :class:`~conveyor.testing.FakeClock` forward, then drain again). A task
    that fails does not raise here: its handle's ``result()`` raises.
    Groups, chords, chains and tasks with dependencies run as they would
    under a worker: a dependent runs in the same drain once its
    dependencies have ended.

    First, the app's schedules are synced and their due slots fired, as a
    worker's scheduler does (one task per slot, at most once): a schedule
    the store has not seen starts now, so its first slot is the next one;
    move the clock past it and drain again to run it.

    Raises ConfigurationError, before running anything, when
    ``time.monotonic`` is frozen (freezegun's ``freeze_time()``), which
    would make the worker wait for ever.
    """
    return app.portal.run(drain_async(app, queues=queues, concurrency=concurrency))
