"""Schedules with real workers, on every backend: two workers fire each slot
once, the missed-slot policies, a removed schedule stops, and a schedule's
mistakes are refused when it is declared."""

from __future__ import annotations

import asyncio
import itertools
from datetime import UTC, datetime, timedelta

import pytest

import conveyor
from conveyor.backends.protocol import ScheduleSync
from conveyor.errors import ConfigurationError, PayloadError
from conveyor.worker.scheduler import Scheduler, stored
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
