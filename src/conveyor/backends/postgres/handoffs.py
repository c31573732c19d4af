"""Hand-offs on PostgreSQL: which enqueues may make one, and their notices.

An enqueue of one task due now may lease it to an idle worker that offers
a free slot (``enqueue_handoff`` in sql/enqueue.sql), and tells that worker on
a channel of its own with ``pg_notify``. The notice carries what a claim
returns, so the worker starts the task without a round trip.

Limits: a notice's payload is under 8,000 bytes, so a task whose fields
would not fit (see :data:`MAX_NOTICE_FIELDS`) is enqueued pending and
claimed as usual. Only an enqueue on the backend's own connection
hands off: in a caller's transaction the lease would start before the
commit that makes the task visible, and the offer's row would stay locked
until then.
"""

from __future__ import annotations

import hashlib
import json
from collections.abc import Sequence
from datetime import UTC, datetime
from typing import Any

from conveyor.backends.params import HandOff, NewTask
from conveyor.backends.stored import claimed_task

MAX_NOTICE_FIELDS = 3500
"""Characters of a task's own text (payload, name, queue, step, trace
context) up to which its enqueue may try to hand it off. The statement
then measures the notice itself: the payload as stored may be longer (jsonb
writes numbers out in full and spaces its separators) and escaping inside
the notice lengthens every text; a notice over pg_notify's 8,000 bytes is
not sent, and the task is enqueued pending."""


def channel(schema_channel: str, worker_id: str, nonce: str) -> str:
    """The channel a worker process hears its hand-offs on: drawn from the
    schema's wake-up channel, the worker's id and the process's nonce
    (``enqueue_handoff`` draws it the same way), 49 characters whatever
    their length."""
    text = f"{schema_channel} {worker_id} {nonce}"
    return f"conveyor_handoff_{hashlib.md5(text.encode(), usedforsecurity=False).hexdigest()}"


def may_hand_off(task: NewTask) -> bool:
    """Whether an enqueue of ``task`` alone may hand it to an idle worker:
    due now, with no key, rate limit, first message or inbox, more than one
    attempt allowed (a hand-off its worker never starts is charged an
    attempt, as a claim is), and small enough for the notice (the statement
    checks the notice's exact size too)."""
    if (
        task.run_at is not None
        or task.delay > 0
        or task.inbox
        or task.message is not None
        or task.idempotency_key is not None
        or task.concurrency_key is not None
        or task.rate_limit is not None
        or task.max_attempts < 2
    ):
        return False
    texts = (task.payload, task.name, task.queue, task.step or "", task.trace or "")
    return sum(map(len, texts)) <= MAX_NOTICE_FIELDS


def _moment(epoch: Any) -> datetime:
    return datetime.fromtimestamp(float(epoch), UTC)


def handoff(row: Sequence[Any], worker_id: str) -> HandOff:
    """A hand-off from a notice's (or ``standby_adopt``'s) row: the task's
    id, the start and end of its lease (epoch seconds), and its own fields
    (name, queue, payload text, max attempts, retry policy text, timeout,
    lease, step, parent id, trace context)."""
    task_id, leased_at, expires, fields = row
    name, queue, payload, max_attempts, retry, timeout, lease, step, parent_id, trace = fields
    if not isinstance(task_id, int) or not isinstance(payload, str):
        raise ValueError("not a hand-off")
    # The claim's row (stored.claimed_task), attempt and spent both 1.
    claimed = (
        task_id,
        1,
        str(name),
        str(queue),
        payload,
        1,
        int(max_attempts),
        str(retry),
        None if timeout is None else float(timeout),
        None if lease is None else float(lease),
        _moment(expires),
        step,
        parent_id,
        _moment(leased_at),
        trace,
    )
    task = claimed_task(claimed, worker_id)
    return HandOff(task, float(leased_at))


def notice(payload: str, worker_id: str) -> HandOff:
    """A hand-off from its notice's JSON payload."""
    row = json.loads(payload)
    if not isinstance(row, list) or len(row) != 4:
        raise ValueError("not a hand-off")
    return handoff(row, worker_id)
