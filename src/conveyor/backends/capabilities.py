"""The optional capabilities: a protocol for each that a backend may add
to :class:`~conveyor.backends.protocol.Backend`, and the one lookup,
:func:`capability_of`, that gives a backend as one of them.

A backend declares what it offers in its ``capabilities``
(:class:`~conveyor.backends.protocol.Capability`) and implements exactly
what it declares; callers look a capability up once, when they build or
open a backend, and take None as "not offered".
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from datetime import datetime
from typing import Any, Literal, Protocol, TypeAlias, overload, runtime_checkable

from conveyor.backends.params import (
    Completion,
    EnqueueParams,
    HandOff,
    HeartbeatParams,
    HeartbeatResult,
    Offered,
    OfferParams,
    SendParams,
)
from conveyor.backends.protocol import Backend, Capability
from conveyor.model import Task
from conveyor.records import (
    ActivityBucket,
    KeyInfo,
    Migration,
    PruneParams,
    PruneResult,
    QueueBacklog,
    TaskCount,
    TaskFilter,
    TaskSummary,
    WorkerInfo,
)

Connection: TypeAlias = Any
"""A caller's native database connection (a psycopg ``Connection`` or
``AsyncConnection``, a ``sqlite3.Connection``): a backend checks its type."""


@runtime_checkable
class TransactionalEnqueue(Protocol):
    """``Capability.TRANSACTIONAL_ENQUEUE``: enqueue and send inside the
    caller's own database transaction, so that the tasks and messages exist
    if and only if the caller commits. Nothing is committed here. Raises
    ConfigurationError for a connection of the wrong kind or store."""

    async def enqueue_in(self, params: EnqueueParams, connection: Connection) -> list[int]:
        """:meth:`Backend.enqueue` on the caller's async connection (a sync
        ``sqlite3.Connection`` is used on the caller's thread)."""

    def enqueue_in_sync(self, params: EnqueueParams, connection: Connection) -> list[int]:
        """:meth:`Backend.enqueue` on the caller's synchronous connection."""

    async def send_in(self, params: SendParams, connection: Connection) -> list[int]:
        """:meth:`Backend.send` on the caller's async connection."""

    def send_in_sync(self, params: SendParams, connection: Connection) -> list[int]:
        """:meth:`Backend.send` on the caller's synchronous connection."""


class AttemptTransaction(Protocol):
    """A database transaction opened for one attempt.

    ``connection`` is the backend's native connection, inside the transaction.
    ``commit_success`` writes the task's success on it, fenced by the lease,
    and commits; if the lease was lost it rolls everything back and returns
    False. ``rollback`` discards the handler's writes.
    """

    @property
    def connection(self) -> Connection: ...

    async def commit_success(self, completion: Completion) -> bool: ...

    async def rollback(self) -> None: ...

    async def abandon(self) -> None:
        """End the transaction from outside while its handler may still use the
        connection (a thread that ignored the order to stop): nothing the
        handler writes afterwards can commit."""


@runtime_checkable
class AttemptTransactions(Protocol):
    """``Capability.ATTEMPT_TRANSACTION``: a handler's writes commit
    atomically with its task's success (``ctx.transaction()``)."""

    async def begin_attempt_transaction(self, worker_id: str) -> AttemptTransaction:
        """Open an attempt's transaction on an async connection."""

    def begin_attempt_transaction_sync(self, worker_id: str) -> AttemptTransaction:
        """Open an attempt's transaction on a sync connection, from a handler's thread.

        ``connection`` is then a synchronous native connection; ``commit_success``
        and ``rollback`` stay awaitable (the worker runs them off its loop).
        """


