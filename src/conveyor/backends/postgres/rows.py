"""Python values to statement arguments, and rows back to domain objects.

Pure functions: no connection, no I/O. The statements themselves live in
``queries.sql``.
"""

from __future__ import annotations

import functools
import logging
from collections.abc import Sequence
from datetime import datetime
from typing import Any

from conveyor import payload as codec
from conveyor.backends.protocol import ClaimedTask, Completion, EnqueueParams, NewTask
from conveyor.model import Attempt, LeaseToken, Outcome, RetryPolicy, Task, TaskState

log = logging.getLogger("conveyor.postgres")


@functools.lru_cache(maxsize=256)
def _retry_json(policy: RetryPolicy) -> str:
    return codec.encode(policy.to_json())


def _options(task: NewTask) -> tuple[Any, ...]:
    return (
        task.name,
        task.queue,
        task.priority,
        task.max_attempts,
        task.retry,
        task.run_at,
        task.delay,
        task.timeout,
        task.lease,
    )


def enqueue_statement(params: EnqueueParams) -> tuple[str, dict[str, Any]]:
    """The cheapest ``enqueue`` statement for these tasks, and its arguments."""
    tasks = params.tasks
    first = _options(tasks[0])
    if len(tasks) > 1 and all(_options(t) == first for t in tasks):
        head = tasks[0]
        return "enqueue_uniform", {
            "now": params.now,
            "name": head.name,
            "queue": head.queue,
            "priority": head.priority,
            "run_at": head.run_at,
            "delay": head.delay,
            "max_attempts": head.max_attempts,
            "retry_policy": _retry_json(head.retry),
            "timeout": head.timeout,
            "lease": head.lease,
            "payloads": "[" + ",".join(t.payload for t in tasks) + "]",
        }
    return "enqueue", {
        "now": params.now,
        "names": [t.name for t in tasks],
        "queues": [t.queue for t in tasks],
        "payloads": [t.payload for t in tasks],
        "priorities": [t.priority for t in tasks],
        "run_ats": [t.run_at for t in tasks],
        "delays": [t.delay for t in tasks],
        "max_attempts": [t.max_attempts for t in tasks],
        "retry_policies": [_retry_json(t.retry) for t in tasks],
        "timeouts": [t.timeout for t in tasks],
        "leases": [t.lease for t in tasks],
    }


def finish_args(
    worker_id: str, completions: Sequence[Completion], now: datetime | None
) -> dict[str, Any]:
    """Column arrays for the ``finish`` statement."""
    return {
        "now": now,
        "worker_id": worker_id,
        "ids": [c.token.task_id for c in completions],
        "attempts": [c.token.attempt for c in completions],
        "states": [c.next_state.value for c in completions],
        "outcomes": [c.outcome.value for c in completions],
        "delays": [c.retry_delay for c in completions],
        "results": [c.result for c in completions],
        "error_types": [c.error.type if c.error else None for c in completions],
        "error_messages": [c.error.message if c.error else None for c in completions],
        "tracebacks": [c.error.traceback if c.error else None for c in completions],
    }


def ordered_ids(rows: list[tuple[Any, ...]]) -> list[int]:
    # Identity values are drawn in insertion order within one statement, so
    # ascending ids are the input order.
    return sorted(int(row[0]) for row in rows)


@functools.lru_cache(maxsize=256)
def _retry_policy(text: str) -> RetryPolicy:
    return RetryPolicy.from_json(codec.decode(text))


def stored_retry_policy(text: str, max_attempts: int) -> RetryPolicy:
    """The stored policy; one that does not decode (written around conveyor)
    must not lose a claimed batch: the defaults apply, with the row's budget."""
    try:
        return _retry_policy(text)
    except Exception:
        log.error("a task's stored retry policy does not decode: %r; using defaults", text)
        return RetryPolicy(max_attempts=max(max_attempts, 1))


def claimed_task(row: tuple[Any, ...], worker_id: str) -> ClaimedTask:
    (
        task_id,
        attempt,
        name,
        queue,
        payload,
        spent,
        max_attempts,
        retry,
        timeout,
        lease,
        expires,
    ) = row
    return ClaimedTask(
        token=LeaseToken(task_id=task_id, attempt=attempt, worker_id=worker_id),
        name=name,
        queue=queue,
        payload=payload,
        spent=spent,
        max_attempts=max_attempts,
        retry=stored_retry_policy(retry, max_attempts),
        timeout=timeout,
        lease=lease,
        lease_expires_at=expires,
    )


def attempt_row(row: tuple[Any, ...]) -> Attempt:
    return Attempt(
        task_id=row[0],
        number=row[1],
        worker_id=row[2],
        outcome=Outcome(row[3]),
        started_at=row[4],
        finished_at=row[5],
        error_type=row[6],
        error_message=row[7],
        traceback=row[8],
    )


def task_row(row: tuple[Any, ...], attempts: tuple[Attempt, ...]) -> Task:
    (
        task_id,
        name,
        queue,
        payload,
        state,
        priority,
        run_at,
        attempt,
        max_attempts,
        retry,
        timeout,
        lease,
        result,
        created_at,
        finished_at,
        worker_id,
        lease_expires_at,
        cancel_requested,
    ) = row
    return Task(
        id=task_id,
        name=name,
        queue=queue,
        payload=codec.decode(payload),
        state=TaskState(state),
        priority=priority,
        run_at=run_at,
        attempt=attempt,
        max_attempts=max_attempts,
        retry=stored_retry_policy(retry, max_attempts),
        timeout=timeout,
        lease=lease,
        result=codec.decode(result) if result is not None else None,
        created_at=created_at,
        finished_at=finished_at,
        worker_id=worker_id,
        lease_expires_at=lease_expires_at,
        cancel_requested=cancel_requested,
        attempts=attempts,
    )
