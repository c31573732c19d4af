"""The backend contract, run against every backend, with an injected clock.

Each test moves the clock through ``now`` instead of sleeping. The same
behaviour is expected of every backend; capability gaps are asserted in
``test_capabilities.py``.
"""

from __future__ import annotations

from dataclasses import replace
from datetime import UTC, datetime, timedelta

import pytest

from conveyor import payload as codec
from conveyor.backends.params import (
    ClaimParams,
    Completion,
    EnqueueParams,
    ErrorInfo,
    FinishParams,
    HeartbeatParams,
    NewTask,
    WorkFilter,
)
from conveyor.backends.protocol import Backend
from conveyor.errors import InvalidTransitionError, TaskNotFoundError
from conveyor.model import LeaseToken, Outcome, RetryPolicy, TaskState
from conveyor.records import PruneParams, TaskFilter, WorkerInfo

T0 = datetime(2030, 1, 1, tzinfo=UTC)
LEASE = 10.0


def new(
    name: str = "job",
    *,
    queue: str = "default",
    priority: int = 0,
    run_at: datetime | None = T0,
    max_attempts: int = 3,
    payload: object = None,
) -> NewTask:
    return NewTask(
        name=name,
        queue=queue,
        payload=codec.encode(payload if payload is not None else {}),
        priority=priority,
        max_attempts=max_attempts,
        retry=RetryPolicy(max_attempts=max_attempts),
        run_at=run_at,
    )


async def enqueue(backend: Backend, *tasks: NewTask) -> list[int]:
    return await backend.enqueue(EnqueueParams(tasks=tasks, now=T0))


async def claim(
    backend: Backend,
    worker: str = "w1",
    *,
    limit: int = 10,
    at: datetime = T0,
    names: tuple[str, ...] = ("job",),
    queues: tuple[str, ...] = ("default",),
):
    return await backend.claim(
        ClaimParams(worker_id=worker, names=names, queues=queues, limit=limit, lease=LEASE, now=at)
    )


def success(token: LeaseToken, result: object = "ok") -> Completion:
    return Completion(token, Outcome.SUCCEEDED, TaskState.SUCCEEDED, result=codec.encode(result))


def later(seconds: float) -> datetime:
    return T0 + timedelta(seconds=seconds)


async def test_claim_creates_attempt_rows_and_leases(backend: Backend) -> None:
    [task_id] = await enqueue(backend, new(payload={"a": 1}))
    [claimed] = await claim(backend)
    assert claimed.token == LeaseToken(task_id, 1, "w1", claimed.token.nonce)
    assert codec.decode(claimed.payload) == {"a": 1}
    assert claimed.lease_expires_at == later(LEASE)
    task = await backend.get_task(task_id)
    assert task is not None
    assert task.state is TaskState.IN_PROGRESS
    assert task.worker_id == "w1"
    assert [(a.number, a.worker_id, a.outcome) for a in task.attempts] == [
        (1, "w1", Outcome.IN_PROGRESS)
    ]
    assert await claim(backend, "w2") == []


async def test_claim_limit_takes_the_head_of_the_order(backend: Backend) -> None:
    ids = await enqueue(
        backend,
        new(priority=0, run_at=later(-5)),
        new(priority=5, run_at=later(-1)),
        new(priority=5, run_at=later(-3)),
        new(priority=0, run_at=later(-5)),
        new(priority=-1, run_at=later(-9)),
    )
    taken = []
    for _ in ids:
        [one] = await claim(backend, limit=1)
        taken.append(one.token.task_id)
    assert taken == [ids[2], ids[1], ids[0], ids[3], ids[4]]


async def test_a_batch_claim_comes_back_in_claim_order(backend: Backend) -> None:
    ids = await enqueue(
        backend,
        new(priority=0, run_at=later(-5)),
        new(priority=5, run_at=later(-1)),
        new(queue="mail", priority=5, run_at=later(-3)),
        new(priority=0, run_at=later(-5)),
        new(queue="mail", priority=-1, run_at=later(-9)),
    )
    batch = await claim(backend, limit=4, queues=("default", "mail"))
    assert [c.token.task_id for c in batch] == [ids[2], ids[1], ids[0], ids[3]]


async def test_future_tasks_wait_for_their_time(backend: Backend) -> None:
    [task_id] = await enqueue(backend, new(run_at=later(60)))
    assert await claim(backend, at=later(59)) == []
    [claimed] = await claim(backend, at=later(60))
    assert claimed.token.task_id == task_id


