"""Hand-offs on PostgreSQL: which enqueues may make one, and their notices.

An enqueue of one task due now may lease it to an idle worker that offers
a free slot (``enqueue_handoff`` in queries.sql), and tells that worker on
a channel of its own with ``pg_notify``. The notice carries what a claim
returns, so the worker starts the task without a round trip.

Limits: a notice's payload is under 8,000 bytes, so a task whose stored
fields would not fit (a payload of more than :data:`MAX_NOTICE_FIELDS`
bytes with its name, queue, step and trace context) is enqueued pending
and claimed as usual. Only an enqueue on the backend's own connection
hands off: in a caller's transaction the lease would start before the
commit that makes the task visible, and the offer's row would stay locked
until then.
"""

from __future__ import annotations

import hashlib
import json
from datetime import UTC, datetime
from typing import Any

from conveyor.backends.protocol import HandOff, NewTask
from conveyor.backends.stored import claimed_task

MAX_NOTICE_FIELDS = 3500
"""Bytes of a task's own text (payload, name, queue, step, trace context)
up to which its enqueue may hand it off. Inside the notice each is a JSON
string, where escaping at most doubles it; the rest of the notice (numbers,
the retry policy) is a few hundred bytes: the whole stays inside
PostgreSQL's 8,000-byte payload."""


def channel(schema_channel: str, worker_id: str) -> str:
    """The channel a worker hears its hand-offs on: drawn from the schema's
    wake-up channel and the worker's id (``enqueue_handoff`` draws it the
    same way), 49 characters whatever their length."""
    digest = hashlib.md5(f"{schema_channel} {worker_id}".encode(), usedforsecurity=False)
    return f"conveyor_handoff_{digest.hexdigest()}"


def may_hand_off(task: NewTask) -> bool:
    """Whether an enqueue of ``task`` alone may hand it to an idle worker:
    due now, with no key, first message or inbox, and small enough for the
    notice."""
    if (
        task.run_at is not None
        or task.delay > 0
        or task.inbox
        or task.message is not None
        or task.idempotency_key is not None
        or task.concurrency_key is not None
    ):
        return False
    texts = (task.payload, task.name, task.queue, task.step or "", task.trace or "")
    if sum(map(len, texts)) > MAX_NOTICE_FIELDS:
        return False  # characters: the bytes are no fewer
    return sum(len(text.encode()) for text in texts) <= MAX_NOTICE_FIELDS


def _moment(epoch: Any) -> datetime | None:
    return None if epoch is None else datetime.fromtimestamp(float(epoch), UTC)


def handoff(row: list[Any], worker_id: str) -> HandOff:
    """A hand-off from a notice's (or ``standby_adopt``'s) row: the claim's
    columns, timestamps as epoch seconds."""
    fields = list(row)
    fields[10] = _moment(fields[10])
    fields[13] = _moment(fields[13])
    task = claimed_task(tuple(fields), worker_id)
    return HandOff(task, float(row[13]))


def notice(payload: str, worker_id: str) -> HandOff:
    """A hand-off from its notice's JSON payload."""
    return handoff(json.loads(payload), worker_id)
