"""Hand-offs (PostgreSQL): an idle worker offers slots, and an enqueue of one
task leases it to that worker in its own commit. The task starts without a
claim; the worker never runs more than its concurrency; a hand-off to a
worker that died, or whose notice never came, is neither lost nor run twice."""

from __future__ import annotations

import asyncio
import logging
import time

import psycopg
import pytest

import conveyor
from conveyor import TaskState
from conveyor.backends.params import ClaimedTask, HandOff, HandOffsHeard, OfferParams
from conveyor.backends.postgres import handoffs
from conveyor.backends.postgres.backend import PostgresBackend
from conveyor.worker.outage import Outage
from conveyor.worker.standby import ADOPT_AFTER, HEAR_WITHIN, Standby
from tests.conftest import PG_URL
from tests.worker.helpers import RunningWorker, wait_for, wait_terminal

LONG_POLL = 60.0
"""Seconds between polls: longer than any wait here, so a task that starts
was handed off or claimed on a wake-up, never found by a poll."""


async def offering(worker: conveyor.Worker) -> bool:
    return worker.standby is not None and worker.standby.standing


async def settled(worker: conveyor.Worker) -> None:
    """The worker offers slots, and has answered its first wake-ups (its
    listener's connection, its turn) with their claims."""
    await wait_for(lambda: offering(worker))
    await asyncio.sleep(0.5)
    await wait_for(lambda: offering(worker))


async def test_an_idle_worker_starts_tasks_enqueued_alone_without_a_claim(
    app: conveyor.App,
) -> None:
    @app.task()
    async def noop(i: int) -> int:
        return i

    # A lease long enough that no renewal falls within the test: an enqueue
    # passes over an offer whose row a renewal holds locked (it is claimed).
    config = {"poll_interval": LONG_POLL, "concurrency": 4, "lease": 4 * LONG_POLL}
    async with app, RunningWorker(app, **config) as worker:
        await settled(worker)
        claims = worker.claims_made
        ids = []
        for i in range(12):
            # Each one sent while an offer stands, not while the worker tops
            # it up after the last hand-off (that statement holds its row).
            await wait_for(lambda: offering(worker))
            ids.append((await noop.enqueue_async(i=i)).id)
            await wait_terminal(app, ids[-1:])
        tasks = await wait_terminal(app, ids)
        assert worker.claims_made == claims  # not one claim: every task was handed off
        assert worker.standby is not None and worker.standby.handed_off == 12
    assert [t.state for t in tasks] == [TaskState.SUCCEEDED] * 12
    assert all([a.worker_id for a in t.attempts] == [worker.id] for t in tasks)


async def test_hand_offs_never_take_a_worker_past_its_concurrency(app: conveyor.App) -> None:
    release = asyncio.Event()
    running = 0
    most = 0

    @app.task()
    async def hold(i: int) -> int:
        nonlocal running, most
        running += 1
        most = max(most, running)
        await release.wait()
        running -= 1
        return i

    async with app, RunningWorker(app, poll_interval=0.2, concurrency=4) as worker:
        await settled(worker)
        # A burst of single enqueues at once: the offer's slots go, the rest
        # wait pending for claims, which leave the pledged slots alone.
        handles = await asyncio.gather(*(hold.enqueue_async(i=i) for i in range(20)))
        await asyncio.sleep(1.5)
        assert running == 4
        release.set()
        tasks = await wait_terminal(app, [h.id for h in handles], timeout=30)
    assert most == 4
    assert {t.state for t in tasks} == {TaskState.SUCCEEDED}
    assert all(len(t.attempts) == 1 for t in tasks)  # each ran once


async def test_a_task_that_cannot_be_handed_off_is_claimed(app: conveyor.App) -> None:
    @app.task()
    async def echo(text: str) -> int:
        return len(text)

    async with app, RunningWorker(app, poll_interval=LONG_POLL, concurrency=4) as worker:
        await settled(worker)
        claims = worker.claims_made
        # Too large for a notice, keyed, unique: each waits pending and is
        # claimed on a wake-up.
        big = await echo.enqueue_async(text="x" * (handoffs.MAX_NOTICE_FIELDS + 1))
        keyed = await echo.options(concurrency=conveyor.Concurrency(key="k")).enqueue_async(
            text="y"
        )
        unique = await echo.options(idempotency_key="u").enqueue_async(text="zz")
        tasks = await wait_terminal(app, [big.id, keyed.id, unique.id])
        assert worker.claims_made > claims
        assert worker.standby is not None and worker.standby.handed_off == 0
    assert [t.result for t in tasks] == [handoffs.MAX_NOTICE_FIELDS + 1, 1, 2]


