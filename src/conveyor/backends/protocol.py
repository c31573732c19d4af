"""The backend protocol: what every store does.

:class:`Backend` is the core every store implements (enqueue, claim,
heartbeat, finish, cancel, retry, send, reads for the worker), and
:class:`Capability` names what some stores add. Each optional capability
with methods of its own is a protocol in :mod:`conveyor.backends.capabilities`,
looked up once with ``capability_of``. A store implements exactly what it
declares: none has a method that only raises. The params the operations
take are in :mod:`conveyor.backends.params`; the records the reads give
back in :mod:`conveyor.records`.

Each operation takes one params object and returns domain objects.
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
- Dependencies (``NewTask.after``): an enqueue stores a task with
  dependencies ``waiting``, its ``waiting_for`` their number, with one edge
  per entry (a stored id, or an earlier task of the same enqueue; a stored
  id that does not exist raises TaskNotFoundError and nothing is stored,
  before any unique key is looked at),
  then counts at once those already ended. From then on, whenever a task
  reaches a terminal state, whatever ended it (its worker, a cancel, a bulk
  cancel, a spent crash budget, a quarantine, an expiry), the same write
  settles each edge of which it is the dependency and not settled yet
  (an edge is settled once: a manual retry of its dependency moves
  nothing again) and, for a dependent still ``waiting`` with
  ``waiting_for > 0``: a dependency that succeeded, or any end under the
  ``run`` policy, takes one off ``waiting_for``, and the last makes the
  dependent pending, due at the later of now and its own ``run_at``, its
  queue woken; one that failed or was cancelled ends the dependent
  ``cancelled`` (policy ``cancel``) or ``failed`` (``fail``), which moves
  its own dependents in turn. A dependency ending at the same time as the
  enqueue that names it is counted exactly once, by one or the other. An
  enqueue whose task hits a stored idempotency key stores no edge.
  ``delete`` refuses (InvalidTransitionError) a task that an unfinished
  dependent waits for, and ``prune`` keeps it, so that the dependent can
  read its outcome (``dependencies``).
- Times come from the backend's clock; ``now`` on a params object overrides
  it for tests only.
"""

from __future__ import annotations

import enum
from collections.abc import AsyncIterator, Iterable, Sequence
from datetime import datetime
from typing import Protocol, runtime_checkable

from conveyor.backends.params import (
    ClaimedTask,
    ClaimParams,
    EnqueueParams,
    FinishParams,
    FinishResult,
    FireParams,
    HeartbeatParams,
    HeartbeatResult,
    NewTask,
    ProgressParams,
    ScheduleSync,
    SendParams,
    Wakeup,
    WorkFilter,
)
from conveyor.model import LeaseToken, Message, Pause, PauseKind, Task, TaskState
from conveyor.records import (
    CancelMany,
    DeleteMany,
    DependencyEdge,
    DependencyRecord,
    PruneParams,
    PruneResult,
    RetryMany,
    StoredSchedule,
    WorkerInfo,
)


class Capability(enum.Enum):
    """What a backend can offer beyond the common contract. Each of
    TRANSACTIONAL_ENQUEUE, ATTEMPT_TRANSACTION, INSPECT, VACUUM, TURNS and
    HANDOFF names a protocol of :mod:`conveyor.backends.capabilities`, which
    a backend that declares it implements; ``capability_of`` gives a
    backend's, or None."""

    TRANSACTIONAL_ENQUEUE = "transactional_enqueue"
    """Enqueue inside the caller's own database transaction."""
    ATTEMPT_TRANSACTION = "attempt_transaction"
    """A handler's writes commit atomically with the task's success."""
    NOTIFICATIONS = "notifications"
    """Push wake-ups for idle workers (otherwise they poll)."""
    INSPECT = "inspect"
    """A read side for the CLI and dashboards: lists, counts and workers."""
    INLINE = "inline"
    """Tests only: an enqueue runs its tasks to the end before it returns."""
    VACUUM = "vacuum"
    """The store's tables need vacuuming that the server may not do itself."""
    TURNS = "turns"
    """Idle workers of one kind take turns answering wake-ups (a wake-up
    reaches every worker; see :mod:`conveyor.worker.turns`)."""
    HANDOFF = "handoff"
    """An idle worker offers free slots that an enqueue of one task fills
    directly, leasing the task to it in the enqueue's own commit (see
    :class:`~conveyor.backends.capabilities.HandOffs` and :mod:`conveyor.worker.standby`)."""


