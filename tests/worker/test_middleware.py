"""Middleware (conveyor.middleware) with real workers, on PostgreSQL, SQLite
and memory: a counting middleware of the test's own sees every enqueue (a
small batch, a coroutine's start, a batch stored in chunks, one inside a
caller's transaction), every send, every attempt with its outcome and every
inbox read; one that raises in its enqueue hook stores nothing, and one
that raises in its attempt hook costs that attempt, not the worker or the
task."""

from __future__ import annotations

import asyncio
import contextlib
import sqlite3
from collections import Counter
from collections.abc import Awaitable, Coroutine, Iterator, Sequence
from pathlib import Path
from typing import Any, cast
from unittest import mock

import pytest

import conveyor
from conveyor import Poll, TaskState
from conveyor.backends.params import ClaimedTask, Completion, Delivery, NewTask
from conveyor.client import ENQUEUE_CHUNK
from conveyor.middleware import (
    AttemptInfo,
    EnqueueScope,
    InboxRead,
    Middleware,
    Middlewares,
    Run,
)
from conveyor.model import Message
from tests.conftest import backend_url, schema_for
from tests.worker.helpers import RunningWorker, wait_for, wait_terminal


@pytest.fixture(params=["postgres", "sqlite", "memory"])
def app(request: pytest.FixtureRequest, tmp_path: Path) -> Iterator[conveyor.App]:
    url, options = backend_url(request.param, schema_for(request.param, request), tmp_path)
    application = conveyor.App(url, **options)
    yield application
    application.close()


class Counted(EnqueueScope):
    def __init__(self, counts: Counter[str]) -> None:
        self.counts = counts

    def stamp(self, tasks: Sequence[NewTask]) -> None:
        self.counts["stamped"] += len(tasks)

    def stored(self, ids: Sequence[int]) -> None:
        self.counts["stored"] += len(ids)


class Counting(Middleware):
    def __init__(self) -> None:
        self.counts: Counter[str] = Counter()
        self.outcomes: Counter[tuple[str, str]] = Counter()

    @contextlib.contextmanager
    def enqueue(self, tasks: Sequence[NewTask]) -> Iterator[EnqueueScope]:
        self.counts["enqueues"] += 1
        yield Counted(self.counts)

    @contextlib.contextmanager
    def send(self, deliveries: Sequence[Delivery]) -> Iterator[Sequence[Delivery]]:
        self.counts["sends"] += len(deliveries)
        yield deliveries

    async def attempt(self, run: Run, info: AttemptInfo) -> Completion | None:
        completion = await run()
        assert completion is not None
        self.outcomes[(info.kind, completion.outcome.value)] += 1
        return completion

    def inbox_reader(self, read: InboxRead) -> InboxRead:
        async def counted() -> list[Message]:
            found = await read()
            self.counts["messages read"] += len(found)
            return found

        return counted


async def test_a_middleware_sees_enqueues_sends_attempts_and_inbox_reads(
    app: conveyor.App,
) -> None:
    counting = Counting()
    app.add_middleware(counting)
    assert app.middleware[-1] is counting

    @app.task()
    async def job(n: int) -> int:
        return n

    @app.task(queue="bulk")
    async def bulk(n: int) -> int:
        return n

    @app.coroutine("listener")
    async def listener(poll: Poll) -> conveyor.Suspend | conveyor.Done:
        if poll.inbox:
            return conveyor.done(poll.inbox[0].body)
        return conveyor.suspend()

    total = ENQUEUE_CHUNK + 10
    async with app:
        handles = await app.enqueue_many_async(job, [{"n": n} for n in range(3)])
        started = await listener.start_async({})
        await app.send_async(started.id, {"hello": 1})
        await app.enqueue_many_async(bulk, [{"n": n} for n in range(total)])
        async with RunningWorker(app, queues=["default"]):
            done = await wait_terminal(app, [h.id for h in [*handles, started]])
    assert [t.state for t in done] == [TaskState.SUCCEEDED] * 4
    assert counting.counts == {
        "enqueues": 3,
        "stamped": 3 + 1 + total,
        "stored": 3 + 1 + total,
        "sends": 1,
        "messages read": 1,
    }
    assert counting.outcomes == {("attempt", "succeeded"): 3, ("poll", "succeeded"): 1}


def test_an_enqueue_in_a_caller_s_transaction_goes_through_the_middleware(
    tmp_path: Path,
) -> None:
    path = tmp_path / "tx.db"
    app = conveyor.App(f"sqlite:///{path}")
    counting = Counting()
    app.add_middleware(counting)

    @app.task()
    def job(n: int) -> int:
        return n

    app.migrate()
    try:
        with contextlib.closing(sqlite3.connect(path)) as conn:
            handle = app.enqueue(job, {"n": 1}, connection=conn)
            conn.commit()
        assert app.list_tasks()[0].id == handle.id
    finally:
        app.close()
    assert counting.counts == {"enqueues": 1, "stamped": 1, "stored": 1}


