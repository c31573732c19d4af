"""The backend protocol: the one contract every storage engine implements.

Each operation takes one frozen params object and returns domain objects.
Guarantees every implementation keeps (the conformance suite checks them):

- ``claim`` is atomic: a task is handed to at most one worker per lease, the
  attempt row exists as soon as the claim returns, and an expired lease is
  reclaimed (its attempt closed as ``lease_lost``) or, when its crash budget
  is spent, the task ends ``failed``.
- ``heartbeat`` and ``finish`` are fenced by the lease token *and* a live
  lease: a write for a lease that expired or moved on changes nothing and is
  reported back (missing from ``renewed`` / ``applied``), never raised.
- Inboxes: a message is consumed only by an applied completion whose poll
  saw it; one that arrives during a poll stays and makes the task due again
  as soon as that poll ends. When a task with a parent reaches a terminal
  state, the parent gets one ``end`` message (per time it finishes: a manual
  retry can finish it again), whatever ended it: its worker, a spent crash
  budget or a cancel.
- Times come from the backend's clock; ``now`` on a params object overrides
  it for tests only.
"""

from __future__ import annotations

import enum
from collections.abc import AsyncIterator, Iterable, Sequence
from dataclasses import dataclass
from datetime import datetime
from typing import Any, Protocol, TypeAlias, runtime_checkable

from conveyor.model import LeaseToken, Message, Outcome, RetryPolicy, Task, TaskState


class Capability(enum.Enum):
    """What a backend can offer beyond the common contract."""

    TRANSACTIONAL_ENQUEUE = "transactional_enqueue"
    """Enqueue inside the caller's own database transaction."""
    ATTEMPT_TRANSACTION = "attempt_transaction"
    """A handler's writes commit atomically with the task's success."""
    NOTIFICATIONS = "notifications"
    """Push wake-ups for idle workers (otherwise they poll)."""
    INLINE = "inline"
    """Tests only: an enqueue runs its tasks to the end before it returns."""


@dataclass(slots=True)  # not frozen: built per task, and frozen costs 7x
class NewTask:
    """One task to insert; ``payload`` is already-encoded strict JSON."""

    name: str
    queue: str
    payload: str
    priority: int
    max_attempts: int
    retry: RetryPolicy
    run_at: datetime | None = None
    delay: float = 0.0
    timeout: float | None = None
    lease: float | None = None
    step: str | None = None
    """A step workflow's first step (``payload`` is its state)."""
    inbox: bool = False
    """A coroutine task: ``payload`` is its state, and it takes messages."""
    parent_id: int | None = None
    """The coroutine task that spawns this one: it gets this one's end-of-stream."""
    message: str | None = None
    """A first message (encoded JSON) for the new task's inbox, from ``parent_id``."""
    idempotency_key: str | None = None
    """Identifies this enqueue among those of its task name: an enqueue whose
    name and key are already stored inserts nothing (nor its first message)
    and returns the stored task's id."""


@dataclass(frozen=True, slots=True)
class EnqueueParams:
    tasks: Sequence[NewTask]
    now: datetime | None = None

    @classmethod
    def gathered(cls, chunks: Iterable[Sequence[NewTask]]) -> EnqueueParams:
        """Every chunk's tasks, in order, as one enqueue."""
        return cls(tasks=[task for chunk in chunks for task in chunk])


@dataclass(frozen=True, slots=True)
class ClaimParams:
    worker_id: str
    names: Sequence[str]
    queues: Sequence[str]
    limit: int
    lease: float
    """Lease seconds for tasks that do not set their own."""
    now: datetime | None = None
    reclaim: bool = True
    """Whether to look for expired leases too. False lets a backend leave
    them to a later claim (PostgreSQL skips that search; the others always
    search): a worker asks for it at least once per poll interval."""


@dataclass(slots=True)  # not frozen: built per task, and frozen costs 7x
class ClaimedTask:
    """A task handed to a worker under a fresh lease."""

    token: LeaseToken
    name: str
    queue: str
    payload: str
    """The stored JSON text, decoded by the worker (a corrupt one fails the attempt)."""
    spent: int
    max_attempts: int
    retry: RetryPolicy
    timeout: float | None
    lease: float | None
    lease_expires_at: datetime
    step: str | None = None
    parent_id: int | None = None


@dataclass(frozen=True, slots=True)
class HeartbeatParams:
    worker_id: str
    tokens: Sequence[LeaseToken]
    lease: float
    now: datetime | None = None


@dataclass(frozen=True, slots=True)
class HeartbeatResult:
    """``renewed``: extended now. ``lost``: no longer this worker's. A token in
    neither is still held but could not be renewed this time (its row was
    busy); its lease keeps the expiry it had."""

    renewed: frozenset[LeaseToken]
    lost: frozenset[LeaseToken]
    cancel_requested: frozenset[LeaseToken]


