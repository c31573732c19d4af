"""Schedules with real workers, on every backend: two workers fire each slot
once, the missed-slot policies, a removed schedule stops, an old release
never reverts a new one and a running worker stores its schedules again when
they change under it, and a schedule's mistakes are refused when it is
declared."""

from __future__ import annotations

import asyncio
import itertools
from dataclasses import replace
from datetime import UTC, datetime, timedelta

import pytest

import conveyor
from conveyor.backends.params import RELEASE_LIFETIME, ScheduleSync
from conveyor.errors import ConfigurationError, PayloadError
from conveyor.worker.scheduler import RELEASE_REFRESH, RESYNC_SLEEP, Scheduler, stored
from tests.worker.helpers import RunningWorker


@pytest.fixture
def app(any_app: conveyor.App) -> conveyor.App:
    return any_app


def slots_of(tasks: list[conveyor.Task]) -> list[str]:
    return sorted(t.idempotency_key or "" for t in tasks)


async def test_two_workers_fire_each_slot_once(app: conveyor.App) -> None:
    ran: list[int] = []

    @app.periodic(every=1, args={"n": 7})
    @app.task()
    async def tick(n: int) -> None:
        ran.append(n)

    async with app:
        async with RunningWorker(app), RunningWorker(app):
            await asyncio.sleep(3.5)
        tasks = await app.list_tasks_async(name="tick", limit=100)
    keys = slots_of(tasks)
    assert 2 <= len(keys) <= 4, keys  # one a second, from the first sync
    assert len(set(keys)) == len(keys)  # never one slot twice
    stamps = sorted(datetime.fromisoformat(k.split(":", 2)[2].rstrip("Z")) for k in keys)
    gaps = {(b - a).total_seconds() for a, b in itertools.pairwise(stamps)}
    assert gaps == {1.0}, gaps  # every slot, none skipped (each worker woke in time)
    assert set(ran) == {7}
    _, [row] = await (await app.backend()).list_schedules()
    assert row.last_task_id == max(t.id for t in tasks)


@pytest.mark.parametrize(("missed", "fired"), [("latest", 1), ("all", 5), ("skip", 0)])
async def test_slots_missed_while_no_worker_ran(app: conveyor.App, missed: str, fired: int) -> None:
    @app.task()
    async def job() -> None:
        return None

    schedule = app.schedule(job, every=1, missed=missed, catch_up=5, grace=0.001)
    async with app:
        backend = await app.backend()
        # Synced two minutes ago: 120 slots have passed since.
        long_ago = datetime.now(UTC) - timedelta(minutes=2)
        await backend.sync_schedules(
            ScheduleSync([stored(schedule, job, 1 << 20)], ["job"], now=long_ago)
        )
        scheduler = Scheduler(backend, app.schedules, app.tasks, 1 << 20)
        await scheduler.run_once()
        tasks = await app.list_tasks_async(name="job", limit=100)
    assert len(tasks) == fired
    if fired > 1:
        stamps = sorted(
            datetime.fromisoformat(k.split(":", 2)[2].rstrip("Z")) for k in slots_of(tasks)
        )
        assert {(b - a).total_seconds() for a, b in itertools.pairwise(stamps)} == {1.0}


async def test_a_removed_schedule_stops_firing(app: conveyor.App) -> None:
    @app.task()
    async def job() -> None:
        return None

    app.schedule(job, every=3600, name="hourly")
    async with app:
        backend = await app.backend()
        await Scheduler(backend, app.schedules, app.tasks, 1 << 20).sync()
        assert [s.name for s in (await backend.list_schedules())[1]] == ["hourly"]
        await Scheduler(backend, {}, app.tasks, 1 << 20).sync()  # the next release dropped it
        assert (await backend.list_schedules())[1] == []


def test_a_schedule_s_mistakes_are_refused_when_it_is_declared(app: conveyor.App) -> None:
    @app.task()
    async def job(n: int) -> None:
        return None

    with pytest.raises(ConfigurationError, match=r"above @app\.task"):
        app.periodic(every=60)(lambda: None)  # type: ignore[arg-type,return-value]
    with pytest.raises(PayloadError):
        app.schedule(job, every=60, args={"n": "not a number", "extra": 1})
    with pytest.raises(ConfigurationError, match="exactly one of cron= and every="):
        app.schedule(job, args={"n": 1})
    with pytest.raises(ConfigurationError, match="registered"):
        app.schedule("nope", every=60)
    app.schedule(job, cron="0 3 * * *", tz="Europe/Paris", args={"n": 1})
    with pytest.raises(ConfigurationError, match="taken"):
        app.schedule(job, every=60, args={"n": 2})
    assert app.schedule(job, every=60, args={"n": 2}, name="often").describe() == "every 60s"
    assert sorted(app.schedules) == ["job", "often"]


