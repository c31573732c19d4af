"""Expiry at the backend level, on every backend: a task's ``expires_at``
comes back as its claim's ``expired_at`` exactly when the claim starts the
task's first attempt at or after it, by the store's clock, through every way
in (one task, a uniform batch, a mixed batch, a keyed one, a concurrency-keyed
one); a retry or a reclaim of a task that started in time never expires; the
cancelled completion the worker then writes ends the task."""

from __future__ import annotations

from dataclasses import replace

from conveyor.backends.params import Completion, ErrorInfo, FinishParams, NewTask
from conveyor.backends.protocol import Backend
from conveyor.model import Outcome, TaskState
from tests.conformance.test_tasks import LEASE, claim, enqueue, later, new


def expiring(task: NewTask, seconds: float) -> NewTask:
    return replace(task, expires_at=later(seconds))


async def test_a_first_attempt_past_its_expiry_is_handed_over_expired(backend: Backend) -> None:
    one = [expiring(new(), 3)]
    uniform = [expiring(new(), 3), expiring(new(), 3)]
    mixed = [expiring(new(priority=1), 3), new(priority=2), expiring(new(priority=3), 9)]
    keyed = [
        replace(expiring(new(), 3), idempotency_key="k"),
        replace(expiring(new(), 9), idempotency_key="k2"),
    ]
    expected: dict[int, object] = {}
    for batch in (one, uniform, mixed, keyed):
        ids = await enqueue(backend, *batch)
        expected.update(
            {
                i: (t.expires_at if t.expires_at is not None and t.expires_at <= later(5) else None)
                for i, t in zip(ids, batch, strict=True)
            }
        )
    claimed = await claim(backend, limit=20, at=later(5))
    assert {t.token.task_id: t.expired_at for t in claimed} == expected
    assert sum(value is not None for value in expected.values()) == 5


async def test_the_expiry_instant_itself_is_past(backend: Backend) -> None:
    [on_time, at_expiry] = await enqueue(backend, expiring(new(), 5.001), expiring(new(), 5))
    claimed = {t.token.task_id: t.expired_at for t in await claim(backend, at=later(5))}
    assert claimed == {on_time: None, at_expiry: later(5)}


async def test_a_concurrency_keyed_task_expires_too(backend: Backend) -> None:
    [task_id] = await enqueue(
        backend, replace(expiring(new(), 3), concurrency_key="tenant", concurrency_limit=1)
    )
    [claimed] = await claim(backend, at=later(5))
    assert (claimed.token.task_id, claimed.expired_at) == (task_id, later(3))


async def test_a_task_that_started_in_time_never_expires(backend: Backend) -> None:
    [retried, reclaimed] = await enqueue(backend, expiring(new(), 3), expiring(new(), 3))
    first = {t.token.task_id: t for t in await claim(backend, at=later(1))}
    assert [t.expired_at for t in first.values()] == [None, None]
    error = ErrorInfo("ValueError", "bad")
    retry = Completion(
        first[retried].token, Outcome.FAILED, TaskState.PENDING, error=error, retry_delay=30
    )
    assert (await backend.finish(FinishParams("w1", [retry], now=later(2)))).applied
    again = await claim(backend, "w2", at=later(LEASE + 40))
    assert {t.token.task_id: (t.token.attempt, t.expired_at) for t in again} == {
        retried: (2, None),
        reclaimed: (2, None),
    }


async def test_the_worker_s_cancelled_completion_ends_an_expired_task(backend: Backend) -> None:
    [task_id] = await enqueue(backend, expiring(new(), 3))
    [claimed] = await claim(backend, at=later(5))
    assert claimed.expired_at == later(3)
    ended = Completion(
        claimed.token,
        Outcome.CANCELLED,
        TaskState.CANCELLED,
        error=ErrorInfo("Expired", "not started by its expiry time"),
    )
    assert (await backend.finish(FinishParams("w1", [ended], now=later(5)))).applied
    task = await backend.get_task(task_id)
    assert task is not None and task.state is TaskState.CANCELLED
    assert [(a.outcome, a.error_type) for a in task.attempts] == [(Outcome.CANCELLED, "Expired")]
    assert await claim(backend, at=later(60)) == []