@runtime_checkable
class Inspector(Protocol):
    """``Capability.INSPECT``: the read side of the CLI and dashboards. Reads
    only. A page of ``list_tasks`` is served by an index; ``count_tasks``
    reads every task (no index holds state, queue and name together: one
    would cost every state change an index write)."""

    async def list_tasks(self, task_filter: TaskFilter) -> list[Task]:
        """Tasks newest first, filtered and paged (see :class:`TaskFilter`),
        without their attempt logs."""

    async def list_summaries(self, task_filter: TaskFilter) -> list[TaskSummary]:
        """The tasks :meth:`list_tasks` gives for ``task_filter`` (the same
        ids, in the same order), as summaries: no payload or result is read.
        PostgreSQL and SQLite take the page's ids off an index before they
        read any other column, and each summarized task's latest attempt by
        key; Redis reads the named fields of each task's hash and the last
        row of its attempt log; memory copies no payload."""

    async def summaries(self, ids: Sequence[int]) -> list[TaskSummary]:
        """The stored tasks among ``ids``, as summaries (as
        :meth:`list_summaries` gives them: no payload or result is read),
        highest id first, read in one round trip (Redis: two pipelined ones);
        an id no task has is left out. At most
        :data:`~conveyor.backends.params.MAX_READ_IDS` ids per call (a
        caller reads more in chunks); ConfigurationError beyond, or for
        what is not a task id."""

    async def running_by_worker(self) -> dict[str, int]:
        """How many tasks each worker runs now (workers running none left
        out): counted off the index of running tasks, no task read whole."""

    async def count_tasks(self) -> list[TaskCount]:
        """How many tasks there are, by state, queue and name (zero counts
        left out), ordered by state, queue and name."""

    async def list_workers(self) -> list[WorkerInfo]:
        """Every worker the store knows, live or stopped, newest first."""

    async def list_keys(self, limit: int = 1000, now: datetime | None = None) -> list[KeyInfo]:
        """The flow-control keys that hold tasks back (see :class:`KeyInfo`),
        by key, at most ``limit``: those with pending tasks or a rate bucket
        still refilling, and until when (``now``: tests only)."""

    async def queue_backlogs(self, now: datetime | None = None) -> list[QueueBacklog]:
        """Every queue with pending tasks, by queue name (``now``: tests
        only; else the store's clock). Reads each pending task's index entry
        (Redis: three reads per queue)."""

    async def activity(self, since: datetime, bucket_seconds: int) -> list[ActivityBucket]:
        """Tasks finished since ``since``, by outcome, in buckets of
        ``bucket_seconds`` (1 or more) from ``since`` on: bucket ``k`` covers
        ``[since + k * bucket_seconds, since + (k + 1) * bucket_seconds)``.
        Only buckets with a task are returned, oldest first.

        What is counted is each task's finish time and its state now (not
        the attempt log): a failed task retried since, or a task pruned, is
        no longer counted; a task that ended, was retried and ended again
        counts once, at its last end. Cancelled tasks are left out.
        PostgreSQL and SQLite read the newest :data:`ACTIVITY_SCAN` tasks of
        each of the two states (by id, off the state index: no index holds
        finish times), so a store that finished more than that many since
        ``since`` has its oldest buckets undercounted, and so does a task
        finished lately long after its enqueue behind that many newer ones; Redis
        counts its index of finished tasks by finish time, two reads per
        bucket; memory walks its tasks. Raises ConfigurationError for a
        ``bucket_seconds`` below 1."""

    async def key_holders(self, key: str, limit: int = 20) -> list[int]:
        """The ids of the running tasks of concurrency key ``key``, lowest
        first, at most ``limit``: what holds its pending tasks back."""

    async def count_prunable(self, params: PruneParams) -> PruneResult:
        """How many tasks and workers :meth:`Backend.prune` would delete with
        ``params``, all batches together (``limit`` is ignored). Reads only;
        reads every finished task of the states named."""

    async def pending_migrations(self) -> list[Migration]:
        """The migrations this store still needs, in order, without applying
        them (an empty list: the schema is current). Reads only."""


@runtime_checkable
class Vacuums(Protocol):
    """``Capability.VACUUM``: a store whose dead rows must be vacuumed away
    (PostgreSQL). Workers call :meth:`vacuum` after they prune."""

    async def vacuum(self) -> list[str]:
        """Vacuum the store's tables that need it and that the server will not
        vacuum itself (its autovacuum is off, for the server or the table):
        those with more dead rows than 10,000 plus a twentieth of their
        live ones, and analyze them (the server's autovacuum would have; without
        statistics the planner guesses). Tables another session is vacuuming
        are passed by. The tables vacuumed."""


