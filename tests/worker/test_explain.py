"""``explain``: each reason a task can be not running, made on every backend
(PostgreSQL, SQLite, memory, Redis) and read back, with its facts; and
``conveyor explain`` on the command line."""

from __future__ import annotations

import asyncio
import json
from dataclasses import replace
from typing import Any

import pytest

import conveyor
from conveyor import Concurrency, RateLimit, RetryPolicy
from conveyor.backends.params import ClaimParams
from conveyor.errors import Snooze
from conveyor.records import WorkerInfo
from tests.cli_harness import Cli
from tests.worker.helpers import RunningWorker, wait_for, wait_terminal

FAR = 3600.0


@pytest.fixture
def app(any_app: conveyor.App) -> conveyor.App:
    return any_app


WORKER = WorkerInfo("w1", "host", 1, ("default",), 4, tasks=("job", "keyed", "rated"))


async def register(app: conveyor.App, info: WorkerInfo = WORKER) -> None:
    await (await app.backend()).register_worker(info)


async def claim_as(app: conveyor.App, worker: str, name: str, limit: int = 1) -> list[int]:
    claimed = await (await app.backend()).claim(
        ClaimParams(worker_id=worker, names=[name], queues=["default"], limit=limit, lease=30)
    )
    return [c.token.task_id for c in claimed]


def define(app: conveyor.App) -> dict[str, Any]:
    @app.task()
    async def job() -> None:
        return None

    @app.task(concurrency=Concurrency(key="k", limit=1))
    async def keyed() -> None:
        return None

    @app.task(rate=RateLimit(limit=1, per=FAR))
    async def rated() -> None:
        return None

    return {"job": job, "keyed": keyed, "rated": rated}


async def test_missing_finished_and_running(app: conveyor.App) -> None:
    tasks = define(app)

    @app.task(retry=RetryPolicy(max_attempts=1))
    async def boom() -> None:
        raise ValueError("no luck")

    async with app:
        gone = await app.explain_async(424242)
        assert gone.reason == "missing"
        handle = await boom.enqueue_async()
        async with RunningWorker(app):
            await wait_terminal(app, [handle.id])
        done = await app.explain_async(handle.id)
        assert done.reason == "finished" and done.facts["state"] == "failed"
        assert "ValueError: no luck" in done.sentence
        assert done.facts["last_error"] == {"type": "ValueError", "message": "no luck"}

        await register(app)
        mine = await tasks["job"].enqueue_async()
        ghosts = await tasks["job"].enqueue_async()
        assert await claim_as(app, "w1", "job") == [mine.id]
        assert await claim_as(app, "ghost", "job") == [ghosts.id]
        running = await app.explain_async(mine.id)
        assert running.reason == "running"
        assert running.facts["worker_id"] == "w1" and running.facts["worker_heartbeats"]
        assert 0 < running.facts["lease_seconds_left"] <= 30
        assert "still heartbeats" in running.sentence
        orphan = await app.explain_async(ghosts.id)
        assert orphan.reason == "running" and not orphan.facts["worker_heartbeats"]
        assert "stopped heartbeating" in orphan.sentence


async def test_not_due_for_each_cause(app: conveyor.App) -> None:
    tasks = define(app)
    release = asyncio.Event()

    @app.task(retry=RetryPolicy(max_attempts=3, initial_interval=FAR, max_interval=FAR, jitter=0))
    async def flaky() -> None:
        raise ValueError("later")

    @app.task()
    async def snoozer() -> None:
        raise Snooze(FAR)

    @app.coroutine("napper")
    async def napper(poll: conveyor.Poll) -> conveyor.Sleep:
        release.set()
        return conveyor.sleep(FAR)

    async with app:
        delayed = await tasks["job"].options(delay=FAR).enqueue_async()
        retried = await flaky.enqueue_async()
        snoozed = await snoozer.enqueue_async()
        sleeping = await napper.start_async({})
        async with RunningWorker(app):
            for handle in (retried, snoozed, sleeping):
                await wait_for(lambda h=handle: _ran(app, h.id))
        causes = {}
        for handle in (delayed, retried, snoozed, sleeping):
            found = await app.explain_async(handle.id)
            assert found.reason == "not_due", found
            assert FAR - 60 < found.facts["seconds_left"] <= FAR
            causes[handle.id] = found.facts["cause"]
    assert causes == {
        delayed.id: "delay",
        retried.id: "retry",
        snoozed.id: "snooze",
        sleeping.id: "sleep",
    }


