"""Concurrency keys on every backend: at most the key's limit of its tasks
run at once, whoever claims; a full key holds back only its own tasks;
every way back to pending (retry, release) keeps the task claimable."""

from __future__ import annotations

import asyncio
from dataclasses import replace

import pytest

from conveyor.backends.params import ClaimParams, Completion, ErrorInfo, FinishParams, NewTask
from conveyor.backends.protocol import Backend
from conveyor.model import Outcome, PauseKind, TaskState
from tests.conformance.test_tasks import LEASE, claim, enqueue, later, new, success


def keyed(key: str, limit: int = 1, **fields: object) -> NewTask:
    return replace(new(**fields), concurrency_key=key, concurrency_limit=limit)  # type: ignore[arg-type]


def ids(claimed: list) -> list[int]:  # type: ignore[type-arg]
    return [c.token.task_id for c in claimed]


async def finish_ok(backend: Backend, claimed: list, at: float = 1) -> None:  # type: ignore[type-arg]
    await backend.finish(
        FinishParams(worker_id="w1", completions=[success(c.token) for c in claimed], now=later(at))
    )


async def test_a_key_runs_at_most_its_limit_at_once(backend: Backend) -> None:
    held = await enqueue(backend, keyed("user:1"), keyed("user:1"), keyed("user:1"))
    [plain] = await enqueue(backend, new())
    first = await claim(backend, limit=10)
    assert sorted(ids(first)) == sorted([held[0], plain])  # one of the key, and the plain task
    assert await claim(backend, limit=10) == []  # the key is full
    await finish_ok(backend, [c for c in first if c.token.task_id == held[0]])
    assert ids(await claim(backend, limit=10, at=later(2))) == [held[1]]


async def test_a_full_key_holds_back_only_its_own_tasks(backend: Backend) -> None:
    hot = await enqueue(backend, *(keyed("hot") for _ in range(50)))
    [other] = await enqueue(backend, keyed("cold"))
    first = await claim(backend, limit=1)
    second = await claim(backend, limit=5)
    assert sorted(ids(first) + ids(second)) == sorted([hot[0], other])


async def test_a_limit_above_one_across_claims(backend: Backend) -> None:
    await enqueue(backend, *(keyed("k", limit=3) for _ in range(10)))
    taken = []
    for worker in ("w1", "w2", "w3", "w4"):
        taken += await claim(backend, worker, limit=2)
    assert len(taken) == 3


async def test_concurrent_claims_never_overfill_a_key(backend: Backend) -> None:
    await enqueue(backend, *(keyed("k", limit=2) for _ in range(20)))

    async def one(worker: str) -> int:
        claimed = await backend.claim(
            ClaimParams(
                worker_id=worker,
                names=["job"],
                queues=["default"],
                limit=3,
                lease=LEASE,
                now=later(1),
            )
        )
        return len(claimed)

    counts = await asyncio.gather(*(one(f"w{i}") for i in range(8)))
    assert sum(counts) == 2


async def test_keyed_tasks_keep_their_claim_order_within_a_key(backend: Backend) -> None:
    _low, high = await enqueue(backend, keyed("k", priority=0), keyed("k", priority=9))
    assert ids(await claim(backend)) == [high]


async def test_a_retried_or_released_keyed_task_is_claimed_again(backend: Backend) -> None:
    [task_id] = await enqueue(backend, keyed("k"))
    [first] = await claim(backend)
    retry = Completion(
        first.token, Outcome.FAILED, TaskState.PENDING, error=ErrorInfo("E", "x"), retry_delay=0
    )
    await backend.finish(FinishParams(worker_id="w1", completions=[retry], now=later(1)))
    [second] = await claim(backend, at=later(2))
    assert second.token.task_id == task_id
    release = Completion(
        second.token,
        Outcome.INTERRUPTED,
        TaskState.PENDING,
        error=ErrorInfo("I", "x"),
        retry_delay=0,
    )
    await backend.finish(FinishParams(worker_id="w1", completions=[release], now=later(3)))
    [third] = await claim(backend, at=later(4))
    assert third.token.task_id == task_id and third.token.attempt == 3


async def test_an_expired_lease_is_taken_back_without_a_second_runner(backend: Backend) -> None:
    first, second = await enqueue(backend, keyed("k"), keyed("k"))
    [running] = await claim(backend)
    assert running.token.task_id == first
    # Long after its lease: the next claims take the expired one back, not
    # the second task beside it.
    for at in (LEASE + 1, LEASE + 2):
        again = await claim(backend, "w2", at=later(at))
        assert ids(again) in ([first], [])
    task = await backend.get_task(second, with_attempts=False)
    assert task is not None and task.state is TaskState.PENDING


async def test_paused_names_and_cancelled_tasks_free_their_key(backend: Backend) -> None:
    a, b = await enqueue(backend, keyed("k"), keyed("k"))
    await backend.pause(PauseKind.TASK, "job")
    assert await claim(backend) == []
    await backend.resume(PauseKind.TASK, "job")
    [running] = await claim(backend)
    await backend.cancel(b, now=later(1))
    await finish_ok(backend, [running])
    [c] = await enqueue(backend, keyed("k"))
    assert ids(await claim(backend, at=later(2))) == [c]
    assert running.token.task_id == a