async def test_a_notice_that_does_not_read_leaves_the_listener_hearing(
    app: conveyor.App, caplog: pytest.LogCaptureFixture
) -> None:
    @app.task()
    async def noop() -> str:
        return "done"

    async with app, RunningWorker(app, poll_interval=LONG_POLL, concurrency=4) as worker:
        await settled(worker)
        backend = await store_of(app)
        assert worker.standby is not None
        heard_on = handoffs.channel(backend.channel, *worker.standby.listen_as)
        async with await psycopg.AsyncConnection.connect(PG_URL, autocommit=True) as conn:
            for garbage in ("not json", "[1, 2]", '[null, "x"]'):
                await conn.execute("select pg_notify(%s, %s)", (heard_on, garbage))
        handle = await noop.enqueue_async()
        [task] = await wait_terminal(app, [handle.id])
        assert worker.standby is not None and worker.standby.handed_off == 1
    assert task.state is TaskState.SUCCEEDED
    assert sum("hand-off notice does not read" in r.getMessage() for r in caplog.records) == 3


async def test_a_hand_off_to_a_worker_that_died_runs_when_its_lease_expires(
    app: conveyor.App,
) -> None:
    """A worker killed while offering: enqueues still hand it tasks until
    its offer lapses. Each runs once its lease expires, on another worker."""

    @app.task()
    async def noop(i: int) -> int:
        return i

    async with app:
        backend = await store_of(app)
        dead = OfferParams("dead", "n", ["default"], ["noop"], free=2, lease=1.0, ttl=60)
        await backend.offer(dead)
        handles = [await noop.enqueue_async(i=i) for i in range(3)]
        stored = [await app.get_async(h.id) for h in handles]
        assert [t.state if t else None for t in stored] == [
            TaskState.IN_PROGRESS,
            TaskState.IN_PROGRESS,
            TaskState.PENDING,  # the offer had two slots
        ]
        async with RunningWorker(app, poll_interval=0.2, handoffs=False) as worker:
            tasks = await wait_terminal(app, [h.id for h in handles])
    assert {t.state for t in tasks} == {TaskState.SUCCEEDED}
    for task in tasks[:2]:
        # The dead worker's attempt is logged as lost; the reclaim ran it.
        assert [(a.worker_id, a.outcome.value) for a in task.attempts] == [
            ("dead", "lease_lost"),
            (worker.id, "succeeded"),
        ]


async def test_a_lapsed_offer_is_handed_nothing(app: conveyor.App) -> None:
    @app.task()
    async def noop() -> None:
        return None

    async with app:
        backend = await store_of(app)
        await backend.offer(OfferParams("gone", "n", ["default"], ["noop"], 2, 30.0, ttl=0.001))
        await asyncio.sleep(0.05)
        task = await app.get_async((await noop.enqueue_async()).id)
    assert task is not None and task.state is TaskState.PENDING


class Started:
    """What a standby started, and when its leases count from."""

    def __init__(self) -> None:
        self.tasks: list[tuple[ClaimedTask, float]] = []

    def __call__(self, tasks: list[ClaimedTask], sent_at: float) -> None:
        self.tasks += [(task, sent_at) for task in tasks]

    def ids(self) -> list[int]:
        return [task.token.task_id for task, _ in self.tasks]


def standby_of(backend: PostgresBackend, started: Started, worker_id: str = "w") -> Standby:
    return Standby(
        backend, worker_id, ["default"], ["noop"], 4, 30.0, None, started, lambda: None, Outage()
    )


async def store_of(app: conveyor.App) -> PostgresBackend:
    backend = await app.backend()
    assert isinstance(backend, PostgresBackend)
    return backend


async def standing_by(app: conveyor.App) -> tuple[PostgresBackend, Standby, Started]:
    """The app's store and a standby of worker "w" with no listener (its
    notices are lost), whose offer of 2 slots is stored."""
    backend = await store_of(app)
    started = Started()
    standby = standby_of(backend, started)
    standby.hearing_changed(HandOffsHeard())  # the first connection
    standby.tick(time.monotonic(), idle=True, free=4, claim_due=False)
    await settle(standby)
    return backend, standby, started


async def settle(standby: Standby) -> None:
    """Let the standby's store call in flight return."""
    await wait_for(lambda: _idle(standby))


async def _idle(standby: Standby) -> bool:
    return standby._call is None


