"""Concurrency keys with real workers, on every backend: two workers of
four slots each never run more of a key's tasks at once than its limit,
every task still runs, and a call's own key overrides the task's."""

from __future__ import annotations

import asyncio
from collections import Counter

import pytest

import conveyor
from conveyor import Concurrency, TaskState
from conveyor.backends.params import ClaimParams
from conveyor.errors import ConfigurationError
from tests.worker.helpers import RunningWorker, wait_terminal


@pytest.fixture
def app(any_app: conveyor.App) -> conveyor.App:
    return any_app


async def test_two_workers_keep_each_key_within_its_limit(app: conveyor.App) -> None:
    running: Counter[str] = Counter()
    most: Counter[str] = Counter()

    @app.task(concurrency=Concurrency(key=lambda args: f"user:{args['user']}", limit=2))
    async def sync_user(user: int, n: int) -> None:
        key = f"user:{user}"
        running[key] += 1
        most[key] = max(most[key], running[key])
        await asyncio.sleep(0.05)
        running[key] -= 1

    @app.task()
    async def plain(n: int) -> None:
        await asyncio.sleep(0.01)

    async with app:
        handles = [await sync_user.enqueue_async(user=u, n=n) for n in range(6) for u in (1, 2)]
        handles += [await plain.enqueue_async(n=n) for n in range(6)]
        async with RunningWorker(app, concurrency=4), RunningWorker(app, concurrency=4):
            tasks = await wait_terminal(app, [h.id for h in handles], timeout=60)
    assert {t.state for t in tasks} == {TaskState.SUCCEEDED}
    assert most == {"user:1": 2, "user:2": 2}  # reached, never passed


async def test_a_call_s_own_concurrency_overrides_the_task_s(app: conveyor.App) -> None:
    @app.task(concurrency=Concurrency(key="shared", limit=3))
    def job() -> None:
        return None

    solo = job.options(concurrency=Concurrency(key="solo", limit=1))
    async with app:
        alone = [await solo.enqueue_async() for _ in range(2)]
        shared = [await job.enqueue_async() for _ in range(2)]
        claimed = await (await app.backend()).claim(
            ClaimParams(worker_id="w", names=["job"], queues=["default"], limit=10, lease=30)
        )
    taken = {c.token.task_id for c in claimed}
    assert len(taken & {h.id for h in alone}) == 1  # its own key, limit 1
    assert taken >= {h.id for h in shared}  # the task's key, limit 3


@pytest.mark.parametrize("bad", [{"key": ""}, {"key": "k", "limit": 0}, {"key": 3}])
def test_a_bad_concurrency_is_refused(bad: dict[str, object]) -> None:
    with pytest.raises(ConfigurationError, match="Concurrency"):
        Concurrency(**bad)  # type: ignore[arg-type]


async def test_a_freed_slot_is_taken_at_once_not_at_the_next_poll(app: conveyor.App) -> None:
    # A poll of 60 s: only wake-ups can move the drain on. Each completion
    # that frees a slot of the key must make its next task claimed at once.
    @app.task(concurrency=Concurrency(key="one", limit=2))
    async def keyed(n: int) -> None:
        await asyncio.sleep(0.01)

    async with app:
        handles = [await keyed.enqueue_async(n=n) for n in range(8)]
        async with RunningWorker(app, concurrency=8, poll_interval=60):
            tasks = await wait_terminal(app, [h.id for h in handles], timeout=30)
    assert {t.state for t in tasks} == {TaskState.SUCCEEDED}