async def test_a_task_that_found_its_unique_key_taken_leaves_its_key_no_limit(
    backend: Backend,
) -> None:
    """An enqueue that stores nothing (its unique key is taken) must not
    leave its concurrency key behind: the next task of the key sets the limit."""
    unique = {"idempotency_key": "k1", "unique_scope": "pending"}
    [first] = await enqueue(backend, replace(new(), **unique))  # type: ignore[arg-type]
    taken = await enqueue(backend, keyed("other"), replace(keyed("shared", limit=2), **unique))  # type: ignore[arg-type]
    assert taken[1] == first  # stored nothing
    shared = await enqueue(backend, keyed("shared", limit=1), keyed("shared", limit=1))
    listed = {k.key: k for k in await backend.list_keys(now=later(0))}
    assert listed["shared"].max_running == 1
    claimed = set(ids(await claim(backend, limit=10, at=later(1))))
    assert len(claimed & set(shared)) == 1


async def test_a_key_with_no_pending_task_takes_the_limit_of_its_next(backend: Backend) -> None:
    """A key's row may outlive its last pending task (until a claim reads
    it), with the limit of the task claimed last. The next task made
    pending sets the limit: whether a claim dropped the row meanwhile
    changes nothing."""
    [first] = await enqueue(backend, keyed("k", limit=1))
    assert ids(await claim(backend)) == [first]
    # None pending: the next task's limit of 2 lets it run beside the first.
    [second] = await enqueue(backend, keyed("k", limit=2))
    listed = {k.key: k for k in await backend.list_keys(now=later(1))}
    assert listed["k"].max_running == 2
    assert ids(await claim(backend, limit=10, at=later(1))) == [second]


async def test_a_retry_into_a_key_with_no_pending_task_sets_its_limit(backend: Backend) -> None:
    """The first task (limit 1) runs; the second (limit 2) comes, sets 2 and
    runs beside it; the first fails and is retried at once: none of the
    key's tasks is pending, so its limit of 1 holds the key, which the
    second fills."""
    [first] = await enqueue(backend, keyed("k", limit=1))
    [running] = await claim(backend)
    [second] = await enqueue(backend, keyed("k", limit=2))
    assert ids(await claim(backend, limit=10, at=later(1))) == [second]
    retry = Completion(
        running.token, Outcome.FAILED, TaskState.PENDING, error=ErrorInfo("E", "x"), retry_delay=0
    )
    await backend.finish(FinishParams(worker_id="w1", completions=[retry], now=later(2)))
    listed = {k.key: k for k in await backend.list_keys(now=later(2))}
    assert listed["k"].max_running == 1 and listed["k"].running == 1
    assert await claim(backend, limit=10, at=later(3)) == []
    task = await backend.get_task(first, with_attempts=False)
    assert task is not None and task.state is TaskState.PENDING


async def test_of_one_batch_into_a_key_with_no_pending_task_the_first_sets_its_limit(
    backend: Backend,
) -> None:
    """One enqueue makes two tasks of a key with none pending: the first
    (limit 2) sets the limit, the second (limit 1) finds it pending and
    changes nothing (each store writes the rows in the batch's order)."""
    [running] = await enqueue(backend, keyed("k", limit=1))
    assert ids(await claim(backend)) == [running]
    two, one = await enqueue(backend, keyed("k", limit=2), keyed("k", limit=1))
    listed = {k.key: k for k in await backend.list_keys(now=later(1))}
    assert listed["k"].max_running == 2 and listed["k"].pending == 2
    assert ids(await claim(backend, limit=10, at=later(1))) == [two]
    assert one not in ids(await claim(backend, limit=10, at=later(2)))


async def test_of_one_batch_of_retries_into_a_key_with_no_pending_task_one_sets_its_limit(
    backend: Backend,
) -> None:
    """One finish makes two running tasks of a key (limit 3) pending again,
    when none of the key's tasks is pending and the key holds a limit of 1:
    the retried tasks' limit replaces it, though each of them sees the
    other pending (an UPDATE's rows are all written when a trigger after
    it looks)."""
    [one] = await enqueue(backend, keyed("k", limit=1))
    [running_one] = await claim(backend)
    three = await enqueue(backend, keyed("k", limit=3), keyed("k", limit=3))
    running = await claim(backend, limit=10, at=later(1))
    assert sorted(ids(running)) == sorted(three)
    # The first task is retried later (pending: its limit of 1 is set), then
    # cancelled: none of the key's tasks is pending, and 1 stays.
    later_retry = Completion(
        running_one.token,
        Outcome.FAILED,
        TaskState.PENDING,
        error=ErrorInfo("E", "x"),
        retry_delay=3600,
    )
    await backend.finish(FinishParams(worker_id="w1", completions=[later_retry], now=later(2)))
    assert await backend.cancel(one, now=later(2)) is TaskState.CANCELLED
    assert await backend.list_keys(now=later(2)) == []  # none pending
    retries = [
        Completion(c.token, Outcome.FAILED, TaskState.PENDING, error=ErrorInfo("E", "x"))
        for c in running
    ]
    await backend.finish(FinishParams(worker_id="w1", completions=retries, now=later(3)))
    listed = {k.key: k for k in await backend.list_keys(now=later(3))}
    assert listed["k"].max_running == 3 and listed["k"].pending == 2
    assert sorted(ids(await claim(backend, limit=10, at=later(4)))) == sorted(three)


@pytest.mark.parametrize("how", ["comes-due", "run-now"])
async def test_a_delayed_task_made_due_changes_no_limit(backend: Backend, how: str) -> None:
    """Coming due, or run_now, is no move to pending: a key's delayed task
    made due after the key's other tasks were claimed leaves the limit of
    the task claimed last."""
    now_due, delayed = await enqueue(
        backend, keyed("k", limit=2), keyed("k", limit=1, run_at=later(5))
    )
    assert ids(await claim(backend, limit=10, at=later(1))) == [now_due]
    at = later(6)
    if how == "run-now":
        await backend.run_now(delayed, now=later(2))
        at = later(2)
    assert ids(await claim(backend, limit=10, at=at)) == [delayed]
