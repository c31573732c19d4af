"""conveyor.testing: drain queues in a test, and the memory backend's inline mode."""

from __future__ import annotations

import uuid
from collections.abc import Iterator
from pathlib import Path

import pytest

import conveyor
from conveyor import testing
from conveyor.errors import TaskFailedError


@pytest.fixture(params=["memory", "sqlite"])
def app(request: pytest.FixtureRequest, tmp_path: Path) -> Iterator[conveyor.App]:
    url = (
        f"memory://{uuid.uuid4().hex}"
        if request.param == "memory"
        else f"sqlite:///{tmp_path / 'tasks.db'}"
    )
    application = conveyor.App(url)
    yield application
    application.close()


def test_drain_runs_every_due_task_and_what_they_enqueue(app: conveyor.App) -> None:
    seen: list[str] = []

    @app.task
    def follow_up(word: str) -> None:
        seen.append(f"follow-up {word}")

    @app.task
    def first(word: str) -> str:
        seen.append(word)
        follow_up.enqueue(word=word)
        return word.upper()

    @app.task(queue="other")
    def elsewhere() -> None:
        seen.append("elsewhere")

    handles = [first.enqueue(word=w) for w in ("a", "b")]
    later = elsewhere.enqueue()
    assert seen == []
    assert testing.drain(app, queues=["default"]) == 4
    assert sorted(seen) == ["a", "b", "follow-up a", "follow-up b"]
    assert [h.result(timeout=1) for h in handles] == ["A", "B"]
    assert app.get(later.id).state is conveyor.TaskState.PENDING  # not its queue
    assert testing.drain(app) == 1
    assert seen[-1] == "elsewhere"
    assert testing.drain(app) == 0


def test_inline_mode_runs_tasks_before_enqueue_returns() -> None:
    app = conveyor.App(f"memory://{uuid.uuid4().hex}?inline=true")
    order: list[str] = []

    @app.task
    def child(n: int) -> int:
        order.append(f"child {n}")
        return n * 10

    @app.task
    async def parent(n: int) -> int:
        order.append("parent")
        await child.enqueue_async(n=n)
        return n

    @app.task(retry=conveyor.RetryPolicy(max_attempts=1))
    def broken() -> None:
        raise ValueError("nope")

    handle = parent.enqueue(n=4)
    assert order == ["parent", "child 4"]  # done, child included, on return
    assert app.get(handle.id).state is conveyor.TaskState.SUCCEEDED
    assert handle.result(timeout=0) == 4

    failed = broken.enqueue()
    assert app.get(failed.id).state is conveyor.TaskState.FAILED
    with pytest.raises(TaskFailedError, match="nope"):
        failed.result(timeout=0)
    app.close()


async def test_inline_mode_works_from_async_code_too() -> None:
    app = conveyor.App(f"memory://{uuid.uuid4().hex}?inline=1")

    @app.task
    async def double(n: int) -> int:
        return n * 2

    async with app:
        handle = await double.enqueue_async(n=21)
        assert (await app.get_async(handle.id)).result == 42


def test_memory_urls_reject_unknown_options() -> None:
    with pytest.raises(conveyor.ConfigurationError, match="unknown memory URL option"):
        conveyor.App("memory://x?durable=yes")
    with pytest.raises(conveyor.ConfigurationError, match="inline must be"):
        conveyor.App("memory://x?inline=maybe")