async def test_only_registered_names_and_served_queues_are_claimed(
    backend: Backend,
) -> None:
    other_name, other_queue, mine = await enqueue(
        backend, new("unknown"), new("job", queue="other"), new("job")
    )
    claimed = await claim(backend, names=("job",), queues=("default",))
    assert [c.token.task_id for c in claimed] == [mine]
    task = await backend.get_task(other_name)
    assert task is not None
    assert task.state is TaskState.PENDING
    [c] = await claim(backend, names=("unknown",), queues=("default",))
    assert c.token.task_id == other_name
    [c] = await claim(backend, queues=("other",))
    assert c.token.task_id == other_queue


async def test_heartbeat_renews_only_live_owned_leases(backend: Backend) -> None:
    await enqueue(backend, new(), new())
    first, second = await claim(backend)
    stranger = replace(first.token, worker_id="w2")
    wrong_attempt = replace(second.token, attempt=7)
    result = await backend.heartbeat(
        HeartbeatParams(
            worker_id="w1", tokens=[first.token, wrong_attempt], lease=LEASE, now=later(5)
        )
    )
    assert result.renewed == {first.token}
    assert result.lost == {wrong_attempt}
    result = await backend.heartbeat(
        HeartbeatParams(worker_id="w2", tokens=[stranger], lease=LEASE, now=later(5))
    )
    assert result.lost == {stranger}
    task = await backend.get_task(first.token.task_id)
    assert task is not None
    assert task.lease_expires_at == later(5 + LEASE)


async def test_heartbeat_tells_a_worker_the_store_does_not_know(backend: Backend) -> None:
    """A worker's heartbeat says whether the store knows it: not before it
    registers, nor once its row is deleted (a restore, a wipe, a prune), so
    that it registers again; its leases are renewed either way."""
    await enqueue(backend, new())
    [claimed] = await claim(backend)
    beat = HeartbeatParams(worker_id="w1", tokens=[claimed.token], lease=LEASE, now=later(1))
    unknown = await backend.heartbeat(beat)
    assert not unknown.registered and unknown.renewed == {claimed.token}
    info = WorkerInfo(id="w1", host="h", pid=1, queues=("default",), concurrency=1)
    await backend.register_worker(info)
    assert (await backend.heartbeat(beat)).registered
    assert (await backend.heartbeat(replace(beat, tokens=[]))).registered
    gone = await backend.prune(PruneParams({}, workers_before=later(10)))
    assert gone.workers == 1
    assert not (await backend.heartbeat(replace(beat, tokens=[]))).registered


async def test_expired_lease_is_reclaimed_and_late_writes_change_nothing(
    backend: Backend,
) -> None:
    [task_id] = await enqueue(backend, new())
    [old] = await claim(backend, "w1")
    assert await claim(backend, "w2", at=later(LEASE - 0.001)) == []
    [new_claim] = await claim(backend, "w2", at=later(LEASE))
    assert new_claim.token == LeaseToken(task_id, 2, "w2", new_claim.token.nonce)

    # The old owner's late heartbeat and completion are rejected, not raised.
    beat = await backend.heartbeat(
        HeartbeatParams(worker_id="w1", tokens=[old.token], lease=LEASE, now=later(LEASE + 1))
    )
    assert beat.lost == {old.token}
    done = await backend.finish(
        FinishParams(
            worker_id="w1", completions=[success(old.token, "stale")], now=later(LEASE + 1)
        )
    )
    assert done.rejected == {old.token}
    assert done.applied == frozenset()

    task = await backend.get_task(task_id)
    assert task is not None
    assert task.state is TaskState.IN_PROGRESS
    assert task.worker_id == "w2"
    assert task.result is None
    assert [(a.number, a.worker_id, a.outcome) for a in task.attempts] == [
        (1, "w1", Outcome.LEASE_LOST),
        (2, "w2", Outcome.IN_PROGRESS),
    ]
    assert task.attempts[0].error_type == "LeaseExpired"

    # The new owner's attempt is intact and completes.
    done = await backend.finish(
        FinishParams(
            worker_id="w2", completions=[success(new_claim.token, "fresh")], now=later(LEASE + 2)
        )
    )
    assert done.applied == {new_claim.token}
    task = await backend.get_task(task_id)
    assert task is not None
    assert task.state is TaskState.SUCCEEDED
    assert task.result == "fresh"
    assert [a.outcome for a in task.attempts] == [Outcome.LEASE_LOST, Outcome.SUCCEEDED]


