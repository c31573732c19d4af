"""Wake-up turns (PostgreSQL): idle workers of one kind take turns answering
wake-ups, so a task costs about one claim across them; a worker that holds
the turn and stops, fills its slots or freezes loses no task."""

from __future__ import annotations

import asyncio
import contextlib
from collections.abc import AsyncIterator, Awaitable, Callable

import psycopg
import pytest

import conveyor
from conveyor.backends.postgres import turns as pg_turns
from conveyor.backends.postgres.statements import lock_space
from conveyor.worker.turns import Turn, worker_kind
from tests.conftest import PG_URL
from tests.worker.helpers import RunningWorker, wait_for, wait_terminal

LONG_POLL = 60.0
"""Seconds between polls: longer than any wait here, so what runs was claimed
in answer to a wake-up (or a turn taken), never found by a poll."""

CLAIMS_ONLY = {"poll_interval": LONG_POLL, "handoffs": False}
"""Workers that claim every task: no idle slot is offered to enqueues, whose
hand-offs need no wake-up and would leave the turns untried."""


@contextlib.asynccontextmanager
async def fleet(
    app: conveyor.App, size: int, **config: object
) -> AsyncIterator[list[conveyor.Worker]]:
    config = {**CLAIMS_ONLY, **config}
    runners = [RunningWorker(app, worker_id=f"w{i}", **config) for i in range(size)]
    async with contextlib.AsyncExitStack() as stack:
        workers = [await stack.enter_async_context(r) for r in runners]
        yield workers


async def settled(workers: list[conveyor.Worker], turns: bool = True) -> None:
    """Every worker has made its first claim and one of them holds the turn."""

    async def ready() -> bool:
        if any(w.claims_made == 0 for w in workers):
            return False
        return not turns or sum(1 for w in workers if w.turn is not None and w.turn.held) == 1

    await wait_for(ready)
    await asyncio.sleep(0.3)  # the first wake-ups of each listener are answered


async def one_by_one(app: conveyor.App, task: conveyor.TaskDef, count: int) -> list[int]:
    ids = []
    for i in range(count):
        ids.append((await task.enqueue_async(i=i)).id)
        await wait_terminal(app, ids[-1:])
    return ids


@pytest.mark.parametrize("turns", [True, False], ids=["turns", "every-worker"])
async def test_a_task_costs_one_claim_across_idle_workers(app: conveyor.App, turns: bool) -> None:
    @app.task()
    async def noop(i: int) -> int:
        return i

    async with app, fleet(app, 4, wakeup_turns=turns) as workers:
        await settled(workers, turns)
        before = sum(w.claims_made for w in workers)
        ids = await one_by_one(app, noop, 10)
        await asyncio.sleep(0.2)  # the losers' claims, if any, have returned
        claims = sum(w.claims_made for w in workers) - before
    tasks = await wait_terminal(app, ids)
    assert all(t.state is conveyor.TaskState.SUCCEEDED for t in tasks)
    if turns:
        assert claims <= 12, claims  # one per task (a turn passed on adds one)
        assert sum(1 for w in workers if w.claimed_count > 1) >= 1
    else:
        assert claims >= 30, claims  # every idle worker answered


async def test_when_the_holder_stops_the_next_worker_answers(app: conveyor.App) -> None:
    @app.task()
    async def noop(i: int) -> int:
        return i

    async with app:
        first = RunningWorker(app, worker_id="first", **CLAIMS_ONLY)
        second = RunningWorker(app, worker_id="second", **CLAIMS_ONLY)
        holder = await first.__aenter__()
        try:
            await wait_for(holds(holder))
            other = await second.__aenter__()
            try:
                await settled([holder, other])
                await first.__aexit__(None, None, None)
                await wait_for(holds(other))
                # Far sooner than its poll: the wake-up was answered.
                [task] = await wait_terminal(app, [(await noop.enqueue_async(i=1)).id], 20)
                assert task.attempts[0].worker_id == "second"
            finally:
                await second.__aexit__(None, None, None)
        finally:
            if first._task is not None and not first._task.done():
                await first.__aexit__(None, None, None)


