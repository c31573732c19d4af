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
import functools
import logging
import threading
import weakref
from collections.abc import AsyncIterator, Mapping, Sequence
from datetime import datetime
from typing import Any, LiteralString

import psycopg
from psycopg import AsyncConnection, sql
from psycopg_pool import AsyncConnectionPool, ConnectionPool, PoolTimeout

from conveyor import payload as codec
from conveyor.backends.postgres import queries
from conveyor.backends.postgres.migrate import apply_migrations
from conveyor.backends.protocol import (
    Capability,
    ClaimedTask,
    ClaimParams,
    Completion,
    EnqueueParams,
    FinishParams,
    FinishResult,
    HeartbeatParams,
    HeartbeatResult,
    NewTask,
    TaskFilter,
    WorkerInfo,
    WorkFilter,
)
from conveyor.errors import (
    BackendError,
    BackendUnavailableError,
    ConfigurationError,
    InvalidTransitionError,
    TaskNotFoundError,
)
from conveyor.model import (
    Attempt,
    LeaseToken,
    Outcome,
    RetryPolicy,
    Task,
    TaskState,
)

log = logging.getLogger("conveyor.postgres")

DEFAULT_SCHEMA = "conveyor"
DEFAULT_POOL_SIZE = 10
CONNECT_TIMEOUT = 30.0
# Every fence relies on READ COMMITTED re-checking a row after a concurrent
# update; a server whose default is stricter would fail those statements.
READ_COMMITTED = "set default_transaction_isolation to 'read committed'"
BEGIN_ATTEMPT = "begin isolation level read committed"
RECONNECT_MIN_DELAY = 0.1
RECONNECT_MAX_DELAY = 5.0


@functools.lru_cache(maxsize=256)
def _retry_json(policy: RetryPolicy) -> str:
    return codec.encode(policy.to_json())


@functools.lru_cache(maxsize=256)
def _retry_policy(text: str) -> RetryPolicy:
    return RetryPolicy.from_json(codec.decode(text))


def _stored_retry_policy(text: str, max_attempts: int) -> RetryPolicy:
    """The stored policy; one that does not decode (written around conveyor)
    must not lose a claimed batch: the defaults apply, with the row's budget."""
    try:
        return _retry_policy(text)
    except Exception:
        log.error("a task's stored retry policy does not decode: %r; using defaults", text)
        return RetryPolicy(max_attempts=max(max_attempts, 1))


def _options(task: NewTask) -> tuple[Any, ...]:
    return (
        task.name,
        task.queue,
        task.priority,
        task.max_attempts,
        task.retry,
        task.run_at,
        task.delay,
        task.timeout,
        task.lease,
    )


def enqueue_statement(params: EnqueueParams) -> tuple[str, dict[str, Any]]:
    """The cheapest ``enqueue`` statement for these tasks, and its arguments."""
    tasks = params.tasks
    first = _options(tasks[0])
    if len(tasks) > 1 and all(_options(t) == first for t in tasks):
        head = tasks[0]
        return "enqueue_uniform", {
            "now": params.now,
            "name": head.name,
            "queue": head.queue,
            "priority": head.priority,
            "run_at": head.run_at,
            "delay": head.delay,
            "max_attempts": head.max_attempts,
            "retry_policy": _retry_json(head.retry),
            "timeout": head.timeout,
            "lease": head.lease,
            "payloads": "[" + ",".join(t.payload for t in tasks) + "]",
        }
    return "enqueue", {
        "now": params.now,
        "names": [t.name for t in tasks],
        "queues": [t.queue for t in tasks],
        "payloads": [t.payload for t in tasks],
        "priorities": [t.priority for t in tasks],
        "run_ats": [t.run_at for t in tasks],
        "delays": [t.delay for t in tasks],
        "max_attempts": [t.max_attempts for t in tasks],
        "retry_policies": [_retry_json(t.retry) for t in tasks],
        "timeouts": [t.timeout for t in tasks],
        "leases": [t.lease for t in tasks],
    }


def finish_args(
    worker_id: str, completions: Sequence[Completion], now: datetime | None
) -> dict[str, Any]:
    """Column arrays for the ``finish`` statement."""
    return {
        "now": now,
        "worker_id": worker_id,
        "ids": [c.token.task_id for c in completions],
        "attempts": [c.token.attempt for c in completions],
        "states": [c.next_state.value for c in completions],
        "outcomes": [c.outcome.value for c in completions],
        "delays": [c.retry_delay for c in completions],
        "results": [c.result for c in completions],
        "error_types": [c.error.type if c.error else None for c in completions],
        "error_messages": [c.error.message if c.error else None for c in completions],
        "tracebacks": [c.error.traceback if c.error else None for c in completions],
    }


