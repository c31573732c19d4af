"""Tasks, messages and a poll's effects on a SQLite connection.

Every function runs inside the caller's write transaction (BEGIN
IMMEDIATE): with one writer at a time, a poll's completion, its effects and any
send are serialised, so a message is either seen by a poll or wakes the
task once that poll has ended.
"""

from __future__ import annotations

import json
import sqlite3
from collections.abc import Sequence
from typing import Any

from conveyor.backends.params import Completion, Delivery, EnqueueParams, NewTask
from conveyor.backends.sqlite import rows
from conveyor.backends.sqlite.statements import SQL
from conveyor.backends.stored import check_recipient, message_row
from conveyor.errors import TaskExistsError
from conveyor.model import Message, TaskState


def insert_tasks(conn: sqlite3.Connection, params: EnqueueParams, now: float) -> list[int]:
    """Insert tasks and their first messages; their ids in input order. A
    task whose name and unique key a stored task holds is not inserted (nor
    its first message): see :func:`_insert_keyed`."""
    values = rows.enqueue_rows(params, now)
    if any(t.idempotency_key is not None for t in params.tasks):
        # A savepoint: a TaskExistsError midway leaves the transaction as it
        # was. Begun first, as sqlite3 would before an insert: a savepoint
        # outside a transaction would commit at its release.
        if not conn.in_transaction:
            conn.execute("begin")
        conn.execute("savepoint conveyor_enqueue")
        try:
            ids, fresh = _insert_keyed(conn, params.tasks, values)
        except BaseException:
            conn.execute("rollback to conveyor_enqueue")
            conn.execute("release conveyor_enqueue")
            raise
        conn.execute("release conveyor_enqueue")
    else:
        conn.executemany(SQL["enqueue"], values)
        # Under the write lock rowids are drawn one after another: the last
        # one and the count give every id, in input order.
        last: int = conn.execute("select last_insert_rowid()").fetchone()[0]
        ids = list(range(last - len(params.tasks) + 1, last + 1))
        fresh = [True] * len(ids)
    firsts = [
        {
            "task_id": task_id,
            "sender_id": t.parent_id,
            "body": t.message,
            "now": now,
            "trace": t.trace,
        }
        for task_id, t, new in zip(ids, params.tasks, fresh, strict=True)
        if t.message is not None and new
    ]
    if firsts:
        conn.executemany(SQL["first_message"], firsts)
    return ids


def _insert_keyed(
    conn: sqlite3.Connection, tasks: Sequence[NewTask], values: list[dict[str, Any]]
) -> tuple[list[int], list[bool]]:
    """Insert one task at a time (under the write lock: no one else writes
    meanwhile): each id, and whether it is new. A key whose holder's period
    is over is freed first; a held key answers by the task's
    ``on_conflict`` (a key repeated in the batch is the batch's first task)."""
    ids, fresh = [], []
    mine: set[int] = set()
    for task, value in zip(tasks, values, strict=True):
        held = None
        if task.idempotency_key is not None:
            held = conn.execute(SQL["stored_key"], value).fetchone()
            if held is not None and held[1]:
                conn.execute(SQL["release_key"], {"id": held[0]})
                held = None
        if held is None:
            inserted = conn.execute(SQL["enqueue_keyed"], value).fetchone()
            ids.append(int(inserted[0]))
            fresh.append(True)
            mine.add(int(inserted[0]))
            continue
        holder = int(held[0])
        if holder not in mine:
            if task.on_conflict == "raise":
                assert task.idempotency_key is not None
                raise TaskExistsError(task.name, task.idempotency_key, holder)
            if task.on_conflict == "replace":
                conn.execute(SQL["replace_pending"], {**value, "id": holder})
        ids.append(holder)
        fresh.append(False)
    return ids, fresh


def send(conn: sqlite3.Connection, deliveries: Sequence[Delivery], now: float) -> list[int]:
    """An outside send, all or none: every recipient is checked before any
    message is stored. A delivery whose idempotency key its recipient got
    already sends nothing: the first message's id comes back."""
    sent: dict[int, int] = {}
    for index, d in enumerate(deliveries):
        if d.idempotency_key is not None:
            found = conn.execute(SQL["sent_key"], _key(d)).fetchone()
            if found is not None:
                sent[index] = int(found[0])
                continue
        row = conn.execute(SQL["recipient"], {"id": d.task_id}).fetchone()
        check_recipient(d.task_id, row[0] if row else None, bool(row and row[1]))
    ids = []
    for index, d in enumerate(deliveries):
        if index in sent:
            ids.append(sent[index])
            continue
        [message_id] = deliver(conn, [d], now)
        if d.idempotency_key is not None:
            conn.execute(SQL["keep_key"], {**_key(d), "message_id": message_id})
        ids.append(message_id)
    return ids


def _key(delivery: Delivery) -> dict[str, Any]:
    return {"task_id": delivery.task_id, "key": delivery.idempotency_key}


def deliver(conn: sqlite3.Connection, deliveries: Sequence[Delivery], now: float) -> list[int]:
    """Put each message in its live recipient's inbox (others are skipped) and
    wake the recipient; the ids of the messages stored."""
    ids = []
    for d in deliveries:
        args = {
            "task_id": d.task_id,
            "sender_id": d.sender_id,
            "body": d.body,
            "now": now,
            "trace": d.trace,
        }
        if conn.execute(SQL["deliver"], args).rowcount:
            ids.append(int(conn.execute("select last_insert_rowid()").fetchone()[0]))
            conn.execute(SQL["wake"], {"task_id": d.task_id, "now": now})
    return ids


def holding(
    conn: sqlite3.Connection, worker_id: str, completions: Sequence[Completion], now: float
) -> list[Completion]:
    """The completions among ``completions`` whose lease is still held (``finish``
    will apply exactly these, in the same transaction)."""
    leases = rows.leases_json([c.token for c in completions])
    args = {"leases": leases, "worker_id": worker_id, "now": now}
    live = {(r[0], r[1]) for r in conn.execute(SQL["fence"], args)}
    return [c for c in completions if (c.token.task_id, c.token.attempt) in live]


def apply_effects(conn: sqlite3.Connection, holding: Sequence[Completion], now: float) -> None:
    """The effects of poll completions about to be applied: consume what each poll
    saw, spawn, send."""
    for c in holding:
        effects = c.effects
        if effects is None:
            continue
        if effects.consumed:
            args = {"task_id": c.token.task_id, "ids": json.dumps(list(effects.consumed))}
            conn.execute(SQL["consume"], args)
        if effects.spawns:
            insert_tasks(conn, EnqueueParams(tasks=effects.spawns), now)
        deliver(conn, effects.sends, now)


def rewake(conn: sqlite3.Connection, applied: Sequence[Completion], now: float) -> None:
    """Make due again a poll that rests while its inbox is not empty."""
    for c in applied:
        if c.effects is not None and c.next_state in (TaskState.PENDING, TaskState.WAITING):
            conn.execute(SQL["rewake"], {"task_id": c.token.task_id, "now": now})


def read_inbox(conn: sqlite3.Connection, task_id: int) -> list[Message]:
    found = conn.execute(SQL["inbox"], {"task_id": task_id}).fetchall()
    return [message_row(rows.message(r)) for r in found]
