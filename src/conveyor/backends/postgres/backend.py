"""The PostgreSQL backend: psycopg 3, an async connection pool, LISTEN/NOTIFY.

Guarantees (see docs/guarantees.md): every statement that changes a task is
one statement, fenced by the lease token and a live lease; claims use
``FOR UPDATE SKIP LOCKED`` so concurrent workers never block on each other;
the database clock rules lease expiry. Limits: a wake-up notification is a
hint only (workers also poll), and results are stored as jsonb.
"""

from __future__ import annotations

import asyncio
import contextlib
import logging
import threading
import weakref
from collections.abc import AsyncIterator, Awaitable, Callable, Iterable, Mapping, Sequence
from datetime import datetime
from typing import Any

import psycopg
from psycopg import AsyncConnection, AsyncCursor
from psycopg_pool import AsyncConnectionPool, ConnectionPool, PoolTimeout

from conveyor.backends.params import (
    ClaimedTask,
    ClaimParams,
    EnqueueParams,
    FinishParams,
    FinishResult,
    HandOff,
    HeartbeatParams,
    HeartbeatResult,
    NewTask,
    Offered,
    OfferParams,
    SendParams,
    Wakeup,
    WorkFilter,
)
from conveyor.backends.postgres import failures, handoffs, listen, queries, scripts, turns
from conveyor.backends.postgres.flow import FlowControl
from conveyor.backends.postgres.inboxes import (
    applied,
    has_effects,
    insert_tasks,
    record_with_effects,
    spawning,
)
from conveyor.backends.postgres.loaders import ADAPTERS
from conveyor.backends.postgres.migrate import (
    apply_migrations,
    pending_migrations,
    require_migrated,
)
from conveyor.backends.postgres.reads import Listings
from conveyor.backends.postgres.rows import (
    enqueue_statement,
    finish_statement,
    keyed,
    may_raise,
    ordered_ids,
)
from conveyor.backends.postgres.transactions import (
    PostgresSyncTransaction,
    PostgresTransaction,
)
from conveyor.backends.postgres.urls import connect_timeout
from conveyor.backends.protocol import Capability
from conveyor.backends.refusals import one_line
from conveyor.backends.stored import (
    Unread,
    attempt_row,
    claimed_rows,
    claimed_task,
    key_scan,
    message_row,
    task_row,
    transition_result,
)
from conveyor.backends.sweep import DEFAULT_SWEEP_INTERVAL, Sweep
from conveyor.errors import (
    BackendError,
    BackendUnavailableError,
    ConfigurationError,
)
from conveyor.model import (
    Attempt,
    LeaseToken,
    Message,
    Task,
    TaskState,
)
from conveyor.records import Migration, TaskCount, WorkerInfo
from conveyor.redaction import redact_message, redact_url

log = logging.getLogger("conveyor.postgres")

DEFAULT_SCHEMA = "conveyor"
DEFAULT_POOL_SIZE = 10
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
SYNC_SESSION = "; ".join((READ_COMMITTED, NO_JIT, NO_SEQSCAN))
# Claims run on connections of their own, each statement planned once per
# connection: see PostgresBackend.claim.
CLAIM_PLANS = "set plan_cache_mode to force_generic_plan"
# A handler's own statements, in its attempt transaction, are planned as the
# server would plan them for any client: the session's planner settings
# (NO_SEQSCAN) are conveyor's, not the handler's. conveyor's own statements
# at the end of the transaction take them back (transactions.ATTEMPT_END).
BEGIN_ATTEMPT = "begin isolation level read committed; set local enable_seqscan to default"
BEGIN_UNBOUND_ATTEMPT = (
    "begin isolation level read committed; set local idle_in_transaction_session_timeout to 0;"
    " set local enable_seqscan to default"
)


def _configure_sync(conn: psycopg.Connection[Any]) -> None:
    conn.execute(SYNC_SESSION)


def _check_async(connection: Any) -> None:
    if not isinstance(connection, AsyncConnection):
        raise ConfigurationError(
            "the async API takes a psycopg AsyncConnection; "
            "pass a sync psycopg Connection to the sync API"
        )


