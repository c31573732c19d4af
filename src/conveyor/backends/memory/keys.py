"""Concurrency keys in memory: what the SQL backends keep in their
``concurrency`` table, and the keyed part of a claim.

Functions of the store, called under its lock. A key has a row while it has
pending tasks: made when a task of it becomes pending, dropped by a claim
that reads it and finds none left (as the SQL backends do).
"""

from __future__ import annotations

from collections.abc import Iterable
from dataclasses import dataclass
from datetime import datetime
from typing import TYPE_CHECKING

from conveyor.backends.memory.index import claim_order
from conveyor.backends.memory.rows import Row
from conveyor.backends.stored import key_scan
from conveyor.model import TaskState

if TYPE_CHECKING:
    from conveyor.backends.memory.store import Store


@dataclass
class KeyRow:
    """A key's row: its limit, and when a claim last took a task of it."""

    max_running: int
    claimed_at: datetime | None = None


def ensure(store: Store, row: Row) -> None:
    """``row`` became pending: its key has a row."""
    if row.concurrency_key is not None and row.state is TaskState.PENDING:
        store.concurrency.setdefault(row.concurrency_key, KeyRow(row.concurrency_limit or 1))


def keyed_due(
    store: Store, names: set[str], queues: set[str], now: datetime, limit: int
) -> tuple[list[Row], list[str]]:
    """Due pending tasks of the keys with room, each key at most its room, in
    claim order within a key; and every key read (those claimed from longest
    ago first, at most ``key_scan(limit)``)."""
    order = sorted(
        store.concurrency.items(),
        key=lambda item: (item[1].claimed_at is not None, item[1].claimed_at or now, item[0]),
    )
    read = [key for key, _ in order[: key_scan(limit)]]
    found: list[Row] = []
    for key in read:
        room = store.concurrency[key].max_running - len(store.index.keyed_running.get(key, ()))
        if room <= 0:
            continue
        due = sorted(
            (
                row
                for task_id in store.index.keyed_pending.get(key, ())
                if (row := store.tasks[task_id]).run_at <= now
                and row.name in names
                and row.queue in queues
            ),
            key=claim_order,
        )
        found += due[: min(room, limit)]
    return found, read


def settle(store: Store, read: Iterable[str], taken: list[Row], now: datetime) -> None:
    """After a claim: the keys of ``taken`` (rows just claimed) are marked,
    with the limit of each one's newest task; other keys read that have no
    pending task lose their row."""
    newest = {row.concurrency_key: row for row in sorted(taken, key=lambda row: row.id)}
    for key, row in newest.items():
        if key is not None and key in store.concurrency:
            store.concurrency[key].claimed_at = now
            store.concurrency[key].max_running = row.concurrency_limit or 1
    for key in read:
        if key not in newest and not store.index.keyed_pending.get(key):
            store.concurrency.pop(key, None)
