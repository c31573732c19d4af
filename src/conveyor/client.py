"""The Client: everything that talks to a store, and nothing that runs tasks.

A client holds one open backend per event loop and stores, reads and
controls tasks through it: enqueue (of tasks already checked and encoded by
their definitions), get, list, count, cancel, retry, send, inbox, workers,
migrate; its controls are :mod:`conveyor.controls`, its views of the whole
store (clock, overview, activity) :mod:`conveyor.reads`. It knows no
handlers: :class:`conveyor.App` builds on it with the registry of tasks,
and task definitions, handles and the worker take a client, never the app.

Every operation has a sync form (``get``) and an async form (``get_async``).
Async calls use the backend bound to the calling event loop; sync calls go
through a private loop thread (:mod:`conveyor.portal`).
"""

from __future__ import annotations

import time
import types
from collections.abc import Awaitable, Callable, Iterator, Sequence
from typing import Any

from conveyor import payload as codec
from conveyor.backends import Backend
from conveyor.backends.capabilities import Inspector, TransactionalEnqueue, capability_of
from conveyor.backends.params import Delivery, EnqueueParams, NewTask, SendParams
from conveyor.backends.protocol import Capability
from conveyor.connections import Connections
from conveyor.controls import Controls
from conveyor.errors import ConfigurationError
from conveyor.events import EventBus, EventsMiddleware
from conveyor.handle import TaskHandle
from conveyor.middleware import EnqueueScope, Middleware, Middlewares
from conveyor.model import (
    DEFAULT_MAX_PAYLOAD_BYTES,
    Message,
    TaskState,
    check_idempotency_key,
    check_name,
    findable,
    stored_id,
)
from conveyor.reads import Reads

ENQUEUE_CHUNK = 1000
"""Tasks per chunk of an ``enqueue_many`` without a caller's connection."""
ENQUEUE_FIRST_CHUNK = 125
"""The first chunk's size; each next chunk doubles, up to ``ENQUEUE_CHUNK``.
Only the first is encoded before the server has work: a small one starts
the server early, and the larger ones after it save round trips."""

Encoder = Callable[[int, int], list[NewTask]]
"""``encode(start, end)``: the checked, encoded tasks of items ``start`` to
``end`` of a batch (no I/O; raises PayloadError or ConfigurationError)."""
InlineRunner = Callable[[Sequence[str]], Awaitable[None]]
TIME_CHECK_SECONDS = 0.002
"""How long :func:`check_time_moves` watches a replaced ``time.monotonic``."""


def check_time_moves() -> None:
    """Raise ConfigurationError if ``time.monotonic`` has been replaced by a
    clock that does not follow real time (frozen or stepped, as freezegun's
    ``freeze_time()`` makes it): a worker in this process paces its claims
    and timers on it and would wait for ever. Costs nothing when it is the
    system's own; else it watches it for ``TIME_CHECK_SECONDS``."""
    if isinstance(time.monotonic, types.BuiltinFunctionType):
        return
    system = getattr(time, "clock_gettime", None)  # absent on Windows: only frozen is caught
    real_start, start = system(time.CLOCK_MONOTONIC) if system else 0.0, time.monotonic()
    time.sleep(TIME_CHECK_SECONDS)
    moved = time.monotonic() - start
    real = system(time.CLOCK_MONOTONIC) - real_start if system else moved
    if not 0 < moved <= real + 0.05:
        raise ConfigurationError(
            "time.monotonic() does not follow real time here (freezegun's freeze_time() "
            "stops or steps it): a worker in this process would wait for ever. Move the time of "
            "tasks with conveyor.testing.FakeClock (the conveyor_clock fixture), or use "
            "freeze_time(..., tick=True) or time-machine, whose clocks keep running"
        )


def chunk_bounds(total: int) -> Iterator[tuple[int, int]]:
    """``(start, end)`` of each chunk of ``total`` tasks: ``ENQUEUE_FIRST_CHUNK``
    first, doubling up to ``ENQUEUE_CHUNK``."""
    start, size = 0, ENQUEUE_FIRST_CHUNK
    while start < total:
        end = min(start + size, total)
        yield start, end
        start, size = end, min(size * 2, ENQUEUE_CHUNK)