def _check_sync(connection: Any) -> None:
    if not isinstance(connection, psycopg.Connection):
        raise ConfigurationError(
            "the sync API takes a psycopg Connection; pass an AsyncConnection to the async API"
        )


class PostgresBackend(Listings, FlowControl):
    """Tasks in PostgreSQL tables of one schema (default ``conveyor``).

    ``migrate`` says what :meth:`open` does about the schema: True applies
    the pending migrations (creating the schema at first use), False
    refuses a schema that is missing or behind (StoreNotReadyError), None
    only connects. Either check is one read of the migrations table; DDL
    runs only for a pending migration, so a role with the grants of
    docs/operations.md and no DDL right opens a current schema."""

    capabilities = frozenset(
        {
            Capability.TRANSACTIONAL_ENQUEUE,
            Capability.ATTEMPT_TRANSACTION,
            Capability.NOTIFICATIONS,
            Capability.INSPECT,
            Capability.VACUUM,
            Capability.TURNS,
            Capability.HANDOFF,
        }
    )

    def __init__(
        self,
        url: str,
        *,
        schema: str = DEFAULT_SCHEMA,
        pool_size: int = DEFAULT_POOL_SIZE,
        migrate: bool | None = True,
        sweep_interval: float = DEFAULT_SWEEP_INTERVAL,
    ) -> None:
        self.url = url
        self._connect_timeout = connect_timeout(url)
        self.schema = queries.validate_schema(schema)
        self.sql: Mapping[str, bytes] = queries.load(self.schema)
        self.channel = queries.channel(self.schema)
        self._auto_migrate = migrate
        self._sweep = Sweep(sweep_interval)
        self._keyed_first = False
        """Whether the last claim took keyed tasks first (claims alternate)."""
        self._keyed_active = False
        """Whether keyed tasks were waiting at the last look (see ``_claim``)."""
        if pool_size < 1:
            raise ConfigurationError("pool_size must be at least 1")
        self._pool_size = pool_size
        self._pool: AsyncConnectionPool[AsyncConnection[Any]] | None = None
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
        await conn.execute(SESSION)
        self._connections.add(conn)

    async def _configure_claims(self, conn: AsyncConnection[Any]) -> None:
        await self._configure(conn)
        await conn.execute(CLAIM_PLANS)
        conn.prepare_threshold = 0  # prepared at once: the plan is kept from the first claim

    async def claim_pool(self) -> AsyncConnectionPool[AsyncConnection[Any]]:
        """The claims' own pool, opened at the first claim (a backend that only
        enqueues never opens it). It starts empty and grows to the claims in
        flight at once, two for a worker."""
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

    @property
    def sync_pool(self) -> ConnectionPool[psycopg.Connection[Any]]:
        """A synchronous pool, opened on first use (thread handlers' transactions)."""
        with self._sync_lock:
            if self._sync_pool is None:
                pool: ConnectionPool[psycopg.Connection[Any]] = ConnectionPool(
                    self.url,
                    min_size=0,
                    max_size=self._pool_size,
                    kwargs={
                        "autocommit": True,
                        "context": ADAPTERS,
                        "connect_timeout": self._connect_timeout,
                    },
                    configure=_configure_sync,
                    open=False,
                    name=f"conveyor-{self.schema}-sync",
                )
                pool.open()
                self._sync_pool = pool
            return self._sync_pool

    def _async_pool(
        self,
        min_size: int,
        configure: Callable[[AsyncConnection[Any]], Awaitable[None]],
        suffix: str = "",
    ) -> AsyncConnectionPool[AsyncConnection[Any]]:
        """An unopened pool of autocommit connections, up to ``pool_size``."""
        return AsyncConnectionPool(
            self.url,
            min_size=min_size,
            max_size=self._pool_size,
            kwargs={
                "autocommit": True,
                "context": ADAPTERS,
                "connect_timeout": self._connect_timeout,
            },
            configure=configure,
            open=False,
            name=f"conveyor-{self.schema}{suffix}",
        )

    @property
    def location(self) -> str:
        return f"{redact_url(self.url)} (schema {self.schema})"

    async def open(self) -> None:
        """Connect, or raise BackendUnavailableError within the connect
        timeout with the cause in one line (the URL's password hidden).
        Then apply the pending migrations (``migrate=True``), or refuse a
        schema missing or behind (``migrate=False``: StoreNotReadyError); a
        connection lost meanwhile raises BackendUnavailableError too. No
        connection is left open when it raises (an open pool left behind
        would keep reconnecting, and hold its event loop's shutdown)."""
        if self._pool is not None:
            return
        # One connection first: a refused connection, a missing database or
        # a wrong password fails it at once, with the server's reason (a
        # pool would retry quietly until its timeout).
        try:
            probe = await AsyncConnection.connect(
                self.url, autocommit=True, connect_timeout=self._connect_timeout
            )
        except psycopg.Error as exc:
            raise self._unreachable(exc) from exc
        await probe.close()
        pool = self._async_pool(1, self._configure)
        try:
            await pool.open(wait=True, timeout=self._connect_timeout)
        except BaseException as exc:
            await pool.close()  # stop its reconnect attempts
            if isinstance(exc, psycopg.Error | PoolTimeout):
                raise self._unreachable(exc) from exc
            raise
        self._pool = pool
        if self._auto_migrate is None:
            return
        try:
            if self._auto_migrate:
                await self.migrate()
            else:
                await self.require_migrated()
        except BaseException:
            await self.close()
            raise

    def _unreachable(self, exc: BaseException) -> BackendUnavailableError:
        reason = redact_message(one_line(str(exc)), self.url)
        return BackendUnavailableError(f"cannot connect to {redact_url(self.url)}: {reason}")

    async def close(self) -> None:
        pools = [p for p in (self._claim_pool, self._pool) if p is not None]
        self._claim_pool = self._pool = None
        for pool in pools:
            await self._close_pool(pool)
        with self._sync_lock:
            sync_pool, self._sync_pool = self._sync_pool, None
        if sync_pool is not None:
            await asyncio.to_thread(sync_pool.close)

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

    async def migrate(self) -> list[int]:
        async with self._connection() as conn:
            return await apply_migrations(conn, self.schema, self.sql)

    async def require_migrated(self) -> None:
        async with self._connection() as conn:
            await require_migrated(
                conn, self.sql, f'schema "{self.schema}" at {redact_url(self.url)}'
            )

    async def destroy(self) -> None:
        async with self.pool.connection() as conn:
            await conn.execute(
                queries.compose("drop schema if exists {schema} cascade", self.schema)
            )

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

    # -- enqueue ---------------------------------------------------------

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
        _check_async(connection)
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
        _check_sync(connection)
        if not params.tasks:
            return []
        if not may_raise(params.tasks):
            return scripts.run_sync(connection, scripts.insert(self.sql, params.tasks, params.now))
        with connection.transaction():  # a savepoint, as in enqueue_in
            return scripts.run_sync(connection, scripts.insert(self.sql, params.tasks, params.now))

    # -- messages --------------------------------------------------------

    async def send(self, params: SendParams) -> list[int]:
        if not params.deliveries:
            return []
        async with self._connection() as conn, conn.transaction():
            return await self._send_on(conn, params)

    async def send_in(self, params: SendParams, connection: Any) -> list[int]:
        _check_async(connection)
        if not params.deliveries:
            return []
        return await self._send_on(connection, params)

    async def _send_on(self, conn: AsyncConnection[Any], params: SendParams) -> list[int]:
        return await scripts.run(conn, scripts.send(self.sql, params.deliveries, params.now))

    def send_in_sync(self, params: SendParams, connection: Any) -> list[int]:
        _check_sync(connection)
        if not params.deliveries:
            return []
        return scripts.run_sync(connection, scripts.send(self.sql, params.deliveries, params.now))

    async def inbox(self, task_id: int) -> list[Message]:
        return [message_row(r) for r in await self._fetchall("inbox", {"id": task_id})]

    # -- claim, heartbeat, finish ---------------------------------------

    async def claim(self, params: ClaimParams) -> list[ClaimedTask]:
        """Claims run on the claim pool, where each statement is prepared at
        once and planned once per connection. PostgreSQL would otherwise plan
        the claim anew at every execution: a generic plan knows nothing of
        the arrays and limit it gets, and guesses it costlier than a plan for
        one queue and a known limit. Planning cost more than running the
        claim (a third of a millisecond, on every claim). The generic plans
        are the ones the plan guard tests check."""
        if params.limit <= 0 or not params.names or not params.queues:
            return []
        args = {
            "now": params.now,
            "worker_id": params.worker_id,
            "names": list(params.names),
            "queues": list(params.queues),
            "limit": params.limit,
            "lease": params.lease,
            "inbox_names": list(params.inbox_names),
        }
        with self._sweep.turn() as sweep:
            return await self._claim(params, args, sweep)

    async def _claim(
        self, params: ClaimParams, args: Mapping[str, Any], sweep: bool
    ) -> list[ClaimedTask]:
        async with self._connection(await self.claim_pool()) as conn:
            if sweep:
                quarantined = await (await conn.execute(self.sql["quarantine"], args)).fetchall()
                if quarantined:
                    log.error(
                        "failed %d tasks whose attempt counters stand at their limit: %s",
                        len(quarantined),
                        ", ".join(str(r[0]) for r in quarantined),
                    )
            statement = self.sql["claim_reclaim" if sweep else "claim"]
            # While keyed tasks wait, plain and keyed tasks take turns at being
            # claimed first: neither kind can keep a busy worker from the other.
            self._keyed_first = keyed_first = self._keyed_active and not self._keyed_first
            rows = await self._claim_keyed(conn, args, params.limit) if keyed_first else []
            if len(rows) < params.limit:
                left = {**args, "limit": params.limit - len(rows)}
                # Rows in binary: their timestamps load without text parsing.
                plain = await (await conn.execute(statement, left, binary=True)).fetchall()
                # claim says whether keys wait in its last column; claim_reclaim does not.
                waiting: bool | None = None
                if not sweep:
                    waiting = bool(plain[0][-1])
                    plain = [row[:-1] for row in plain if row[0] is not None]
                # Keys are looked for when they were seen last time, when the
                # plain claim comes back short, and at each sweep: a keyed
                # task waits at most a poll interval behind a plain backlog.
                look = self._keyed_active or sweep or len(plain) < left["limit"]
                rows += plain
                if not keyed_first and look and len(rows) < params.limit:
                    rows += await self._claim_keyed(conn, args, params.limit - len(rows), waiting)
        worker = params.worker_id
        claimed, unread = claimed_rows(rows, lambda row: claimed_task(row, worker), worker)
        if unread:
            await self._set_aside(worker, unread)
        return claimed

    async def _set_aside(self, worker_id: str, unread: Sequence[Unread]) -> None:
        """Claimed rows that do not read end ``failed`` (``CorruptTask``),
        each fenced by its token, so that the rest of the claim runs and they
        are not claimed again. Never raises: a row left as it is waits out
        its lease."""
        failures = [c for c in (bad.completion() for bad in unread) if c is not None]
        if not failures:
            return
        try:
            await self.finish(FinishParams(worker_id, failures))
        except Exception as exc:
            log.error("claimed rows that do not read were not set aside: %s", exc)

    async def _claim_keyed(
        self,
        conn: AsyncConnection[Any],
        args: Mapping[str, Any],
        limit: int,
        waiting: bool | None = None,
    ) -> list[tuple[Any, ...]]:
        """Claim up to ``limit`` tasks with concurrency keys, if any key has
        pending tasks (``waiting``, when the plain claim said; else asked
        here): in one transaction, lock key rows, then claim (see
        ``lock_keys`` and ``claim_keyed`` in sql/flow.sql)."""
        if not self._keyed_active:
            if waiting is None:
                found = await (await conn.execute(self.sql["keys_waiting"])).fetchone()
                waiting = bool(found and found[0])
            self._keyed_active = waiting
            if not waiting:
                return []
        async with conn.transaction():
            scan = {"key_scan": key_scan(limit)}
            locked = await (await conn.execute(self.sql["lock_keys"], scan)).fetchall()
            keys = [row[0] for row in locked]
            if not keys:
                # No key row, or every one held by another claim: look again
                # when the probe says so.
                self._keyed_active = False
                return []
            keyed = {**args, "keys": keys, "limit": limit}
            claimed = await conn.execute(self.sql["claim_keyed"], keyed, binary=True)
            return await claimed.fetchall()

    async def heartbeat(self, params: HeartbeatParams) -> HeartbeatResult:
        tokens = list(params.tokens)
        rows = await self._fetchall(
            "heartbeat",
            {
                "now": params.now,
                "worker_id": params.worker_id,
                "ids": [t.task_id for t in tokens],
                "attempts": [t.attempt for t in tokens],
                "lease": params.lease,
            },
        )
        # A row without a task is there only when the worker is not registered.
        by_token = {(int(r[0]), int(r[1])): r for r in rows if r[0] is not None}
        live = {t for t in tokens if by_token[(t.task_id, t.attempt)][2]}
        return HeartbeatResult(
            renewed=frozenset(t for t in live if by_token[(t.task_id, t.attempt)][3]),
            lost=frozenset(tokens) - live,
            cancel_requested=frozenset(t for t in live if by_token[(t.task_id, t.attempt)][4]),
            registered=len(by_token) == len(rows),
        )

    async def cancel_requested(
        self, worker_id: str, tokens: Sequence[LeaseToken]
    ) -> frozenset[LeaseToken]:
        if not tokens:
            return frozenset()
        args = {
            "worker_id": worker_id,
            "ids": [t.task_id for t in tokens],
            "attempts": [t.attempt for t in tokens],
        }
        found = {(int(r[0]), int(r[1])) for r in await self._fetchall("cancel_requested", args)}
        return frozenset(t for t in tokens if (t.task_id, t.attempt) in found)

    async def finish(self, params: FinishParams) -> FinishResult:
        completions = list(params.completions)
        if not completions:
            return FinishResult(frozenset(), frozenset())
        if has_effects(completions):
            async with self._connection() as conn:
                if spawning(completions):
                    async with conn.transaction():
                        finished = await record_with_effects(
                            conn, self.sql, params.worker_id, completions, params.now
                        )
                else:
                    finished = await self._record_piped(conn, params)
                done = await applied(finished)
        else:
            name, args = finish_statement(params.worker_id, completions, params.now)
            rows = await self._fetchall(name, args)
            done = {(int(r[0]), int(r[1])) for r in rows}
        tokens = [c.token for c in completions]
        return FinishResult(
            applied=frozenset(t for t in tokens if (t.task_id, t.attempt) in done),
            rejected=frozenset(t for t in tokens if (t.task_id, t.attempt) not in done),
        )

    async def _record_piped(
        self,
        conn: AsyncConnection[Any],
        params: FinishParams,
    ) -> AsyncCursor[Any] | None:
        """Completions with effects in one pipeline from BEGIN to COMMIT: BEGIN
        goes out with the guard and the locks, COMMIT with the effects and the
        finish, two round trips in all. (psycopg's ``transaction()`` syncs the
        pipeline as it enters and as it leaves: two more.) The finish's rows
        are read after the commit: the transaction has failed if a holder of
        its lease is missing from them (``fence_check``)."""
        try:
            async with conn.pipeline():
                await conn.execute(b"begin")
                finished = await record_with_effects(
                    conn, self.sql, params.worker_id, params.completions, params.now
                )
                await conn.execute(b"commit")
            return finished
        except BaseException:
            # A failed statement skipped the COMMIT: the transaction is still open.
            with contextlib.suppress(psycopg.Error):
                await conn.rollback()
            raise

    async def begin_attempt_transaction(self, worker_id: str) -> PostgresTransaction:
        conn = await self.pool.getconn()
        try:
            await conn.execute(BEGIN_UNBOUND_ATTEMPT)
        except BaseException:
            await self.pool.putconn(conn)
            raise
        return PostgresTransaction(self, conn, worker_id)

    def begin_attempt_transaction_sync(self, worker_id: str) -> PostgresSyncTransaction:
        conn = self.sync_pool.getconn()
        try:
            conn.execute(BEGIN_ATTEMPT)
        except BaseException:
            self.sync_pool.putconn(conn)
            raise
        return PostgresSyncTransaction(self, conn, worker_id)

    # -- control ---------------------------------------------------------

    async def _transition(
        self, name: str, task_id: int, now: datetime | None, what: str
    ) -> TaskState:
        rows = await self._fetchall(name, {"id": task_id, "now": now})
        if rows:
            return TaskState(rows[0][0])
        current = await self._fetchall("task_state", {"id": task_id})
        return transition_result(task_id, what, None, current[0][0] if current else None)

    async def cancel(self, task_id: int, now: datetime | None = None) -> TaskState:
        return await self._transition("cancel", task_id, now, "cancel")

    async def retry(self, task_id: int, now: datetime | None = None) -> TaskState:
        return await self._transition("retry", task_id, now, "retry")

    # -- reads -----------------------------------------------------------

    async def get_task(self, task_id: int, with_attempts: bool = True) -> Task | None:
        async with self._connection() as conn:
            cursor = await conn.execute(self.sql["get_task"], {"id": task_id})
            row = await cursor.fetchone()
            if row is None:
                return None
            attempts: tuple[Attempt, ...] = ()
            if with_attempts:
                cursor = await conn.execute(self.sql["get_attempts"], {"id": task_id})
                attempts = tuple(attempt_row(r) for r in await cursor.fetchall())
        return task_row(row, attempts)

    async def count_tasks(self) -> list[TaskCount]:
        rows = await self._fetchall_scanning("count_tasks", {})
        return [TaskCount(TaskState(r[0]), r[1], r[2], r[3]) for r in rows]

    async def count_unfinished(self, work: WorkFilter) -> int:
        rows = await self._fetchall(
            "count_unfinished",
            {"names": list(work.names), "queues": list(work.queues), "now": work.now},
        )
        return int(rows[0][0])

    async def next_due_at(self, queues: Sequence[str]) -> datetime | None:
        rows = await self._fetchall("next_run_at", {"queues": list(queues)})
        value = rows[0][0] if rows else None
        return value if isinstance(value, datetime) else None

    # -- workers ---------------------------------------------------------

    async def register_worker(self, info: WorkerInfo) -> None:
        async with self._connection() as conn:
            await conn.execute(
                self.sql["register_worker"],
                {
                    "id": info.id,
                    "host": info.host,
                    "pid": info.pid,
                    "queues": list(info.queues),
                    "concurrency": info.concurrency,
                    "tasks": list(info.tasks),
                    "beat_seconds": info.beat_seconds,
                },
            )

    async def stop_worker(self, worker_id: str) -> None:
        async with self._connection() as conn:
            await conn.execute(self.sql["stop_worker"], {"id": worker_id})

    async def pending_migrations(self) -> list[Migration]:
        async with self._connection() as conn:
            return await pending_migrations(conn, self.schema, self.sql)

    async def list_workers(self) -> list[WorkerInfo]:
        rows = await self._fetchall("list_workers", {})
        return [
            WorkerInfo(
                id=r[0],
                host=r[1],
                pid=r[2],
                queues=tuple(r[3]),
                concurrency=r[4],
                started_at=r[5],
                last_seen_at=r[6],
                stopped_at=r[7],
                tasks=tuple(r[8]),
                beat_seconds=r[9],
            )
            for r in rows
        ]

    # -- wake-ups --------------------------------------------------------

    def turn_lock(self, kind: str) -> turns.PostgresTurnLock:
        """The wake-up turn of the workers of ``kind`` (see :mod:`.turns`)."""
        return turns.PostgresTurnLock(
            self.url, self.sql["turn_take"], self.sql["turn_give"], turns.kind_key(kind)
        )

    def wakeups(
        self, queues: Sequence[str], handoffs_for: tuple[str, str] | None = None
    ) -> AsyncIterator[Wakeup]:
        """Queue names from the wake-up channel, cancel hints (task ids) from
        the cancel channel, hand-offs to ``handoffs_for`` from its own (see
        :mod:`.listen`)."""
        cancels = queries.cancel_channel(self.schema)
        return listen.wakeups(self.url, self.channel, cancels, queues, handoffs_for)

    # -- hand-offs -------------------------------------------------------

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