def _configure_sync(conn: psycopg.Connection[Any]) -> None:
    conn.execute(READ_COMMITTED)


def _ordered_ids(rows: list[tuple[Any, ...]]) -> list[int]:
    # Identity values are drawn in insertion order within one statement, so
    # ascending ids are the input order.
    return sorted(int(row[0]) for row in rows)


class PostgresTransaction:
    """An attempt's own transaction on a pooled connection (see protocol)."""

    def __init__(
        self, backend: PostgresBackend, conn: AsyncConnection[Any], worker_id: str
    ) -> None:
        self._backend = backend
        self._conn = conn
        self._worker_id = worker_id
        self._done = False

    @property
    def connection(self) -> AsyncConnection[Any]:
        return self._conn

    async def commit_success(self, completion: Completion) -> bool:
        if self._done:
            raise BackendError("the attempt transaction is already closed")
        try:
            cursor = await self._conn.execute(
                self._backend.sql["finish"],
                finish_args(self._worker_id, [completion], None),
            )
            applied = await cursor.fetchall()
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
            await self._backend.pool.putconn(self._conn)


class PostgresSyncTransaction:
    """An attempt's transaction on a synchronous connection (thread handlers)."""

    def __init__(
        self, backend: PostgresBackend, conn: psycopg.Connection[Any], worker_id: str
    ) -> None:
        self._backend = backend
        self._conn = conn
        self._worker_id = worker_id
        self._pid = conn.info.backend_pid
        self._done = False

    @property
    def connection(self) -> psycopg.Connection[Any]:
        return self._conn

    async def commit_success(self, completion: Completion) -> bool:
        return await asyncio.to_thread(self._commit_success, completion)

    async def rollback(self) -> None:
        await asyncio.to_thread(self._finish, "rollback")

    async def abandon(self) -> None:
        # The handler's thread may be inside a statement on this connection: a
        # rollback from here would race it, and leave its next statement to
        # autocommit. End the session on the server instead; the connection is
        # never returned to the pool.
        if self._done:
            return
        self._done = True
        async with self._backend.pool.connection() as conn:
            await conn.execute("select pg_terminate_backend(%s)", (self._pid,))

    def _commit_success(self, completion: Completion) -> bool:
        if self._done:
            raise BackendError("the attempt transaction is already closed")
        try:
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


