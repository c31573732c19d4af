"""The App: the registry of tasks and the entry to enqueue, inspect and run them.

Every operation has a sync form (``enqueue``) and an async form
(``enqueue_async``). Async calls use a backend bound to the calling event
loop; sync calls go through a private loop thread (:mod:`conveyor.portal`).
"""

from __future__ import annotations

import asyncio
import atexit
import contextlib
import functools
import itertools
import os
import weakref
from collections.abc import AsyncGenerator, Callable, Iterable, Iterator, Mapping, Sequence
from datetime import datetime, timedelta
from typing import TYPE_CHECKING, Any, TypeVar, overload

from conveyor import payload as codec
from conveyor.backends import Backend, backend_from_url, resolve_url
from conveyor.backends.protocol import (
    Capability,
    Delivery,
    EnqueueParams,
    NewTask,
    SendParams,
    TaskFilter,
    WorkerInfo,
)
from conveyor.errors import ConfigurationError, DuplicateTaskError, UnknownTaskError
from conveyor.handle import TaskHandle
from conveyor.model import (
    DEFAULT_MAX_PAYLOAD_BYTES,
    DEFAULT_QUEUE,
    DEFAULT_RETRY,
    Message,
    RetryPolicy,
    Task,
    TaskState,
    batch_keys,
    check_idempotency_key,
)
from conveyor.portal import INHERITED_AT_FORK, Portal
from conveyor.task import Executor, TaskDef, TaskOptions

if TYPE_CHECKING:
    from conveyor.coroutine import Coroutine
    from conveyor.workflow import Workflow

F = TypeVar("F", bound=Callable[..., Any])
SCHEMA_ENV = "CONVEYOR_SCHEMA"
ENQUEUE_CHUNK = 1000
"""Tasks per chunk of an ``enqueue_many`` without a caller's connection."""
ENQUEUE_FIRST_CHUNK = 125
"""The first chunk's size; each next chunk doubles, up to ``ENQUEUE_CHUNK``.
Only the first is encoded before the server has work: a small one starts
the server early, and the larger ones after it save round trips."""


def chunk_bounds(total: int) -> Iterator[tuple[int, int]]:
    """``(start, end)`` of each chunk of ``total`` tasks: ``ENQUEUE_FIRST_CHUNK``
    first, doubling up to ``ENQUEUE_CHUNK``."""
    start, size = 0, ENQUEUE_FIRST_CHUNK
    while start < total:
        end = min(start + size, total)
        yield start, end
        start, size = end, min(size * 2, ENQUEUE_CHUNK)