@dataclass(frozen=True, slots=True)
class ErrorInfo:
    type: str
    message: str
    traceback: str | None = None


@dataclass(frozen=True, slots=True)
class Transition:
    """A step workflow moving on, or a coroutine task's poll ending: its next
    step (None for a coroutine), the new state (encoded JSON), when it runs
    next (``run_at``, else ``delay`` seconds from now; ignored when it waits
    for a message) and its options. The attempt budget starts afresh."""

    step: str | None
    state: str
    max_attempts: int
    retry: RetryPolicy
    timeout: float | None = None
    lease: float | None = None
    run_at: datetime | None = None
    delay: float = 0.0


@dataclass(frozen=True, slots=True)
class Delivery:
    """A message for a task's inbox: ``body`` is encoded strict JSON;
    ``sender_id`` the sending task (None from outside). A send with an
    ``idempotency_key`` already used for this recipient delivers nothing
    and returns the first message's id (whatever the task's state now)."""

    task_id: int
    body: str
    sender_id: int | None = None
    idempotency_key: str | None = None


@dataclass(frozen=True, slots=True)
class Effects:
    """What a coroutine task's poll does besides ending: the inbox messages
    it consumed (exactly those it saw), the messages it sends and the child
    tasks it spawns. Written with its completion, only if that is applied.
    A send to a task that is missing or finished is dropped (the poll's
    outcome is already decided); ``App.send`` is the checked way."""

    consumed: tuple[int, ...] = ()
    sends: tuple[Delivery, ...] = ()
    spawns: tuple[NewTask, ...] = ()


@dataclass(frozen=True, slots=True)
class SendParams:
    deliveries: Sequence[Delivery]
    now: datetime | None = None


@dataclass(slots=True)  # not frozen: built per task, and frozen costs 7x
class Completion:
    """How one attempt ended and the state its task moves to.

    ``next_state`` is ``succeeded``, ``failed``, ``cancelled`` or ``pending``
    (a retry after ``retry_delay`` seconds, a release after an
    ``interrupted`` attempt, which gives the attempt back to the budget, or,
    with ``transition``, a workflow's next step or a coroutine's sleep), or
    ``waiting`` (a coroutine suspended until a message). Whenever a task
    would be pending or waiting again but its cancel was requested, it ends
    ``cancelled``. A coroutine that sleeps or waits while its inbox holds
    messages it did not consume is pending again at once.
    """

    token: LeaseToken
    outcome: Outcome
    next_state: TaskState
    result: str | None = None
    error: ErrorInfo | None = None
    retry_delay: float | None = None
    transition: Transition | None = None
    effects: Effects | None = None


@dataclass(frozen=True, slots=True)
class FinishParams:
    worker_id: str
    completions: Sequence[Completion]
    now: datetime | None = None


@dataclass(frozen=True, slots=True)
class FinishResult:
    applied: frozenset[LeaseToken]
    rejected: frozenset[LeaseToken]


@dataclass(frozen=True, slots=True)
class TaskFilter:
    state: TaskState | None = None
    name: str | None = None
    queue: str | None = None
    limit: int = 100


@dataclass(frozen=True, slots=True)
class WorkerInfo:
    id: str
    host: str
    pid: int
    queues: tuple[str, ...]
    concurrency: int
    started_at: datetime | None = None
    last_seen_at: datetime | None = None
    stopped_at: datetime | None = None


@dataclass(frozen=True, slots=True)
class CancelHint:
    """A wake-up about a running task: its cancel may have been requested.

    ``task_id`` names it, or is None when the backend cannot tell which task
    (SQLite sees only that another process wrote something). A hint is only
    a hint: the worker asks :meth:`Backend.cancel_requested` before it stops
    anything, and its heartbeat reports cancels anyway."""

    task_id: int | None = None


Wakeup: TypeAlias = str | CancelHint
"""What :meth:`Backend.wakeups` yields: a queue name where work may be due,
or a :class:`CancelHint`."""


@dataclass(frozen=True, slots=True)
class WorkFilter:
    names: Sequence[str]
    queues: Sequence[str]
    now: datetime | None = None


class AttemptTransaction(Protocol):
    """A database transaction opened for one attempt (SQL backends only).

    ``connection`` is the backend's native connection, inside the transaction.
    ``commit_success`` writes the task's success on it, fenced by the lease,
    and commits; if the lease was lost it rolls everything back and returns
    False. ``rollback`` discards the handler's writes.
    """

    @property
    def connection(self) -> Any: ...

    async def commit_success(self, completion: Completion) -> bool: ...

    async def rollback(self) -> None: ...

    async def abandon(self) -> None:
        """End the transaction from outside while its handler may still use the
        connection (a thread that ignored the order to stop): nothing the
        handler writes afterwards can commit."""


