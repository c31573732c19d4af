"""The worker's scheduler: fires its app's periodic schedules.

At start the worker syncs its app's schedules to the store (a new one starts
from that moment; removed ones of its task names are deleted, so they stop
firing everywhere once a worker with the new code starts). Then it wakes at
each schedule's next slot, computes the due slots from the stored last slot
and the store's clock (:meth:`conveyor.schedules.Schedule.due`), and fires
them: one transaction moves the last slot forward and enqueues one task per
slot (:meth:`~conveyor.backends.protocol.Backend.fire_schedule`). Every
worker of the app does this; the first to fire a slot wins, the others find
it fired. A worker whose definition differs from the stored one (an old
release during a rolling deploy) fires nothing for that schedule.
"""

from __future__ import annotations

import asyncio
import logging
from collections.abc import Mapping, Sequence
from datetime import datetime

from conveyor.backends.protocol import Backend, FireParams, ScheduleSync, StoredSchedule
from conveyor.events import EventBus, ScheduleFired
from conveyor.options import EnqueueOptions
from conveyor.schedules import Schedule
from conveyor.task import TaskDef
from conveyor.worker.stopping import Background
from conveyor.worker.texts import reason

log = logging.getLogger("conveyor.worker")

LONGEST_SLEEP = 5.0
"""Seconds the scheduler sleeps at most: it reads the stored schedules at
least this often (another worker's sync, a slot fired elsewhere)."""
SHORTEST_SLEEP = 0.01
RETRY_SLEEP = 1.0
"""Seconds before the scheduler tries again after the store failed it."""


def stored(schedule: Schedule, definition: TaskDef, max_bytes: int) -> StoredSchedule:
    """``schedule`` as the store keeps it (its args checked and encoded now)."""
    return StoredSchedule(
        name=schedule.name,
        task=schedule.task,
        cron=schedule.cron,
        every=schedule.every,
        tz=schedule.tz,
        missed=schedule.missed.value,
        catch_up=schedule.catch_up,
        args=definition.encode_args(schedule.args, max_bytes),
        fingerprint=schedule.fingerprint(),
    )


class Scheduler(Background):
    """Syncs and fires ``schedules`` (by name) of the tasks ``tasks`` (by name)."""

    name = "conveyor-scheduler"

    def __init__(
        self,
        backend: Backend,
        schedules: Mapping[str, Schedule],
        tasks: Mapping[str, TaskDef],
        max_payload_bytes: int,
        events: EventBus | None = None,
    ) -> None:
        self.backend = backend
        self.events = events or EventBus()
        self.schedules = dict(schedules)
        self.tasks = dict(tasks)
        self.max_payload_bytes = max_payload_bytes
        self.fired = 0
        """Tasks this scheduler enqueued so far."""

    async def sync(self) -> None:
        """Store this app's schedules; drop the removed ones of its task names."""
        await self.backend.sync_schedules(
            ScheduleSync(
                schedules=[
                    stored(s, self.tasks[s.task], self.max_payload_bytes)
                    for s in self.schedules.values()
                ],
                tasks=sorted(self.tasks),
            )
        )

    async def run_once(self) -> float:
        """Fire every due slot of this app's schedules; seconds until the next slot."""
        now, rows = await self.backend.list_schedules()
        found = {row.name: row for row in rows}
        wait = LONGEST_SLEEP
        for name, schedule in self.schedules.items():
            row = found.get(name)
            if row is None or row.fingerprint != schedule.fingerprint():
                continue  # not synced yet, or another release's definition
            slots = schedule.due(row.last_slot, now)
            if slots:
                await self._fire(schedule, slots)
            last = max(slots[-1] if slots else now, row.last_slot or now)
            wait = min(wait, (schedule.next_slot(max(last, now)) - now).total_seconds())
        return max(wait, SHORTEST_SLEEP)

    async def _fire(self, schedule: Schedule, slots: Sequence[datetime]) -> None:
        definition = self.tasks[schedule.task]
        tasks = [
            definition.new_tasks(
                [schedule.args], EnqueueOptions(idempotency_key=schedule.key(slot))
            )[0]
            for slot in slots
        ]
        ids = await self.backend.fire_schedule(
            FireParams(schedule.name, schedule.fingerprint(), slots, tasks)
        )
        if ids:
            self.fired += len(ids)
            if self.events.active:
                for slot, task_id in zip(slots, ids, strict=False):
                    self.events.emit(
                        ScheduleFired(schedule.name, schedule.task, slot.timestamp(), task_id)
                    )
            log.info(
                "schedule %s fired %d slot(s), the last %s: task %s",
                schedule.name,
                len(ids),
                slots[-1].isoformat(),
                ids[-1],
            )

    async def _loop(self) -> None:
        while True:
            try:
                await self.sync()
                break
            except Exception as exc:
                log.warning("cannot sync schedules (%s); trying again", reason(exc))
                await asyncio.sleep(RETRY_SLEEP)
        if not self.schedules:
            return
        while True:
            try:
                wait = await self.run_once()
            except Exception as exc:
                log.warning("cannot fire schedules (%s); trying again", reason(exc))
                wait = RETRY_SLEEP
            await asyncio.sleep(wait)
