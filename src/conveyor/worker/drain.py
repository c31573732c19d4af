"""Burst runs: a worker that runs every due task of some queues, then stops.

Used by :func:`conveyor.testing.drain` and by the inline mode of the memory
backend (``memory://NAME?inline=true``). A drain first fires the slots of
the registry's schedules that are due by the store's clock (a
:class:`~conveyor.testing.FakeClock` moved forward makes them due), as one
pass of a worker's scheduler would, then runs what is due.
"""

from __future__ import annotations

from collections.abc import Sequence

from conveyor.worker.config import WorkerConfig
from conveyor.worker.scheduler import Scheduler
from conveyor.worker.worker import Registry, Worker

DRAIN_POLL_INTERVAL = 0.01
DRAIN_LEASE = 60.0


async def drain_registry(
    registry: Registry,
    *,
    queues: Sequence[str] | None = None,
    concurrency: int = 1,
    schedules: bool = True,
) -> int:
    """Fire the registry's due schedule slots (unless ``schedules`` is
    False), then run every due task of ``queues`` (default: all the
    registry's queues) and the tasks they enqueue, until none is due or
    running; return how many attempts ran."""
    config = WorkerConfig(
        queues=queues,
        concurrency=concurrency,
        burst=True,
        handle_signals=False,
        poll_interval=DRAIN_POLL_INTERVAL,
        lease=DRAIN_LEASE,
        retention=None,  # a drain runs what is due; it prunes and schedules nothing
        schedules=False,
    )
    if schedules:
        await fire_due_schedules(registry)
    worker = Worker(registry, config)
    await worker.run()
    return worker.claimed_count


async def fire_due_schedules(registry: Registry) -> int:
    """Sync the registry's schedules and fire their due slots, once (see
    :meth:`~conveyor.worker.scheduler.Scheduler.run_once`); how many tasks
    that enqueued. A schedule seen for the first time starts now: its first
    slot is the next one."""
    if not registry.schedules or not registry.tasks:
        return 0
    client = registry.client
    scheduler = Scheduler(
        await client.backend(), registry.schedules, registry.tasks, client.max_payload_bytes
    )
    await scheduler.run_once()
    return scheduler.fired
