"""The worker's scheduler: fires its app's periodic schedules.

At start the worker syncs its app's schedules to the store as one release
(:class:`~conveyor.backends.params.ScheduleSync`): a new one starts from
that moment; removed ones of its task names are deleted, so they stop
firing everywhere once a worker with the new code starts. Then it wakes at
each schedule's next slot, computes the due slots from the stored last slot
and the store's clock (:meth:`conveyor.schedules.Schedule.due`), and fires
them: one transaction moves the last slot forward and enqueues one task per
slot (:meth:`~conveyor.backends.protocol.Backend.fire_schedule`). Every
worker of the app does this; the first to fire a slot wins, the others find
it fired. A worker whose definition differs from the stored one (an old
release during a rolling deploy) fires nothing for that schedule.

While it runs, the worker syncs again: every ``RELEASE_REFRESH`` seconds, so
that its release stays live and outranks older releases (an old worker that
restarts during a rolling deploy then changes nothing), and at its next
read (at most ``LONGEST_SLEEP`` seconds later, and ``RESYNC_SLEEP`` after
its last sync) when the stored schedules are not its own: one of its
schedules is missing, differs or was stored by another release, or one of
its task names has a schedule it does not define. A sync of an older
release while a newer one is live changes nothing (the store refuses it);
the older release's workers keep trying, and take over once the newer
release has had no worker for ``RELEASE_LIFETIME`` seconds (a rollback).
"""

from __future__ import annotations

import asyncio
import logging
import time
from collections.abc import Callable, Mapping, Sequence
from datetime import datetime

from conveyor.backends.params import FireParams, ScheduleSync
from conveyor.backends.protocol import Backend
from conveyor.events import EventBus, ScheduleFired
from conveyor.options import EnqueueOptions
from conveyor.records import StoredSchedule
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
RELEASE_REFRESH = 20.0
"""Seconds between a running worker's syncs while its schedules are stored
as it defines them: a third of ``RELEASE_LIFETIME`` (60 s), so that its
release stays live while two syncs in a row fail."""
RESYNC_SLEEP = LONGEST_SLEEP
"""Seconds a worker waits after a sync before it syncs again because the
stored schedules are not its own (an older release's workers, refused while
a newer one runs, try that often)."""


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
        clock: Callable[[], float] = time.monotonic,
    ) -> None:
        self.backend = backend
        self.events = events or EventBus()
        self.schedules = dict(schedules)
        self.tasks = dict(tasks)
        self.max_payload_bytes = max_payload_bytes
        self.clock = clock
        """The worker's own clock (monotonic seconds): when to sync again."""
        self.fired = 0
        """Tasks this scheduler enqueued so far."""
        self.release: str | None = None
        """This app's release of schedules, once synced."""
        self.superseded = False
        """Whether the last sync was refused: a newer release runs."""
        self._synced_at: float | None = None

    async def sync(self) -> bool:
        """Store this app's schedules; drop the removed ones of its task
        names. False: a newer live release runs, and nothing was stored."""
        params = ScheduleSync(
            schedules=[
                stored(s, self.tasks[s.task], self.max_payload_bytes)
                for s in self.schedules.values()
            ],
            tasks=sorted(self.tasks),
        )
        applied = await self.backend.sync_schedules(params)
        self.release, self._synced_at = params.release, self.clock()
        if applied == self.superseded:  # a change either way: say it once
            if applied:
                log.info("schedules of release %s stored", params.release)
            else:
                log.warning(
                    "a newer release of these schedules runs: release %s stores nothing, "
                    "and fires none of the schedules the newer one changed",
                    params.release,
                )
        self.superseded = not applied
        return applied

    def _sync_due(self, rows: Sequence[StoredSchedule]) -> bool:
        """Whether to sync again now: the release's refresh is due, or the
        stored schedules are not this app's and the last sync is not recent."""
        since = self.clock() - self._synced_at if self._synced_at is not None else RELEASE_REFRESH
        if since >= RELEASE_REFRESH:
            return True
        return since >= RESYNC_SLEEP and self._out_of_step(rows)

    def _out_of_step(self, rows: Sequence[StoredSchedule]) -> bool:
        """Whether the stored schedules differ from this app's: one missing,
        another definition or another release's, or a schedule of one of its
        task names that it does not define."""
        found = {row.name: row for row in rows}
        for name, schedule in self.schedules.items():
            row = found.get(name)
            if row is None or row.fingerprint != schedule.fingerprint():
                return True
            if row.release != self.release:
                return True
        return any(row.task in self.tasks and row.name not in self.schedules for row in rows)

    async def run_once(self) -> float:
        """Sync again if due (see the module), then fire every due slot of
        this app's schedules; seconds until the next slot."""
        now, rows = await self.backend.list_schedules()
        if self._sync_due(rows):
            await self.sync()
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
        while True:
            try:
                wait = await self.run_once() if self.schedules else await self._refresh()
            except Exception as exc:
                log.warning("cannot fire schedules (%s); trying again", reason(exc))
                wait = RETRY_SLEEP
            await asyncio.sleep(wait)

    async def _refresh(self) -> float:
        """An app without schedules syncs only to keep its release live (its
        sync still drops what an older release stored for its task names);
        seconds until the next."""
        await self.sync()
        return RELEASE_REFRESH
