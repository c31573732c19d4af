"""The App: the registry of tasks, on top of a :class:`~conveyor.client.Client`.

An App is a client (it stores, reads and controls tasks in one store; see
:mod:`conveyor.client`) that also knows the handlers: it registers tasks,
workflows and coroutines, checks payloads against them by name, and builds
workers for them. Every operation has a sync form (``enqueue``) and an
async form (``enqueue_async``).
"""

from __future__ import annotations

import asyncio
from collections.abc import Awaitable, Callable, Iterable, Mapping, Sequence
from datetime import datetime, timedelta
from typing import Any, Concatenate, TypeVar, Unpack, cast, overload

from conveyor.client import Client
from conveyor.context import TaskContext
from conveyor.coroutine import Coroutine
from conveyor.errors import ConfigurationError, DuplicateTaskError, UnknownTaskError
from conveyor.handle import TaskHandle
from conveyor.model import DEFAULT_MAX_PAYLOAD_BYTES, DEFAULT_QUEUE, DEFAULT_RETRY, RetryPolicy
from conveyor.options import (
    AfterPolicy,
    Concurrency,
    EnqueueOptions,
    OptionFields,
    RateLimit,
    Unique,
    options_from,
)
from conveyor.schedules import Missed, Schedule
from conveyor.task import Executor, P, R, TaskDecorator, TaskDef, TaskOptions
from conveyor.worker import Worker, WorkerConfig
from conveyor.worker.drain import drain_registry
from conveyor.workflow import Workflow

F = TypeVar("F", bound=Callable[..., Any])
T = TypeVar("T")


