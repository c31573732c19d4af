"""Flow control in memory: pauses, schedules, concurrency keys and rate
limits, as the SQL backends keep them in their tables.

Functions of the store, called under its lock. A concurrency key has a row
while it has pending tasks: made when a task of it becomes pending, dropped
by a claim that reads it and finds none left (as the SQL backends do). Its
limit is that of its newest claimed task, or, once none of its tasks is
pending, of the next task made pending: the same whether a claim dropped
the row or not.
"""

from __future__ import annotations

import dataclasses
import math
from collections import Counter
from collections.abc import Iterable
from datetime import datetime, timedelta

from conveyor.backends.memory.enqueue import Enqueue, refuse_held
from conveyor.backends.memory.rows import Row
from conveyor.backends.memory.schema import UNLIMITED, ScheduleRelease, Tables, claim_order
from conveyor.backends.params import FireParams, ScheduleSync
from conveyor.backends.stored import key_scan
from conveyor.model import Cause, Pause, PauseKind, TaskState
from conveyor.records import KeyInfo, StoredSchedule


class Flow(Tables):
    """``pause``, ``resume`` and ``list_pauses``."""

    def pause(self, kind: PauseKind, name: str, now: datetime) -> bool:
        with self.lock:
            return self.pauses.pause(kind, name, now)

    def resume(self, kind: PauseKind, name: str) -> bool:
        """Undo a pause; the queues it held back are woken."""
        with self.lock:
            if not self.pauses.resume(kind, name):
                return False
            self.woken.update(
                row.queue
                for row in self.tasks.values()
                if row.state is TaskState.PENDING
                and (row.queue == name if kind is PauseKind.QUEUE else row.name == name)
            )
            return True

    def list_pauses(self) -> list[Pause]:
        with self.lock:
            return self.pauses.listed()


# -- concurrency keys and rate limits ----------------------------------------------


def freed(store: Tables, row: Row, now: datetime) -> None:
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
    store: Tables, names: set[str], queues: set[str], now: datetime, limit: int
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


def settle(store: Tables, read: Iterable[str], taken: list[Row], now: datetime) -> None:
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


def listed_keys(store: Tables, now: datetime, limit: int) -> list[KeyInfo]:
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


# -- schedules ---------------------------------------------------------------------


def sync(store: Tables, params: ScheduleSync, now: datetime) -> bool:
    """Store an app's schedules; drop the ones of its tasks it no longer
    defines; unless a newer live release of the app runs (see the protocol)."""
    with store.lock:
        release = _record(store, params, now)
        live_since = now - timedelta(seconds=params.lifetime)

        def outranks(name: str | None) -> bool:
            found = store.releases.get(name) if name is not None else None
            return (
                found is not None
                and found.generation > release.generation
                and found.seen_at >= live_since
            )

        tasks = set(params.tasks)
        if any(
            outranks(name) and not other.tasks.isdisjoint(tasks)
            for name, other in store.releases.items()
        ):
            return False
        for given in params.schedules:
            row = store.schedules.get(given.name)
            if row is not None and (
                outranks(row.release)
                or (row.release, row.fingerprint) == (params.release, given.fingerprint)
            ):
                continue  # a newer release's, or stored by this release already
            last = row.last_slot if row is not None else now
            last_task = row.last_task_id if row is not None else None
            store.schedules[given.name] = dataclasses.replace(
                given,
                last_slot=last,
                last_task_id=last_task,
                synced_at=now,
                release=params.release,
            )
        names = {s.name for s in params.schedules}
        for name, stored in list(store.schedules.items()):
            if stored.task in tasks and name not in names and not outranks(stored.release):
                del store.schedules[name]
        return True


def _record(store: Tables, params: ScheduleSync, now: datetime) -> ScheduleRelease:
    """``params.release``, recorded as synced at ``now`` (and given the next
    generation at its first sync)."""
    found = store.releases.get(params.release)
    if found is None:
        generation = max((r.generation for r in store.releases.values()), default=0) + 1
        found = ScheduleRelease(generation, frozenset(params.tasks), now)
        store.releases[params.release] = found
    found.seen_at = now
    return found


def listed_schedules(store: Tables) -> list[StoredSchedule]:
    with store.lock:
        return [store.schedules[name] for name in sorted(store.schedules)]


def fire(store: Enqueue, params: FireParams, now: datetime) -> list[int]:
    """The slots' tasks, if this call takes the slots (see the protocol)."""
    if not params.slots:
        return []
    with store.lock:
        found = store.schedules.get(params.name)
        if found is None or found.fingerprint != params.fingerprint:
            return []
        if found.last_slot is not None and found.last_slot >= params.slots[0]:
            return []
        refuse_held(store, params.tasks, now)
        mine: set[int] = set()
        ids = [store._insert(new, now, Cause.ENQUEUE, mine).id for new in params.tasks]
        store.schedules[params.name] = dataclasses.replace(
            found,
            last_slot=params.slots[-1],
            last_task_id=ids[-1] if ids else found.last_task_id,
        )
        store.woken.update(new.queue for new in params.tasks)
        return ids
