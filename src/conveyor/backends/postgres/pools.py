"""The PostgreSQL backend's connections: its pools and their session settings.

The main pool (autocommit, at least one connection while open) serves every
statement but the claims; the claims' pool, opened at the first claim,
plans each claim once per connection; the synchronous pool, opened at first
use, serves thread handlers' attempt transactions.

A worker's backend (``work_pool_size`` set) keeps fewer: its main pool, of
at most ``work_pool_size`` connections, serves its completions and the rest
and, with more than one, its claims (each planned once per connection, as
on the claims' pool); with one, the claims run on the session connection of
:mod:`.session` (LISTEN, turns, heartbeats), so that claims and completions
never wait for each other. Attempt transactions borrow from pools of their
own that open a connection only while a handler runs in one and close it
``TRANSACTION_IDLE`` seconds after (async and sync, up to ``pool_size``
each). A worker process then holds ``work_pool_size + 1`` server sessions
(two by default) while no handler is inside its own transaction. Every connection reads
timestamps with conveyor's bounded loaders (:mod:`.loaders`) and runs with
the settings of :data:`SESSION`. psycopg's errors on a connection of
:meth:`Pools._connection` come out as conveyor's (:mod:`.failures`).

Through a pooler in transaction mode (``pool_mode=transaction``, see
:mod:`.urls`) a connection's session is not conveyor's: it sets nothing
on it and prepares nothing (psycopg's ``prepare_threshold`` is None, and
claims are planned at each call). The settings of :data:`SESSION` then
come from the server's side, where the operator puts them (PgBouncer's
``connect_query``, or ``ALTER ROLE ... SET``): :meth:`Pools.missing_settings`
names those a server session lacks, and the backend warns at open.
"""

from __future__ import annotations

import asyncio
import contextlib
import threading
import weakref
from collections.abc import AsyncIterator, Awaitable, Callable, Mapping
from typing import TYPE_CHECKING, Any

import psycopg
from psycopg import AsyncConnection
from psycopg_pool import AsyncConnectionPool, ConnectionPool, PoolTimeout

from conveyor.backends.postgres import failures, statements
from conveyor.backends.postgres.loaders import ADAPTERS
from conveyor.backends.postgres.urls import connect_timeout, target
from conveyor.errors import BackendError, ConfigurationError

if TYPE_CHECKING:
    from conveyor.backends.postgres.session import Session

DEFAULT_SCHEMA = "conveyor"
DEFAULT_POOL_SIZE = 10
TRANSACTION_IDLE = 5.0
"""Seconds an attempt-transaction connection of a worker's backend stays
open unused before it closes."""
# Every fence relies on READ COMMITTED re-checking a row after a concurrent
# update; a server whose default is stricter would fail those statements.
READ_COMMITTED = "set default_transaction_isolation to 'read committed'"
# No JIT compilation: the planner's cost of a claim grows with the tasks
# table (a generic plan assumes a LIMIT takes a tenth of the rows), and past
# jit_above_cost the server compiled each claim's expressions at every
# execution, 0.3-0.6 s a claim with 2.5 million tasks pending instead of a
# few milliseconds. conveyor's statements are short; none gains from it.
NO_JIT = "set jit to off"
# The worker's own transactions (a completion with its effects, a bulk enqueue)
# send their statements back to back. A process frozen in the middle of one
# (SIGSTOP, a paused VM, a thread handler holding the GIL in a C call) would
# keep its row locks, and no other worker could reclaim those tasks (claims
# skip locked rows) until it woke: the server ends such a session after one
# second instead, and its transaction rolls back. An attempt transaction
# waits on the handler, so it lifts the limit for itself.
BOUND_IDLE_TRANSACTIONS = "set idle_in_transaction_session_timeout to '1s'"
# A prepared statement keeps its plan for the connection's life, and that
# plan must not depend on how big the tasks table was when it was made. A
# worker that started on an empty queue planned its claim, its finishes and
# its renewals while a scan of the table cost less than a look in the
# primary key, and kept scanning the whole table as the backlog grew: 35 ms
# a claim beside 100,000 tasks, and a finish of 50,000 completions that
# compared each row with the whole batch (11 s), until an ANALYZE made the
# server plan again. Every statement of conveyor reaches its rows through an
# index, so no sequential scan is weighed at all; where no index serves (a
# count of every task), the scan still runs.
NO_SEQSCAN = "set enable_seqscan to off"
SCANNING = "set local enable_seqscan to default"
"""For a statement that reads (nearly) every task (see _fetchall_scanning)."""
SESSION = "; ".join((READ_COMMITTED, BOUND_IDLE_TRANSACTIONS, NO_JIT, NO_SEQSCAN))
"""Every setting of a conveyor connection, in one round trip."""
SETTINGS = {
    "default_transaction_isolation": "read committed",
    "idle_in_transaction_session_timeout": "1s",
    "jit": "off",
    "enable_seqscan": "off",
}
"""The settings of :data:`SESSION` by name, as ``SHOW`` prints them."""
SYNC_SESSION = "; ".join((READ_COMMITTED, NO_JIT, NO_SEQSCAN))
# Claims run on connections of their own, each statement planned once per
# connection: see Attempts.claim.
CLAIM_PLANS = "set plan_cache_mode to force_generic_plan"