class Client(Connections, Controls, Reads):
    """A connection to one store (see the module docstring).

    ``url`` is a backend URL (``postgresql://…``, ``sqlite:///path.db``,
    ``memory://name``); None reads ``CONVEYOR_URL``, else uses SQLite in
    ``./conveyor.db``. ``schema`` names the PostgreSQL schema (default
    ``conveyor``, or ``CONVEYOR_SCHEMA``). ``max_payload_bytes`` caps
    encoded payloads and messages (default 1 MiB). ``pool_size`` sizes a
    PostgreSQL pool.

    ``migrate`` (default True): opening the store applies its pending
    migrations, so the first use creates it; a current store is only read
    (one query, no DDL). False: this client and its workers never create
    or upgrade the store; opening one that is missing or behind raises
    StoreNotReadyError (``conveyor migrate`` does it, at deploy, with a role
    that may run DDL; see docs/operations.md for the grants of each role).
    """

    def __init__(
        self,
        url: str | None = None,
        *,
        schema: str | None = None,
        max_payload_bytes: int = DEFAULT_MAX_PAYLOAD_BYTES,
        pool_size: int | None = None,
        migrate: bool = True,
    ) -> None:
        super().__init__(url, schema=schema, pool_size=pool_size, migrate=migrate)
        self.max_payload_bytes = max_payload_bytes
        self.events = EventBus()
        """This client's events, and its workers' (see :mod:`conveyor.events`)."""
        self._middleware = Middlewares([EventsMiddleware(self.events)])
        """Around this client's enqueues and sends and its workers' attempts:
        its events first (see :meth:`add_middleware`)."""
        self.inline_runner: InlineRunner | None = None
        """Runs the tasks of these queues to the end, on a backend with
        ``Capability.INLINE`` (the App sets it: a client has no handlers)."""
        self._inline_running = False

    def _transactional(self, backend: Backend) -> TransactionalEnqueue:
        found = capability_of(backend, Capability.TRANSACTIONAL_ENQUEUE)
        if found is None:
            raise ConfigurationError(
                f"the {type(backend).__name__} cannot enqueue or send inside a caller's "
                "transaction (PostgreSQL and SQLite can)"
            )
        return found

    async def _inspector(self) -> Inspector:
        backend = await self.backend()
        found = capability_of(backend, Capability.INSPECT)
        if found is None:
            raise ConfigurationError(f"the {type(backend).__name__} cannot list or count tasks")
        return found

    # -- middleware ----------------------------------------------------------

    def add_middleware(self, middleware: Middleware) -> None:
        """Install ``middleware`` around this client's enqueues and sends and
        its workers' attempts (see :mod:`conveyor.middleware`), inside the
        ones installed before it. Installing one twice does nothing."""
        if not any(m is middleware for m in self._middleware.items):
            self._middleware = self._middleware.with_(middleware)

    def remove_middleware(self, middleware: Middleware) -> None:
        """Uninstall ``middleware`` (nothing if it is not installed)."""
        self._middleware = self._middleware.without(middleware)

    @property
    def middleware(self) -> tuple[Middleware, ...]:
        """The installed middleware, outermost first (this client's events first)."""
        return self._middleware.items

    @property
    def middlewares(self) -> Middlewares:
        """The installed middleware, composed (what the workers run through)."""
        return self._middleware

    # -- enqueue -------------------------------------------------------------

    def enqueue_new(self, tasks: Sequence[NewTask], connection: Any = None) -> list[TaskHandle]:
        """Store tasks already checked and encoded (``TaskDef.new_tasks``,
        ``Workflow.new_workflow``), all or none; handles in order, once
        durable. With ``connection`` (a sync native connection), inside the
        caller's transaction: stored if it commits. A task or queue name
        that breaks the name rule raises ConfigurationError before any I/O."""
        checked_names(tasks)
        if connection is not None:
            statements = self._transactional(self._statements)
            with self._middleware.enqueue(tasks) as scope:
                scope.stamp(tasks)
                ids = statements.enqueue_in_sync(EnqueueParams(tasks=tasks), connection)
                scope.stored(ids)
            return self.handles(ids)
        return self.portal.run(self.enqueue_new_async(tasks))

    async def enqueue_new_async(
        self, tasks: Sequence[NewTask], connection: Any = None
    ) -> list[TaskHandle]:
        """Async form of :meth:`enqueue_new` (``connection``: an async native
        connection, or a ``sqlite3.Connection`` used on the caller's thread)."""
        checked_names(tasks)
        with self._middleware.enqueue(tasks) as scope:
            backend = await self.backend()
            scope.stamp(tasks)
            params = EnqueueParams(tasks=tasks)
            if connection is not None:
                ids = await self._transactional(backend).enqueue_in(params, connection)
            else:
                ids = await backend.enqueue(params)
            scope.stored(ids)
        return await self._stored(backend, ids, {t.queue for t in tasks})

    def enqueue_encoded(
        self, encode: Encoder, total: int, connection: Any = None
    ) -> list[TaskHandle]:
        """Store a batch of ``total`` tasks that ``encode`` checks and encodes;
        all or none; handles in order. Without ``connection``, large batches
        go in chunks (see ``chunk_bounds``) in one transaction: a backend may
        insert one chunk while the next is encoded. Every task that fails
        its check raises before anything is stored."""
        if connection is not None:
            return self.enqueue_new(encode(0, total), connection)
        return self.portal.run(self.enqueue_encoded_async(encode, total))

    async def enqueue_encoded_async(
        self, encode: Encoder, total: int, connection: Any = None
    ) -> list[TaskHandle]:
        """Async form of :meth:`enqueue_encoded`."""
        if connection is not None or total <= ENQUEUE_CHUNK:  # one statement
            return await self.enqueue_new_async(encode(0, total), connection)
        queues: set[str] = set()

        def chunks() -> Iterator[list[NewTask]]:
            for start, end in chunk_bounds(total):
                tasks = encode(start, end)
                queues.update(t.queue for t in tasks)
                yield tasks

        drawn = chunks()
        first = next(drawn)  # checked before any I/O, like a small batch whole
        with self._middleware.enqueue(first) as scope:
            backend = await self.backend()
            ids = await backend.enqueue_chunks(_stamped(_chained(first, drawn), scope))
            scope.stored(ids)
        return await self._stored(backend, ids, queues)

    def handles(self, ids: Sequence[int]) -> list[TaskHandle]:
        """Handles of the tasks with these ids."""
        return [TaskHandle(self, task_id) for task_id in ids]

    async def _stored(
        self, backend: Backend, ids: Sequence[int], queues: set[str]
    ) -> list[TaskHandle]:
        await self._run_inline(backend, queues)
        return self.handles(ids)

    async def _run_inline(self, backend: Backend, queues: set[str]) -> None:
        """Inline mode: run the tasks now. Tasks they enqueue join this run."""
        runner = self.inline_runner
        if runner is None or Capability.INLINE not in backend.capabilities:
            return
        if self._inline_running:
            return
        check_time_moves()
        self._inline_running = True
        try:
            await runner(sorted(queues))
        finally:
            self._inline_running = False

    # -- messages --------------------------------------------------------------

    def _deliveries(self, task_id: int, message: Any, key: str | None) -> SendParams:
        task_id = stored_id(task_id)
        body = codec.encode(codec.to_plain(message), self.max_payload_bytes)
        key = check_idempotency_key(key)
        return SendParams(deliveries=[Delivery(task_id, body, idempotency_key=key)])

    def send(
        self,
        task_id: int,
        message: Any,
        *,
        idempotency_key: str | None = None,
        connection: Any = None,
    ) -> int:
        """Put ``message`` (strict JSON) in coroutine task ``task_id``'s inbox
        and wake it; the message's id once durable. With ``connection`` (a
        sync native connection on a SQL backend), inside the caller's
        transaction: it is sent when the caller commits.

        ``idempotency_key`` makes the call safe to repeat: a send to this task
        with a key it already got delivers nothing and returns the first
        message's id, even if the task has since consumed it or finished.
        Repeat a send that raised BackendUnavailableError with the same key.

        Raises PayloadError (before any I/O) for a message that is not strict
        JSON or is over the payload cap, TaskNotFoundError, TaskFinishedError
        or NoInboxError (nothing is sent then).
        """
        params = self._deliveries(task_id, message, idempotency_key)
        if connection is None:
            return self.portal.run(self._send_async(params))
        statements = self._transactional(self._statements)
        with self._middleware.send(params.deliveries) as deliveries:
            return statements.send_in_sync(SendParams(deliveries), connection)[0]

    async def send_async(
        self,
        task_id: int,
        message: Any,
        *,
        idempotency_key: str | None = None,
        connection: Any = None,
    ) -> int:
        """Async form of :meth:`send` (``connection``: an async native connection)."""
        return await self._send_async(
            self._deliveries(task_id, message, idempotency_key), connection
        )

    async def _send_async(self, params: SendParams, connection: Any = None) -> int:
        with self._middleware.send(params.deliveries) as deliveries:
            return await self._send_stored(SendParams(deliveries), connection)

    async def _send_stored(self, params: SendParams, connection: Any) -> int:
        backend = await self.backend()
        if connection is not None:
            ids = await self._transactional(backend).send_in(params, connection)
        else:
            ids = await backend.send(params)
        if Capability.INLINE in backend.capabilities and self.inline_runner is not None:
            task = await backend.get_task(params.deliveries[0].task_id, with_attempts=False)
            if task is not None:
                await self._run_inline(backend, {task.queue})
        return ids[0]

    async def inbox_async(self, task_id: int) -> list[Message]:
        """The messages waiting in a task's inbox, oldest first."""
        if not findable(task_id):
            return []
        return await (await self.backend()).inbox(task_id)

    def inbox(self, task_id: int) -> list[Message]:
        """The messages waiting in a task's inbox, oldest first."""
        return self.portal.run(self.inbox_async(task_id))

    # -- inspect and control ---------------------------------------------------

    async def cancel_async(self, task_id: int) -> TaskState:
        """Cancel a task. Pending/waiting ones end ``cancelled`` now; a running
        one is stopped by its worker as soon as it hears of it, within about a
        second through the wake-up channel (at worst at its next heartbeat),
        and this returns ``in_progress``. Raises TaskNotFoundError,
        InvalidTransitionError.
        """
        return await (await self.backend()).cancel(stored_id(task_id))

    def cancel(self, task_id: int) -> TaskState:
        """Sync form of :meth:`cancel_async`."""
        return self.portal.run(self.cancel_async(task_id))

    async def retry_async(self, task_id: int) -> TaskState:
        """Run a failed or cancelled task again, with a fresh attempt budget."""
        return await (await self.backend()).retry(stored_id(task_id))

    def retry(self, task_id: int) -> TaskState:
        """Sync form of :meth:`retry_async`."""
        return self.portal.run(self.retry_async(task_id))

    async def migrate_async(self) -> list[int]:
        """Async form of :meth:`migrate`."""
        backend = self.make_backend(migrate=None)
        await backend.open()
        try:
            return await backend.migrate()
        finally:
            await backend.close()

    def migrate(self) -> list[int]:
        """Create or upgrade the schema, whatever this client's ``migrate``
        option; returns the migration versions applied (none: it was
        current, and only read)."""
        return self.portal.run(self.migrate_async())


def checked_names(tasks: Sequence[NewTask]) -> None:
    """Every task's name and queue by the name rule (see ``check_name``):
    tasks built by hand reach the store through here too."""
    for task in tasks:
        check_name("a task name", task.name)
        check_name("queue", task.queue)


def _stamped(chunks: Iterator[list[NewTask]], scope: EnqueueScope) -> Iterator[list[NewTask]]:
    """``chunks``, each stamped by the enqueue's middleware as it is drawn."""
    for tasks in chunks:
        scope.stamp(tasks)
        yield tasks


def _chained(first: list[NewTask], rest: Iterator[list[NewTask]]) -> Iterator[list[NewTask]]:
    yield first
    yield from rest
