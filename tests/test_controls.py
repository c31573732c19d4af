"""Operator controls through the App, on every backend: failed tasks retried
in bulk run again with a worker; run_now and delete."""

from __future__ import annotations

from datetime import timedelta

import pytest

import conveyor
from conveyor import RetryPolicy, TaskState
from conveyor.errors import ConfigurationError, TaskNotFoundError
from tests.worker.helpers import run_all, wait_terminal

ONCE = RetryPolicy(max_attempts=1)


@pytest.fixture
def app(any_app: conveyor.App) -> conveyor.App:
    return any_app


async def test_failed_tasks_retried_in_bulk_run_again(app: conveyor.App) -> None:
    healthy: set[int] = set()

    @app.task(retry=ONCE)
    async def flaky(n: int) -> int:
        if n not in healthy:
            raise RuntimeError("down")
        return n

    @app.task(retry=ONCE)
    async def broken() -> None:
        raise RuntimeError("always")

    async with app:
        handles = [await flaky.enqueue_async(n=n) for n in range(7)]
        other = await broken.enqueue_async()
        tasks = await run_all(app, [*handles, other])
        assert {t.state for t in tasks} == {TaskState.FAILED}
        healthy.update(range(7))
        retried = await app.retry_many_async(name="flaky", batch=3)
        assert retried == [h.id for h in handles]
        again = await run_all(app, handles)
        assert {t.state for t in again} == {TaskState.SUCCEEDED}
        [still] = await wait_terminal(app, [other.id])
        assert still.state is TaskState.FAILED  # another name: not selected


def test_run_now_and_delete(app: conveyor.App) -> None:
    @app.task()
    def job() -> None:
        return None

    later = job.options(delay=3600).enqueue()
    assert app.run_now(later.id) is TaskState.PENDING
    task = app.get(later.id)
    assert task is not None and task.run_at <= task.created_at + timedelta(seconds=5)
    app.delete(later.id)
    assert app.get(later.id) is None
    with pytest.raises(conveyor.TaskNotFoundError):
        app.delete(later.id)


@pytest.mark.parametrize("task_id", [0, -1, 2**63, 10**30])
async def test_an_id_no_task_can_have_is_missing_on_every_backend(
    any_app: conveyor.App, task_id: int
) -> None:
    """Not a store's own refusal of the number (SQLite's OverflowError, a
    PostgreSQL bigint out of range): the same answer as any missing task."""
    async with any_app:
        assert await any_app.get_async(task_id) is None
        assert await any_app.inbox_async(task_id) == []
        assert (await any_app.explain_async(task_id)).reason == "missing"
        for change in (
            any_app.cancel_async,
            any_app.retry_async,
            any_app.run_now_async,
            any_app.delete_async,
        ):
            with pytest.raises(TaskNotFoundError):
                await change(task_id)
        with pytest.raises(TaskNotFoundError):
            await any_app.send_async(task_id, {"hello": 1})
        with pytest.raises(ConfigurationError):
            await any_app.get_async("7")  # type: ignore[arg-type]