class App:
    """Registry of tasks bound to one backend URL.

    ``url`` is a backend URL (``postgresql://…``, ``sqlite:///path.db``,
    ``memory://name``); None reads ``CONVEYOR_URL``, else uses SQLite in
    ``./conveyor.db``.
    ``schema`` names the PostgreSQL schema (default ``conveyor``).
    ``max_payload_bytes`` caps encoded payloads (default 1 MiB).
    ``allow_unregistered`` lets ``enqueue`` take names this app has no
    handler for (a producer-only app); otherwise they raise UnknownTaskError.
    """

    def __init__(
        self,
        url: str | None = None,
        *,
        schema: str | None = None,
        max_payload_bytes: int = DEFAULT_MAX_PAYLOAD_BYTES,
        allow_unregistered: bool = False,
        pool_size: int | None = None,
    ) -> None:
        self.url = resolve_url(url)
        schema = schema if schema is not None else os.environ.get(SCHEMA_ENV) or None
        self.max_payload_bytes = max_payload_bytes
        self.allow_unregistered = allow_unregistered
        self._backend_options: dict[str, Any] = {}
        if schema is not None:
            self._backend_options["schema"] = schema
        if pool_size is not None:
            self._backend_options["pool_size"] = pool_size
        self.tasks: dict[str, TaskDef] = {}
        self._inline_running = False
        self.portal = Portal()
        self._backends: weakref.WeakKeyDictionary[asyncio.AbstractEventLoop, Backend] = (
            weakref.WeakKeyDictionary()
        )
        self._opening: weakref.WeakKeyDictionary[asyncio.AbstractEventLoop, asyncio.Lock] = (
            weakref.WeakKeyDictionary()
        )
        self._closers: dict[asyncio.AbstractEventLoop, AsyncGenerator[None, None]] = {}
        atexit.register(_close_at_exit, weakref.ref(self))
        os.register_at_fork(after_in_child=functools.partial(_forget_after_fork, weakref.ref(self)))
        # Validates the URL and schema now; runs sync enqueues on callers' connections.
        self._statements: Backend = backend_from_url(self.url, **self._backend_options)

    # -- registration ------------------------------------------------------

    @overload
    def task(self, fn: F, /) -> TaskDef: ...

    @overload
    def task(
        self,
        fn: None = None,
        /,
        *,
        name: str | None = None,
        queue: str = DEFAULT_QUEUE,
        priority: int = 0,
        retry: RetryPolicy = DEFAULT_RETRY,
        timeout: float | None = None,
        lease: float | None = None,
        process: bool = False,
    ) -> Callable[[F], TaskDef]: ...

    def task(
        self,
        fn: F | None = None,
        /,
        *,
        name: str | None = None,
        queue: str = DEFAULT_QUEUE,
        priority: int = 0,
        retry: RetryPolicy = DEFAULT_RETRY,
        timeout: float | None = None,
        lease: float | None = None,
        process: bool = False,
    ) -> TaskDef | Callable[[F], TaskDef]:
        """Register a handler: ``async def`` runs on the worker's loop, plain
        ``def`` in a thread, and ``process=True`` in a child process (for
        CPU-bound work; the handler must be importable by module and name).

        Raises DuplicateTaskError if the name is taken.
        """
        options = TaskOptions(
            queue=queue, priority=priority, retry=retry, timeout=timeout, lease=lease
        )

        def register(handler: F) -> TaskDef:
            task_name = self._free_name(name or handler.__name__)
            executor: Executor
            if process:
                executor = "process"
            elif asyncio.iscoroutinefunction(handler):
                executor = "async"
            else:
                executor = "thread"
            definition = TaskDef(self, handler, task_name, options, executor)
            self.tasks[task_name] = definition
            return definition

        return register(fn) if fn is not None else register

    def workflow(self, name: str, *, queue: str = DEFAULT_QUEUE, priority: int = 0) -> Workflow:
        """Register a step workflow under ``name``; add steps with
        ``@workflow.step`` and start one with ``workflow.start(step)``.

        Raises DuplicateTaskError if the name is taken by a task or workflow.
        """
        from conveyor.workflow import Workflow

        found = Workflow(self, self._free_name(name), TaskOptions(queue=queue, priority=priority))
        self.tasks[name] = found
        return found

    def coroutine(
        self,
        name: str | None = None,
        *,
        queue: str = DEFAULT_QUEUE,
        priority: int = 0,
        retry: RetryPolicy = DEFAULT_RETRY,
        timeout: float | None = None,
        lease: float | None = None,
    ) -> Callable[[F], Coroutine]:
        """Register an ``async def`` poll function as a coroutine task (see
        :mod:`conveyor.coroutine`); ``retry``, ``timeout`` and ``lease``
        apply to each poll, whose attempt budget starts afresh after every
        poll that ends well. Start one with ``coroutine.start(state)``.

        Raises DuplicateTaskError if the name is taken.
        """
        from conveyor.coroutine import Coroutine

        options = TaskOptions(
            queue=queue, priority=priority, retry=retry, timeout=timeout, lease=lease
        )

        def register(handler: F) -> Coroutine:
            task_name = self._free_name(name or handler.__name__)
            found = Coroutine(self, handler, task_name, options)
            self.tasks[task_name] = found
            return found

        return register

    def _free_name(self, name: str) -> str:
        """``name``, if no task, workflow or coroutine has it yet."""
        if name in self.tasks:
            raise DuplicateTaskError(f"task name {name!r} is already registered")
        return name

    def _definition(self, task: str | TaskDef) -> TaskDef:
        if isinstance(task, TaskDef):
            return task
        found = self.tasks.get(task)
        if found is not None:
            return found
        if not self.allow_unregistered:
            raise UnknownTaskError(
                f"no task named {task!r} is registered on this app "
                "(App(allow_unregistered=True) enqueues names handled elsewhere)"
            )
        return TaskDef(self, _unregistered, task, TaskOptions(), "async")

    # -- backends ------------------------------------------------------------

    def rebind(self, url: str | None = None, *, schema: str | None = None) -> None:
        """Point this app at another store (``url``) or PostgreSQL schema, as
        ``conveyor worker --url/--schema`` does; None keeps the current one.
        Only before the app has opened a backend: raises ConfigurationError
        after."""
        if self._backends or self.portal.started:
            raise ConfigurationError("rebind() must come before the app opens its store")
        options = dict(self._backend_options)
        if schema is not None:
            options["schema"] = schema
        new_url = resolve_url(url) if url is not None else self.url
        statements = backend_from_url(new_url, **options)  # validates first
        self.url, self._backend_options, self._statements = new_url, options, statements

    def make_backend(self, **overrides: Any) -> Backend:
        """A new, unopened backend for this app's URL."""
        return backend_from_url(self.url, **{**self._backend_options, **overrides})

    async def backend(self) -> Backend:
        """The open backend bound to the running event loop."""
        loop = asyncio.get_running_loop()
        found = self._backends.get(loop)
        if found is not None:
            return found
        lock = self._opening.setdefault(loop, asyncio.Lock())
        async with lock:
            found = self._backends.get(loop)
            if found is None:
                found = self.make_backend()
                await found.open()
                self._backends[loop] = found
                # Closed when the loop shuts down (asyncio.run finalizes async
                # generators), for code that never calls aclose().
                closer = _close_with_loop(self, loop, found)
                await closer.__anext__()
                self._closers[loop] = closer
        return found

    async def aclose(self) -> None:
        """Close the backend of the running loop."""
        loop = asyncio.get_running_loop()
        self._closers.pop(loop, None)
        found = self._backends.pop(loop, None)
        if found is not None:
            await found.close()

    def close(self) -> None:
        """Close the sync API's backend and its loop thread."""
        loop = self.portal._loop
        if loop is not None:
            self.portal.run(self.aclose())
        self.portal.close()

    async def __aenter__(self) -> App:
        await self.backend()
        return self

    async def __aexit__(self, *exc: object) -> None:
        await self.aclose()

    def __enter__(self) -> App:
        return self

    def __exit__(self, *exc: object) -> None:
        self.close()

    # -- enqueue -------------------------------------------------------------

    def _new_tasks(
        self,
        task: str | TaskDef,
        many: Iterable[Mapping[str, Any] | None],
        options: Mapping[str, Any],
        keys: Sequence[str | None] | None = None,
    ) -> list[NewTask]:
        definition = self._definition(task)
        return definition.new_tasks(many, self.max_payload_bytes, keys=keys, **options)

    async def _insert(self, tasks: Sequence[NewTask], connection: Any) -> list[TaskHandle]:
        backend = await self.backend()
        ids = await backend.enqueue(EnqueueParams(tasks=tasks), connection)
        return await self._handles(backend, ids, sorted({t.queue for t in tasks}))

    async def _handles(
        self, backend: Backend, ids: list[int], queues: list[str]
    ) -> list[TaskHandle]:
        if Capability.INLINE in backend.capabilities and not self._inline_running:
            await self._run_inline(queues)
        return [TaskHandle(self, task_id) for task_id in ids]

    async def _run_inline(self, queues: list[str]) -> None:
        """Inline mode: run the tasks now. Tasks they enqueue join this run."""
        from conveyor.testing import drain_async

        self._inline_running = True
        try:
            await drain_async(self, queues=queues)
        finally:
            self._inline_running = False

    def enqueue(
        self,
        task: str | TaskDef,
        args: Mapping[str, Any] | None = None,
        *,
        queue: str | None = None,
        priority: int | None = None,
        delay: float | timedelta | None = None,
        run_at: datetime | None = None,
        retry: RetryPolicy | None = None,
        timeout: float | None = None,
        lease: float | None = None,
        idempotency_key: str | None = None,
        connection: Any = None,
    ) -> TaskHandle:
        """Store one task; return its handle once it is durable.

        With ``connection`` (a psycopg ``Connection`` on PostgreSQL, a
        ``sqlite3.Connection`` on SQLite), the insert runs inside the caller's
        transaction and exists only if that transaction commits (if your
        COMMIT itself fails, the driver's error is yours to handle: whether
        it committed is unknown, as for any write of yours).

        ``idempotency_key`` makes the call safe to repeat: an enqueue of
        this task name with a key already stored inserts nothing and returns
        the stored task's handle, whatever its state (until retention
        deletes it), on every backend and under concurrent calls from many
        processes. Repeat a call that raised BackendUnavailableError with
        the same key: the first may have been stored.

        Raises PayloadError, UnknownTaskError or ConfigurationError before
        any I/O.
        """
        options = dict(
            queue=queue,
            priority=priority,
            delay=delay,
            run_at=run_at,
            retry=retry,
            timeout=timeout,
            lease=lease,
        )
        keys = [check_idempotency_key(idempotency_key)]
        return self._enqueue(task, [args], keys, connection, options)[0]

    async def enqueue_async(
        self,
        task: str | TaskDef,
        args: Mapping[str, Any] | None = None,
        *,
        queue: str | None = None,
        priority: int | None = None,
        delay: float | timedelta | None = None,
        run_at: datetime | None = None,
        retry: RetryPolicy | None = None,
        timeout: float | None = None,
        lease: float | None = None,
        idempotency_key: str | None = None,
        connection: Any = None,
    ) -> TaskHandle:
        """Async form of :meth:`enqueue` (``connection``: a psycopg ``AsyncConnection``,
        or a ``sqlite3.Connection``, used synchronously on the caller's thread)."""
        options = dict(
            queue=queue,
            priority=priority,
            delay=delay,
            run_at=run_at,
            retry=retry,
            timeout=timeout,
            lease=lease,
        )
        keys = [check_idempotency_key(idempotency_key)]
        return (await self._enqueue_async(task, [args], keys, connection, options))[0]

    def enqueue_many(
        self,
        task: str | TaskDef,
        many: Iterable[Mapping[str, Any] | None],
        *,
        connection: Any = None,
        idempotency_key: str | None = None,
        **options: Any,
    ) -> list[TaskHandle]:
        """Store many tasks of one kind, all or none; handles in order.

        With ``connection``, in one statement inside the caller's transaction,
        every payload checked before any I/O. Otherwise in one transaction of
        the backend's own, in chunks (see ``chunk_bounds``): a backend may
        insert one chunk while the next is checked and encoded. A payload that fails
        its check raises PayloadError, and nothing is stored.

        With ``idempotency_key``, task *i* of the batch gets the key
        ``{idempotency_key}#{i}`` (see :meth:`enqueue`): repeating the call
        returns the handles of the tasks the first one stored."""
        payloads = list(many)
        keys = batch_keys(idempotency_key, len(payloads))
        return self._enqueue(task, payloads, keys, connection, options)

    def _enqueue(
        self,
        task: str | TaskDef,
        payloads: list[Mapping[str, Any] | None],
        keys: list[str | None],
        connection: Any,
        options: Mapping[str, Any],
    ) -> list[TaskHandle]:
        if connection is not None:
            return self.enqueue_new(self._new_tasks(task, payloads, options, keys), connection)
        return self.portal.run(self._enqueue_async(task, payloads, keys, None, options))

    def enqueue_new(self, tasks: Sequence[NewTask], connection: Any = None) -> list[TaskHandle]:
        """Store tasks already checked and encoded (``TaskDef.new_tasks``,
        ``Workflow.new_workflow``); handles in order."""
        if connection is not None:
            ids = self._statements.enqueue_sync(EnqueueParams(tasks=tasks), connection)
            return [TaskHandle(self, task_id) for task_id in ids]
        return self.portal.run(self._insert(tasks, None))

    async def enqueue_new_async(
        self, tasks: Sequence[NewTask], connection: Any = None
    ) -> list[TaskHandle]:
        """Async form of :meth:`enqueue_new`."""
        return await self._insert(tasks, connection)

    async def enqueue_many_async(
        self,
        task: str | TaskDef,
        many: Iterable[Mapping[str, Any] | None],
        *,
        connection: Any = None,
        idempotency_key: str | None = None,
        **options: Any,
    ) -> list[TaskHandle]:
        """Async form of :meth:`enqueue_many`."""
        payloads = list(many)
        keys = batch_keys(idempotency_key, len(payloads))
        return await self._enqueue_async(task, payloads, keys, connection, options)

    async def _enqueue_async(
        self,
        task: str | TaskDef,
        payloads: list[Mapping[str, Any] | None],
        keys: list[str | None],
        connection: Any,
        options: Mapping[str, Any],
    ) -> list[TaskHandle]:
        if connection is not None or len(payloads) <= ENQUEUE_CHUNK:  # one statement
            tasks = self._new_tasks(task, payloads, options, keys)
            return await self._insert(tasks, connection)
        definition = self._definition(task)
        queues: set[str] = set()

        def chunks() -> Iterator[list[NewTask]]:
            for start, end in chunk_bounds(len(payloads)):
                part = payloads[start:end]
                tasks = definition.new_tasks(
                    part, self.max_payload_bytes, keys=keys[start:end], **options
                )
                queues.update(t.queue for t in tasks)
                yield tasks

        drawn = chunks()
        first = next(drawn, None)  # checked before any I/O, like a small batch whole
        if first is None:
            return []
        backend = await self.backend()
        ids = await backend.enqueue_chunks(itertools.chain([first], drawn))
        return await self._handles(backend, ids, sorted(queues))

    # -- messages --------------------------------------------------------------

    def _deliveries(self, task_id: int, message: Any, key: str | None) -> SendParams:
        if not isinstance(task_id, int) or isinstance(task_id, bool):
            raise ConfigurationError("task_id must be an int")
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
        if connection is not None:
            return self._statements.send_sync(params, connection)[0]
        return self.portal.run(self._send_async(params))

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
        backend = await self.backend()
        ids = await backend.send(params, connection)
        if Capability.INLINE in backend.capabilities and not self._inline_running:
            task = await backend.get_task(params.deliveries[0].task_id, with_attempts=False)
            if task is not None:
                await self._run_inline([task.queue])
        return ids[0]

    async def inbox_async(self, task_id: int) -> list[Message]:
        """The messages waiting in a task's inbox, oldest first."""
        return await (await self.backend()).inbox(task_id)

    def inbox(self, task_id: int) -> list[Message]:
        """The messages waiting in a task's inbox, oldest first."""
        return self.portal.run(self.inbox_async(task_id))

    # -- inspect and control ---------------------------------------------------

    async def get_async(self, task_id: int) -> Task | None:
        """The task with its attempt log, or None."""
        return await (await self.backend()).get_task(task_id)

    def get(self, task_id: int) -> Task | None:
        return self.portal.run(self.get_async(task_id))

    async def list_tasks_async(
        self,
        *,
        state: TaskState | str | None = None,
        name: str | None = None,
        queue: str | None = None,
        limit: int = 100,
    ) -> list[Task]:
        """Tasks newest first, filtered by state, name and queue."""
        wanted = TaskState(state) if state is not None else None
        task_filter = TaskFilter(state=wanted, name=name, queue=queue, limit=limit)
        return await (await self.backend()).list_tasks(task_filter)

    def list_tasks(self, **filters: Any) -> list[Task]:
        return self.portal.run(self.list_tasks_async(**filters))

    async def cancel_async(self, task_id: int) -> TaskState:
        """Cancel a task. Pending/waiting ones end ``cancelled`` now; a running
        one is stopped by its worker as soon as it hears of it, within about a
        second through the wake-up channel (at worst at its next heartbeat),
        and this returns ``in_progress``. Raises TaskNotFoundError,
        InvalidTransitionError.
        """
        return await (await self.backend()).cancel(task_id)

    def cancel(self, task_id: int) -> TaskState:
        return self.portal.run(self.cancel_async(task_id))

    async def retry_async(self, task_id: int) -> TaskState:
        """Run a failed or cancelled task again, with a fresh attempt budget."""
        return await (await self.backend()).retry(task_id)

    def retry(self, task_id: int) -> TaskState:
        return self.portal.run(self.retry_async(task_id))

    async def list_workers_async(self) -> list[WorkerInfo]:
        """Workers known to the backend, with their last heartbeat."""
        return await (await self.backend()).list_workers()

    def list_workers(self) -> list[WorkerInfo]:
        return self.portal.run(self.list_workers_async())

    async def migrate_async(self) -> list[int]:
        """Async form of :meth:`migrate`."""
        backend = self.make_backend(migrate=False)
        await backend.open()
        try:
            return await backend.migrate()
        finally:
            await backend.close()

    def migrate(self) -> list[int]:
        """Create or upgrade the schema; returns the migration versions applied."""
        return self.portal.run(self.migrate_async())

    # -- workers ---------------------------------------------------------------

    def worker(self, **config: Any) -> Any:
        """A :class:`~conveyor.worker.Worker` for this app (see WorkerConfig)."""
        from conveyor.worker import Worker, WorkerConfig

        return Worker(self, WorkerConfig(**config))

    def run_worker(self, **config: Any) -> None:
        """Run a worker in this thread until SIGTERM/SIGINT (or, with
        ``burst=True``, until no task is due or running)."""
        worker = self.worker(**config)
        asyncio.run(worker.run())


async def _close_with_loop(
    app: App, loop: asyncio.AbstractEventLoop, backend: Backend
) -> AsyncGenerator[None, None]:
    try:
        yield
    finally:
        app._closers.pop(loop, None)
        if app._backends.get(loop) is backend:
            del app._backends[loop]
        await backend.close()


def _forget_after_fork(ref: weakref.ref[App]) -> None:
    """In a forked child: start afresh, keeping (never closing) the parent's pools."""
    app = ref()
    if app is not None:
        INHERITED_AT_FORK.append(dict(app._backends))
        app._backends = weakref.WeakKeyDictionary()
        app._opening = weakref.WeakKeyDictionary()


def _close_at_exit(ref: weakref.ref[App]) -> None:
    """Close the sync API's pool at interpreter exit, for scripts that never do."""
    app = ref()
    if app is not None and app.portal.started:
        with contextlib.suppress(Exception):
            app.close()


def _unregistered(**_: Any) -> None:
    raise ConfigurationError("this task is handled by another app")  # pragma: no cover