class PostgresBackend:
    """Tasks in PostgreSQL tables of one schema (default ``conveyor``)."""

    capabilities = frozenset(
        {
            Capability.TRANSACTIONAL_ENQUEUE,
            Capability.ATTEMPT_TRANSACTION,
            Capability.NOTIFICATIONS,
        }
    )

    def __init__(
        self,
        url: str,
        *,
        schema: str = DEFAULT_SCHEMA,
        pool_size: int = DEFAULT_POOL_SIZE,
        migrate: bool = True,
    ) -> None:
        self.url = url
        self.schema = queries.validate_schema(schema)
        self.sql: Mapping[str, bytes] = queries.load(self.schema)
        self.channel = f"conveyor_{self.schema}"
        self._auto_migrate = migrate
        if pool_size < 1:
            raise ConfigurationError("pool_size must be at least 1")
        self._pool_size = pool_size
        self._pool: AsyncConnectionPool[AsyncConnection[Any]] | None = None
        self._sync_pool: ConnectionPool[psycopg.Connection[Any]] | None = None
        self._sync_lock = threading.Lock()
        self._connections: weakref.WeakSet[AsyncConnection[Any]] = weakref.WeakSet()

    @property
    def pool(self) -> AsyncConnectionPool[AsyncConnection[Any]]:
        if self._pool is None:
            raise BackendError("the backend is not open")
        return self._pool

    async def _configure(self, conn: AsyncConnection[Any]) -> None:
        await conn.execute(READ_COMMITTED)
        self._connections.add(conn)

    @property
    def sync_pool(self) -> ConnectionPool[psycopg.Connection[Any]]:
        """A synchronous pool, opened on first use (thread handlers' transactions)."""
        with self._sync_lock:
            if self._sync_pool is None:
                pool: ConnectionPool[psycopg.Connection[Any]] = ConnectionPool(
                    self.url,
                    min_size=0,
                    max_size=self._pool_size,
                    kwargs={"autocommit": True},
                    configure=_configure_sync,
                    open=False,
                    name=f"conveyor-{self.schema}-sync",
                )
                pool.open()
                self._sync_pool = pool
            return self._sync_pool

    async def open(self) -> None:
        if self._pool is not None:
            return
        pool: AsyncConnectionPool[AsyncConnection[Any]] = AsyncConnectionPool(
            self.url,
            min_size=1,
            max_size=self._pool_size,
            kwargs={"autocommit": True},
            configure=self._configure,
            open=False,
            name=f"conveyor-{self.schema}",
        )
        try:
            await pool.open(wait=True, timeout=CONNECT_TIMEOUT)
        except BaseException as exc:
            await pool.close()  # stop its reconnect attempts
            if isinstance(exc, psycopg.Error | PoolTimeout):
                raise BackendError(f"cannot connect to PostgreSQL: {exc}") from exc
            raise
        self._pool = pool
        if self._auto_migrate:
            await self.migrate()

    async def close(self) -> None:
        if self._pool is not None:
            pool, self._pool = self._pool, None
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
        with self._sync_lock:
            sync_pool, self._sync_pool = self._sync_pool, None
        if sync_pool is not None:
            await asyncio.to_thread(sync_pool.close)

    async def migrate(self) -> list[int]:
        async with self.pool.connection() as conn:
            return await apply_migrations(conn, self.schema)

    async def destroy(self) -> None:
        async with self.pool.connection() as conn:
            await conn.execute(
                queries.compose("drop schema if exists {schema} cascade", self.schema)
            )

    @contextlib.asynccontextmanager
    async def _connection(self) -> AsyncIterator[AsyncConnection[Any]]:
        """A pooled connection; psycopg errors come out as conveyor's."""
        try:
            async with self.pool.connection() as conn:
                yield conn
        except (psycopg.OperationalError, psycopg.InterfaceError, PoolTimeout) as exc:
            raise BackendUnavailableError(f"PostgreSQL is unavailable: {exc}") from exc
        except psycopg.Error as exc:
            raise BackendError(f"PostgreSQL refused the statement: {exc}") from exc

    async def _fetchall(self, name: str, args: Mapping[str, Any]) -> list[tuple[Any, ...]]:
        async with self._connection() as conn:
            cursor = await conn.execute(self.sql[name], args)
            return await cursor.fetchall()

    # -- enqueue ---------------------------------------------------------

    async def enqueue(self, params: EnqueueParams, connection: Any = None) -> list[int]:
        if not params.tasks:
            return []
        name, args = enqueue_statement(params)
        if connection is None:
            return _ordered_ids(await self._fetchall(name, args))
        if not isinstance(connection, AsyncConnection):
            raise ConfigurationError(
                "the async API takes a psycopg AsyncConnection; "
                "pass a sync psycopg Connection to the sync API"
            )
        cursor = await connection.execute(self.sql[name], args)
        return _ordered_ids(await cursor.fetchall())

    def enqueue_sync(self, params: EnqueueParams, connection: Any) -> list[int]:
        if not isinstance(connection, psycopg.Connection):
            raise ConfigurationError(
                "the sync API takes a psycopg Connection; pass an AsyncConnection to the async API"
            )
        if not params.tasks:
            return []
        name, args = enqueue_statement(params)
        cursor = connection.execute(self.sql[name], args)
        return _ordered_ids(cursor.fetchall())

    # -- claim, heartbeat, finish ---------------------------------------

    async def claim(self, params: ClaimParams) -> list[ClaimedTask]:
        if params.limit <= 0 or not params.names or not params.queues:
            return []
        rows = await self._fetchall(
            "claim",
            {
                "now": params.now,
                "worker_id": params.worker_id,
                "names": list(params.names),
                "queues": list(params.queues),
                "limit": params.limit,
                "lease": params.lease,
            },
        )
        return [_claimed(row, params.worker_id) for row in rows]

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
        by_token = {(int(r[0]), int(r[1])): r for r in rows}
        live = {t for t in tokens if by_token[(t.task_id, t.attempt)][2]}
        return HeartbeatResult(
            renewed=frozenset(t for t in live if by_token[(t.task_id, t.attempt)][3]),
            lost=frozenset(tokens) - live,
            cancel_requested=frozenset(t for t in live if by_token[(t.task_id, t.attempt)][4]),
        )

    async def finish(self, params: FinishParams) -> FinishResult:
        completions = list(params.completions)
        if not completions:
            return FinishResult(frozenset(), frozenset())
        rows = await self._fetchall(
            "finish", finish_args(params.worker_id, completions, params.now)
        )
        done = {(int(r[0]), int(r[1])) for r in rows}
        tokens = [c.token for c in completions]
        applied = frozenset(t for t in tokens if (t.task_id, t.attempt) in done)
        return FinishResult(applied=applied, rejected=frozenset(tokens) - applied)

    async def begin_attempt_transaction(self, worker_id: str) -> PostgresTransaction:
        conn = await self.pool.getconn()
        try:
            await conn.execute(BEGIN_ATTEMPT)
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
        if not current:
            raise TaskNotFoundError(f"no task with id {task_id}")
        raise InvalidTransitionError(f"cannot {what} task {task_id}: it is {current[0][0]}")

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
                attempts = tuple(_attempt(r) for r in await cursor.fetchall())
        return _task(row, attempts)

    async def list_tasks(self, task_filter: TaskFilter) -> list[Task]:
        rows = await self._fetchall(
            "list_tasks",
            {
                "state": task_filter.state.value if task_filter.state else None,
                "name": task_filter.name,
                "queue": task_filter.queue,
                "limit": task_filter.limit,
            },
        )
        return [_task(row, ()) for row in rows]

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
                },
            )

    async def stop_worker(self, worker_id: str) -> None:
        async with self._connection() as conn:
            await conn.execute(self.sql["stop_worker"], {"id": worker_id})

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
            )
            for r in rows
        ]

    # -- wake-ups --------------------------------------------------------

    async def wakeups(self, queues: Sequence[str]) -> AsyncIterator[str]:
        wanted = set(queues)
        listen = sql.SQL("listen {}").format(sql.Identifier(self.channel))
        delay = RECONNECT_MIN_DELAY
        while True:
            try:
                conn = await AsyncConnection.connect(self.url, autocommit=True)
                async with conn:
                    await conn.execute(listen)
                    delay = RECONNECT_MIN_DELAY
                    # Anything enqueued while we were not listening is due now.
                    for queue in queues:
                        yield queue
                    async for note in conn.notifies():
                        if note.payload in wanted:
                            yield note.payload
            except psycopg.Error as exc:
                log.warning(
                    "wake-up listener lost its connection (%s); retrying in %.1fs", exc, delay
                )
                await asyncio.sleep(delay)
                delay = min(delay * 2, RECONNECT_MAX_DELAY)


