"""One reading of a whole store, for the views of it: ``conveyor top``, the
store's Prometheus gauges (:class:`~conveyor.metrics.StoreMetrics`) and the
dashboard's overview and queues pages.

:func:`read_overview` takes the store's clock (``Backend.store_clock``), the
counts by state, queue and name, each queue's backlog and the live workers,
in four reads (not one transaction: a task may move between them). The
counts walk every task, as ``conveyor counts`` does. Callers read it
through the client (:meth:`conveyor.Client.overview_async`).
"""

from __future__ import annotations

from dataclasses import dataclass
from datetime import datetime

from conveyor.backends.capabilities import Inspector
from conveyor.backends.protocol import Backend
from conveyor.records import QueueBacklog, TaskCount, WorkerInfo


@dataclass(frozen=True, slots=True)
class Overview:
    """The store at ``now`` (its clock)."""

    now: datetime
    counts: list[TaskCount]
    backlogs: list[QueueBacklog]
    live_workers: list[WorkerInfo]


async def read_overview(backend: Backend, inspector: Inspector) -> Overview:
    """Read the store's clock, counts, backlogs and live workers."""
    now = await backend.store_clock()
    counts = await inspector.count_tasks()
    backlogs = await inspector.queue_backlogs()
    live = [w for w in await inspector.list_workers() if w.live(now)]
    return Overview(now, counts, backlogs, live)
