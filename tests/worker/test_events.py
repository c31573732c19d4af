"""The event stream (conveyor.events) with real workers, on every backend:
what an enqueue, a claim, an attempt, a heartbeat, a schedule and a pause
emit; a callback that raises stops nothing; and with nobody listening no
event is made."""

from __future__ import annotations

import asyncio
import logging
from typing import Any

import pytest

import conveyor
from conveyor import events as ev
from conveyor.model import Outcome, RetryPolicy, TaskState
from conveyor.worker import heartbeat, producer
from tests.worker.helpers import RunningWorker, listening, steal, wait_for, wait_terminal


@pytest.fixture
def app(any_app: conveyor.App) -> conveyor.App:
    return any_app


def of(kind: type[Any], seen: list[ev.Event]) -> list[Any]:
    return [e for e in seen if isinstance(e, kind)]


async def test_a_task_s_life_in_events(app: conveyor.App) -> None:
    seen: list[ev.Event] = []
    app.events.subscribe(seen.append)

    @app.task(retry=RetryPolicy(max_attempts=2, initial_interval=0.01, max_interval=0.01, jitter=0))
    async def flaky(n: int) -> int:
        if n == 1:
            raise ValueError("no")
        return n

    async with app:
        handles = await app.enqueue_many_async(flaky, [{"n": 0}, {"n": 1}])
        ids = [h.id for h in handles]
        async with RunningWorker(app) as worker:
            await wait_terminal(app, ids)
    [enqueued] = of(ev.TaskEnqueued, seen)
    assert (enqueued.name, enqueued.queue, enqueued.task_ids) == ("flaky", "default", tuple(ids))
    started = of(ev.AttemptStarted, seen)
    assert sorted((e.task_id, e.attempt) for e in started) == [
        (ids[0], 1),
        (ids[1], 1),
        (ids[1], 2),
    ]
    assert {e.worker_id for e in started} == {worker.id}
    # Due at its enqueue (or its retry): started a moment later, by two clocks.
    assert all(e.delay is not None and -1 < e.delay < 10 for e in started)
    ended = {(e.task_id, e.attempt): e for e in of(ev.AttemptEnded, seen)}
    assert ended[(ids[0], 1)].outcome is Outcome.SUCCEEDED
    assert ended[(ids[0], 1)].state is TaskState.SUCCEEDED
    assert ended[(ids[1], 1)].outcome is Outcome.FAILED
    assert ended[(ids[1], 1)].state is TaskState.PENDING  # to be retried
    assert ended[(ids[1], 2)].state is TaskState.FAILED
    assert all(e.duration >= 0 and e.name == "flaky" for e in ended.values())
    sent, returned = of(ev.ClaimSent, seen), of(ev.ClaimReturned, seen)
    assert sent and len(returned) <= len(sent)
    assert sum(r.count for r in returned) == 3  # each attempt claimed once
    assert all(r.failed is None and r.count <= r.limit for r in returned)
    # Each attempt starts after the claim that brought it returned.
    first_start = seen.index(started[0])
    assert any(isinstance(e, ev.ClaimReturned) and e.count for e in seen[:first_start])


async def test_heartbeats_and_a_lost_lease(app: conveyor.App) -> None:
    seen: list[ev.Event] = []
    app.events.subscribe(seen.append)
    started = asyncio.Event()

    @app.task()
    async def victim() -> None:
        started.set()
        await asyncio.sleep(60)

    async with app:
        handle = await victim.enqueue_async()
        async with RunningWorker(app, lease=1.0, poll_interval=30) as worker:
            await asyncio.wait_for(started.wait(), 10)
            await wait_for(lambda: listening(worker), timeout=10)
            await wait_for(lambda: _has(seen, ev.LeaseRenewed))
            await steal(app, handle.id, "thief")  # the lease is another's now
            await wait_for(lambda: _has(seen, ev.LeaseLost))
    renewed = of(ev.LeaseRenewed, seen)
    assert renewed[0].worker_id == worker.id and renewed[0].count == 1
    [lost] = of(ev.LeaseLost, seen)
    assert (lost.worker_id, lost.task_id, lost.attempt) == (worker.id, handle.id, 1)
    assert (lost.name, lost.queue) == ("victim", "default")


async def _has(seen: list[ev.Event], kind: type[Any]) -> bool:
    return any(isinstance(e, kind) for e in seen)


async def test_schedules_and_pauses(app: conveyor.App) -> None:
    seen: list[ev.Event] = []
    app.events.subscribe(seen.append)

    @app.periodic(every=1)
    @app.task()
    async def tick() -> None:
        return None

    async with app:
        assert await app.pause_async(queue="default")
        assert not await app.pause_async(queue="default")  # already: no event
        assert await app.resume_async(queue="default")
        async with RunningWorker(app):
            await wait_for(lambda: _has(seen, ev.ScheduleFired))
        tasks = await app.list_tasks_async(name="tick", limit=100)
    paused = of(ev.QueuePaused, seen)
    assert [(e.target, e.kind, e.paused) for e in paused] == [
        ("default", "queue", True),
        ("default", "queue", False),
    ]
    fired = of(ev.ScheduleFired, seen)
    assert {e.task_id for e in fired} <= {t.id for t in tasks}
    assert all(e.schedule == "tick" and e.name == "tick" for e in fired)


async def test_a_callback_that_raises_stops_nothing(
    app: conveyor.App, caplog: pytest.LogCaptureFixture
) -> None:
    seen: list[ev.Event] = []

    def broken(event: ev.Event) -> None:
        raise RuntimeError("metrics bug")

    app.events.subscribe(broken)
    unsubscribe = app.events.subscribe(seen.append)

    @app.task()
    async def job(n: int) -> int:
        return n

    async with app:
        with caplog.at_level(logging.ERROR, logger="conveyor.events"):
            handles = await app.enqueue_many_async(job, [{"n": n} for n in range(5)])
            async with RunningWorker(app):
                done = await wait_terminal(app, [h.id for h in handles])
        assert {t.state for t in done} == {TaskState.SUCCEEDED}
        unsubscribe()
        count = len(seen)
        await job.enqueue_async(n=9)
    assert len(of(ev.AttemptEnded, seen)) == 5
    assert len(seen) == count  # unsubscribed: nothing more
    # Logged once per callback and exception type, not once per event.
    assert len([r for r in caplog.records if "event callback raised" in r.message]) == 1


async def test_no_listener_makes_no_event(
    app: conveyor.App, monkeypatch: pytest.MonkeyPatch
) -> None:
    def refuse(*args: object) -> None:
        raise AssertionError("an event was made with nobody listening")

    makers = [(ev, "AttemptStarted"), (ev, "AttemptEnded"), (ev, "TaskEnqueued")]
    makers += [(producer, "ClaimSent"), (heartbeat, "LeaseRenewed")]
    for module, name in makers:
        monkeypatch.setattr(module, name, refuse)

    @app.task()
    async def job(n: int) -> int:
        return n

    async with app:
        handles = await app.enqueue_many_async(job, [{"n": n} for n in range(3)])
        async with RunningWorker(app, heartbeat_interval=0.05):
            done = await wait_terminal(app, [h.id for h in handles])
    assert [t.result for t in done] == [0, 1, 2]
