"""Step transitions at the backend level, on every backend, with an injected clock.

A transition is a fenced finish that moves a workflow to its next step: the
step name, its state, its run time and its options change together, the
attempt budget starts afresh, and every attempt row records its step.
"""

from __future__ import annotations

from datetime import datetime

from conveyor import payload as codec
from conveyor.backends.params import (
    Completion,
    EnqueueParams,
    FinishParams,
    FinishResult,
    NewTask,
    Transition,
)
from conveyor.backends.protocol import Backend
from conveyor.model import LeaseToken, Outcome, RetryPolicy, TaskState
from tests.conformance.test_tasks import LEASE, T0, claim, later


def first_step(step: str = "reserve", state: object = None, max_attempts: int = 3) -> NewTask:
    return NewTask(
        name="order",
        queue="default",
        payload=codec.encode(state if state is not None else {"order": 1}),
        priority=0,
        max_attempts=max_attempts,
        retry=RetryPolicy(max_attempts=max_attempts),
        run_at=T0,
        step=step,
    )


def move(
    token: LeaseToken,
    step: str,
    state: object,
    *,
    delay: float = 0.0,
    run_at: datetime | None = None,
    timeout: float | None = None,
) -> Completion:
    transition = Transition(
        step=step,
        state=codec.encode(state),
        max_attempts=2,
        retry=RetryPolicy(max_attempts=2, initial_interval=7),
        timeout=timeout,
        run_at=run_at,
        delay=delay,
    )
    return Completion(token, Outcome.SUCCEEDED, TaskState.PENDING, transition=transition)


async def finish(
    backend: Backend, worker: str, completion: Completion, at: datetime
) -> FinishResult:
    return await backend.finish(FinishParams(worker, [completion], now=at))


async def test_a_transition_moves_step_state_time_and_options_together(
    backend: Backend,
) -> None:
    [task_id] = await backend.enqueue(EnqueueParams([first_step()], now=T0))
    [first] = await claim(backend, names=("order",))
    assert first.step == "reserve" and codec.decode(first.payload) == {"order": 1}
    state = {"order": 1, "amount": 5}
    done = await finish(
        backend, "w1", move(first.token, "charge", state, delay=30, timeout=9), later(1)
    )
    assert done.applied == {first.token}

    task = await backend.get_task(task_id)
    assert task is not None
    assert (task.state, task.step, task.payload) == (
        TaskState.PENDING,
        "charge",
        {"order": 1, "amount": 5},
    )
    assert (task.max_attempts, task.retry.initial_interval, task.timeout) == (2, 7, 9.0)
    assert task.run_at == later(31)
    assert [(a.step, a.outcome) for a in task.attempts] == [("reserve", Outcome.SUCCEEDED)]

    assert await claim(backend, names=("order",), at=later(30)) == []
    [second] = await claim(backend, names=("order",), at=later(31))
    assert (second.step, second.spent, second.max_attempts, second.timeout) == ("charge", 1, 2, 9.0)
    assert second.token.attempt == 2  # the lease token keeps growing across steps
    task = await backend.get_task(task_id)
    assert task is not None
    assert [a.step for a in task.attempts] == ["reserve", "charge"]


async def test_each_step_has_its_own_attempt_budget(backend: Backend) -> None:
    [task_id] = await backend.enqueue(EnqueueParams([first_step(max_attempts=3)], now=T0))
    for n in range(2):  # two attempts of the first step are lost to crashes
        await claim(backend, names=("order",), at=later(n * (LEASE + 1)))
    [third] = await claim(backend, names=("order",), at=later(2 * (LEASE + 1)))
    assert third.spent == 3
    await finish(backend, "w1", move(third.token, "ship", {"order": 1}), later(2 * (LEASE + 1)))
    [shipping] = await claim(backend, names=("order",), at=later(3 * (LEASE + 1)))
    assert (shipping.step, shipping.spent) == ("ship", 1)
    task = await backend.get_task(task_id)
    assert task is not None
    assert [(a.step, a.outcome) for a in task.attempts] == [
        ("reserve", Outcome.LEASE_LOST),
        ("reserve", Outcome.LEASE_LOST),
        ("reserve", Outcome.SUCCEEDED),
        ("ship", Outcome.IN_PROGRESS),
    ]


async def test_a_transition_from_a_lost_lease_changes_nothing(backend: Backend) -> None:
    [task_id] = await backend.enqueue(EnqueueParams([first_step()], now=T0))
    [stale] = await claim(backend, names=("order",))
    [fresh] = await claim(backend, "w2", names=("order",), at=later(LEASE + 1))
    before = await backend.get_task(task_id)
    late = move(stale.token, "charge", {"order": "late"}, run_at=later(5))
    done = await finish(backend, "w1", late, later(LEASE + 2))
    assert done.rejected == {stale.token}
    after = await backend.get_task(task_id)
    assert after == before
    assert after is not None and after.step == "reserve" and after.worker_id == "w2"
    onward = move(fresh.token, "charge", {"order": 1}, run_at=later(99))
    assert (await finish(backend, "w2", onward, later(LEASE + 3))).applied == {fresh.token}
    moved = await backend.get_task(task_id)
    assert moved is not None and (moved.step, moved.run_at) == ("charge", later(99))


async def test_a_workflow_cancelled_while_running_ends_at_its_transition(
    backend: Backend,
) -> None:
    [task_id] = await backend.enqueue(EnqueueParams([first_step()], now=T0))
    [running] = await claim(backend, names=("order",))
    assert await backend.cancel(task_id, now=later(1)) is TaskState.IN_PROGRESS
    await finish(backend, "w1", move(running.token, "charge", {}), later(2))
    task = await backend.get_task(task_id)
    assert task is not None and task.state is TaskState.CANCELLED
    assert await claim(backend, names=("order",), at=later(100)) == []
