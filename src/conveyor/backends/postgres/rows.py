"""Python values to statement arguments, and rows back to domain objects.

Pure functions: no connection, no I/O. The statements themselves live in
the ``sql`` folder.
"""

from __future__ import annotations

from collections.abc import Iterable, Sequence
from datetime import datetime
from typing import Any

from conveyor.backends.params import Completion, Delivery, EnqueueParams, NewTask
from conveyor.backends.stored import retry_json
from conveyor.model import Outcome, TaskState


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
        task.step,
        task.inbox,
        task.parent_id,
        task.trace,
        task.expires_at,
    )


def enqueue_statement(params: EnqueueParams) -> tuple[str, dict[str, Any]]:
    """The cheapest ``enqueue`` statement for these tasks (none of which
    carries an idempotency key: see ``enqueue_keyed``), and its arguments."""
    tasks = params.tasks
    first = _options(tasks[0])
    if all(_options(t) == first for t in tasks):
        head = tasks[0]
        one = len(tasks) == 1
        return "enqueue_one" if one else "enqueue_uniform", {
            "now": params.now,
            "name": head.name,
            "queue": head.queue,
            "priority": head.priority,
            "run_at": head.run_at,
            "delay": head.delay,
            "max_attempts": head.max_attempts,
            "retry_policy": retry_json(head.retry),
            "timeout": head.timeout,
            "lease": head.lease,
            "step": head.step,
            "inbox": head.inbox,
            "parent_id": head.parent_id,
            "trace": head.trace,
            "expires_at": head.expires_at,
            "payloads": head.payload if one else "[" + ",".join(t.payload for t in tasks) + "]",
        }
    return "enqueue", _columns(tasks, params.now)


def _columns(tasks: Sequence[NewTask], now: datetime | None) -> dict[str, Any]:
    """One array per column (``enqueue``, ``enqueue_keyed``)."""
    return {
        "now": now,
        "names": [t.name for t in tasks],
        "queues": [t.queue for t in tasks],
        "payloads": [t.payload for t in tasks],
        "priorities": [t.priority for t in tasks],
        "run_ats": [t.run_at for t in tasks],
        "delays": [t.delay for t in tasks],
        "max_attempts": [t.max_attempts for t in tasks],
        "retry_policies": [retry_json(t.retry) for t in tasks],
        "timeouts": [t.timeout for t in tasks],
        "leases": [t.lease for t in tasks],
        "steps": [t.step for t in tasks],
        "inboxes": [t.inbox for t in tasks],
        "parent_ids": [t.parent_id for t in tasks],
        "traces": [t.trace for t in tasks],
        "expires": [t.expires_at for t in tasks],
    }


def keyed(tasks: Sequence[NewTask]) -> bool:
    """Whether any of ``tasks`` carries a unique or a concurrency key, or
    dependencies (then ``enqueue_keyed`` stores them)."""
    return any(
        t.idempotency_key is not None or t.concurrency_key is not None or t.after for t in tasks
    )


def may_raise(tasks: Sequence[NewTask]) -> bool:
    """Whether an insert of ``tasks`` may raise midway: TaskExistsError, or
    TaskNotFoundError for a dependency that is not stored."""
    return any(
        (t.on_conflict == "raise" and t.idempotency_key is not None) or t.after for t in tasks
    )


def keyed_args(tasks: Sequence[NewTask], now: datetime | None) -> dict[str, Any]:
    """Arguments of ``enqueue_keyed``."""
    return {
        **_columns(tasks, now),
        "keys": [t.idempotency_key for t in tasks],
        "scopes": [t.unique_scope for t in tasks],
        "periods": [t.unique_for for t in tasks],
        "concurrency_keys": [t.concurrency_key for t in tasks],
        "concurrency_limits": [t.concurrency_limit for t in tasks],
        "rate_limits": [t.rate_limit for t in tasks],
        "rate_periods": [t.rate_period for t in tasks],
        "waiting_fors": [len(t.after) if t.after else None for t in tasks],
        "after_policies": [t.after_policy if t.after else None for t in tasks],
        "receives": [t.receives for t in tasks],
    }


def replace_args(replacing: Sequence[tuple[NewTask, int]], now: datetime | None) -> dict[str, Any]:
    """Arguments of ``replace_pending``: each holder's id and its new values
    (a holder replaced twice in one batch takes the last: one row each)."""
    replacing = list({holder: (task, holder) for task, holder in replacing}.values())
    return {
        "now": now,
        "ids": [holder for _, holder in replacing],
        "payloads": [t.payload for t, _ in replacing],
        "priorities": [t.priority for t, _ in replacing],
        "run_ats": [t.run_at for t, _ in replacing],
        "delays": [t.delay for t, _ in replacing],
    }


def keyed_ids(
    tasks: Sequence[NewTask], returned: list[tuple[Any, ...]]
) -> tuple[list[int | None], list[bool]]:
    """From ``enqueue_keyed``'s rows: each task's id (None where a keyed
    task was skipped: its key is stored already) and whether it is new."""
    rows = sorted((int(r[0]), r[1], r[2]) for r in returned)
    by_key = {(name, key): task_id for task_id, name, key in rows if key is not None}
    unkeyed = iter(task_id for task_id, _name, key in rows if key is None)
    ids: list[int | None] = []
    fresh: list[bool] = []
    claimed: set[tuple[str, str]] = set()
    for task in tasks:
        if task.idempotency_key is None:
            ids.append(next(unkeyed))
            fresh.append(True)
            continue
        pair = (task.name, task.idempotency_key)
        ids.append(by_key.get(pair))
        fresh.append(pair in by_key and pair not in claimed)  # a repeat in one batch is not
        claimed.add(pair)
    return ids, fresh


