"""Wake-up turns on PostgreSQL: a session advisory lock per kind of worker.

A NOTIFY reaches every listening worker. The workers of one kind (the same
queues and task names) on one schema take turns at one advisory lock: the
worker that holds it answers wake-ups with a claim, the others wait for it
in ``pg_advisory_lock`` (PostgreSQL grants a lock's waiters in turn). The
lock is a session lock on a connection of its own, so a worker that dies,
freezes past its connection's end, or loses the connection gives its turn
back with the session. See :mod:`conveyor.worker.turns` for when a worker
takes and gives its turn.
"""

from __future__ import annotations

import hashlib
from typing import Any

from psycopg import AsyncConnection


def kind_key(kind: str) -> int:
    """The lock's second key: a signed 32-bit integer drawn from ``kind``.
    Two kinds that share a key (one chance in 2^32) share turns: nothing is
    lost, but while one kind holds the turn the other's wake-ups wait for
    its workers' polls."""
    digest = hashlib.blake2b(kind.encode(), digest_size=4).digest()
    return int.from_bytes(digest, "big", signed=True)


class PostgresTurnLock:
    """``turn_take`` waits for the lock, ``turn_give`` gives it back, on a
    connection of its own, opened at the first ``take`` (and again after a
    failure)."""

    def __init__(self, url: str, take_sql: bytes, give_sql: bytes, key: int) -> None:
        self._url = url
        self._take = take_sql
        self._give = give_sql
        self._params = {"kind": key}
        self._conn: AsyncConnection[Any] | None = None

    async def take(self) -> None:
        if self._conn is None or self._conn.closed:
            self._conn = await AsyncConnection.connect(self._url, autocommit=True)
        try:
            await self._conn.execute(self._take, self._params)
        except BaseException:
            # Cancelled (psycopg cancels the wait on the server) or failed: a
            # lock granted as the wait ended must not stay held by a
            # session nobody answers for.
            await self.close()
            raise

    async def give(self) -> None:
        if self._conn is None:
            return
        try:
            await self._conn.execute(self._give, self._params)
        except BaseException:
            await self.close()
            raise

    async def close(self) -> None:
        conn, self._conn = self._conn, None
        if conn is not None and not conn.closed:
            await conn.close()