@runtime_checkable
class Backend(Protocol):
    """A storage engine for tasks, attempts and workers."""

    capabilities: frozenset[Capability]

    async def open(self) -> None:
        """Connect; apply pending migrations unless told not to."""

    async def close(self) -> None: ...

    async def migrate(self) -> list[int]:
        """Apply pending schema migrations; return the versions applied now."""

    async def destroy(self) -> None:
        """Delete everything this backend stores (tables, schema). Irreversible."""

    async def enqueue(self, params: EnqueueParams, connection: Any = None) -> list[int]:
        """Insert tasks, returning their ids in order; with ``connection``, inside
        the caller's transaction (needs ``TRANSACTIONAL_ENQUEUE``). A task
        whose name and idempotency key are stored already is not inserted
        again: its stored id comes back. Race-free: concurrent enqueues of
        one key store one task."""

    def enqueue_sync(self, params: EnqueueParams, connection: Any) -> list[int]:
        """Insert tasks on the caller's own synchronous connection, uncommitted."""

    async def enqueue_chunks(self, chunks: Iterable[Sequence[NewTask]]) -> list[int]:
        """Insert every chunk's tasks, all or none; their ids in order.

        Drawing a chunk from ``chunks`` may do work (check and encode its
        payloads) and may raise: then nothing is stored. A backend may insert
        one chunk while the next is drawn."""

    async def claim(self, params: ClaimParams) -> list[ClaimedTask]:
        """Claim up to ``limit`` due or reclaimable tasks, returned in claim
        order: priority (highest first), then run_at, then id."""

    async def heartbeat(self, params: HeartbeatParams) -> HeartbeatResult: ...

    async def cancel_requested(
        self, worker_id: str, tokens: Sequence[LeaseToken]
    ) -> frozenset[LeaseToken]:
        """The leases among ``tokens``, held by ``worker_id``, whose task's
        cancel was requested. Reads only: a worker asks it when a
        :class:`CancelHint` arrives, sooner than its next heartbeat."""

    async def finish(self, params: FinishParams) -> FinishResult: ...

    async def begin_attempt_transaction(self, worker_id: str) -> AttemptTransaction:
        """Open an attempt's transaction on an async connection."""

    def begin_attempt_transaction_sync(self, worker_id: str) -> AttemptTransaction:
        """Open an attempt's transaction on a sync connection, from a handler's thread.

        ``connection`` is then a synchronous native connection; ``commit_success``
        and ``rollback`` stay awaitable (the worker runs them off its loop).
        """

    async def send(self, params: SendParams, connection: Any = None) -> list[int]:
        """Put messages in coroutine tasks' inboxes, all or none; their ids.

        A waiting recipient is pending again at once, a sleeping one is due
        now; one being polled sees the message at its next poll. Raises
        TaskNotFoundError, TaskFinishedError or NoInboxError (nothing is
        sent then). With ``connection``, inside the caller's transaction
        (needs ``TRANSACTIONAL_ENQUEUE``)."""

    def send_sync(self, params: SendParams, connection: Any) -> list[int]:
        """``send`` on the caller's own synchronous connection, uncommitted."""

    async def inbox(self, task_id: int) -> list[Message]:
        """The messages in a task's inbox not consumed yet, oldest first."""

    async def cancel(self, task_id: int, now: datetime | None = None) -> TaskState:
        """Cancel a task; returns its state afterwards (``in_progress`` while its
        worker is being told). Raises TaskNotFoundError or InvalidTransitionError.
        A cancelled coroutine task's live children are cancelled too."""

    async def retry(self, task_id: int, now: datetime | None = None) -> TaskState:
        """Make a failed or cancelled task pending again with a fresh budget."""

    async def get_task(self, task_id: int, with_attempts: bool = True) -> Task | None: ...

    async def list_tasks(self, task_filter: TaskFilter) -> list[Task]: ...

    async def count_unfinished(self, work: WorkFilter) -> int:
        """Due pending plus in-progress tasks matching ``work``."""

    async def next_due_at(self, queues: Sequence[str]) -> datetime | None: ...

    async def register_worker(self, info: WorkerInfo) -> None: ...

    async def stop_worker(self, worker_id: str) -> None: ...

    async def list_workers(self) -> list[WorkerInfo]: ...

    def wakeups(self, queues: Sequence[str]) -> AsyncIterator[Wakeup]:
        """Yield a queue name whenever work may have become due there, and a
        :class:`CancelHint` whenever a running task may have been cancelled.

        Reconnects on its own; ends only when the consumer stops iterating.
        Backends without ``NOTIFICATIONS`` yield nothing and never end.
        """
        ...