def key_pairs_args(tasks: Sequence[NewTask], now: datetime | None = None) -> dict[str, Any]:
    """Arguments of ``stored_keys`` and ``release_keys`` for ``tasks``' keys."""
    return {
        "now": now,
        "names": [t.name for t in tasks],
        "keys": [t.idempotency_key for t in tasks],
    }


def first_messages_args(
    tasks: Sequence[NewTask],
    ids: Sequence[int],
    now: datetime | None,
    fresh: Sequence[bool] | None = None,
) -> dict[str, Any] | None:
    """Arguments of ``first_messages`` for new tasks that carry one (only the
    ``fresh`` ones, if given: a task stored earlier has its first message),
    or None."""
    news = fresh if fresh is not None else [True] * len(tasks)
    firsts = [
        (task_id, t) for task_id, t, new in zip(ids, tasks, news, strict=True) if t.message and new
    ]
    if not firsts:
        return None
    return {
        "now": now,
        "task_ids": [task_id for task_id, _ in firsts],
        "sender_ids": [t.parent_id for _, t in firsts],
        "bodies": [t.message for _, t in firsts],
        "traces": [t.trace for _, t in firsts],
    }


def deliver_args(deliveries: Sequence[Delivery], now: datetime | None) -> dict[str, Any]:
    """Arguments of ``deliver``."""
    return {
        "now": now,
        "task_ids": [d.task_id for d in deliveries],
        "sender_ids": [d.sender_id for d in deliveries],
        "bodies": [d.body for d in deliveries],
        "traces": [d.trace for d in deliveries],
    }


def _int_array(values: Iterable[int]) -> str:
    """An array literal of integers: several times cheaper to send than a list."""
    return "{" + ",".join(map(str, values)) + "}"


def _quoted(value: object) -> str:
    """One element of an array literal: NULL, or the value's text in double
    quotes with its backslashes and double quotes escaped (the literal's
    only special characters inside quotes)."""
    if value is None:
        return "NULL"
    text = value.isoformat() if isinstance(value, datetime) else str(value)
    return '"' + text.replace("\\", "\\\\").replace('"', '\\"') + '"'


def _array(values: Iterable[object]) -> str:
    """An array literal of any values that may be None (text, JSON texts,
    numbers, timestamps), for a parameter the statement casts (``::text[]``,
    ``::float8[]``...). psycopg's list dumper looks up a dumper per element
    in Python: for the sixteen columns of ``finish`` it took about a tenth of
    a workflow step's time in the worker."""
    return "{" + ",".join(map(_quoted, values)) + "}"


def _plain_success(completion: Completion) -> bool:
    return (
        completion.outcome is Outcome.SUCCEEDED
        and completion.next_state is TaskState.SUCCEEDED
        and completion.transition is None
        and completion.error is None
    )


def finish_statement(
    worker_id: str, completions: Sequence[Completion], now: datetime | None
) -> tuple[str, dict[str, Any]]:
    """The cheapest ``finish`` statement for these completions, and its arguments:
    plain successes (the common case) send three columns, not sixteen."""
    if all(_plain_success(c) for c in completions):
        return "finish_succeeded", {
            "now": now,
            "worker_id": worker_id,
            "ids": _int_array(c.token.task_id for c in completions),
            "attempts": _int_array(c.token.attempt for c in completions),
            "results": "[" + ",".join(c.result or "null" for c in completions) + "]",
        }
    return "finish", finish_args(worker_id, completions, now)


def finish_args(
    worker_id: str, completions: Sequence[Completion], now: datetime | None
) -> dict[str, Any]:
    """Column arrays for the ``finish`` statement."""
    moves = [c.transition for c in completions]
    return {
        "now": now,
        "worker_id": worker_id,
        "ids": _int_array(c.token.task_id for c in completions),
        "attempts": _int_array(c.token.attempt for c in completions),
        "states": _array(c.next_state.value for c in completions),
        "outcomes": _array(c.outcome.value for c in completions),
        "delays": _array(
            m.delay if m else c.retry_delay for c, m in zip(completions, moves, strict=True)
        ),
        "results": _array(c.result for c in completions),
        "error_types": _array(c.error.type if c.error else None for c in completions),
        "error_messages": _array(c.error.message if c.error else None for c in completions),
        "tracebacks": _array(c.error.traceback if c.error else None for c in completions),
        "steps": _array(m.step if m else None for m in moves),
        "step_states": _array(m.state if m else None for m in moves),
        "run_ats": _array(m.run_at if m else None for m in moves),
        "max_attempts": _array(m.max_attempts if m else None for m in moves),
        "retry_policies": _array(retry_json(m.retry) if m else None for m in moves),
        "timeouts": _array(m.timeout if m else None for m in moves),
        "leases": _array(m.lease if m else None for m in moves),
    }


def ordered_ids(rows: list[tuple[Any, ...]]) -> list[int]:
    """The ids an enqueue statement returns (one array, in input order)."""
    return list(rows[0][0] or ()) if rows else []
