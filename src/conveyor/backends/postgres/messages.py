"""Coroutine tasks on PostgreSQL: sends, inboxes, and a poll's completion
with its effects.

:class:`Messages` is a mixin of
:class:`~conveyor.backends.postgres.backend.PostgresBackend`: a send is the
script :func:`~conveyor.backends.postgres.scripts.send` (its advisory locks,
checks and idempotency keys), in one transaction, the backend's or the
caller's.

A poll's completion is one transaction: take the advisory lock that orders it
after the outside sends to its task under way (see ``guard_send`` in
sql/messages.sql), lock the rows it touches in id order
(its task, its parent, the recipients of its messages) and read each
completion's fence under those locks; for the completions that hold their lease,
consume the messages each poll saw, insert its spawned children with their
first messages and deliver its messages; then write the fenced ``finish``
at the same clock, and make due again each task that ended waiting or
sleeping while its inbox still holds messages. A rejected completion writes
none of it. Effects go first so that a child's last messages precede the
end-of-stream message its completion makes the database send its parent.
"""

from __future__ import annotations

import contextlib
from collections.abc import Mapping, Sequence
from datetime import datetime
from typing import Any

from psycopg import AsyncConnection, AsyncCursor, pq

from conveyor.backends.params import Completion, SendParams
from conveyor.backends.postgres import scripts
from conveyor.backends.postgres.enqueue import insert_tasks
from conveyor.backends.postgres.pools import Pools, check_async, check_sync
from conveyor.backends.postgres.rows import deliver_args, finish_args
from conveyor.backends.stored import message_row
from conveyor.model import Message, TaskState

Statements = Mapping[str, bytes]


class Messages(Pools):
    """``send`` and its forms in an application's transaction, and a task's
    inbox (see :class:`~conveyor.backends.protocol.Backend`)."""

    async def send(self, params: SendParams) -> list[int]:
        if not params.deliveries:
            return []
        async with self._connection() as conn, conn.transaction():
            return await self._send_on(conn, params)

    async def send_in(self, params: SendParams, connection: Any) -> list[int]:
        check_async(connection)
        if not params.deliveries:
            return []
        return await self._send_on(connection, params)

    async def _send_on(self, conn: AsyncConnection[Any], params: SendParams) -> list[int]:
        return await scripts.run(conn, scripts.send(self.sql, params.deliveries, params.now))

    def send_in_sync(self, params: SendParams, connection: Any) -> list[int]:
        check_sync(connection)
        if not params.deliveries:
            return []
        return scripts.run_sync(connection, scripts.send(self.sql, params.deliveries, params.now))

    async def inbox(self, task_id: int) -> list[Message]:
        return [message_row(r) for r in await self._fetchall("inbox", {"id": task_id})]


def has_effects(completions: Sequence[Completion]) -> bool:
    return any(c.effects is not None for c in completions)


def spawning(completions: Sequence[Completion]) -> bool:
    """Whether any completion spawns a task: its statements then go one at a
    time (each spawn reads the id of its insert), not in a pipeline."""
    return any(c.effects is not None and c.effects.spawns for c in completions)


def lock_args(completions: Sequence[Completion], now: datetime | None) -> dict[str, Any]:
    own = [c.token.task_id for c in completions]
    recipients = [d.task_id for c in completions if c.effects for d in c.effects.sends]
    return {"ids": own + recipients, "own": own, "now": now}


async def finish_with_effects(
    conn: AsyncConnection[Any],
    sql: Statements,
    worker_id: str,
    completions: Sequence[Completion],
    now: datetime | None,
) -> set[tuple[int, int]]:
    """Record ``completions`` and their effects on ``conn``, inside its open
    transaction; the (task id, attempt) of each applied one. The caller
    commits after this returns (see :func:`record_with_effects` for a commit
    in the same flight)."""
    return await applied(await record_with_effects(conn, sql, worker_id, completions, now))


async def applied(finished: AsyncCursor[Any] | None) -> set[tuple[int, int]]:
    """The (task id, attempt) of each completion ``finished`` recorded."""
    if finished is None:
        return set()
    return {(int(r[0]), int(r[1])) for r in await finished.fetchall()}


async def record_with_effects(
    conn: AsyncConnection[Any],
    sql: Statements,
    worker_id: str,
    completions: Sequence[Completion],
    now: datetime | None,
) -> AsyncCursor[Any] | None:
    """Write ``completions`` and their effects on ``conn``, inside its open
    transaction; the cursor of the finish, whose rows (see :func:`applied`)
    may be read after the commit, or None when no completion holds its lease.

    The completions that hold their lease under the row locks are recorded,
    or the transaction fails (``fence_check``): no effect of a completion can
    stay without the completion. So nothing here waits on the finish's reply,
    and a caller in pipeline mode sends its COMMIT in the same flight."""
    own = sorted({c.token.task_id for c in completions if c.effects is not None})
    # Two flights of statements (psycopg's pipeline mode): the guard and the
    # locks, whose rows say which completions hold their lease; then the
    # effects, the finish, the rewake and the check, none of which waits on
    # another's reply. A failed statement aborts the transaction all the
    # same. Spawns read the ids of their inserts as they go: with any, one at
    # a time. A caller already in pipeline mode keeps it (a nested pipeline
    # would sync on entry and on exit: two more round trips).
    opened = conn.pgconn.pipeline_status != pq.PipelineStatus.OFF
    async with contextlib.nullcontext() if spawning(completions) or opened else conn.pipeline():
        await conn.execute(sql["guard_endings"], {"ids": own})
        cursor = await conn.execute(sql["lock_tasks"], lock_args(completions, now))
        locked = await cursor.fetchall()
        if not locked:
            return None
        clock: datetime = locked[0][4]
        live = {(int(r[0]), int(r[1])) for r in locked if r[2] == worker_id and r[3]}
        holding = [c for c in completions if (c.token.task_id, c.token.attempt) in live]
        if not holding:
            return None
        await _apply_effects(conn, sql, holding, clock)
        # fence_check reads its ids, attempts, worker and clock from the same arguments.
        recorded = finish_args(worker_id, holding, clock)
        finished = await conn.execute(sql["finish"], recorded)
        resting = [
            c.token.task_id
            for c in holding
            if c.effects is not None and c.next_state in (TaskState.PENDING, TaskState.WAITING)
        ]
        if resting:
            await conn.execute(sql["rewake"], {"ids": resting, "now": clock})
        await conn.execute(sql["fence_check"], recorded)
    return finished


async def _apply_effects(
    conn: AsyncConnection[Any],
    sql: Statements,
    holding: Sequence[Completion],
    now: datetime,
) -> None:
    consumed = [
        (c.token.task_id, message_id)
        for c in holding
        if c.effects
        for message_id in c.effects.consumed
    ]
    if consumed:
        await conn.execute(
            sql["consume"],
            {"task_ids": [t for t, _ in consumed], "ids": [m for _, m in consumed]},
        )
    spawns = [new for c in holding if c.effects for new in c.effects.spawns]
    if spawns:
        await insert_tasks(conn, sql, spawns, now)
    sends = [d for c in holding if c.effects for d in c.effects.sends]
    if sends:
        await conn.execute(sql["deliver"], deliver_args(sends, now))