@runtime_checkable
class Backend(Protocol):
    """The contract every store keeps: store, claim, keep, finish, control and
    read tasks. Each method raises BackendUnavailableError when the store
    cannot be reached (nothing is known to have happened then, except where
    said), and ConfigurationError for arguments it cannot take."""

    capabilities: frozenset[Capability]

    @property
    def location(self) -> str:
        """Where this backend stores, as shown to people: the URL with its
        secrets shown as ``***`` (:func:`conveyor.redaction.redact_url`; and
        the PostgreSQL schema), an absolute SQLite path."""
        ...

    async def open(self) -> None:
        """Connect, then as the backend's ``migrate`` option says: True (the
        default) applies the pending migrations, creating the store at its
        first use; False refuses a store that is missing or behind
        (StoreNotReadyError) and creates nothing; None only connects (the
        caller migrates, or reads what is there). Either check is one read
        of the store's migration record; nothing is written unless a
        migration is pending."""

    async def close(self) -> None:
        """Release every connection; the backend cannot be used afterwards."""

    async def migrate(self) -> list[int]:
        """Apply pending schema migrations; return the versions applied now.
        Reads the store's migration record first: a current store is never
        written to (no DDL), so a role without DDL rights can call it."""

    async def require_migrated(self) -> None:
        """Raise StoreNotReadyError, naming the store, unless it exists with
        every migration applied. Reads only; creates nothing."""

    async def destroy(self) -> None:
        """Delete everything this backend stores (tables, schema). Irreversible."""

    async def enqueue(self, params: EnqueueParams) -> list[int]:
        """Insert tasks, all or none, and return their ids in order once
        durable. A task whose name and idempotency key are stored already is
        not inserted again: its stored id comes back. Race-free: concurrent
        enqueues of one key store one task."""

    async def enqueue_chunks(self, chunks: Iterable[Sequence[NewTask]]) -> list[int]:
        """Insert every chunk's tasks, all or none; their ids in order.

        Drawing a chunk from ``chunks`` may do work (check and encode its
        payloads) and may raise: then nothing is stored. A backend may insert
        one chunk while the next is drawn."""

    async def claim(self, params: ClaimParams) -> list[ClaimedTask]:
        """Claim up to ``limit`` due or reclaimable tasks of these names and
        queues, in claim order: priority (highest first), then run_at, then
        id. Atomic: each task goes to one worker per lease, its attempt row
        exists when this returns, an expired lease found on the way is
        reclaimed (its attempt closed ``lease_lost``) or, with its crash
        budget spent, its task ends ``failed``. A backend may look for
        expired leases on some claims only (see its ``sweep_interval``)."""

    async def heartbeat(self, params: HeartbeatParams) -> HeartbeatResult:
        """Extend the leases ``worker_id`` still holds; report those it lost
        and those whose task's cancel was requested. Fenced: a lease that
        expired or moved on is never extended."""

    async def report_progress(self, params: ProgressParams) -> frozenset[LeaseToken]:
        """Store each report on its task, as the task's ``progress`` (with the
        store's clock as its time), where the report's lease is live: this
        attempt, this worker, not expired (a heartbeat's fence; nothing else
        of the task changes, its lease is not extended). Returns the tokens
        whose report was stored; the others' leases are lost (or their row
        was busy being finished: a report is a hint, never waited for)."""

    async def cancel_requested(
        self, worker_id: str, tokens: Sequence[LeaseToken]
    ) -> frozenset[LeaseToken]:
        """The leases among ``tokens``, held by ``worker_id``, whose task's
        cancel was requested. Reads only: a worker asks it when a
        :class:`CancelHint` arrives, sooner than its next heartbeat."""

    async def finish(self, params: FinishParams) -> FinishResult:
        """Record how attempts ended (see :class:`Completion`), each fenced by
        its lease token and a live lease: a completion whose lease is gone
        changes nothing and comes back in ``rejected``, never raised. An
        applied completion writes its effects in the same transaction."""

    async def send(self, params: SendParams) -> list[int]:
        """Put messages in coroutine tasks' inboxes, all or none; their ids.

        A waiting recipient is pending again at once, a sleeping one is due
        now; one being polled sees the message at its next poll. Raises
        TaskNotFoundError, TaskFinishedError or NoInboxError (nothing is
        sent then)."""

    async def inbox(self, task_id: int) -> list[Message]:
        """The messages in a task's inbox not consumed yet, oldest first."""

    async def cancel(self, task_id: int, now: datetime | None = None) -> TaskState:
        """Cancel a task; returns its state afterwards (``in_progress`` while its
        worker is being told). Raises TaskNotFoundError or InvalidTransitionError.
        A cancelled coroutine task's live children are cancelled too."""

    async def retry(self, task_id: int, now: datetime | None = None) -> TaskState:
        """Make a failed or cancelled task pending again with a fresh budget.
        Raises TaskNotFoundError or InvalidTransitionError."""

    async def run_now(self, task_id: int, now: datetime | None = None) -> TaskState:
        """Make a pending task due now (a delay, back-off, snooze or sleep cut
        short) and wake its queue. Raises TaskNotFoundError, or
        InvalidTransitionError for a task that is not pending."""

    async def delete(self, task_id: int) -> None:
        """Delete a task with its attempts, messages and keys. Raises
        TaskNotFoundError, or InvalidTransitionError for a task in progress
        (cancel it first) or an unfinished one whose parent is alive."""

    async def retry_many(self, selection: RetryMany) -> list[int]:
        """One batch of a bulk retry (see :class:`RetryMany`): each task
        pending again, due now, with a fresh budget, as :meth:`retry`; rows
        locked by others are passed by. The ids moved, in order."""

    async def cancel_many(self, selection: CancelMany) -> list[int]:
        """One batch of a bulk cancel (see :class:`CancelMany`), each task as
        :meth:`cancel` (a running one has its cancel requested, its worker
        told). The ids cancelled, in order."""

    async def delete_many(self, selection: DeleteMany) -> list[int]:
        """One batch of a bulk delete (see :class:`DeleteMany`), each task as
        :meth:`delete`. The ids deleted, in order."""

    async def get_task(self, task_id: int, with_attempts: bool = True) -> Task | None:
        """The task (with its attempt log unless told not to), or None."""

    async def dependencies(self, task_id: int) -> list[DependencyRecord]:
        """The task's dependencies (its ``after``), in the order they were
        given; [] for a task without any, or not stored."""

    async def edges(self, ids: Sequence[int]) -> list[DependencyEdge]:
        """Every edge whose dependent or dependency is among ``ids``, each
        once, by dependent then position, read in one round trip (PostgreSQL
        and SQLite: one statement, off the edges' key and the index on the
        task waited for; Redis: one script; memory: under its lock): what a
        walk of a task's graph reads per level (:mod:`conveyor.graph`). An
        id no task has gives nothing; the edges of a dependency that is no
        longer stored are found from their dependents' side only. At most
        :data:`~conveyor.backends.params.MAX_READ_IDS` ids per call (a
        caller reads more in chunks); ConfigurationError beyond, or for
        what is not a task id (see :func:`~conveyor.backends.params.read_ids`)."""

    async def count_unfinished(self, work: WorkFilter) -> int:
        """Due pending plus in-progress tasks matching ``work``."""

    async def next_due_at(self, queues: Sequence[str]) -> datetime | None:
        """When the next pending task of these queues becomes due, or None."""

    async def register_worker(self, info: WorkerInfo) -> None:
        """Record a live worker (again, after a restart of the same id)."""

    async def stop_worker(self, worker_id: str) -> None:
        """Record that a worker stopped."""

    async def prune(self, params: PruneParams) -> PruneResult:
        """Delete one batch of finished tasks (with their attempts, messages
        and idempotency keys) and old workers, as ``params`` allow: state
        by state in the order ``params.before`` gives them, oldest ids first
        within each (Redis: oldest finish first). Never a task that is
        pending, in progress or waiting, nor a finished one whose parent is
        alive (its end message may yet be read). One transaction per batch,
        whose locks are held only as long as it runs; rows locked by others
        (a claim, a completion) are passed by. Stores that many processes
        share prune in one process at a time: a batch that finds another one
        under way returns ``busy``."""

    async def sync_schedules(self, params: ScheduleSync) -> bool:
        """Store an app's schedules and drop those it removed, unless a
        newer live release of the app runs (see :class:`ScheduleSync`), in one
        transaction. False: a newer live release refused the whole sync (only
        this release's last sync was recorded)."""

    async def list_schedules(self) -> tuple[datetime, list[StoredSchedule]]:
        """The store's clock now, and every stored schedule by name."""

    async def store_clock(self) -> datetime:
        """The store's clock now (timezone-aware): what its leases, due times
        and worker heartbeats are read by. One read, of nothing else."""

    async def fire_schedule(self, params: FireParams) -> list[int]:
        """Enqueue the tasks of some slots of a schedule, at most once per
        slot across every worker: in one transaction, only if the stored
        schedule has ``fingerprint`` and its last slot is before the first
        of ``slots``, move its last slot to the last of them and store the
        tasks. Their ids, or [] if another worker fired them first (or the
        schedule changed or went)."""

    async def pause(self, kind: PauseKind, name: str, now: datetime | None = None) -> bool:
        """Pause a queue or a task name: from this call's commit on, no claim
        starts an attempt of a task it holds back (nor reclaims one); running
        attempts go on. Whether it was paused by this call (False: it was
        already). Stored: it outlives every worker."""

    async def resume(self, kind: PauseKind, name: str) -> bool:
        """Undo a pause, and wake idle workers whose work it held back.
        Whether it was paused."""

    async def list_pauses(self) -> list[Pause]:
        """Every pause, by kind and name."""

    def wakeups(
        self, queues: Sequence[str], handoffs_for: tuple[str, str] | None = None
    ) -> AsyncIterator[Wakeup]:
        """Yield a queue name whenever work may have become due there, and a
        :class:`CancelHint` whenever a running task may have been cancelled.
        With ``handoffs_for`` (a worker id and its process's nonce, as in
        :class:`OfferParams`) and ``Capability.HANDOFF``, also the tasks
        handed off to that process (:class:`HandOff`), and
        :class:`HandOffsHeard` as the listener connects, hears an offer's
        own notice, or loses its connection.

        Reconnects on its own; ends only when the consumer stops iterating.
        Backends without ``NOTIFICATIONS`` yield nothing and never end.
        """
        ...
