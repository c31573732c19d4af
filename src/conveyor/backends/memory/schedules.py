"""Schedules in memory: what the SQL backends' schedules table does."""

from __future__ import annotations

import dataclasses
from datetime import datetime, timedelta

from conveyor.backends.memory import unique
from conveyor.backends.memory.store import ScheduleRelease, Store
from conveyor.backends.params import FireParams, ScheduleSync
from conveyor.records import StoredSchedule
from conveyor.states import Cause


def sync(store: Store, params: ScheduleSync, now: datetime) -> bool:
    """Store an app's schedules; drop the ones of its tasks it no longer
    defines; unless a newer live release of the app runs (see the protocol)."""
    with store.lock:
        release = _record(store, params, now)
        live_since = now - timedelta(seconds=params.lifetime)

        def outranks(name: str | None) -> bool:
            found = store.releases.get(name) if name is not None else None
            return (
                found is not None
                and found.generation > release.generation
                and found.seen_at >= live_since
            )

        tasks = set(params.tasks)
        if any(
            outranks(name) and not other.tasks.isdisjoint(tasks)
            for name, other in store.releases.items()
        ):
            return False
        for given in params.schedules:
            row = store.schedules.get(given.name)
            if row is not None and (
                outranks(row.release)
                or (row.release, row.fingerprint) == (params.release, given.fingerprint)
            ):
                continue  # a newer release's, or stored by this release already
            last = row.last_slot if row is not None else now
            last_task = row.last_task_id if row is not None else None
            store.schedules[given.name] = dataclasses.replace(
                given,
                last_slot=last,
                last_task_id=last_task,
                synced_at=now,
                release=params.release,
            )
        names = {s.name for s in params.schedules}
        for name, stored in list(store.schedules.items()):
            if stored.task in tasks and name not in names and not outranks(stored.release):
                del store.schedules[name]
        return True


def _record(store: Store, params: ScheduleSync, now: datetime) -> ScheduleRelease:
    """``params.release``, recorded as synced at ``now`` (and given the next
    generation at its first sync)."""
    found = store.releases.get(params.release)
    if found is None:
        generation = max((r.generation for r in store.releases.values()), default=0) + 1
        found = ScheduleRelease(generation, frozenset(params.tasks), now)
        store.releases[params.release] = found
    found.seen_at = now
    return found


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