def _claimed(row: tuple[Any, ...], worker_id: str) -> ClaimedTask:
    (
        task_id,
        attempt,
        name,
        queue,
        payload,
        spent,
        max_attempts,
        retry,
        timeout,
        lease,
        expires,
    ) = row
    return ClaimedTask(
        token=LeaseToken(task_id=task_id, attempt=attempt, worker_id=worker_id),
        name=name,
        queue=queue,
        payload=payload,
        spent=spent,
        max_attempts=max_attempts,
        retry=_stored_retry_policy(retry, max_attempts),
        timeout=timeout,
        lease=lease,
        lease_expires_at=expires,
    )


def _attempt(row: tuple[Any, ...]) -> Attempt:
    return Attempt(
        task_id=row[0],
        number=row[1],
        worker_id=row[2],
        outcome=Outcome(row[3]),
        started_at=row[4],
        finished_at=row[5],
        error_type=row[6],
        error_message=row[7],
        traceback=row[8],
    )


def _task(row: tuple[Any, ...], attempts: tuple[Attempt, ...]) -> Task:
    (
        task_id,
        name,
        queue,
        payload,
        state,
        priority,
        run_at,
        attempt,
        max_attempts,
        retry,
        timeout,
        lease,
        result,
        created_at,
        finished_at,
        worker_id,
        lease_expires_at,
        cancel_requested,
    ) = row
    return Task(
        id=task_id,
        name=name,
        queue=queue,
        payload=codec.decode(payload),
        state=TaskState(state),
        priority=priority,
        run_at=run_at,
        attempt=attempt,
        max_attempts=max_attempts,
        retry=_stored_retry_policy(retry, max_attempts),
        timeout=timeout,
        lease=lease,
        result=codec.decode(result) if result is not None else None,
        created_at=created_at,
        finished_at=finished_at,
        worker_id=worker_id,
        lease_expires_at=lease_expires_at,
        cancel_requested=cancel_requested,
        attempts=attempts,
    )
