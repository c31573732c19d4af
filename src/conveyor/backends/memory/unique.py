"""Unique keys in memory: who holds a key, and what an enqueue of a held key does.

Functions of the store, called under its lock (as the SQL backends do this
inside one transaction). A key is held by the task in ``Store.keys`` until
it leaves its unique scope (:meth:`Row.leaves_unique_scope`), its period
ends (checked here, lazily, when the key is wanted again) or it is deleted.
"""

from __future__ import annotations

from collections.abc import Sequence
from datetime import datetime, timedelta
from typing import TYPE_CHECKING

from conveyor.backends.memory.rows import Row
from conveyor.backends.params import NewTask
from conveyor.errors import TaskExistsError
from conveyor.model import TaskState

if TYPE_CHECKING:
    from conveyor.backends.memory.store import Store


def holder(store: Store, name: str, key: str, now: datetime) -> Row | None:
    """The task holding ``key`` of ``name`` (a period that ended releases it)."""
    task_id = store.keys.get((name, key))
    if task_id is None:
        return None
    row = store.tasks[task_id]
    if row.unique_until is not None and row.unique_until <= now:
        release(store, row)
        return None
    return row


def release(store: Store, row: Row) -> None:
    """``row`` gives its key up: the next enqueue of it stores a new task."""
    if row.idempotency_key is not None:
        store.keys.pop((row.name, row.idempotency_key), None)
        row.idempotency_key = None


def refuse_held(store: Store, batch: Sequence[NewTask], now: datetime) -> None:
    """Raise TaskExistsError, before anything is stored, for the first task of
    ``batch`` with ``on_conflict="raise"`` whose key a stored task holds.
    (A key repeated within one batch is the batch's first task with it.)"""
    for new in batch:
        if new.idempotency_key is not None and new.on_conflict == "raise":
            found = holder(store, new.name, new.idempotency_key, now)
            if found is not None:
                raise TaskExistsError(new.name, new.idempotency_key, found.id)


def conflict(store: Store, row: Row, new: NewTask, now: datetime) -> Row:
    """An enqueue of ``new`` whose key ``row`` holds: ``replace`` gives a
    pending ``row`` the new payload, priority and due time."""
    if new.on_conflict == "replace" and row.state is TaskState.PENDING:
        row.payload = new.payload
        row.priority = new.priority
        row.run_at = new.run_at or now + timedelta(seconds=new.delay)
        store.index.update(row)
    return row
