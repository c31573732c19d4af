"""Python values to SQLite arguments, and SQLite rows back to domain objects.

Pure functions: no connection, no I/O. Times are stored as REAL seconds
since the epoch and come back as aware UTC datetimes; lists travel as JSON.
"""

from __future__ import annotations

import json
from collections.abc import Sequence
from dataclasses import replace
from datetime import UTC, datetime
from typing import Any

from conveyor.backends import stored
from conveyor.backends.params import ClaimedTask, Completion, EnqueueParams, Transition
from conveyor.backends.stored import attempt_row, retry_json, summary_row, task_row
from conveyor.model import Attempt, LeaseToken, Task
from conveyor.records import TaskSummary, WorkerInfo

# Column positions of the timestamps in get_task/list_tasks and get_attempts.
_TASK_TIMES = (6, 13, 14, 16)
_ATTEMPT_TIMES = (4, 5)
_CLAIM_TIMES = (10, 13, 15)
_SUMMARY_TIMES = (5, 8, 9)


def seconds(moment: datetime | None) -> float | None:
    return moment.timestamp() if moment is not None else None


EARLIEST = datetime.min.replace(tzinfo=UTC)
LATEST = datetime.max.replace(tzinfo=UTC)


def moment(value: float | None) -> datetime | None:
    """A stored time as an aware datetime. One a datetime cannot hold (±inf,
    or not a number at all: written around conveyor) reads as its nearest
    end, so that the row stays readable."""
    if value is None:
        return None
    try:
        return datetime.fromtimestamp(value, UTC)
    except (OverflowError, OSError, ValueError, TypeError):
        return EARLIEST if isinstance(value, int | float) and value < 0 else LATEST


def _with_times(row: Sequence[Any], positions: Sequence[int]) -> tuple[Any, ...]:
    values = list(row)
    for i in positions:
        values[i] = moment(values[i])
    return tuple(values)


def enqueue_rows(params: EnqueueParams, now: float) -> list[dict[str, Any]]:
    """One argument set per task, for executemany."""
    return [
        {
            "now": now,
            "name": t.name,
            "queue": t.queue,
            "payload": t.payload,
            "priority": t.priority,
            "run_at": seconds(t.run_at),
            "delay": t.delay,
            "max_attempts": t.max_attempts,
            "retry_policy": retry_json(t.retry),
            "timeout": t.timeout,
            "lease": t.lease,
            "step": t.step,
            "inbox": t.inbox,
            "parent_id": t.parent_id,
            "idempotency_key": t.idempotency_key,
            "unique_scope": t.unique_scope,
            "unique_for": t.unique_for,
            "concurrency_key": t.concurrency_key,
            "concurrency_limit": t.concurrency_limit,
            "rate_limit": t.rate_limit,
            "rate_period": t.rate_period,
            "trace": t.trace,
            "expires_at": seconds(t.expires_at),
            "state": "waiting" if t.after else "pending",
            "waiting_for": len(t.after) if t.after else None,
            "after_policy": t.after_policy if t.after else None,
            "receives": t.receives,
        }
        for t in params.tasks
    ]


def leases_json(tokens: Sequence[LeaseToken]) -> str:
    return json.dumps([[t.task_id, t.attempt] for t in tokens])


def completions_json(completions: Sequence[Completion]) -> str:
    """The ``finish`` input: results stay JSON text inside a JSON string."""
    return json.dumps(
        [
            {
                "id": c.token.task_id,
                "attempt": c.token.attempt,
                "state": c.next_state.value,
                "outcome": c.outcome.value,
                "delay": c.retry_delay,
                "result": c.result,
                "error_type": c.error.type if c.error else None,
                "error_message": c.error.message if c.error else None,
                "traceback": c.error.traceback if c.error else None,
                **_transition(c.transition),
            }
            for c in completions
        ]
    )


def _transition(move: Transition | None) -> dict[str, Any]:
    if move is None:
        return {}
    return {
        "delay": move.delay,
        "step": move.step,
        "step_state": move.state,
        "run_at": seconds(move.run_at),
        "max_attempts": move.max_attempts,
        "retry_policy": retry_json(move.retry),
        "timeout": move.timeout,
        "lease": move.lease,
    }


def claimed_task(row: Sequence[Any], worker_id: str) -> ClaimedTask:
    """A claim's row: the columns :func:`stored.claimed_task` reads, then
    ``receives``."""
    claimed = stored.claimed_task(_with_times(row[:-1], _CLAIM_TIMES), worker_id)
    return replace(claimed, receives=row[-1]) if row[-1] is not None else claimed


def task(row: Sequence[Any], attempts: tuple[Attempt, ...]) -> Task:
    """A task's row: the columns :func:`stored.task_row` reads, then
    ``waiting_for``, ``progress`` and ``progress_at``."""
    *columns, waiting_for, progress, progress_at = row
    values = list(_with_times(columns, _TASK_TIMES))
    values[17] = bool(values[17])  # cancel_requested
    found = task_row(tuple(values), attempts)
    if waiting_for is None and progress is None:
        return found
    return replace(
        found,
        waiting_for=waiting_for,
        progress=stored.progress_of(progress, moment(progress_at)),
    )


def summary(row: Sequence[Any]) -> TaskSummary:
    return summary_row(_with_times(row, _SUMMARY_TIMES))


def message(row: Sequence[Any]) -> tuple[Any, ...]:
    """An inbox row with its time as a datetime."""
    return _with_times(row, (5,))


def attempt(row: Sequence[Any]) -> Attempt:
    return attempt_row(_with_times(row, _ATTEMPT_TIMES))


def worker(row: Sequence[Any]) -> WorkerInfo:
    return WorkerInfo(
        id=row[0],
        host=row[1],
        pid=row[2],
        queues=tuple(json.loads(row[3])),
        concurrency=row[4],
        started_at=moment(row[5]),
        last_seen_at=moment(row[6]),
        stopped_at=moment(row[7]),
        tasks=tuple(json.loads(row[8])),
        beat_seconds=row[9],
    )