def _configure_sync(conn: psycopg.Connection[Any]) -> None:
    conn.execute(SYNC_SESSION)


def check_async(connection: Any) -> None:
    """Refuse an application's connection that is not an AsyncConnection."""
    if not isinstance(connection, AsyncConnection):
        raise ConfigurationError(
            "the async API takes a psycopg AsyncConnection; "
            "pass a sync psycopg Connection to the sync API"
        )


def check_sync(connection: Any) -> None:
    """Refuse an application's connection that is not a sync Connection."""
    if not isinstance(connection, psycopg.Connection):
        raise ConfigurationError(
            "the sync API takes a psycopg Connection; pass an AsyncConnection to the async API"
        )


class Pools:
    """The state every section of the backend shares: its URL, schema and
    statements, and the pools (see the module's docstring). The pools are
    not open until the backend's ``open``."""

    def __init__(
        self,
        url: str,
        *,
        schema: str = DEFAULT_SCHEMA,
        pool_size: int = DEFAULT_POOL_SIZE,
        work_pool_size: int | None = None,
    ) -> None:
        self.url = url
        self.target = target(url)
        self._connect_timeout = connect_timeout(self.target.url)
        self.schema = statements.validate_schema(schema)
        self.sql: Mapping[str, bytes] = statements.load(self.schema)
        self.channel = statements.channel(self.schema)
        if pool_size < 1:
            raise ConfigurationError("pool_size must be at least 1")
        if work_pool_size is not None and work_pool_size < 1:
            raise ConfigurationError("work_pool_size must be at least 1")
        self._pool_size = pool_size
        self._work_pool_size = work_pool_size
        self._pool: AsyncConnectionPool[AsyncConnection[Any]] | None = None
        self._transaction_pool: AsyncConnectionPool[AsyncConnection[Any]] | None = None
        self._transaction_pool_lock = asyncio.Lock()
        self._sync_pool: ConnectionPool[psycopg.Connection[Any]] | None = None
        self._sync_lock = threading.Lock()
        self._claim_pool: AsyncConnectionPool[AsyncConnection[Any]] | None = None
        self._claim_pool_lock = asyncio.Lock()
        self._connections: weakref.WeakSet[AsyncConnection[Any]] = weakref.WeakSet()

    @property
    def pool(self) -> AsyncConnectionPool[AsyncConnection[Any]]:
        if self._pool is None:
            raise BackendError("the backend is not open")
        return self._pool

    async def _configure(self, conn: AsyncConnection[Any]) -> None:
        if not self.target.transaction_pooling:
            await conn.execute(SESSION)
        self._connections.add(conn)

    async def _configure_main(self, conn: AsyncConnection[Any]) -> None:
        """A worker's main pool may serve its claims: their plans are made
        once per connection there too (prepared after psycopg's usual few
        executions: the same connection runs the migrations, which no
        statement can prepare)."""
        await self._configure(conn)
        if self._work_pool_size is not None and not self.target.transaction_pooling:
            await conn.execute(CLAIM_PLANS)

    async def _configure_claims(self, conn: AsyncConnection[Any]) -> None:
        await self._configure(conn)
        if not self.target.transaction_pooling:
            await conn.execute(CLAIM_PLANS)
            conn.prepare_threshold = 0  # prepared at once: the plan is kept from the first claim

    def _claim_session(self) -> Session | None:
        """Where a worker's claims run, if not on a pool: the backend's
        session connection (see :mod:`.session`)."""
        return None

    async def missing_settings(self) -> list[str]:
        """The settings of :data:`SESSION` that a session of the main pool
        does not have, as ``name = value`` (wanted): through a pooler in
        transaction mode, those the server's side does not set."""
        names = list(SETTINGS)
        query = "select " + ", ".join(f"current_setting('{name}')" for name in names)
        async with self._connection() as conn:
            cursor = await conn.execute(query)
            found = await cursor.fetchone()
        return [
            f"{name} = {SETTINGS[name]}"
            for name, value in zip(names, found or (), strict=False)
            if str(value).lower() != SETTINGS[name]
        ]

    async def claim_pool(self) -> AsyncConnectionPool[AsyncConnection[Any]]:
        """The claims' own pool, opened at the first claim (a backend that only
        enqueues never opens it). It starts empty and grows to the claims in
        flight at once, two for a worker. A worker's backend claims on its
        main pool."""
        if self._work_pool_size is not None:
            return self.pool
        if self._claim_pool is not None:
            return self._claim_pool
        self.pool  # noqa: B018 - raises if the backend is not open
        async with self._claim_pool_lock:
            if self._claim_pool is None:
                claims = self._async_pool(0, self._configure_claims, "-claims")
                await claims.open()
                if self._pool is None:  # closed meanwhile
                    await claims.close()
                    raise BackendError("the backend is not open")
                self._claim_pool = claims
            return self._claim_pool

    async def transaction_pool(self) -> AsyncConnectionPool[AsyncConnection[Any]]:
        """Where async attempt transactions borrow their connection: the main
        pool, or a worker's pool of its own (see the module's docstring)."""
        if self._work_pool_size is None:
            return self.pool
        if self._transaction_pool is not None:
            return self._transaction_pool
        self.pool  # noqa: B018 - raises if the backend is not open
        async with self._transaction_pool_lock:
            if self._transaction_pool is None:
                pool = self._async_pool(0, self._configure, "-transactions", TRANSACTION_IDLE)
                await pool.open()
                if self._pool is None:  # closed meanwhile
                    await pool.close()
                    raise BackendError("the backend is not open")
                self._transaction_pool = pool
            return self._transaction_pool

    @property
    def sync_pool(self) -> ConnectionPool[psycopg.Connection[Any]]:
        """A synchronous pool, opened on first use (thread handlers' transactions)."""
        with self._sync_lock:
            if self._sync_pool is None:
                pool: ConnectionPool[psycopg.Connection[Any]] = ConnectionPool(
                    self.target.url,
                    min_size=0,
                    max_size=self._pool_size,
                    max_idle=600.0 if self._work_pool_size is None else TRANSACTION_IDLE,
                    kwargs=self._connection_options(),
                    configure=None if self.target.transaction_pooling else _configure_sync,
                    open=False,
                    name=f"conveyor-{self.schema}-sync",
                )
                pool.open()
                self._sync_pool = pool
            return self._sync_pool

    def _connection_options(self) -> dict[str, Any]:
        """Every pooled connection's: autocommit, conveyor's adapters, the
        URL's connect timeout; and, through a pooler in transaction mode, no
        prepared statements."""
        options: dict[str, Any] = {
            "autocommit": True,
            "context": ADAPTERS,
            "connect_timeout": self._connect_timeout,
        }
        if self.target.transaction_pooling:
            options["prepare_threshold"] = None
        return options

    def _async_pool(
        self,
        min_size: int,
        configure: Callable[[AsyncConnection[Any]], Awaitable[None]],
        suffix: str = "",
        max_idle: float = 600.0,
        max_size: int | None = None,
    ) -> AsyncConnectionPool[AsyncConnection[Any]]:
        """An unopened pool of autocommit connections, up to ``max_size``
        (``pool_size`` by default)."""
        return AsyncConnectionPool(
            self.target.url,
            min_size=min_size,
            max_size=max_size or self._pool_size,
            max_idle=max_idle,
            kwargs=self._connection_options(),
            configure=configure,
            open=False,
            name=f"conveyor-{self.schema}{suffix}",
        )

    async def _close_pool(self, pool: AsyncConnectionPool[AsyncConnection[Any]]) -> None:
        try:
            await pool.close()
        except asyncio.CancelledError:
            task = asyncio.current_task()
            if task is not None and task.cancelling():
                raise
            # The loop is shutting down and already cancelled the pool's
            # own tasks, so the pool could not close its connections.
            for conn in list(self._connections):
                with contextlib.suppress(Exception):
                    await conn.close()

    @contextlib.asynccontextmanager
    async def _connection(
        self, pool: AsyncConnectionPool[AsyncConnection[Any]] | None = None
    ) -> AsyncIterator[AsyncConnection[Any]]:
        """A connection of ``pool`` (the main pool by default); psycopg errors
        come out as conveyor's, classified by cause (see :mod:`.failures`)."""
        try:
            async with (pool or self.pool).connection() as conn:
                yield conn
        except (psycopg.Error, PoolTimeout) as exc:
            raise failures.translated(exc) from exc

    async def _fetchall(self, name: str, args: Mapping[str, Any]) -> list[tuple[Any, ...]]:
        async with self._connection() as conn:
            cursor = await conn.execute(self.sql[name], args)
            return await cursor.fetchall()

    async def _fetchall_scanning(self, name: str, args: Mapping[str, Any]) -> list[tuple[Any, ...]]:
        """``name``, which reads (nearly) every task, with sequential scans
        weighed as usual: forced to scan with them off, the planner also
        gives up the rest of a good plan (a count by state took five times
        as long, sorting where it would hash)."""
        async with self._connection() as conn, conn.transaction():
            await conn.execute(SCANNING)
            cursor = await conn.execute(self.sql[name], args)
            return await cursor.fetchall()
