"""Inserting tasks into PostgreSQL: plain, keyed (idempotency keys), with
first messages, in an application's transaction, and the offers of workers
on standby that an enqueue may hand a task to.

A mixin of :class:`~conveyor.backends.postgres.backend.PostgresBackend`.
A plain enqueue is one statement (``enqueue``, ``enqueue_uniform``,
``enqueue_one`` or ``enqueue_handoff`` of sql/enqueue.sql); one with keys
or first messages is the script :func:`~conveyor.backends.postgres.scripts.insert`,
in a transaction. An enqueue that hands a task off still commits it as a
pending task: a standby worker that never starts it loses it to the next
claim when the offer's lease runs out.
"""

from __future__ import annotations

import asyncio
import contextlib
from collections.abc import Iterable, Mapping, Sequence
from datetime import datetime
from typing import Any

from psycopg import AsyncConnection

from conveyor.backends.params import EnqueueParams, HandOff, NewTask, Offered, OfferParams
from conveyor.backends.postgres import handoffs, scripts
from conveyor.backends.postgres.pools import Pools, check_async, check_sync
from conveyor.backends.postgres.rows import enqueue_statement, keyed, may_raise, ordered_ids


async def insert_tasks(
    conn: AsyncConnection[Any],
    sql: Mapping[str, bytes],
    tasks: Sequence[NewTask],
    now: datetime | None,
) -> list[int]:
    """Insert ``tasks`` and their first messages on ``conn`` (in a transaction
    when any has a first message or an idempotency key); their ids in order
    (see :func:`conveyor.backends.postgres.scripts.insert`)."""
    return await scripts.run(conn, scripts.insert(sql, tasks, now))


class Enqueue(Pools):
    """``enqueue`` and its forms, and the standby offers (see
    :class:`~conveyor.backends.protocol.Backend` and
    :class:`~conveyor.backends.capabilities.HandOffs`)."""

    async def enqueue(self, params: EnqueueParams) -> list[int]:
        if not params.tasks:
            return []
        if not any(t.message for t in params.tasks) and not keyed(params.tasks):
            name, args = enqueue_statement(params)
            if name == "enqueue_one" and handoffs.may_hand_off(params.tasks[0]):
                name = "enqueue_handoff"  # to an idle worker, if one offers a slot
            return ordered_ids(await self._fetchall(name, args))
        async with self._connection() as conn, conn.transaction():
            return await insert_tasks(conn, self.sql, params.tasks, params.now)

    async def enqueue_in(self, params: EnqueueParams, connection: Any) -> list[int]:
        check_async(connection)
        if not params.tasks:
            return []
        if not may_raise(params.tasks):
            return await insert_tasks(connection, self.sql, params.tasks, params.now)
        # A savepoint: a TaskExistsError leaves the caller's transaction as it was.
        async with connection.transaction():
            return await insert_tasks(connection, self.sql, params.tasks, params.now)

    async def enqueue_chunks(self, chunks: Iterable[Sequence[NewTask]]) -> list[int]:
        """One transaction; each chunk is sent before the next is drawn, so the
        server inserts one chunk while this process encodes the next."""
        ids: list[int] = []
        async with self._connection() as conn, conn.transaction():
            sending: asyncio.Future[list[int]] | None = None
            try:
                for chunk in chunks:
                    if sending is not None:
                        ids += await sending
                    sending = asyncio.ensure_future(insert_tasks(conn, self.sql, chunk, None))
                    await asyncio.sleep(0)  # sent: the next chunk is drawn meanwhile
                if sending is not None:
                    ids += await sending
            finally:
                # Drawing a chunk raised: the insert in flight ends before the rollback.
                if sending is not None and not sending.done():
                    with contextlib.suppress(Exception):
                        await sending
        return ids

    def enqueue_in_sync(self, params: EnqueueParams, connection: Any) -> list[int]:
        check_sync(connection)
        if not params.tasks:
            return []
        if not may_raise(params.tasks):
            return scripts.run_sync(connection, scripts.insert(self.sql, params.tasks, params.now))
        with connection.transaction():  # a savepoint, as in enqueue_in
            return scripts.run_sync(connection, scripts.insert(self.sql, params.tasks, params.now))

    async def offer(self, params: OfferParams) -> Offered:
        rows = await self._fetchall(
            "standby_offer",
            {
                "now": params.now,
                "worker_id": params.worker_id,
                "nonce": params.nonce,
                "ping": str(params.ping),
                "queues": list(params.queues),
                "names": list(params.names),
                "free": params.free,
                "lease": params.lease,
                "ttl": params.ttl,
            },
        )
        return Offered(clock=rows[0][0], anew=rows[0][1])

    async def withdraw(self, worker_id: str) -> int:
        rows = await self._fetchall("standby_withdraw", {"now": None, "worker_id": worker_id})
        return int(rows[0][0]) if rows else 0

    async def adopt(self, worker_id: str, known: Sequence[int]) -> list[HandOff]:
        args = {"now": None, "worker_id": worker_id, "known": list(known)}
        rows = await self._fetchall("standby_adopt", args)
        return [handoffs.handoff(list(row), worker_id) for row in rows]
