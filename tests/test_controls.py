"""Operator controls through the App, on every backend: failed tasks retried
in bulk run again with a worker; run_now and delete."""

from __future__ import annotations

from datetime import timedelta

import pytest

import conveyor
from conveyor import RetryPolicy, TaskState
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
