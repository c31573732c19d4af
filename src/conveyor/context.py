"""What a running handler knows about its attempt: :class:`TaskContext`.

A handler receives it by declaring a parameter annotated ``TaskContext``
(any name)::

    @app.task()
    async def charge(ctx: TaskContext, order_id: int) -> None:
        conn = await ctx.transaction()      # commits with the task's success
        await conn.execute("insert into charges ...", (order_id,))

Process handlers get no context (it cannot cross the process boundary).
"""

from __future__ import annotations

import asyncio
import threading
from collections.abc import Awaitable, Callable
from typing import Any

from conveyor.errors import ConfigurationError, LeaseLostError, StopAttempt
from conveyor.model import LeaseToken, Message, check_progress

_EVENT_LOCK = threading.Lock()


class TaskContext:
    """The running attempt: ids, lease token and the order to stop.

    ``attempt`` is the lease token's number: it grows at every claim of the
    task. ``step_attempt`` counts the attempts spent against the current
    budget, this one included (1 on a first run); a workflow's budget starts
    afresh at each step, whose name is ``step`` (None for plain tasks).
    ``parent_id`` is the coroutine task that spawned this one, if any.

    ``should_stop`` turns true when the worker lost the lease, the task was
    cancelled, its timeout passed or the worker is shutting down. Async
    handlers are cancelled then; thread handlers must look: ``check()``
    raises the reason (a :class:`~conveyor.errors.StopAttempt`, which
    ``except Exception`` does not catch) so a loop that calls it stops.
    """

    __slots__ = (
        "_open_transaction",
        "_open_transaction_sync",
        "_opening",
        "_progress_sink",
        "_read_inbox",
        "_stop_event",
        "_stop_reason",
        "_sync_lock",
        "_transaction",
        "attempt",
        "last_progress",
        "name",
        "nonce",
        "parent_id",
        "payload",
        "queue",
        "step",
        "step_attempt",
        "task_id",
        "worker_id",
    )

    def __init__(
        self,
        task_id: int,
        name: str,
        queue: str,
        attempt: int,
        worker_id: str,
        payload: dict[str, Any] | None = None,
        *,
        step: str | None = None,
        step_attempt: int | None = None,
        open_transaction: Callable[[], Awaitable[Any]] | None = None,
        open_transaction_sync: Callable[[], Any] | None = None,
        parent_id: int | None = None,
        read_inbox: Callable[[], Awaitable[list[Message]]] | None = None,
        nonce: str = "",
        progress_sink: Callable[[int, int | None, str | None], None] | None = None,
    ) -> None:
        self.task_id = task_id
        self.name = name
        self.queue = queue
        self.attempt = attempt
        self.worker_id = worker_id
        self.nonce = nonce
        self.payload: dict[str, Any] = payload if payload is not None else {}
        self.step = step
        self.step_attempt = step_attempt if step_attempt is not None else attempt
        self.parent_id = parent_id
        self._read_inbox = read_inbox
        self._open_transaction = open_transaction
        self._open_transaction_sync = open_transaction_sync
        self._stop_reason: StopAttempt | None = None
        self._stop_event: threading.Event | None = None
        self._transaction: Any = None
        self._opening: asyncio.Future[Any] | None = None
        self._sync_lock: threading.Lock | None = None
        self._progress_sink = progress_sink
        self.last_progress: tuple[int, int | None, str | None] | None = None
        """The latest ``(done, total, note)`` this attempt reported (None: none)."""

    def __repr__(self) -> str:
        return f"<TaskContext task {self.task_id} {self.name} attempt {self.attempt}>"

    @property
    def lease_token(self) -> LeaseToken:
        """The lease this attempt runs under: task id, attempt number, worker
        id and its claim's nonce (see :class:`~conveyor.model.LeaseToken`)."""
        return LeaseToken(self.task_id, self.attempt, self.worker_id, self.nonce)

    @property
    def should_stop(self) -> bool:
        """True once this attempt has been ordered to stop (see the class docstring)."""
        return self._stop_reason is not None

    @property
    def lease_lost(self) -> bool:
        """True if the attempt must stop because the worker lost its lease:
        nothing it does from now on is recorded."""
        return isinstance(self._stop_reason, LeaseLostError)

    @property
    def stop_reason(self) -> StopAttempt | None:
        """Why the attempt must stop (what :meth:`check` raises); None until then."""
        return self._stop_reason

    def check(self) -> None:
        """Raise the stop reason if this attempt must stop; else return."""
        if self._stop_reason is not None:
            raise self._stop_reason

    def wait_for_stop(self, timeout: float | None = None) -> bool:
        """Block (a thread handler) until told to stop or ``timeout``; True if told."""
        with _EVENT_LOCK:
            if self._stop_event is None:
                self._stop_event = threading.Event()
                if self._stop_reason is not None:
                    self._stop_event.set()
            event = self._stop_event
        return event.wait(timeout)

    async def transaction(self) -> Any:
        """The attempt's own database transaction (SQL backends, async handlers).

        Returns the backend's native connection (psycopg ``AsyncConnection``)
        inside an open transaction. Everything written on it commits in the
        same transaction that records the task's success, and rolls back if
        the handler fails or the lease was lost. Do not commit it yourself.
        Calling it again returns the same connection.
        """
        self.check()
        if self._transaction is None:
            if self._open_transaction is None:
                raise ConfigurationError(
                    "this backend or handler kind offers no attempt transaction "
                    "(it needs an async handler on a SQL backend)"
                )
            if self._opening is None:  # concurrent callers share one opening
                self._opening = asyncio.ensure_future(self._open_transaction())
            transaction = await self._opening
            self._transaction = transaction
        return self._transaction.connection

    def transaction_sync(self) -> Any:
        """The attempt's own transaction for a plain ``def`` handler (SQL backends).

        Returns a synchronous native connection (psycopg ``Connection``)
        inside an open transaction, with the same guarantees as
        :meth:`transaction`: its writes commit with the task's success and
        roll back on failure or a lost lease. Do not commit it yourself.
        """
        self.check()
        if self._open_transaction_sync is None:
            raise ConfigurationError(
                "this backend or handler kind offers no synchronous attempt transaction "
                "(it needs a plain def handler, not a process one, on a SQL backend)"
            )
        with _EVENT_LOCK:
            if self._sync_lock is None:
                self._sync_lock = threading.Lock()
        with self._sync_lock:  # threads of one handler share one transaction
            if self._transaction is None:
                self._transaction = self._open_transaction_sync()
        return self._transaction.connection

    def progress(self, done: int, total: int | None = None, note: str | None = None) -> None:
        """Report how far the attempt got: ``done`` of ``total`` (None: not
        known) and a short ``note``. Cheap: it sets a value in memory, and
        the worker writes the latest value of each attempt at most once per
        progress interval (``WorkerConfig.progress_interval``, 1 s), and
        once more when the attempt ends; so a loop may call it every step.
        Safe from an async handler and from a thread handler's threads.

        The store keeps the report on the task, fenced by the lease (a lost
        lease's reports are not stored), and it stays after the attempt
        ends, until a later attempt reports. Handles
        (``TaskHandle.progress``), ``conveyor show``, ``explain``, the
        dashboard, events (``ProgressStored``) and metrics read it.

        Raises ConfigurationError, storing nothing, unless ``done`` is an
        integer from 0 to 2**53, ``total`` None or an integer from ``done``
        to 2**53, and ``note`` None or up to 200 printable characters.
        """
        checked = check_progress(done, total, note)
        self.last_progress = checked
        if self._progress_sink is not None:
            self._progress_sink(*checked)

    async def read_inbox(self) -> list[Message]:
        """The task's inbox, oldest first (coroutine tasks; see conveyor.coroutine)."""
        if self._read_inbox is None:
            raise ConfigurationError("this attempt has no inbox to read")
        return await self._read_inbox()

    def _request_stop(self, reason: StopAttempt) -> bool:
        """Record the first reason to stop; True if this call recorded it."""
        with _EVENT_LOCK:
            if self._stop_reason is not None:
                return False
            self._stop_reason = reason
            if self._stop_event is not None:
                self._stop_event.set()
        return True
