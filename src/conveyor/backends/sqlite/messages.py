"""Messages and a poll's effects on a SQLite connection.

Every function runs inside the caller's write transaction (BEGIN
IMMEDIATE): with one writer at a time, a poll's completion, its effects and any
send are serialised, so a message is either seen by a poll or wakes the
task once that poll has ended. :class:`Messages` is the section of
:class:`~conveyor.backends.sqlite.backend.SQLiteBackend` that sends and
reads inboxes.
"""

from __future__ import annotations

import json
import sqlite3
from collections.abc import Sequence
from typing import Any

from conveyor.backends import wake
from conveyor.backends.params import Completion, Delivery, EnqueueParams, SendParams
from conveyor.backends.sqlite import rows
from conveyor.backends.sqlite.database import Database, translated_errors
from conveyor.backends.sqlite.enqueue import check_caller, insert_tasks
from conveyor.backends.sqlite.statements import SQL, clock
from conveyor.backends.stored import check_recipient, message_row
from conveyor.model import Message, TaskState


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


class Messages:
    """``send`` and ``inbox`` (see :class:`~conveyor.backends.protocol.Backend`),
    ``send_in`` and ``send_in_sync`` (see
    :class:`~conveyor.backends.capabilities.TransactionalEnqueue`)."""

    path: str
    _db: Database
    _wake_key: str

    async def send(self, params: SendParams) -> list[int]:
        if not params.deliveries:
            return []
        ids = await self._db.write(
            lambda conn: send(conn, params.deliveries, clock(conn, params.now))
        )
        wake.notify_all(self._wake_key)
        return ids

    async def send_in(self, params: SendParams, connection: Any) -> list[int]:
        """As :meth:`send_in_sync`, on the caller's thread."""
        return self.send_in_sync(params, connection)

    def send_in_sync(self, params: SendParams, connection: Any) -> list[int]:
        """Send on the caller's ``sqlite3.Connection`` inside its open
        transaction (as for ``enqueue_in_sync``); the caller commits."""
        check_caller(connection, self.path)
        with translated_errors():
            ids = send(connection, params.deliveries, clock(connection, params.now))
        wake.notify_all(self._wake_key)
        return ids

    async def inbox(self, task_id: int) -> list[Message]:
        return await self._db.read(lambda conn: read_inbox(conn, task_id))
