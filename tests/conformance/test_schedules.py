"""Schedules in the store, on every backend: sync (new ones start now,
changed ones keep their last slot, removed ones of the app's tasks go; an
older release never reverts a newer live one) and firing (one transaction
per fire; a slot fires once, whoever fires it)."""

from __future__ import annotations

import asyncio
from dataclasses import replace
from datetime import timedelta

from conveyor.backends.params import RELEASE_LIFETIME, FireParams, ScheduleSync, release_of
from conveyor.backends.protocol import Backend
from conveyor.records import StoredSchedule
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
    assert replace(stored, last_slot=None, synced_at=None, release=None) == SCHEDULE
    assert stored.release == release_of([SCHEDULE], ["job"])
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


# Two releases of one app: the new one changes "nightly" and renames "hourly".
OLD = [SCHEDULE, replace(SCHEDULE, name="hourly", cron="0 * * * *", fingerprint="h1")]
NEW = [
    replace(SCHEDULE, cron="0 4 * * *", fingerprint="f2"),
    replace(SCHEDULE, name="every_hour", cron="0 * * * *", fingerprint="h1"),
]


def release(schedules: list[StoredSchedule], at: float) -> ScheduleSync:
    return ScheduleSync(schedules, tasks=["job"], now=later(at))


def fire_at(name: str, fingerprint: str, at: float) -> FireParams:
    task = replace(new(), idempotency_key=f"schedule:{name}:{at}")
    return FireParams(name, fingerprint, [later(at)], [task])


async def stored_names(backend: Backend) -> list[tuple[str, str, str | None]]:
    _, stored = await backend.list_schedules()
    return [(s.name, s.fingerprint, s.release) for s in stored]


async def test_an_old_release_synced_after_a_new_one_changes_nothing(backend: Backend) -> None:
    old, new_release = release(OLD, 0).release, release(NEW, 0).release
    assert await backend.sync_schedules(release(OLD, 0))
    assert await backend.sync_schedules(release(NEW, 10))
    synced = [("every_hour", "h1", new_release), ("nightly", "f2", new_release)]
    assert await stored_names(backend) == synced
    # A worker of the old release starts during the rolling deploy.
    assert not await backend.sync_schedules(release(OLD, 20))
    assert not await backend.sync_schedules(release(OLD, 10 + RELEASE_LIFETIME))
    assert await stored_names(backend) == synced  # nothing reverted, nothing re-added
    # The new release's workers go on: they sync (their refresh) and fire.
    assert await backend.sync_schedules(release(NEW, 30))
    assert await stored_names(backend) == synced
    assert len(await backend.fire_schedule(fire_at("nightly", "f2", 31))) == 1
    assert len(await backend.fire_schedule(fire_at("every_hour", "h1", 31))) == 1
    assert await backend.fire_schedule(fire_at("hourly", "h1", 32)) == []
    assert await backend.fire_schedule(fire_at("nightly", "f1", 32)) == []
    assert old != new_release


async def test_a_release_no_worker_synced_for_its_lifetime_gives_way(backend: Backend) -> None:
    """A rollback: the old release takes over once no worker of the new one
    synced for its lifetime; the new one takes back over when it returns."""
    old, new_release = release(OLD, 0).release, release(NEW, 0).release
    await backend.sync_schedules(release(OLD, 0))
    await backend.sync_schedules(release(NEW, 10))
    assert not await backend.sync_schedules(release(OLD, 10 + RELEASE_LIFETIME))
    assert await backend.sync_schedules(release(OLD, 11 + RELEASE_LIFETIME))
    assert await stored_names(backend) == [("hourly", "h1", old), ("nightly", "f1", old)]
    # The new release comes back: it is the newer one, and the old one is live.
    assert await backend.sync_schedules(release(NEW, 12 + RELEASE_LIFETIME))
    assert await stored_names(backend) == [
        ("every_hour", "h1", new_release),
        ("nightly", "f2", new_release),
    ]


async def test_releases_of_apps_without_a_task_name_in_common_go_their_own_ways(
    backend: Backend,
) -> None:
    theirs = replace(SCHEDULE, name="theirs", task="their_job", fingerprint="t1")
    await backend.sync_schedules(ScheduleSync([SCHEDULE], ["job"], now=later(0)))
    await backend.sync_schedules(ScheduleSync([theirs], ["their_job"], now=later(1)))
    # The second app's release is newer, but shares no task name: no matter.
    changed = replace(SCHEDULE, cron="0 4 * * *", fingerprint="f2")
    assert await backend.sync_schedules(ScheduleSync([changed], ["job"], now=later(2)))
    # It also defines "theirs": the newest release to store a name keeps it.
    clash = ScheduleSync([changed, replace(theirs, task="job", fingerprint="c1")], ["job"])
    assert await backend.sync_schedules(replace(clash, now=later(3)))
    their_next = ScheduleSync([replace(theirs, fingerprint="t2")], ["their_job"], now=later(4))
    assert await backend.sync_schedules(their_next)
    assert await backend.sync_schedules(replace(clash, now=later(5)))
    assert await stored_names(backend) == [
        ("nightly", "f2", clash.release),
        ("theirs", "t2", their_next.release),
    ]


async def test_a_release_synced_again_rewrites_no_schedule(backend: Backend) -> None:
    """A running worker's syncs keep its release live and leave its stored
    schedules as they are (synced_at: when its release stored them)."""
    assert await backend.sync_schedules(release(NEW, 0))
    assert len(await backend.fire_schedule(fire_at("nightly", "f2", 5))) == 1
    assert await backend.sync_schedules(release(NEW, 20))
    _, stored = await backend.list_schedules()
    assert [(s.name, s.synced_at) for s in stored] == [
        ("every_hour", later(0)),
        ("nightly", later(0)),
    ]
    assert stored[1].last_slot == later(5)