async def test_finish_after_expiry_is_rejected_even_before_reclaim(
    backend: Backend,
) -> None:
    await enqueue(backend, new())
    [claimed] = await claim(backend)
    done = await backend.finish(
        FinishParams(worker_id="w1", completions=[success(claimed.token)], now=later(LEASE))
    )
    assert done.rejected == {claimed.token}


async def test_crash_budget_fails_the_task_with_a_reason(backend: Backend) -> None:
    [task_id] = await enqueue(backend, new(max_attempts=2))
    at = T0
    for worker in ("w1", "w2"):
        [c] = await claim(backend, worker, at=at)
        assert c.spent <= 2
        at += timedelta(seconds=LEASE)
    assert await claim(backend, "w3", at=at) == []
    task = await backend.get_task(task_id)
    assert task is not None
    assert task.state is TaskState.FAILED
    assert [a.outcome for a in task.attempts] == [Outcome.LEASE_LOST, Outcome.LEASE_LOST]
    assert "crash budget is spent (2 of 2" in (task.attempts[-1].error_message or "")


async def test_failure_retries_then_fails(backend: Backend) -> None:
    [task_id] = await enqueue(backend, new(max_attempts=2))
    [c] = await claim(backend)
    error = ErrorInfo("ValueError", "bad", "Traceback ...")
    retry = Completion(c.token, Outcome.FAILED, TaskState.PENDING, error=error, retry_delay=30)
    assert (await backend.finish(FinishParams("w1", [retry], now=later(1)))).applied
    task = await backend.get_task(task_id)
    assert task is not None
    assert task.state is TaskState.PENDING
    assert task.run_at == later(31)
    assert task.attempts[0].error_message == "bad"
    assert task.attempts[0].traceback == "Traceback ..."
    assert await claim(backend, at=later(30)) == []
    [c2] = await claim(backend, at=later(31))
    assert c2.token.attempt == 2
    final = Completion(c2.token, Outcome.TIMED_OUT, TaskState.FAILED, error=error)
    assert (await backend.finish(FinishParams("w1", [final], now=later(32)))).applied
    task = await backend.get_task(task_id)
    assert task is not None
    assert task.state is TaskState.FAILED
    assert [a.outcome for a in task.attempts] == [Outcome.FAILED, Outcome.TIMED_OUT]


async def test_batched_finish_applies_each_by_its_own_fence(backend: Backend) -> None:
    ids = await enqueue(backend, *[new() for _ in range(5)])
    claimed = await claim(backend)
    stale = replace(claimed[0].token, attempt=99)
    completions = [success(c.token, i) for i, c in enumerate(claimed[1:])] + [success(stale)]
    done = await backend.finish(FinishParams("w1", completions, now=later(1)))
    assert done.applied == {c.token for c in claimed[1:]}
    assert done.rejected == {stale}
    states = {t.id: t.state for t in await backend.list_tasks(TaskFilter(limit=10))}
    assert states[ids[0]] is TaskState.IN_PROGRESS
    assert all(states[i] is TaskState.SUCCEEDED for i in ids[1:])


async def test_interrupted_attempt_gives_its_budget_back(backend: Backend) -> None:
    [task_id] = await enqueue(backend, new(max_attempts=1))
    [c] = await claim(backend)
    assert c.token.task_id == task_id
    release = Completion(c.token, Outcome.INTERRUPTED, TaskState.PENDING, retry_delay=0)
    assert (await backend.finish(FinishParams("w1", [release], now=later(1)))).applied
    [c2] = await claim(backend, at=later(1))
    assert c2.token.attempt == 2
    assert c2.spent == 1  # still within max_attempts=1: the interrupted one did not count


async def test_cancel_pending_and_running(backend: Backend) -> None:
    pending_id, running_id = await enqueue(backend, new(run_at=later(100)), new())
    assert await backend.cancel(pending_id) is TaskState.CANCELLED
    [c] = await claim(backend)
    assert c.token.task_id == running_id
    assert await backend.cancel(running_id) is TaskState.IN_PROGRESS
    beat = await backend.heartbeat(HeartbeatParams("w1", [c.token], LEASE, now=later(1)))
    assert beat.cancel_requested == {c.token}
    with pytest.raises(InvalidTransitionError):
        await backend.cancel(pending_id)
    with pytest.raises(TaskNotFoundError):
        await backend.cancel(10**9)


