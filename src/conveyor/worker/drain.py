"""Burst runs: a worker that runs every due task of some queues, then stops.

Used by :func:`conveyor.testing.drain` and by the inline mode of the memory
backend (``memory://NAME?inline=true``).
"""

from __future__ import annotations

from collections.abc import Sequence

from conveyor.worker.config import WorkerConfig
from conveyor.worker.worker import Registry, Worker

DRAIN_POLL_INTERVAL = 0.01
DRAIN_LEASE = 60.0


async def drain_registry(
    registry: Registry, *, queues: Sequence[str] | None = None, concurrency: int = 1
) -> int:
    """Run every due task of ``queues`` (default: all the registry's queues)
    and the tasks they enqueue, until none is due or running; return how
    many attempts ran."""
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
    worker = Worker(registry, config)
    await worker.run()
    return worker.claimed_count
