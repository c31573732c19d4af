"""Operator controls on every backend: run a pending task now, delete a task,
retry failed tasks in bulk."""

from __future__ import annotations

from dataclasses import replace

import pytest

from conveyor.backends.params import Completion, ErrorInfo, FinishParams
from conveyor.backends.protocol import Backend
from conveyor.errors import ConfigurationError, InvalidTransitionError, TaskNotFoundError
from conveyor.model import Outcome, TaskState
from conveyor.records import RetryMany
from tests.conformance.test_inboxes import coroutine
from tests.conformance.test_tasks import claim, enqueue, later, new


async def fail_all(backend: Backend, names: tuple[str, ...] = ("job",), at: float = 1) -> None:
    taken = await claim(backend, limit=100, names=names, queues=("default", "mail"))
    await backend.finish(
        FinishParams(
            worker_id="w1",
            completions=[
                Completion(c.token, Outcome.FAILED, TaskState.FAILED, error=ErrorInfo("E", "x"))
                for c in taken
            ],
            now=later(at),
        )
    )


async def test_run_now_makes_a_delayed_task_due(backend: Backend) -> None:
    [task_id] = await enqueue(backend, new(run_at=later(3600)))
    assert await claim(backend, at=later(1)) == []
    assert await backend.run_now(task_id, now=later(1)) is TaskState.PENDING
    [claimed] = await claim(backend, at=later(1))
    assert claimed.token.task_id == task_id
    with pytest.raises(InvalidTransitionError, match="run now"):
        await backend.run_now(task_id, now=later(2))
    with pytest.raises(TaskNotFoundError):
        await backend.run_now(task_id + 1000)


async def test_run_now_never_moves_a_due_task_later(backend: Backend) -> None:
    [task_id] = await enqueue(backend, new(run_at=later(-60)))
    await backend.run_now(task_id, now=later(0))
    task = await backend.get_task(task_id, with_attempts=False)
    assert task is not None and task.run_at == later(-60)


async def test_delete_takes_a_task_and_its_log_but_never_a_running_one(backend: Backend) -> None:
    pending, running = await enqueue(backend, new(), new("busy"))
    await claim(backend, names=("busy",))
    await backend.delete(pending)
    assert await backend.get_task(pending) is None
    with pytest.raises(InvalidTransitionError, match="cancel it first"):
        await backend.delete(running)
    with pytest.raises(TaskNotFoundError):
        await backend.delete(pending)
    [failed] = await enqueue(backend, new())
    await fail_all(backend)
    await backend.delete(failed)
    assert await backend.get_task(failed) is None


async def test_delete_refuses_an_unfinished_child_of_a_live_parent(backend: Backend) -> None:
    [parent] = await enqueue(backend, coroutine({"n": 0}))
    [child] = await enqueue(backend, replace(new("kid"), parent_id=parent))
    with pytest.raises(InvalidTransitionError, match="cancel it instead"):
        await backend.delete(child)
    await backend.delete(parent)  # a parent may go: its child runs on alone
    await backend.delete(child)


async def test_retry_many_moves_the_failed_tasks_the_filters_select(backend: Backend) -> None:
    mail = await enqueue(backend, *(new("job", queue="mail") for _ in range(5)))
    other = await enqueue(backend, new("job", queue="default"), new("other"))
    await fail_all(backend, names=("job", "other"))
    moved = await backend.retry_many(RetryMany(queue="mail", limit=2, now=later(5)))
    assert moved == mail[:2]  # oldest first, one batch
    moved += await backend.retry_many(RetryMany(queue="mail", after=moved[-1], now=later(5)))
    assert moved == mail
    tasks = [await backend.get_task(i, with_attempts=False) for i in mail]
    assert {(t.state, t.run_at) for t in tasks if t is not None} == {(TaskState.PENDING, later(5))}
    assert await backend.retry_many(RetryMany(name="other", now=later(6))) == [other[1]]
    left = await backend.get_task(other[0], with_attempts=False)
    assert left is not None and left.state is TaskState.FAILED
    with pytest.raises(ConfigurationError):
        RetryMany(states=(TaskState.PENDING,))