async def test_expired_cancelled_task_is_not_run_again(backend: Backend) -> None:
    [task_id] = await enqueue(backend, new())
    await claim(backend)
    await backend.cancel(task_id)
    assert await claim(backend, "w2", at=later(LEASE)) == []
    task = await backend.get_task(task_id)
    assert task is not None
    assert task.state is TaskState.CANCELLED
    assert task.attempts[-1].outcome is Outcome.LEASE_LOST


async def test_cancel_requested_task_is_not_claimed_again_after_a_retry(backend: Backend) -> None:
    """A cancel of a running task was once forgotten when its attempt ended
    "pending" (a retry after a failure, or a release at shutdown): the task
    ran again."""
    [task_id] = await enqueue(backend, new())
    [c] = await claim(backend)
    assert await backend.cancel(task_id) is TaskState.IN_PROGRESS
    # The handler failed before the next heartbeat told it about the cancel:
    # the worker asks for a retry (or, at shutdown, for a release).
    retry = Completion(
        c.token, Outcome.FAILED, TaskState.PENDING, error=ErrorInfo("E", "m"), retry_delay=0
    )
    assert (await backend.finish(FinishParams("w1", [retry], now=later(1)))).applied
    again = await claim(backend, "w2", at=later(2))
    task = await backend.get_task(task_id)
    assert task is not None
    assert again == [], "a task whose cancellation was accepted was handed out again"
    assert task.state is TaskState.CANCELLED


async def test_manual_retry_of_failed_task(backend: Backend) -> None:
    [task_id] = await enqueue(backend, new(max_attempts=1))
    [c] = await claim(backend)
    fail = Completion(c.token, Outcome.FAILED, TaskState.FAILED, error=ErrorInfo("E", "m"))
    await backend.finish(FinishParams("w1", [fail], now=later(1)))
    [pending_id] = await enqueue(backend, new(run_at=later(100)))
    with pytest.raises(InvalidTransitionError):
        await backend.retry(pending_id)
    with pytest.raises(TaskNotFoundError):
        await backend.retry(10**9)
    assert await backend.retry(task_id) is TaskState.PENDING
    [c2] = await claim(backend, at=later(2))
    assert (c2.token.attempt, c2.spent) == (2, 1)


async def test_bulk_enqueue_keeps_order(backend: Backend) -> None:
    tasks = [new(payload={"i": i}) for i in range(2000)]
    ids = await enqueue(backend, *tasks)
    assert len(ids) == 2000
    assert ids == sorted(ids)
    first = await backend.get_task(ids[0], with_attempts=False)
    last = await backend.get_task(ids[-1], with_attempts=False)
    assert first is not None and last is not None
    assert (first.payload, last.payload) == ({"i": 0}, {"i": 1999})


async def test_count_unfinished_sees_due_and_running(backend: Backend) -> None:
    await enqueue(backend, new(), new(run_at=later(100)))
    work = WorkFilter(names=["job"], queues=["default"], now=T0)
    assert await backend.count_unfinished(work) == 1
    await claim(backend)
    assert await backend.count_unfinished(work) == 1


async def test_bulk_enqueue_of_mixed_options_keeps_order_and_options(
    backend: Backend,
) -> None:
    tasks = [new(payload={"i": i}, priority=i % 3, queue=f"q{i % 2}") for i in range(300)]
    ids = await enqueue(backend, *tasks)
    assert ids == sorted(ids)
    stored = [await backend.get_task(i, with_attempts=False) for i in ids[:6]]
    assert [(t.payload, t.priority, t.queue) for t in stored if t] == [
        ({"i": i}, i % 3, f"q{i % 2}") for i in range(6)
    ]


async def test_uniform_bulk_enqueue_stores_every_option(backend: Backend) -> None:
    policy = RetryPolicy(max_attempts=7, initial_interval=2, max_interval=9, jitter=0)
    task = NewTask(
        name="job",
        queue="mail",
        payload="{}",
        priority=4,
        max_attempts=7,
        retry=policy,
        delay=30,
        timeout=5.5,
        lease=12,
    )
    ids = await enqueue(backend, *[task] * 3)
    stored = await backend.get_task(ids[1], with_attempts=False)
    assert stored is not None
    assert (
        stored.queue,
        stored.priority,
        stored.max_attempts,
        stored.retry,
        stored.timeout,
        stored.lease,
        stored.run_at,
    ) == ("mail", 4, 7, policy, 5.5, 12, later(30))
