"""An attempt's own transaction: the handler's writes commit with its success.

Both kinds run at READ COMMITTED and record the success with the same fenced
``finish`` statement as the worker's batches, inside the transaction: if the
lease was lost, everything rolls back.
"""

from __future__ import annotations

import asyncio
import contextlib
import datetime
from collections.abc import Iterator
from dataclasses import dataclass
from typing import TYPE_CHECKING, Any, LiteralString

import psycopg
from psycopg import AsyncConnection
from psycopg_pool import AsyncConnectionPool

from conveyor.backends.params import Completion
from conveyor.backends.postgres import failures
from conveyor.backends.postgres.messages import finish_with_effects
from conveyor.backends.postgres.rows import finish_args
from conveyor.errors import BackendError

ATTEMPT_END = "set local enable_seqscan to off"
"""Before conveyor's own statements end an attempt transaction: the
session's planner settings again, which its handler ran without (see
``NO_SEQSCAN`` in the backend)."""


@dataclass(frozen=True)
class Session:
    """The server session of a thread handler's attempt transaction: its
    process id, and (through a pooler in transaction mode, where the
    session serves other clients once the transaction ends) when the
    transaction began."""

    pid: int
    began: datetime.datetime | None


TERMINATE = "select pg_terminate_backend(%s)"
TERMINATE_IF_STILL_IN = (
    "select pg_terminate_backend(pid) from pg_stat_activity where pid = %s and xact_start = %s"
)


@contextlib.contextmanager
def translated_errors() -> Iterator[None]:
    """A lost connection (or a server that cannot serve now, see
    :mod:`.failures`; the server ended a session left idle in a transaction,
    too) becomes BackendUnavailableError: the commit's fate is then unknown.
    Other errors pass through as they are: they are the attempt's error (the
    handler's own constraint failing at COMMIT, a value over a limit, a
    serialization failure or a deadlock of its transaction)."""
    try:
        yield
    except psycopg.Error as exc:
        if failures.rolled_back(exc) or not failures.unavailable(exc):
            raise
        raise failures.translated(exc) from exc


if TYPE_CHECKING:
    from conveyor.backends.postgres.pools import Pools


class PostgresTransaction:
    """An attempt's own transaction on a pooled connection (see protocol)."""

    def __init__(
        self,
        backend: Pools,
        pool: AsyncConnectionPool[AsyncConnection[Any]],
        conn: AsyncConnection[Any],
        worker_id: str,
    ) -> None:
        self._backend = backend
        self._pool = pool
        """Where ``conn`` came from, and goes back to."""
        self._conn = conn
        self._worker_id = worker_id
        self._done = False

    @property
    def connection(self) -> AsyncConnection[Any]:
        return self._conn

    async def commit_success(self, completion: Completion) -> bool:
        if self._done:
            raise BackendError("the attempt transaction is already closed")
        with translated_errors():
            return await self._commit_success(completion)

    async def _commit_success(self, completion: Completion) -> bool:
        try:
            await self._conn.execute(ATTEMPT_END)
            if completion.effects is not None:
                backend = self._backend
                applied = await finish_with_effects(
                    self._conn, backend.sql, self._worker_id, [completion], None
                )
            else:
                cursor = await self._conn.execute(
                    self._backend.sql["finish"],
                    finish_args(self._worker_id, [completion], None),
                )
                applied = {(int(r[0]), int(r[1])) for r in await cursor.fetchall()}
            await self._conn.execute("commit" if applied else "rollback")
            return bool(applied)
        except BaseException:
            await self._close_quietly()
            raise
        finally:
            await self._release()

    async def rollback(self) -> None:
        if self._done:
            return
        try:
            await self._conn.execute("rollback")
        finally:
            await self._release()

    async def abandon(self) -> None:
        await self.rollback()  # async handlers are cancelled, never left running

    async def _close_quietly(self) -> None:
        with contextlib.suppress(psycopg.Error):
            await self._conn.execute("rollback")

    async def _release(self) -> None:
        if not self._done:
            self._done = True
            await self._pool.putconn(self._conn)


class PostgresSyncTransaction:
    """An attempt's transaction on a synchronous connection (thread handlers)."""

    def __init__(
        self, backend: Pools, conn: psycopg.Connection[Any], worker_id: str, session: Session
    ) -> None:
        self._backend = backend
        self._conn = conn
        self._worker_id = worker_id
        self._session = session
        """The server process of the transaction's session (see ``abandon``)."""
        self._done = False

    @property
    def connection(self) -> psycopg.Connection[Any]:
        return self._conn

    async def commit_success(self, completion: Completion) -> bool:
        with translated_errors():
            return await asyncio.to_thread(self._commit_success, completion)

    async def rollback(self) -> None:
        await asyncio.to_thread(self._finish, "rollback")

    async def abandon(self) -> None:
        # The handler's thread may be inside a statement on this connection: a
        # rollback from here would race it, and leave its next statement to
        # autocommit. End the session on the server instead; the connection is
        # never returned to the pool. Through a pooler, only while that
        # session is still in this transaction: once it ended (the handler
        # committed it itself), the session may be serving another client.
        if self._done:
            return
        self._done = True
        pid, began = self._session.pid, self._session.began
        async with self._backend.pool.connection() as conn:
            if began is None:
                await conn.execute(TERMINATE, (pid,))
            else:
                await conn.execute(TERMINATE_IF_STILL_IN, (pid, began))

    def _commit_success(self, completion: Completion) -> bool:
        if self._done:
            raise BackendError("the attempt transaction is already closed")
        try:
            self._conn.execute(ATTEMPT_END)
            cursor = self._conn.execute(
                self._backend.sql["finish"], finish_args(self._worker_id, [completion], None)
            )
            applied = bool(cursor.fetchall())
        except BaseException:
            self._finish("rollback")
            raise
        self._finish("commit" if applied else "rollback")
        return applied

    def _finish(self, statement: LiteralString) -> None:
        if self._done:
            return
        self._done = True
        try:
            self._conn.execute(statement)
        finally:
            self._backend.sync_pool.putconn(self._conn)