async def _ran(app: conveyor.App, task_id: int) -> bool:
    task = await app.get_async(task_id)
    return task is not None and task.attempt >= 1 and task.state.value == "pending"


async def test_waiting_for_a_message(app: conveyor.App) -> None:
    @app.coroutine("listener")
    async def listener(poll: conveyor.Poll) -> conveyor.Suspend:
        return conveyor.suspend()

    async with app:
        handle = await listener.start_async({})
        async with RunningWorker(app):
            await wait_for(lambda: _state(app, handle.id, "waiting"))
        found = await app.explain_async(handle.id)
    assert found.reason == "waiting" and "message" in found.sentence


async def _state(app: conveyor.App, task_id: int, state: str) -> bool:
    task = await app.get_async(task_id)
    return task is not None and task.state.value == state


async def test_paused_then_no_worker_then_due(app: conveyor.App) -> None:
    tasks = define(app)
    async with app:
        handle = await tasks["job"].enqueue_async()
        await app.pause_async(queue="default")
        found = await app.explain_async(handle.id)
        assert found.reason == "paused" and found.facts["paused"] == {
            "kind": "queue",
            "name": "default",
        }
        await app.resume_async(queue="default")
        await app.pause_async(task="job")
        assert (await app.explain_async(handle.id)).facts["paused"]["kind"] == "task"
        await app.resume_async(task="job")

        found = await app.explain_async(handle.id)
        assert found.reason == "no_worker" and found.facts["live_workers"] == {}
        assert found.sentence.endswith("(no worker is live).")
        await register(app, replace(WORKER, id="elsewhere", queues=("other",)))
        found = await app.explain_async(handle.id)
        assert found.reason == "no_worker"
        assert found.facts["live_workers"]["elsewhere"]["queues"] == ["other"]
        assert "(1 live worker(s) serve other queues or tasks)" in found.sentence

        await register(app)
        found = await app.explain_async(handle.id)
        assert found.reason == "due" and found.facts["serving_workers"] == ["w1"]


async def test_held_by_its_concurrency_key_and_its_rate(app: conveyor.App) -> None:
    tasks = define(app)
    async with app:
        await register(app)
        first = await tasks["keyed"].enqueue_async()
        second = await tasks["keyed"].enqueue_async()
        assert await claim_as(app, "w1", "keyed", limit=2) == [first.id]
        found = await app.explain_async(second.id)
        assert found.reason == "concurrency", found
        assert found.facts["held_by"] == [first.id]
        assert found.facts["concurrency_key"]["running"] == 1
        assert f"held by {first.id}" in found.sentence

        one = await tasks["rated"].enqueue_async()
        two = await tasks["rated"].enqueue_async()
        assert await claim_as(app, "w1", "rated", limit=2) == [one.id]
        found = await app.explain_async(two.id)
        assert found.reason == "rate_limited", found
        assert found.facts["concurrency_key"]["next_start_at"] is not None


def test_the_command_line(cli: Cli) -> None:
    task_id = cli.enqueue("add", {"a": 1, "b": 2}, "--delay", "600")
    data = json.loads(cli.ok("explain", str(task_id), "--json"))
    assert (data["task_id"], data["reason"], data["facts"]["cause"]) == (
        task_id,
        "not_due",
        "delay",
    )
    text = cli.ok("explain", str(task_id))
    assert text.startswith("not_due: ") and "the delay it was enqueued with" in text
    missing = json.loads(cli.ok("explain", "99999", "--json"))
    assert missing["reason"] == "missing"


async def test_a_task_waiting_for_its_dependencies_says_which(app: conveyor.App) -> None:
    @app.task()
    async def job(n: int) -> int:
        return n

    async with app:
        first = await job.options(delay=FAR).enqueue_async(n=1)
        second = await job.options(delay=FAR).enqueue_async(n=2)
        waits = await job.options(after=[first, second]).enqueue_async(n=3)
        found = await app.explain_async(waits.id)
        assert found.reason == "dependencies"
        assert found.facts["waiting_for"] == 2
        assert [(d["id"], d["state"]) for d in found.facts["dependencies"]] == [
            (first.id, "pending"),
            (second.id, "pending"),
        ]
        assert f"{first.id} (pending), {second.id} (pending)" in found.sentence
        await app.cancel_async(first.id)
        ended = await app.explain_async(waits.id)
    assert ended.reason == "finished"
    assert f"without running: its dependency {first.id} ended cancelled" in ended.sentence