async def test_hand_offs_whose_notices_were_lost_are_adopted_once(app: conveyor.App) -> None:
    """Nothing listens here: the notices are lost, as while a listener
    reconnects. Its next connection reads the hand-offs from the store; a
    notice that comes after all the same starts nothing twice."""

    @app.task()
    async def noop(i: int) -> int:
        return i

    async with app:
        _, standby, started = await standing_by(app)
        assert standby.stored and standby.pledged == 2
        handles = [await noop.enqueue_async(i=i) for i in range(3)]
        assert started.ids() == []
        standby.hearing_changed(HandOffsHeard())  # a new one: what it missed is read
        await settle(standby)
        assert started.ids() == [handles[0].id, handles[1].id]
        assert standby.pledged == 0
        [(task, _)] = started.tasks[:1]
        late = HandOff(task, time.time())
        standby.heard(late)  # the lost notice after all
        assert started.ids() == [handles[0].id, handles[1].id]
        pending = await app.get_async(handles[2].id)
        assert pending is not None and pending.state is TaskState.PENDING


async def test_a_withdrawal_counts_the_hand_offs_still_owed(app: conveyor.App) -> None:
    @app.task()
    async def noop(i: int) -> int:
        return i

    async with app:
        _, standby, started = await standing_by(app)
        handle = await noop.enqueue_async(i=1)  # takes one of the two slots
        # A claim is due and every slot not pledged is taken: withdraw first.
        standby.tick(time.monotonic(), idle=False, free=2, claim_due=True)
        await settle(standby)
        assert not standby.stored
        assert standby.pledged == 1  # owed: its notice has not come
        # It never comes: the hand-off is read from the store in time.
        standby.tick(time.monotonic(), idle=False, free=2, claim_due=False)
        await asyncio.sleep(ADOPT_AFTER + 0.1)
        standby.tick(time.monotonic(), idle=False, free=2, claim_due=False)
        await settle(standby)
        assert started.ids() == [handle.id]
        assert standby.pledged == 0


async def test_a_hand_off_whose_lease_began_too_long_ago_is_not_started(
    app: conveyor.App, caplog: pytest.LogCaptureFixture
) -> None:
    """The lease counts from the enqueue on the store's clock, whenever the
    notice arrives: a notice later than the lease starts nothing (the task is
    reclaimed)."""

    @app.task()
    async def noop(i: int) -> int:
        return i

    async with app:
        backend, standby, started = await standing_by(app)
        first = await noop.enqueue_async(i=1)
        second = await noop.enqueue_async(i=2)
        [adopted_first, adopted_second] = await backend.adopt("w", [])
        assert adopted_first.task.token.task_id == first.id
        standby.heard(adopted_first)
        [(_, sent_at)] = started.tasks
        assert sent_at <= time.monotonic()
        stale = HandOff(adopted_second.task, adopted_second.leased_at - 29.0)
        with caplog.at_level(logging.WARNING, "conveyor.worker"):
            standby.heard(stale)
    assert started.ids() == [first.id]
    assert second.id not in started.ids()
    assert any("came too late" in r.getMessage() for r in caplog.records)


async def test_a_stopping_worker_starts_the_hand_offs_it_is_owed(app: conveyor.App) -> None:
    @app.task()
    async def noop(i: int) -> int:
        return i

    async with app:
        backend, standby, started = await standing_by(app)
        handle = await noop.enqueue_async(i=1)  # its notice is lost
        await standby.close()
        assert started.ids() == [handle.id]
        assert await backend.withdraw("w") == 0  # the offer is gone
        after = await noop.enqueue_async(i=2)
        task = await app.get_async(after.id)
    assert task is not None and task.state is TaskState.PENDING


async def test_a_task_with_a_lease_shorter_than_the_worker_s_is_handed_off_and_runs(
    app: conveyor.App,
) -> None:
    @app.task(lease=3)
    async def brief() -> str:
        return "ran"

    async with app, RunningWorker(app, poll_interval=LONG_POLL, concurrency=4) as worker:
        await settled(worker)
        [task] = await wait_terminal(app, [(await brief.enqueue_async()).id])
        assert worker.standby is not None and worker.standby.handed_off == 1
    assert task.state is TaskState.SUCCEEDED and task.result == "ran"
    assert len(task.attempts) == 1


async def test_a_task_of_one_attempt_is_never_handed_off(app: conveyor.App) -> None:
    """A hand-off its worker never starts is charged an attempt: a task that
    has only one is claimed, by a worker that is alive to run it."""

    @app.task(retry=conveyor.RetryPolicy(max_attempts=1))
    async def once() -> str:
        return "ran"

    async with app:
        backend = await store_of(app)
        await backend.offer(OfferParams("dead", "n", ["default"], ["once"], 2, 30.0, ttl=60))
        task = await app.get_async((await once.enqueue_async()).id)
    assert task is not None and task.state is TaskState.PENDING


