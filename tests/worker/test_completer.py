"""Batched completions against a real database."""

from __future__ import annotations

import asyncio

from conveyor.backends.postgres import PostgresBackend
from conveyor.backends.protocol import ClaimParams, Completion, EnqueueParams, NewTask
from conveyor.model import Outcome, RetryPolicy, TaskState
from conveyor.worker.completer import Completer


async def test_a_completion_the_database_refuses_does_not_hold_back_the_others(
    backend: PostgresBackend,
) -> None:
    new = NewTask(
        name="job", queue="default", payload="{}", priority=0, max_attempts=3, retry=RetryPolicy()
    )
    await backend.enqueue(EnqueueParams([new] * 3))
    claimed = await backend.claim(ClaimParams("w", ["job"], ["default"], 3, 30))
    good = [
        Completion(c.token, Outcome.SUCCEEDED, TaskState.SUCCEEDED, result="1") for c in claimed[:2]
    ]
    # jsonb cannot hold \u0000: the database refuses this one for good.
    bad = Completion(claimed[2].token, Outcome.SUCCEEDED, TaskState.SUCCEEDED, result='"\\u0000"')
    recorded: dict[int, bool] = {}
    completer = Completer(
        backend,
        "w",
        lambda _token: True,
        lambda c, applied: recorded.__setitem__(c.token.task_id, applied),
    )
    completer.start()
    for completion in (good[0], bad, good[1]):
        completer.submit(completion)
    await asyncio.wait_for(completer.wait_idle(), 10)
    await completer.stop()
    assert recorded == {
        good[0].token.task_id: True,
        bad.token.task_id: False,
        good[1].token.task_id: True,
    }
    states = [(await backend.get_task(c.token.task_id)).state for c in claimed]  # type: ignore[union-attr]
    assert states == [TaskState.SUCCEEDED, TaskState.SUCCEEDED, TaskState.IN_PROGRESS]
