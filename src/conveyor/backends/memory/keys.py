"""Concurrency keys in memory: what the SQL backends keep in their
``concurrency`` table, and the keyed part of a claim.

Functions of the store, called under its lock. A key has a row while it has
pending tasks: made when a task of it becomes pending, dropped by a claim
that reads it and finds none left (as the SQL backends do). Its limit is
that of its newest claimed task, or, once none of its tasks is pending, of
the next task made pending: the same whether a claim dropped the row or not.
"""

from __future__ import annotations

import math
from collections import Counter
from collections.abc import Iterable
from dataclasses import dataclass
from datetime import datetime, timedelta
from typing import TYPE_CHECKING

from conveyor.backends.memory.index import claim_order
from conveyor.backends.memory.rows import Row
from conveyor.backends.stored import key_scan
from conveyor.model import TaskState
from conveyor.records import KeyInfo

if TYPE_CHECKING:
    from conveyor.backends.memory.store import Store


UNLIMITED = 1_000_000
"""The running limit of a key that only has a rate."""


@dataclass
class KeyRow:
    """A key's row: its limit, when a claim last took a task of it, and its
    rate bucket (``tokens`` as of ``refilled_at``)."""

    max_running: int
    claimed_at: datetime | None = None
    rate_limit: int | None = None
    rate_period: float | None = None
    tokens: float | None = None
    refilled_at: datetime | None = None

    def tokens_at(self, now: datetime) -> float | None:
        """The bucket's tokens at ``now`` (None: no rate)."""
        if self.rate_limit is None or self.rate_period is None or self.tokens is None:
            return None
        elapsed = (now - (self.refilled_at or now)).total_seconds()
        refill = elapsed * self.rate_limit / self.rate_period
        return min(float(self.rate_limit), self.tokens + refill)


def ensure(store: Store, row: Row, now: datetime | None = None) -> None:
    """``row`` became pending: its key has a row (a new one with a full
    bucket). A key none of whose other tasks is pending takes ``row``'s
    running limit, as a new row would: whether a claim dropped the key's row
    meanwhile (see :func:`settle`) changes nothing."""
    key = row.concurrency_key
    if key is None or row.state is not TaskState.PENDING:
        return
    limit = row.concurrency_limit or UNLIMITED
    found = store.concurrency.get(key)
    if found is None:
        store.concurrency[key] = KeyRow(
            limit,
            rate_limit=row.rate_limit,
            rate_period=row.rate_period,
            tokens=None if row.rate_limit is None else float(row.rate_limit),
            refilled_at=now,
        )
    elif found.max_running != limit and not any(
        task_id != row.id for task_id in store.index.keyed_pending.get(key, ())
    ):
        found.max_running = limit


def freed(store: Store, row: Row, now: datetime) -> None:
    """``row``'s attempt ended: a slot of its key is free, so the queues of
    the key's due pending tasks are woken at once, as for a workflow's next
    step (without it the key's tasks would wait for a poll between slots)."""
    key = row.concurrency_key
    if key is None:
        return
    for task_id in store.index.keyed_pending.get(key, ()):
        waiting = store.tasks[task_id]
        if waiting.run_at <= now:
            store.woken.add(waiting.queue)


def spent_lease(row: Row, now: datetime) -> bool:
    """A running task whose lease expired with nothing left to run: its next
    sweep ends it, and it takes no room of its key meanwhile."""
    expired = row.lease_expires_at is not None and row.lease_expires_at <= now
    return expired and (row.cancel_requested or row.spent >= row.max_attempts)


def keyed_due(
    store: Store, names: set[str], queues: set[str], now: datetime, limit: int
) -> tuple[list[Row], list[str]]:
    """Due pending tasks of the keys with room (see :func:`spent_lease`),
    each key at most its room, in claim order within a key; and every key
    read (those claimed from longest ago first, at most ``key_scan(limit)``)."""
    order = sorted(
        store.concurrency.items(),
        key=lambda item: (item[1].claimed_at is not None, item[1].claimed_at or now, item[0]),
    )
    read = [key for key, _ in order[: key_scan(limit)]]
    found: list[Row] = []
    for key in read:
        found_row = store.concurrency[key]
        running = [store.tasks[task_id] for task_id in store.index.keyed_running.get(key, ())]
        room = found_row.max_running - sum(not spent_lease(row, now) for row in running)
        tokens = found_row.tokens_at(now)
        if tokens is not None:
            room = min(room, math.floor(tokens))
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
    with the limit of each one's newest task and the tokens spent; other keys
    read that have no pending task lose their row (one with a rate once its
    bucket is full)."""
    newest = {row.concurrency_key: row for row in sorted(taken, key=lambda row: row.id)}
    spent = Counter(row.concurrency_key for row in taken)
    for key, row in newest.items():
        found = store.concurrency.get(key) if key is not None else None
        if found is not None:
            tokens = found.tokens_at(now)
            found.claimed_at = now
            found.max_running = row.concurrency_limit or UNLIMITED
            if tokens is not None:
                found.tokens, found.refilled_at = tokens - spent[key], now
    for key in read:
        found = store.concurrency.get(key)
        if key in newest or found is None or store.index.keyed_pending.get(key):
            continue
        tokens = found.tokens_at(now)
        if found.rate_limit is None or (tokens is not None and tokens >= found.rate_limit):
            del store.concurrency[key]


def listed(store: Store, now: datetime, limit: int) -> list[KeyInfo]:
    """The keys that hold tasks back (pending tasks, or a rate bucket still
    refilling), as the SQL backends list them."""
    with store.lock:
        found: list[KeyInfo] = []
        for key in sorted(store.concurrency):
            row = store.concurrency[key]
            tokens = row.tokens_at(now)
            pending = len(store.index.keyed_pending.get(key, ()))
            refilling = (
                tokens is not None and row.rate_limit is not None and tokens < row.rate_limit
            )
            if not pending and not refilling:
                continue
            if len(found) == limit:
                break
            upcoming = None
            if tokens is not None and tokens < 1 and row.rate_limit and row.rate_period:
                upcoming = now + timedelta(seconds=(1 - tokens) * row.rate_period / row.rate_limit)
            found.append(
                KeyInfo(
                    key,
                    row.max_running,
                    len(store.index.keyed_running.get(key, ())),
                    pending,
                    row.rate_limit,
                    row.rate_period,
                    tokens,
                    upcoming,
                )
            )
        return found