class Refusing(Middleware):
    @contextlib.contextmanager
    def enqueue(self, tasks: Sequence[NewTask]) -> Iterator[EnqueueScope]:
        raise RuntimeError("refused")
        yield EnqueueScope()  # pragma: no cover


async def test_an_enqueue_hook_that_raises_stores_nothing(app: conveyor.App) -> None:
    refusing = Refusing()
    app.add_middleware(refusing)

    @app.task()
    async def job(n: int) -> int:
        return n

    async with app:
        with pytest.raises(RuntimeError, match="refused"):
            await app.enqueue_many_async(job, [{"n": n} for n in range(3)])
        with pytest.raises(RuntimeError, match="refused"):
            await app.enqueue_many_async(job, [{"n": n} for n in range(ENQUEUE_CHUNK + 1)])
        assert await app.list_tasks_async() == []
        app.remove_middleware(refusing)
        assert refusing not in app.middleware
        await job.enqueue_async(n=1)
        assert len(await app.list_tasks_async()) == 1


class FailingOnce(Middleware):
    def __init__(self) -> None:
        self.calls = 0

    async def attempt(self, run: Run, info: AttemptInfo) -> Completion | None:
        self.calls += 1
        if self.calls == 1:
            raise RuntimeError("a middleware bug")
        return await run()


async def test_an_attempt_hook_that_raises_costs_the_attempt_not_the_task(
    app: conveyor.App, caplog: pytest.LogCaptureFixture
) -> None:
    failing = FailingOnce()
    app.add_middleware(failing)

    @app.task()
    async def job(n: int) -> int:
        return n

    async with app:
        handle = await job.enqueue_async(n=7)
        async with RunningWorker(app, lease=1.0):
            [task] = await wait_terminal(app, [handle.id])
    assert task.state is TaskState.SUCCEEDED and task.result == 7
    assert failing.calls == 2  # reclaimed once its lease expired, and run again
    assert any("attempt crashed in the worker" in r.message for r in caplog.records)


class Raising(Middleware):
    def attempt(self, run: Run, info: AttemptInfo) -> Awaitable[Completion | None]:
        raise RuntimeError("raised before the attempt ran")


async def test_an_attempt_hook_that_raises_at_once_is_a_crash_too(
    app: conveyor.App, caplog: pytest.LogCaptureFixture
) -> None:
    raising = Raising()
    app.add_middleware(raising)

    @app.task()
    async def job(n: int) -> int:
        return n

    async with app:
        handle = await job.enqueue_async(n=3)
        async with RunningWorker(app, lease=1.0) as worker:

            async def crashed() -> bool:
                return "attempt crashed in the worker" in caplog.text

            await wait_for(crashed)
            app.remove_middleware(raising)
            [task] = await wait_terminal(app, [handle.id])
            assert worker.running_count == 0
    assert task.state is TaskState.SUCCEEDED and task.result == 3


class Named(Middleware):
    def __init__(self, name: str, seen: list[str]) -> None:
        self.name, self.seen = name, seen

    @contextlib.contextmanager
    def enqueue(self, tasks: Sequence[NewTask]) -> Iterator[EnqueueScope]:
        self.seen.append(f"enter {self.name}")
        yield EnqueueScope()
        self.seen.append(f"leave {self.name}")

    async def attempt(self, run: Run, info: AttemptInfo) -> Completion | None:
        self.seen.append(f"start {self.name}")
        completion = await run()
        self.seen.append(f"end {self.name}")
        return completion


def test_the_first_middleware_is_the_outermost() -> None:
    seen: list[str] = []
    chain = Middlewares([Named("a", seen), Middleware(), Named("b", seen)])
    with chain.enqueue([]):
        seen.append("store")

    async def run() -> Completion | None:
        seen.append("run")
        return None

    info = AttemptInfo(cast(ClaimedTask, None), "attempt", "w", 0.0)
    asyncio.run(cast(Coroutine[Any, Any, None], chain.attempt(run, info)))
    assert seen == [
        *("enter a", "enter b", "store", "leave b", "leave a"),
        *("start a", "start b", "run", "end b", "end a"),
    ]


def test_a_hook_nobody_overrides_calls_through() -> None:
    chain = Middlewares([Middleware(), Middleware()])
    run = mock.Mock(return_value="the attempt itself")
    assert chain.attempt(run, cast(AttemptInfo, None)) == "the attempt itself"
    read = mock.Mock()
    assert chain.inbox_reader(read) is read
    with chain.send(["d"]) as deliveries:  # type: ignore[list-item]
        assert deliveries == ["d"]
