"""``conveyor top``: a live view of the store in the terminal (rich).

Each frame reads the store a few times (queue backlogs, counts by state,
workers, the store's clock) and shows, per queue, the tasks due now and
later, running and waiting, how long its oldest due task has waited, and
tasks finished per second since the frame before (from the counts: a prune
between two frames shows as no progress, never as negative); then the live
workers with their queues, slots and last heartbeat. ``--once`` prints one
frame and exits (rates need two frames, so they show as ``-``).
"""

from __future__ import annotations

import asyncio
import time
from collections import Counter
from dataclasses import dataclass, field
from datetime import datetime

import click
from rich.console import Group
from rich.live import Live
from rich.table import Table

from conveyor.app import App
from conveyor.cli.common import backend_options, console, fail, open_client
from conveyor.cli.text import line, plain
from conveyor.durations import relative, span
from conveyor.errors import ConveyorError
from conveyor.model import TaskState
from conveyor.records import QueueBacklog, WorkerInfo


@dataclass
class Frame:
    """One reading of the store."""

    now: datetime
    taken: float
    """This process's monotonic clock when it was read (for rates)."""
    backlogs: dict[str, QueueBacklog]
    states: Counter[tuple[str, TaskState]] = field(default_factory=Counter)
    workers: list[WorkerInfo] = field(default_factory=list)

    def finished(self, queue: str, state: TaskState) -> int:
        return self.states[(queue, state)]

    @property
    def queues(self) -> list[str]:
        return sorted(set(self.backlogs) | {queue for queue, _ in self.states})


async def read_frame(app: App) -> Frame:
    """Read what one frame shows."""
    found = await app.overview_async()
    states: Counter[tuple[str, TaskState]] = Counter()
    for count in found.counts:
        states[(count.queue, count.state)] += count.count
    backlogs = {b.queue: b for b in found.backlogs}
    return Frame(found.now, time.monotonic(), backlogs, states, found.live_workers)


def _rate(now: Frame, before: Frame | None, queue: str, state: TaskState) -> str:
    if before is None:
        return "-"
    seconds = max(now.taken - before.taken, 1e-6)
    done = max(now.finished(queue, state) - before.finished(queue, state), 0)
    return f"{done / seconds:,.1f}"


def render(now: Frame, before: Frame | None, location: str) -> Group:
    """A frame as rich renderables: a header, the queues, the workers."""
    queues = Table(
        "queue", "due", "later", "running", "waiting", "oldest due", "done/s", "failed/s"
    )
    for queue in now.queues:
        backlog = now.backlogs.get(queue) or QueueBacklog(queue, 0, 0, None)
        oldest = backlog.oldest_due_at
        waited = span((now.now - oldest).total_seconds()) if oldest else "-"
        queues.add_row(
            plain(queue),
            f"{backlog.due:,}",
            f"{backlog.later:,}",
            f"{now.states[(queue, TaskState.IN_PROGRESS)]:,}",
            f"{now.states[(queue, TaskState.WAITING)]:,}",
            waited,
            _rate(now, before, queue, TaskState.SUCCEEDED),
            _rate(now, before, queue, TaskState.FAILED),
        )
    workers = Table("worker", "host:pid", "queues", "slots", "last heartbeat")
    for w in sorted(now.workers, key=lambda w: w.id):
        seen = relative(w.last_seen_at, now.now) if w.last_seen_at else "-"
        workers.add_row(
            plain(w.id),
            plain(f"{w.host}:{w.pid}"),
            plain(",".join(w.queues)),
            str(w.concurrency),
            seen,
        )
    header = line("conveyor top - ", location, f" - {now.now.isoformat(timespec='seconds')}")
    if not now.workers:
        workers = Table("no live worker")
    return Group(header, queues, workers)


async def _watch(app: App, interval: float, once: bool) -> None:
    async with app:
        frame = await read_frame(app)
        if once:
            console.print(render(frame, None, app.location))
            return
        first = render(frame, None, app.location)
        with Live(first, console=console, auto_refresh=False) as live:
            while True:
                await asyncio.sleep(interval)
                before, frame = frame, await read_frame(app)
                live.update(render(frame, before, app.location), refresh=True)


@click.command()
@click.option(
    "--interval",
    type=click.FloatRange(min=0.2),
    default=2.0,
    show_default=True,
    help="Seconds between frames.",
)
@click.option("--once", is_flag=True, help="Print one frame and exit.")
@backend_options
def top(url: str | None, schema: str | None, interval: float, once: bool) -> None:
    """A live view of queues (due, later, running, waiting, the oldest due
    task's wait, throughput) and live workers; Ctrl-C to leave."""
    try:
        asyncio.run(_watch(open_client(url, schema), interval, once))
    except ConveyorError as exc:
        fail(exc)
    except KeyboardInterrupt:
        pass