def release_app(app: conveyor.App) -> conveyor.App:
    """Another App on ``app``'s store: another release of the same app."""
    return conveyor.App(app.url, schema=app._backend_options.get("schema"))


async def synced(worker: conveyor.Worker) -> Scheduler:
    """``worker``'s scheduler, once its first sync is done."""
    while worker.scheduler is None or worker.scheduler.release is None:
        await asyncio.sleep(0.05)
    return worker.scheduler


async def stored_schedules(app: conveyor.App) -> dict[str, str]:
    _, rows = await (await app.backend()).list_schedules()
    return {row.name: row.fingerprint for row in rows}


async def test_an_old_release_that_starts_after_the_new_one_reverts_nothing(
    app: conveyor.App,
) -> None:
    """A rolling deploy: the new release renames "hourly" and changes
    "tick"; a worker of the old release starts after it, then goes. The new
    release's running worker fires its schedules all along."""
    new_app = release_app(app)
    for release, n, hourly in ((app, 1, "hourly"), (new_app, 2, "every_hour")):

        @release.task(name="tick")
        async def tick(n: int) -> None:
            return None

        @release.task(name="report")
        async def report() -> None:
            return None

        release.schedule(tick, every=1, args={"n": n}, name="tick")
        release.schedule(report, every=3600, name=hourly)
    new_schedules = {name: s.fingerprint() for name, s in new_app.schedules.items()}
    async with app, new_app:
        async with RunningWorker(app) as worker:  # the old release runs
            await synced(worker)
        async with RunningWorker(new_app):  # the rolling deploy
            while await stored_schedules(new_app) != new_schedules:
                await asyncio.sleep(0.05)
            async with RunningWorker(app) as worker:  # an old worker restarts
                assert (await synced(worker)).superseded
            assert await stored_schedules(new_app) == new_schedules
            gone = datetime.now(UTC)
            fired_after: list[conveyor.Task] = []
            for _ in range(300):  # the new worker fires a slot after the old one left
                tasks = await new_app.list_tasks_async(name="tick", limit=100)
                fired_after = [t for t in tasks if t.created_at > gone]
                if fired_after:
                    break
                await asyncio.sleep(0.05)
    assert fired_after and {t.payload["n"] for t in fired_after} == {2}


async def test_a_running_worker_syncs_again_when_its_schedules_change_under_it(
    app: conveyor.App,
) -> None:
    """Another release (an older one whose worker came back after this
    one's lifetime, say) stores its own schedules: within its read interval
    this worker stores its own again, and fires them."""

    @app.task()
    async def job() -> None:
        return None

    app.schedule(job, every=1, name="tick")
    app.schedule(job, every=3600, name="hourly")
    mine = {name: s.fingerprint() for name, s in app.schedules.items()}
    clock = [0.0]
    async with app:
        backend = await app.backend()
        other = ScheduleSync([], ["job"])  # a release of the same tasks, without schedules
        assert await backend.sync_schedules(other)
        scheduler = Scheduler(backend, app.schedules, app.tasks, 1 << 20, clock=lambda: clock[0])
        assert await scheduler.sync()
        assert await stored_schedules(app) == mine
        # The other release syncs once this one looks gone: it drops them all.
        later = datetime.now(UTC) + timedelta(seconds=RELEASE_LIFETIME + 1)
        assert await backend.sync_schedules(replace(other, now=later))
        assert await stored_schedules(app) == {}
        clock[0] = RESYNC_SLEEP / 2
        await scheduler.run_once()  # synced too recently to sync again
        assert await stored_schedules(app) == {}
        clock[0] = RESYNC_SLEEP
        await scheduler.run_once()
        assert await stored_schedules(app) == mine
        assert not scheduler.superseded
        # Nothing changed under it: it syncs again only to keep its release live.
        clock[0] = RESYNC_SLEEP + RELEASE_REFRESH - 1
        await scheduler.run_once()
        assert scheduler._synced_at == RESYNC_SLEEP
        clock[0] = RESYNC_SLEEP + RELEASE_REFRESH
        await scheduler.run_once()
        assert scheduler._synced_at == RESYNC_SLEEP + RELEASE_REFRESH
