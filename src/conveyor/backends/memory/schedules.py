"""Schedules in memory: what the SQL backends' schedules table does."""

from __future__ import annotations

import dataclasses
from datetime import datetime

from conveyor.backends.memory import unique
from conveyor.backends.memory.store import Store
from conveyor.backends.protocol import FireParams, ScheduleSync, StoredSchedule
from conveyor.model import Cause


def sync(store: Store, params: ScheduleSync, now: datetime) -> None:
    """Store an app's schedules; drop the ones of its tasks it no longer defines."""
    with store.lock:
        for given in params.schedules:
            found = store.schedules.get(given.name)
            last = found.last_slot if found is not None else now
            last_task = found.last_task_id if found is not None else None
            store.schedules[given.name] = dataclasses.replace(
                given, last_slot=last, last_task_id=last_task, synced_at=now
            )
        names = {s.name for s in params.schedules}
        tasks = set(params.tasks)
        for name, stored in list(store.schedules.items()):
            if stored.task in tasks and name not in names:
                del store.schedules[name]


def listed(store: Store) -> list[StoredSchedule]:
    with store.lock:
        return [store.schedules[name] for name in sorted(store.schedules)]


def fire(store: Store, params: FireParams, now: datetime) -> list[int]:
    """The slots' tasks, if this call takes the slots (see the protocol)."""
    if not params.slots:
        return []
    with store.lock:
        found = store.schedules.get(params.name)
        if found is None or found.fingerprint != params.fingerprint:
            return []
        if found.last_slot is not None and found.last_slot >= params.slots[0]:
            return []
        unique.refuse_held(store, params.tasks, now)
        mine: set[int] = set()
        ids = [store._insert(new, now, Cause.ENQUEUE, mine).id for new in params.tasks]
        store.schedules[params.name] = dataclasses.replace(
            found,
            last_slot=params.slots[-1],
            last_task_id=ids[-1] if ids else found.last_task_id,
        )
        store.woken.update(new.queue for new in params.tasks)
        return ids
