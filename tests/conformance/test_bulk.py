"""Bulk retries, cancels and deletes on every backend: each batch reads its
filter in the same write as its action, so a task whose state changed after
a caller listed it is judged as it is now, never as the listing saw it.

The race is made deterministic: the listing is taken, the state changes,
then the bulk action runs with the stale listing's ids (``ids=``) and its
filter's states."""

from __future__ import annotations

from dataclasses import replace

import pytest

from conveyor.backends.params import Completion, FinishParams
from conveyor.backends.protocol import Backend
from conveyor.errors import ConfigurationError
from conveyor.model import Outcome, TaskState
from conveyor.records import CancelMany, DeleteMany, RetryMany
from tests.conformance.test_controls import fail_all
from tests.conformance.test_inboxes import coroutine
from tests.conformance.test_tasks import claim, enqueue, later, new


async def states(backend: Backend, ids: list[int]) -> list[TaskState | None]:
    tasks = [await backend.get_task(i, with_attempts=False) for i in ids]
    return [t.state if t is not None else None for t in tasks]


async def test_a_bulk_retry_of_failed_tasks_leaves_one_cancelled_since_it_was_listed(
    backend: Backend,
) -> None:
    ids = await enqueue(backend, new(), new(), new())
    await fail_all(backend)
    listed = list(ids)  # an operator lists the failed tasks...
    await backend.retry(ids[1], now=later(2))  # ...another retries one and cancels it
    assert await backend.cancel(ids[1], now=later(3)) is TaskState.CANCELLED
    retried = await backend.retry_many(RetryMany(states=(TaskState.FAILED,), ids=listed))
    assert retried == [ids[0], ids[2]]
    assert await states(backend, ids) == [TaskState.PENDING, TaskState.CANCELLED, TaskState.PENDING]
    # Without ids too: the filter, not a listing, says what moves.
    assert await backend.retry_many(RetryMany(states=(TaskState.FAILED,))) == []


async def test_a_bulk_retry_among_ids_keeps_to_them_and_to_its_other_filters(
    backend: Backend,
) -> None:
    ids = await enqueue(backend, *(new() for _ in range(5)))
    await fail_all(backend)
    among = [ids[4], ids[0], ids[2], ids[0], 10**12]  # any order, repeats, an id no task has
    first = await backend.retry_many(RetryMany(ids=among, limit=2))
    assert first == [ids[0], ids[2]]
    assert await backend.retry_many(RetryMany(ids=among, after=first[-1])) == [ids[4]]
    assert await backend.retry_many(RetryMany(ids=[])) == []
    assert await backend.retry_many(RetryMany(ids=[ids[1]], name="other")) == []
    assert await states(backend, [ids[1], ids[3]]) == [TaskState.FAILED, TaskState.FAILED]


async def test_a_bulk_cancel_never_cancels_a_task_that_finished_or_started_meanwhile(
    backend: Backend,
) -> None:
    ids = await enqueue(backend, *(new() for _ in range(4)))
    listed = list(ids)  # an operator lists the pending tasks...
    done, started = await claim(backend, limit=2)  # ...a worker takes two, ends one
    await backend.finish(
        FinishParams(
            worker_id="w1",
            completions=[Completion(done.token, Outcome.SUCCEEDED, TaskState.SUCCEEDED, "1")],
            now=later(1),
        )
    )
    cancelled = await backend.cancel_many(
        CancelMany(states=(TaskState.PENDING,), ids=listed, now=later(2))
    )
    assert cancelled == [ids[2], ids[3]]
    assert await states(backend, ids) == [
        TaskState.SUCCEEDED,
        TaskState.IN_PROGRESS,
        TaskState.CANCELLED,
        TaskState.CANCELLED,
    ]
    running = await backend.get_task(started.token.task_id, with_attempts=False)
    assert running is not None and not running.cancel_requested  # "pending" did not take it
    # The default states take a running task too: its cancel is requested.
    assert await backend.cancel_many(CancelMany(ids=listed, now=later(3))) == [ids[1]]
    running = await backend.get_task(ids[1], with_attempts=False)
    assert running is not None and running.state is TaskState.IN_PROGRESS
    assert running.cancel_requested


async def test_a_bulk_cancel_pages_by_filter_and_cancels_a_coroutine_s_children(
    backend: Backend,
) -> None:
    mail = await enqueue(backend, *(new(queue="mail") for _ in range(3)))
    [other] = await enqueue(backend, new("other", queue="mail"))
    [parent] = await enqueue(backend, coroutine({"n": 0}))
    [child] = await enqueue(backend, replace(new("kid"), parent_id=parent))
    first = await backend.cancel_many(CancelMany(name="job", queue="mail", limit=2, now=later(1)))
    rest = await backend.cancel_many(CancelMany(name="job", queue="mail", after=first[-1]))
    assert first + rest == mail
    assert await states(backend, [other]) == [TaskState.PENDING]
    assert await backend.cancel_many(CancelMany(name="coro", now=later(2))) == [parent]
    assert await states(backend, [parent, child]) == [TaskState.CANCELLED, TaskState.CANCELLED]


async def test_a_bulk_delete_of_failed_tasks_never_deletes_one_retried_meanwhile(
    backend: Backend,
) -> None:
    ids = await enqueue(backend, new(), new(), new())
    await fail_all(backend)
    listed = list(ids)  # an operator lists the failed tasks...
    await backend.retry(ids[1], now=later(2))  # ...another retries one
    deleted = await backend.delete_many(DeleteMany(states=(TaskState.FAILED,), ids=listed))
    assert deleted == [ids[0], ids[2]]
    assert await states(backend, ids) == [None, TaskState.PENDING, None]
    kept = await backend.get_task(ids[1])
    assert kept is not None and len(kept.attempts) == 1  # its log stays with it
    [again] = await claim(backend, at=later(3))
    assert again.token.task_id == ids[1]


async def test_a_bulk_delete_takes_finished_tasks_by_filter_with_their_logs(
    backend: Backend,
) -> None:
    ids = await enqueue(backend, new(), new(), new("other"))
    await fail_all(backend, names=("job", "other"))
    [pending] = await enqueue(backend, new())
    finished = (TaskState.FAILED, TaskState.SUCCEEDED)
    assert await backend.delete_many(DeleteMany(states=finished, name="job", limit=1)) == ids[:1]
    assert await backend.delete_many(DeleteMany(states=finished, name="job")) == ids[1:2]
    assert await states(backend, [*ids, pending]) == [
        None,
        None,
        TaskState.FAILED,
        TaskState.PENDING,
    ]


@pytest.mark.parametrize(
    ("kind", "state"),
    [
        (RetryMany, TaskState.PENDING),
        (CancelMany, TaskState.FAILED),
        (DeleteMany, TaskState.PENDING),
        (DeleteMany, TaskState.IN_PROGRESS),
    ],
)
def test_a_bulk_action_refuses_a_state_it_cannot_take(
    kind: type[RetryMany | CancelMany | DeleteMany], state: TaskState
) -> None:
    with pytest.raises(ConfigurationError, match="a bulk"):
        kind(states=(state,))
