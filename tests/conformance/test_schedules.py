"""Schedules in the store, on every backend: sync (new ones start now,
changed ones keep their last slot, removed ones of the app's tasks go) and
firing (one transaction per fire; a slot fires once, whoever fires it)."""

from __future__ import annotations

import asyncio
from dataclasses import replace
from datetime import timedelta

from conveyor.backends.protocol import Backend, FireParams, ScheduleSync, StoredSchedule
from tests.conformance.test_tasks import later, new

SCHEDULE = StoredSchedule(
    name="nightly",
    task="job",
    cron="0 3 * * *",
    every=None,
    tz="Europe/Paris",
    missed="latest",
    catch_up=10,
    args='{"full": true}',  # as PostgreSQL's jsonb writes it back
    fingerprint="f1",
)


def slot_task(slot: int) -> object:
    return replace(new(), idempotency_key=f"schedule:nightly:{slot}")


async def test_sync_stores_new_schedules_from_now_and_keeps_a_changed_one_s_last_slot(
    backend: Backend,
) -> None:
    await backend.sync_schedules(ScheduleSync([SCHEDULE], tasks=["job"], now=later(0)))
    now, [stored] = await backend.list_schedules()
    assert now.tzinfo is not None
    assert stored.last_slot == later(0) and stored.last_task_id is None
    assert replace(stored, last_slot=None, synced_at=None) == SCHEDULE
    fired = await backend.fire_schedule(
        FireParams("nightly", "f1", [later(5)], [slot_task(5)])  # type: ignore[list-item]
    )
    assert len(fired) == 1
    changed = replace(SCHEDULE, cron="0 4 * * *", fingerprint="f2")
    await backend.sync_schedules(ScheduleSync([changed], tasks=["job"], now=later(9)))
    _, [stored] = await backend.list_schedules()
    assert (stored.cron, stored.fingerprint) == ("0 4 * * *", "f2")
    assert (stored.last_slot, stored.last_task_id) == (later(5), fired[0])


async def test_sync_removes_the_app_s_schedules_it_no_longer_defines(backend: Backend) -> None:
    other_app = replace(SCHEDULE, name="theirs", task="their_job")
    extra = replace(SCHEDULE, name="hourly", cron="0 * * * *")
    await backend.sync_schedules(ScheduleSync([SCHEDULE, extra, other_app], tasks=["job"]))
    await backend.sync_schedules(ScheduleSync([SCHEDULE], tasks=["job"]))
    _, stored = await backend.list_schedules()
    assert [s.name for s in stored] == ["nightly", "theirs"]  # another app's stays


async def test_a_slot_fires_once_and_only_for_the_stored_definition(backend: Backend) -> None:
    await backend.sync_schedules(ScheduleSync([SCHEDULE], tasks=["job"], now=later(0)))
    stale = FireParams("nightly", "old", [later(5)], [slot_task(5)])  # type: ignore[list-item]
    assert await backend.fire_schedule(stale) == []
    first = FireParams("nightly", "f1", [later(5), later(6)], [slot_task(5), slot_task(6)])  # type: ignore[list-item]
    ids = await backend.fire_schedule(first)
    assert len(ids) == 2
    assert await backend.fire_schedule(first) == []  # fired already
    overlap = FireParams("nightly", "f1", [later(6), later(7)], [slot_task(6), slot_task(7)])  # type: ignore[list-item]
    assert await backend.fire_schedule(overlap) == []  # its first slot was fired
    _, [stored] = await backend.list_schedules()
    assert (stored.last_slot, stored.last_task_id) == (later(6), ids[-1])
    tasks = [await backend.get_task(i, with_attempts=False) for i in ids]
    assert [t.idempotency_key for t in tasks if t is not None] == [
        "schedule:nightly:5",
        "schedule:nightly:6",
    ]
    gone = FireParams("missing", "f1", [later(8)], [slot_task(8)])  # type: ignore[list-item]
    assert await backend.fire_schedule(gone) == []


async def test_concurrent_fires_of_one_slot_store_one_task(backend: Backend) -> None:
    await backend.sync_schedules(ScheduleSync([SCHEDULE], tasks=["job"], now=later(0)))
    fire = FireParams("nightly", "f1", [later(1)], [slot_task(1)])  # type: ignore[list-item]
    results = await asyncio.gather(*(backend.fire_schedule(fire) for _ in range(8)))
    assert sorted(len(r) for r in results) == [0] * 7 + [1]
    _, [stored] = await backend.list_schedules()
    assert stored.last_slot == later(1) and stored.last_slot - later(0) == timedelta(seconds=1)