async def test_a_payload_whose_notice_would_not_fit_is_enqueued_pending(
    app: conveyor.App,
) -> None:
    """Short as sent, long as stored: jsonb writes 1e300 out in 301 digits.
    The enqueue neither fails nor hands off."""

    @app.task()
    async def noop(values: list[float]) -> int:
        return len(values)

    async with app:
        backend = await store_of(app)
        await backend.offer(OfferParams("w", "n", ["default"], ["noop"], 2, 30.0, ttl=60))
        huge = await noop.enqueue_async(values=[1e300] * 30)
        small = await noop.enqueue_async(values=[1.0])
        stored = [await app.get_async(h.id) for h in (huge, small)]
    assert [t.state if t else None for t in stored] == [TaskState.PENDING, TaskState.IN_PROGRESS]


async def test_a_process_under_a_reused_worker_id_takes_over_its_offer(app: conveyor.App) -> None:
    """A worker restarted under the same id (a fixed ``worker_id``): its
    offer replaces the old process's, and the old one's channel hears no
    more hand-offs."""

    @app.task()
    async def noop(i: int) -> int:
        return i

    async with app:
        backend = await store_of(app)
        old = OfferParams("w", "old", ["default"], ["noop"], 2, 30.0, ttl=60)
        await backend.offer(old)
        started = Started()
        standby = standby_of(backend, started)
        listening = backend.wakeups(["default"], handoffs_for=standby.listen_as)
        heard: list[object] = []

        async def listen() -> None:
            async for wakeup in listening:
                heard.append(wakeup)
                if isinstance(wakeup, HandOffsHeard):
                    standby.hearing_changed(wakeup)
                elif isinstance(wakeup, HandOff):
                    standby.heard(wakeup)

        listener = asyncio.create_task(listen())
        try:
            await wait_for(lambda: _hearing(standby))
            standby.tick(time.monotonic(), idle=True, free=4, claim_due=False)
            await settle(standby)
            assert standby.pledged == 2
            handles = [await noop.enqueue_async(i=i) for i in range(3)]
            await wait_for(lambda: _started(started, 2))
            assert started.ids() == [handles[0].id, handles[1].id]  # 2 slots, not 2 + 2
            third = await app.get_async(handles[2].id)
            assert third is not None and third.state is TaskState.PENDING
        finally:
            listener.cancel()
            await asyncio.gather(listener, return_exceptions=True)


async def _hearing(standby: Standby) -> bool:
    return standby.hearing


async def _started(started: Started, count: int) -> bool:
    return len(started.tasks) >= count


async def test_a_finished_hand_off_is_not_started_again_by_a_later_read(
    app: conveyor.App,
) -> None:
    """A completion the store refused leaves the task in progress under the
    worker's id until its lease expires: a read of what the worker is owed
    must not start it a second time."""

    @app.task()
    async def noop(i: int) -> int:
        return i

    async with app:
        backend, standby, started = await standing_by(app)
        handle = await noop.enqueue_async(i=1)
        [handed] = await backend.adopt("w", [])
        standby.heard(handed)
        standby.recorded(handle.id)  # its completion was refused: still in progress
        standby.hearing_changed(HandOffsHeard())  # a new connection: read what is owed
        await settle(standby)
        await standby.close()
    assert started.ids() == [handle.id]


async def test_an_offer_whose_notices_are_not_heard_is_withdrawn(
    app: conveyor.App, caplog: pytest.LogCaptureFixture
) -> None:
    """Each offer sends an empty notice on the process's channel. Nothing
    listens here, as with a connection that died without a word: the
    worker withdraws its offer rather than be handed tasks it cannot hear
    of."""

    @app.task()
    async def noop() -> None:
        return None

    async with app:
        _, standby, _ = await standing_by(app)
        assert standby.stored
        later = time.monotonic() + HEAR_WITHIN + 0.1
        with caplog.at_level(logging.WARNING, "conveyor.worker"):
            standby.tick(later, idle=True, free=4, claim_due=False)
        await settle(standby)
        assert not standby.stored and not standby.hearing
        task = await app.get_async((await noop.enqueue_async()).id)
        assert task is not None and task.state is TaskState.PENDING
        assert any("does not hear its hand-offs" in r.getMessage() for r in caplog.records)
        # The notice was only late: heard, it makes the worker offer again.
        standby.hearing_changed(HandOffsHeard(connected=False, ping=1))
        standby.tick(time.monotonic(), idle=True, free=4, claim_due=False)
        await settle(standby)
        assert standby.stored and standby.hearing
        await standby.close()
