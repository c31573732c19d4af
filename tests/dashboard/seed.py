"""A store with a task in every state, for the dashboard's tests."""

from __future__ import annotations

import os
import socket
from dataclasses import dataclass, replace
from datetime import UTC, datetime, timedelta

from conveyor import payload as codec
from conveyor.app import App
from conveyor.backends.params import (
    ClaimParams,
    Completion,
    Delivery,
    EnqueueParams,
    ErrorInfo,
    FinishParams,
    NewTask,
    ProgressParams,
    ProgressReport,
    SendParams,
    Transition,
)
from conveyor.backends.protocol import Backend
from conveyor.backends.stored import progress_text
from conveyor.model import Outcome, RetryPolicy, TaskState
from conveyor.records import WorkerInfo

TRACEBACK = 'Traceback (most recent call last):\n  File "app.py", line 3\nValueError: <bad> card'


def new(
    name: str = "job",
    queue: str = "work",
    payload: object = None,
    *,
    max_attempts: int = 1,
    run_at: datetime | None = None,
    step: str | None = None,
    inbox: bool = False,
) -> NewTask:
    return NewTask(
        name=name,
        queue=queue,
        payload=codec.encode(payload if payload is not None else {"n": 1}),
        priority=0,
        max_attempts=max_attempts,
        retry=RetryPolicy(max_attempts=max_attempts),
        run_at=run_at,
        step=step,
        inbox=inbox,
    )


@dataclass
class Seeded:
    pending: int
    later: int
    running: int
    succeeded: int
    failed: int
    failed_more: list[int]
    cancelled: int
    waiting: int
    step: int
    chat: int
    child: int
    escaped: int
    big: int


async def seed(backend: Backend) -> Seeded:
    """Tasks in every state, a live worker, and a coroutine with messages."""
    later = datetime.now(UTC) + timedelta(hours=1)
    work = await backend.enqueue(
        EnqueueParams(
            [new(payload={"order": 1}), new(), new(), new("chat", inbox=True, max_attempts=3)]
        )
    )
    flaky = await backend.enqueue(EnqueueParams([new(queue="flaky"), new(queue="flaky")]))
    taken = await backend.claim(
        ClaimParams("w1", ["job", "chat"], ["work", "flaky"], limit=10, lease=600)
    )
    tokens = {c.token.task_id: c.token for c in taken}
    error = ErrorInfo("ValueError", "<bad> card", TRACEBACK)
    done = [
        Completion(tokens[work[0]], Outcome.SUCCEEDED, TaskState.SUCCEEDED, codec.encode(42)),
        Completion(tokens[work[1]], Outcome.FAILED, TaskState.FAILED, error=error),
        Completion(
            tokens[work[3]],
            Outcome.SUCCEEDED,
            TaskState.WAITING,
            transition=Transition(
                step=None, state=codec.encode({}), max_attempts=3, retry=RetryPolicy()
            ),
        ),
        *(Completion(tokens[i], Outcome.FAILED, TaskState.FAILED, error=error) for i in flaky),
    ]
    await backend.finish(FinishParams("w1", done))
    running = tokens[work[2]]
    note = progress_text(37, 100, "<b>resizing</b>", running.attempt)
    await backend.report_progress(ProgressParams("w1", [ProgressReport(running, note)]))
    rest = await backend.enqueue(
        EnqueueParams(
            [
                new(),  # pending, due now
                new(queue="mail", run_at=later),  # pending, due later
                new(queue="mail"),  # cancelled below
                new("checkout", step="charge", payload={"cart": 7}),  # a workflow at a step
                new("chat", inbox=True, max_attempts=3),  # a coroutine with messages
                new(payload={"html": "<script>alert(1)</script>"}),
                new(payload={"blob": "x" * 100_000}),
            ]
        )
    )
    [child] = await backend.enqueue(EnqueueParams([replace(new("job"), parent_id=rest[4])]))
    await backend.cancel(rest[2])
    await backend.send(
        SendParams(
            [
                Delivery(rest[4], codec.encode({"hello": "<world>"})),
                Delivery(rest[4], codec.encode({"n": 2})),
            ]
        )
    )
    await backend.register_worker(
        WorkerInfo(
            id="w1",
            host=socket.gethostname(),
            pid=os.getpid(),
            queues=("work", "flaky"),
            concurrency=4,
            tasks=("job", "chat"),
            beat_seconds=600,
        )
    )
    return Seeded(
        pending=rest[0],
        later=rest[1],
        running=work[2],
        succeeded=work[0],
        failed=work[1],
        failed_more=flaky,
        cancelled=rest[2],
        waiting=work[3],
        step=rest[3],
        chat=rest[4],
        child=child,
        escaped=rest[5],
        big=rest[6],
    )


async def seed_app(app: App) -> Seeded:
    return await seed(await app.backend())