class App(Client):
    """Registry of tasks bound to one backend URL.

    ``url`` is a backend URL (``postgresql://…``, ``sqlite:///path.db``,
    ``memory://name``); None reads ``CONVEYOR_URL``, else uses SQLite in
    ``./conveyor.db``.
    ``schema`` names the PostgreSQL schema (default ``conveyor``).
    ``max_payload_bytes`` caps encoded payloads (default 1 MiB).
    ``allow_unregistered`` lets ``enqueue`` take names this app has no
    handler for (a producer-only app); otherwise they raise UnknownTaskError.
    ``migrate=False`` never creates or upgrades the store, here or in this
    app's workers: a store missing or behind raises StoreNotReadyError (see
    :class:`~conveyor.client.Client`).
    """

    def __init__(
        self,
        url: str | None = None,
        *,
        schema: str | None = None,
        max_payload_bytes: int = DEFAULT_MAX_PAYLOAD_BYTES,
        allow_unregistered: bool = False,
        pool_size: int | None = None,
        migrate: bool = True,
    ) -> None:
        super().__init__(
            url,
            schema=schema,
            max_payload_bytes=max_payload_bytes,
            pool_size=pool_size,
            migrate=migrate,
        )
        self.allow_unregistered = allow_unregistered
        self.tasks: dict[str, TaskDef] = {}
        self.schedules: dict[str, Schedule] = {}
        """The periodic schedules of this app's tasks, by name (see :meth:`schedule`)."""
        self.inline_runner = self._run_inline_worker

    # -- registration ------------------------------------------------------

    # The overloads type a definition by its handler: ``TaskDef[P, R]`` with
    # R the awaited value of an ``async def``, and a first TaskContext
    # parameter left out of P (the worker passes it, not the payload).
    @overload
    def task(self, fn: Callable[Concatenate[TaskContext, P], Awaitable[R]], /) -> TaskDef[P, R]: ...

    @overload
    def task(self, fn: Callable[P, Awaitable[R]], /) -> TaskDef[P, R]: ...

    @overload
    def task(self, fn: Callable[Concatenate[TaskContext, P], R], /) -> TaskDef[P, R]: ...

    @overload
    def task(self, fn: Callable[P, R], /) -> TaskDef[P, R]: ...

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
        expires: float | timedelta | datetime | None = None,
        on_dependency_failure: AfterPolicy | None = None,
        process: bool = False,
        unique: Unique | None = None,
        concurrency: Concurrency | None = None,
        rate: RateLimit | None = None,
    ) -> TaskDecorator: ...

    def task(
        self,
        fn: Callable[..., Any] | None = None,
        /,
        *,
        name: str | None = None,
        queue: str = DEFAULT_QUEUE,
        priority: int = 0,
        retry: RetryPolicy = DEFAULT_RETRY,
        timeout: float | None = None,
        lease: float | None = None,
        expires: float | timedelta | datetime | None = None,
        on_dependency_failure: AfterPolicy | None = None,
        process: bool = False,
        unique: Unique | None = None,
        concurrency: Concurrency | None = None,
        rate: RateLimit | None = None,
    ) -> TaskDef | TaskDecorator:
        """Register a handler: ``async def`` runs on the worker's loop, plain
        ``def`` in a thread, and ``process=True`` in a child process (for
        CPU-bound work; the handler must be importable by module and name).
        ``unique`` makes its tasks unique by a key (see :class:`conveyor.Unique`;
        an enqueue's own ``unique=`` or ``idempotency_key=`` overrides it).
        ``concurrency`` caps how many of its tasks run at once per key (see
        :class:`conveyor.Concurrency`), ``rate`` how many start per period
        (see :class:`conveyor.RateLimit`). ``expires`` (seconds, a timedelta
        or an aware datetime) is when each of its tasks no longer starts,
        counted from its enqueue: one not started by then ends cancelled.
        ``on_dependency_failure`` is what a failed or cancelled dependency
        (``after``) does to its tasks: ``cancel`` (the default), ``fail`` or
        ``run`` (see docs/composition.md).

        ``name`` (default: the handler's ``__name__``) and ``queue`` are 1 to
        200 printable characters (no newline or other control character, no
        NUL, no lone surrogate), the rule of every task, queue, pause and
        schedule name. Raises ConfigurationError for one that breaks it, and
        DuplicateTaskError if the name is taken.
        """
        options = TaskOptions(
            queue=queue,
            priority=priority,
            retry=retry,
            timeout=timeout,
            lease=lease,
            expires=expires,
            on_dependency_failure=on_dependency_failure,
            unique=unique,
            concurrency=concurrency,
            rate=rate,
        )

        def register(handler: Callable[..., Any]) -> TaskDef:
            task_name = self._free_name(handler.__name__ if name is None else name)
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

        return register(fn) if fn is not None else cast(TaskDecorator, register)

    def workflow(self, name: str, *, queue: str = DEFAULT_QUEUE, priority: int = 0) -> Workflow:
        """Register a step workflow under ``name``; add steps with
        ``@workflow.step`` and start one with ``workflow.start(step)``.

        Raises DuplicateTaskError if the name is taken by a task or workflow.
        """
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
        options = TaskOptions(
            queue=queue, priority=priority, retry=retry, timeout=timeout, lease=lease
        )

        def register(handler: F) -> Coroutine:
            task_name = self._free_name(handler.__name__ if name is None else name)
            found = Coroutine(self, handler, task_name, options)
            self.tasks[task_name] = found
            return found

        return register

    def schedule(
        self,
        task: str | TaskDef,
        *,
        cron: str | None = None,
        every: float | timedelta | None = None,
        tz: str = "UTC",
        args: Mapping[str, Any] | None = None,
        name: str | None = None,
        missed: Missed | str = Missed.LATEST,
        catch_up: int = 10,
        grace: float | timedelta = 60.0,
    ) -> Schedule:
        """Enqueue ``task`` (registered on this app) with ``args`` once per
        slot: of a five-field ``cron`` expression read in the IANA zone
        ``tz``, or ``every`` so many seconds (from the Unix epoch, so every
        process agrees). Exactly one task per slot is stored, however many
        workers run (see :mod:`conveyor.worker.scheduler`). A new schedule
        starts with the first slot after a worker first syncs it. ``missed``
        says what happens to slots that passed while no worker ran:
        ``"latest"`` (default) fires the latest once, ``"skip"`` fires none
        (only a slot at most ``grace`` seconds late), ``"all"`` fires each, at
        most the last ``catch_up``. ``name`` (default: the task's name) is
        the schedule's, unique in the app. Time zones and daylight saving
        time: see :mod:`conveyor.schedules`.

        Raises ConfigurationError (bad field, name taken, task not
        registered here, a workflow or coroutine) or PayloadError (``args``
        do not fit the task) now, before any worker runs."""
        definition = self.tasks.get(task) if isinstance(task, str) else task
        if definition is None or self.tasks.get(definition.name) is not definition:
            raise ConfigurationError(f"schedule a task registered on this app, not {task!r}")
        if isinstance(definition, Workflow | Coroutine):
            raise ConfigurationError("a schedule enqueues plain tasks, not workflows or coroutines")
        found = Schedule(
            name=name if name is not None else definition.name,
            task=definition.name,
            cron=cron,
            every=every,  # type: ignore[arg-type]  # a timedelta is taken too
            tz=tz,
            args=dict(args or {}),
            missed=missed,  # type: ignore[arg-type]  # its string value is taken too
            catch_up=catch_up,
            grace=grace,  # type: ignore[arg-type]
        )
        if found.name in self.schedules:
            raise ConfigurationError(
                f"schedule name {found.name!r} is taken: give this one a name="
            )
        definition.encode_args(found.args, self.max_payload_bytes)
        self.schedules[found.name] = found
        return found

    def periodic(
        self,
        *,
        cron: str | None = None,
        every: float | timedelta | None = None,
        tz: str = "UTC",
        args: Mapping[str, Any] | None = None,
        name: str | None = None,
        missed: Missed | str = Missed.LATEST,
        catch_up: int = 10,
        grace: float | timedelta = 60.0,
    ) -> Callable[[T], T]:
        """:meth:`schedule` as a decorator, above ``@app.task``::

        @app.periodic(cron="*/5 * * * *", tz="Europe/Paris")
        @app.task()
        async def report() -> None: ...
        """

        def register(task: T) -> T:
            if not isinstance(task, TaskDef):
                raise ConfigurationError("put @app.periodic(...) above @app.task(...)")
            self.schedule(
                task,
                cron=cron,
                every=every,
                tz=tz,
                args=args,
                name=name,
                missed=missed,
                catch_up=catch_up,
                grace=grace,
            )
            return task

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

    @property
    def client(self) -> Client:
        """The client this app builds on: the app itself (an App is a Client
        with a registry of tasks)."""
        return self

    # -- enqueue -------------------------------------------------------------

    def enqueue(
        self,
        task: str | TaskDef,
        args: Mapping[str, Any] | None = None,
        *,
        options: EnqueueOptions | None = None,
        connection: Any = None,
        **fields: Unpack[OptionFields],
    ) -> TaskHandle:
        """Store one task; return its handle once it is durable.

        ``task`` is a registered task or its name. The keyword options (or
        ``options``, an :class:`EnqueueOptions`, with the keywords on top)
        override the task's defaults for this call; ``send_email.options(...)
        .enqueue(...)`` is the same from the task object.

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
        checked = options_from(options, fields)
        return self._definition(task).store([args], checked, connection)[0]

    async def enqueue_async(
        self,
        task: str | TaskDef,
        args: Mapping[str, Any] | None = None,
        *,
        options: EnqueueOptions | None = None,
        connection: Any = None,
        **fields: Unpack[OptionFields],
    ) -> TaskHandle:
        """Async form of :meth:`enqueue` (``connection``: a psycopg ``AsyncConnection``,
        or a ``sqlite3.Connection``, used synchronously on the caller's thread)."""
        checked = options_from(options, fields)
        return (await self._definition(task).store_async([args], checked, connection))[0]

    def enqueue_many(
        self,
        task: str | TaskDef,
        many: Iterable[Mapping[str, Any] | None],
        *,
        options: EnqueueOptions | None = None,
        connection: Any = None,
        **fields: Unpack[OptionFields],
    ) -> list[TaskHandle]:
        """Store many tasks of one kind, all or none; handles in order. Options
        as for :meth:`enqueue`, the same for every task; an unknown one
        raises ConfigurationError.

        With ``connection``, in one statement inside the caller's transaction,
        every payload checked before any I/O. Otherwise in one transaction of
        the backend's own, in chunks (see ``chunk_bounds``): a backend may
        insert one chunk while the next is checked and encoded. A payload that fails
        its check raises PayloadError, and nothing is stored.

        With ``idempotency_key``, task *i* of the batch gets the key
        ``{idempotency_key}#{i}`` (see :meth:`enqueue`): repeating the call
        returns the handles of the tasks the first one stored."""
        checked = options_from(options, fields)
        return self._definition(task).store(list(many), checked, connection, batch=True)

    async def enqueue_many_async(
        self,
        task: str | TaskDef,
        many: Iterable[Mapping[str, Any] | None],
        *,
        options: EnqueueOptions | None = None,
        connection: Any = None,
        **fields: Unpack[OptionFields],
    ) -> list[TaskHandle]:
        """Async form of :meth:`enqueue_many`."""
        checked = options_from(options, fields)
        definition = self._definition(task)
        return await definition.store_async(list(many), checked, connection, batch=True)

    # -- workers ---------------------------------------------------------------

    def worker(self, **config: Any) -> Worker:
        """A :class:`~conveyor.worker.Worker` for this app's tasks (see WorkerConfig)."""
        return Worker(self, WorkerConfig(**config))

    def run_worker(self, **config: Any) -> None:
        """Run a worker in this thread until SIGTERM/SIGINT (or, with
        ``burst=True``, until no task is due or running)."""
        worker = self.worker(**config)
        asyncio.run(worker.run())

    async def _run_inline_worker(self, queues: Sequence[str]) -> None:
        """Inline mode: run the tasks now. Tasks they enqueue join this run
        (an enqueue fires no schedule: ``testing.drain`` does)."""
        await drain_registry(self, queues=queues, schedules=False)


def _unregistered(**_: Any) -> None:
    raise ConfigurationError("this task is handled by another app")  # pragma: no cover