class TurnLock(Protocol):
    """The lock one kind of worker takes turns at: a session lock of the
    store, held until given back or until the session ends (a worker that
    dies or loses its connection gives it back); waiters get it in turn."""

    async def take(self) -> None:
        """Wait until this worker holds the lock (raises on a store error)."""

    async def give(self) -> None:
        """Give the lock back (raises on a store error; the lock then goes
        with the session, which this closes)."""

    async def close(self) -> None:
        """End the lock's session (giving the lock back if held)."""


@runtime_checkable
class HandOffs(Protocol):
    """``Capability.HANDOFF``: idle workers offer free slots, and an enqueue
    of one task due now, with no concurrency key, idempotency key, first
    message or inbox, made on the backend's own connection (not the
    caller's transaction), leases it to one of them in its own commit when
    an offer has a slot for its queue and name (neither paused).

    The store counts each offer's slots down as enqueues fill them; a
    worker that withdraws its offer learns how many were left, so it knows
    how many hand-offs it is owed. A hand-off is an ordinary lease: renewed
    by the heartbeat, fenced like a claim's, and reclaimed when it expires
    (so a hand-off whose worker died or never heard of it runs again after
    one lease, as a claimed task would)."""

    async def offer(self, params: OfferParams) -> Offered:
        """Add ``params.free`` slots to the worker's offer (made if there
        is none) and renew it."""

    async def withdraw(self, worker_id: str) -> int:
        """Delete the worker's offer; the slots it still had (0 if none)."""

    async def adopt(self, worker_id: str, known: Sequence[int]) -> list[HandOff]:
        """The tasks handed off to the worker, still in progress under its
        first lease, whose ids are not in ``known``: those whose notice it
        may not have heard."""


@runtime_checkable
class Turns(Protocol):
    """``Capability.TURNS``: one lock per kind of worker for wake-up turns."""

    def turn_lock(self, kind: str) -> TurnLock:
        """The turn lock of the workers of ``kind`` (their queues and task
        names), on a session of its own, opened at the first ``take``."""


class Renewer(Protocol):
    """What a worker's heartbeat thread renews leases with: a backend of
    its own, or a store's :class:`SharedHeartbeats`."""

    async def open(self) -> None: ...

    async def close(self) -> None: ...

    async def heartbeat(self, params: HeartbeatParams) -> HeartbeatResult: ...


@runtime_checkable
class SharedHeartbeats(Protocol):
    """A backend whose heartbeats may run on a connection it already keeps
    for its worker, on a thread of their own (PostgreSQL's session
    connection), instead of on a backend of the heartbeat's own."""

    def session_heartbeats(self) -> Renewer | None:
        """The renewer to use from the heartbeat's thread (a new one at each
        call), or None where the backend keeps no such connection."""


PROTOCOLS: Mapping[Capability, type] = {
    Capability.TRANSACTIONAL_ENQUEUE: TransactionalEnqueue,
    Capability.ATTEMPT_TRANSACTION: AttemptTransactions,
    Capability.INSPECT: Inspector,
    Capability.VACUUM: Vacuums,
    Capability.TURNS: Turns,
    Capability.HANDOFF: HandOffs,
}
"""The protocol each capability with methods of its own names."""


@overload
def capability_of(
    backend: Backend, capability: Literal[Capability.TRANSACTIONAL_ENQUEUE]
) -> TransactionalEnqueue | None: ...
@overload
def capability_of(
    backend: Backend, capability: Literal[Capability.ATTEMPT_TRANSACTION]
) -> AttemptTransactions | None: ...
@overload
def capability_of(
    backend: Backend, capability: Literal[Capability.INSPECT]
) -> Inspector | None: ...
@overload
def capability_of(backend: Backend, capability: Literal[Capability.VACUUM]) -> Vacuums | None: ...
@overload
def capability_of(backend: Backend, capability: Literal[Capability.TURNS]) -> Turns | None: ...
@overload
def capability_of(backend: Backend, capability: Literal[Capability.HANDOFF]) -> HandOffs | None: ...
def capability_of(backend: Backend, capability: Capability) -> object:
    """The backend as the protocol of ``capability`` (see :data:`PROTOCOLS`),
    or None when it does not declare it. Raises TypeError for a backend
    that declares the capability without implementing its protocol."""
    if capability not in backend.capabilities:
        return None
    if isinstance(backend, PROTOCOLS[capability]):
        return backend
    raise TypeError(f"{type(backend).__name__} declares {capability.value} without its methods")