async def test_a_holder_with_its_slots_full_passes_the_turn(app: conveyor.App) -> None:
    release = asyncio.Event()

    @app.task()
    async def hold() -> str:
        await release.wait()
        return "held"

    @app.task()
    async def noop(i: int) -> int:
        return i

    async with app, fleet(app, 2, concurrency=1) as workers:
        await settled(workers)
        holder = next(w for w in workers if w.turn is not None and w.turn.held)
        other = next(w for w in workers if w is not holder)
        busy = await hold.enqueue_async()
        await wait_for(running(holder))
        # Its one slot is taken: the other worker holds the turn and answers.
        await wait_for(holds(other))
        [task] = await wait_terminal(app, [(await noop.enqueue_async(i=1)).id], 20)
        assert task.attempts[0].worker_id == other.id
        release.set()
        await wait_terminal(app, [busy.id])


async def test_a_frozen_holder_delays_tasks_by_a_poll_at_most(
    app: conveyor.App, schema: str
) -> None:
    # The turn held by a session that never claims (a worker frozen by
    # SIGSTOP or a GIL-holding call looks the same from the database).
    @app.task()
    async def noop(i: int) -> int:
        return i

    kind = worker_kind(["default"], sorted(app.tasks))
    async with await psycopg.AsyncConnection.connect(PG_URL, autocommit=True) as frozen:
        await frozen.execute(
            "select pg_advisory_lock(%s # 2, %s)", (lock_space(schema), pg_turns.kind_key(kind))
        )
        async with app, fleet(app, 2, poll_interval=0.5) as workers:
            await asyncio.sleep(0.5)
            assert not any(w.turn is not None and w.turn.held for w in workers)
            [task] = await wait_terminal(app, [(await noop.enqueue_async(i=1)).id], 20)
        assert task.state is conveyor.TaskState.SUCCEEDED


async def test_workers_of_other_tasks_take_turns_apart(app: conveyor.App, schema: str) -> None:
    # Kinds differ by task names: a worker that cannot run a task never
    # holds the turn its wake-ups need.
    other_app = conveyor.App(PG_URL, schema=schema)

    @app.task()
    async def mine(i: int) -> int:
        return i

    @other_app.task()
    async def theirs(i: int) -> int:
        return -i

    async with app, other_app, fleet(app, 1) as [worker], fleet(other_app, 1) as [stranger]:
        await wait_for(holds(worker))
        await wait_for(holds(stranger))
        [a] = await wait_terminal(app, [(await mine.enqueue_async(i=1)).id], 20)
        [b] = await wait_terminal(app, [(await theirs.enqueue_async(i=1)).id], 20)
    assert a.attempts[0].worker_id == worker.id
    assert b.attempts[0].worker_id == stranger.id


def holds(worker: conveyor.Worker) -> Callable[[], Awaitable[bool]]:
    async def check() -> bool:
        return worker.turn is not None and worker.turn.held

    return check


def running(worker: conveyor.Worker) -> Callable[[], Awaitable[bool]]:
    async def check() -> bool:
        return worker.running_count > 0

    return check


class _Unreachable:
    """A turn lock whose store cannot be reached."""

    def __init__(self) -> None:
        self.tries = 0

    async def take(self) -> None:
        self.tries += 1
        raise OSError("connection refused")

    async def give(self) -> None:
        raise AssertionError("never taken")

    async def close(self) -> None:
        return None


async def test_a_turn_that_cannot_be_taken_answers_every_wake_up() -> None:
    lock = _Unreachable()
    taken: list[bool] = []
    turn = Turn(lock, lambda: taken.append(True))
    assert not turn.answers
    turn.start()
    turn.want(True)
    try:

        async def tried_twice() -> bool:
            return lock.tries >= 2

        await wait_for(tried_twice)
        assert turn.answers and turn.failing and not turn.held
        assert taken == []
    finally:
        await turn.stop()
