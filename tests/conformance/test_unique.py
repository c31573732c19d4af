"""Unique keys on every backend: how long a task holds its key (scope), what
an enqueue of a held key does (on_conflict), and batches; an idempotency key
is a unique key held while the task is stored."""

from __future__ import annotations

from dataclasses import replace

import pytest

from conveyor.backends.params import EnqueueParams, FinishParams, NewTask, WorkFilter
from conveyor.backends.protocol import Backend
from conveyor.errors import TaskExistsError
from conveyor.model import TaskState
from conveyor.records import TaskFilter
from tests.conformance.test_tasks import claim, enqueue, later, new, success


def unique(
    key: str,
    scope: str | None = "active",
    *,
    period: float | None = None,
    on_conflict: str = "existing",
    payload: object = None,
    priority: int = 0,
    at: float = 0,
) -> NewTask:
    return replace(
        new(payload=payload, priority=priority, run_at=later(at)),
        idempotency_key=key,
        unique_scope=scope,
        unique_for=period,
        on_conflict=on_conflict,
    )


async def count(backend: Backend) -> int:
    return len(await backend.list_tasks(TaskFilter(limit=1000)))


async def test_scope_pending_releases_the_key_when_the_task_starts(backend: Backend) -> None:
    [first] = await enqueue(backend, unique("k", "pending"))
    assert await enqueue(backend, unique("k", "pending")) == [first]
    [claimed] = await claim(backend)
    assert claimed.token.task_id == first
    [second] = await enqueue(backend, unique("k", "pending"))
    assert second != first
    task = await backend.get_task(first, with_attempts=False)
    assert task is not None and task.idempotency_key is None  # given up
    assert await enqueue(backend, unique("k", "pending")) == [second]


async def test_scope_active_holds_the_key_until_the_task_finishes(backend: Backend) -> None:
    [first] = await enqueue(backend, unique("k"))
    [claimed] = await claim(backend)
    assert await enqueue(backend, unique("k")) == [first]  # running: still held
    await backend.finish(
        FinishParams(worker_id="w1", completions=[success(claimed.token)], now=later(1))
    )
    [second] = await enqueue(backend, unique("k"))
    assert second != first


async def test_a_cancel_ends_the_active_scope_too(backend: Backend) -> None:
    [first] = await enqueue(backend, unique("k"))
    await backend.cancel(first, now=later(1))
    [second] = await enqueue(backend, unique("k"))
    assert second != first
    await backend.retry(first, now=later(2))  # a retried task does not take its key back
    assert await enqueue(backend, unique("k")) == [second]


async def test_a_stored_key_is_held_after_the_task_finished(backend: Backend) -> None:
    [first] = await enqueue(backend, unique("k", None))
    [claimed] = await claim(backend)
    await backend.finish(
        FinishParams(worker_id="w1", completions=[success(claimed.token)], now=later(1))
    )
    assert await enqueue(backend, unique("k", None)) == [first]


async def test_a_period_holds_the_key_whatever_the_state_until_it_ends(backend: Backend) -> None:
    [first] = await enqueue(backend, unique("k", None, period=60))
    [claimed] = await claim(backend)
    await backend.finish(
        FinishParams(worker_id="w1", completions=[success(claimed.token)], now=later(1))
    )
    again = unique("k", None, period=60)
    assert await backend.enqueue(EnqueueParams([again], now=later(59))) == [first]
    [second] = await backend.enqueue(EnqueueParams([again], now=later(61)))
    assert second != first
    assert await backend.enqueue(EnqueueParams([again], now=later(100))) == [second]


async def test_replace_updates_a_pending_holder_and_leaves_a_running_one(
    backend: Backend,
) -> None:
    [first] = await enqueue(backend, unique("k", payload={"v": 1}, at=30))
    again = unique("k", on_conflict="replace", payload={"v": 2}, priority=5, at=-10)
    assert await enqueue(backend, again) == [first]
    task = await backend.get_task(first, with_attempts=False)
    assert task is not None
    assert (task.payload, task.priority, task.run_at) == ({"v": 2}, 5, later(-10))
    [claimed] = await claim(backend)
    third = unique("k", on_conflict="replace", payload={"v": 3})
    assert await enqueue(backend, third) == [first]
    task = await backend.get_task(first, with_attempts=False)
    assert task is not None and task.state is TaskState.IN_PROGRESS
    assert claimed.token.task_id == first


async def test_raise_stores_nothing_of_the_enqueue(backend: Backend) -> None:
    [first] = await enqueue(backend, unique("k"))
    before = await count(backend)
    with pytest.raises(TaskExistsError) as raised:
        await enqueue(backend, unique("other"), unique("k", on_conflict="raise"))
    assert (raised.value.task_id, raised.value.key) == (first, "k")
    assert await count(backend) == before  # "other" was not stored either


async def test_a_key_repeated_in_one_batch_is_its_first_task(backend: Backend) -> None:
    ids = await enqueue(
        backend,
        unique("k", payload={"v": 1}),
        unique("k", on_conflict="raise", payload={"v": 2}),
        unique("k", on_conflict="replace", payload={"v": 3}),
        unique("j"),
    )
    assert ids[0] == ids[1] == ids[2] != ids[3]
    task = await backend.get_task(ids[0], with_attempts=False)
    assert task is not None and task.payload == {"v": 1}


async def test_a_holder_replaced_twice_in_one_batch_is_due_once(backend: Backend) -> None:
    [holder] = await enqueue(backend, unique("k", payload={"v": 1}, at=30))
    ids = await enqueue(
        backend,
        unique("other", payload={"v": 0}, at=60),
        unique("k", on_conflict="replace", payload={"v": 2}, priority=5, at=-10),
        unique("k", on_conflict="replace", payload={"v": 3}, priority=7, at=-5),
    )
    assert ids[1:] == [holder, holder] and ids[0] != holder
    task = await backend.get_task(holder, with_attempts=False)
    assert task is not None
    assert (task.payload, task.priority, task.run_at) == ({"v": 3}, 7, later(-5))
    # One claim of ten finds the holder once, and not the task due later.
    claimed = await claim(backend, limit=10)
    assert [c.token.task_id for c in claimed] == [holder]


async def test_a_replace_beside_a_new_task_of_its_name_leaves_both_claimable(
    backend: Backend,
) -> None:
    """One enqueue stores a new task and replaces the pending holder of a
    unique key, of the same queue and name, moving it later: the new task
    stays due and counted, and a claim takes it."""
    unique = {"idempotency_key": "k1", "unique_scope": "pending"}
    [holder] = await enqueue(backend, replace(new(), **unique))  # type: ignore[arg-type]
    fresh, found = await enqueue(
        backend,
        new(),
        replace(new(run_at=None), delay=5.0, on_conflict="replace", **unique),  # type: ignore[arg-type]
    )
    assert found == holder
    work = WorkFilter(names=["job"], queues=["default"], now=later(1))
    assert await backend.count_unfinished(work) == 1
    assert [c.token.task_id for c in await claim(backend, limit=10, at=later(1))] == [fresh]
    assert [c.token.task_id for c in await claim(backend, limit=10, at=later(6))] == [holder]
