"""The backend protocol: what every store does, and what some stores add.

:class:`Backend` is the core every store implements (enqueue, claim,
heartbeat, finish, cancel, retry, send, reads for the worker). Optional
capabilities are protocols of their own, declared in ``capabilities`` and
looked up once with ``transactional_of``, ``attempt_transactions_of`` and
``inspector_of``: :class:`TransactionalEnqueue` (enqueue and send inside a
caller's transaction), :class:`AttemptTransactions` (a handler's writes
commit with its task's success) and :class:`Inspector` (lists, counts and
workers for the CLI and dashboards). A store implements exactly what it
declares: none has a method that only raises.

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
- Times come from the backend's clock; ``now`` on a params object overrides
  it for tests only.
"""

from __future__ import annotations

import enum
import hashlib
import json
from collections.abc import AsyncIterator, Iterable, Mapping, Sequence
from dataclasses import dataclass
from datetime import datetime
from typing import Any, ClassVar, Protocol, TypeAlias, runtime_checkable

from conveyor.errors import ConfigurationError
from conveyor.model import (
    LeaseToken,
    Message,
    Outcome,
    Pause,
    PauseKind,
    RetryPolicy,
    Task,
    TaskState,
    check_name,
)


class Capability(enum.Enum):
    """What a backend can offer beyond the common contract. The first three
    name the optional protocols below (a backend that declares one
    implements it); ``transactional_of``, ``attempt_transactions_of`` and
    ``inspector_of`` give a backend's, or None."""

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
    :class:`HandOffs` and :mod:`conveyor.worker.standby`)."""


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
    """The task's unique key among those of its name: an enqueue whose name
    and key are held by a stored task inserts nothing (nor its first
    message) and, by ``on_conflict``, returns the holder's id, replaces the
    pending holder's payload, priority and due time, or raises
    TaskExistsError."""
    unique_scope: str | None = None
    """``pending`` or ``active``: the task gives its key up when it leaves
    that scope (starts; finishes). None: it holds it while stored (or for
    ``unique_for``)."""
    unique_for: float | None = None
    """Seconds after its enqueue the task holds its key (then a new enqueue
    of the key takes it)."""
    on_conflict: str = "existing"
    """``existing``, ``replace`` or ``raise`` (see ``idempotency_key``)."""
    concurrency_key: str | None = None
    """At most ``concurrency_limit`` attempts of the tasks that share this key
    run at once, across every worker (the limit of the key's newest claimed
    task applies)."""
    concurrency_limit: int | None = None
    rate_limit: int | None = None
    """At most this many tasks of ``concurrency_key`` start per ``rate_period``
    seconds (a token bucket of ``rate_limit`` tokens, refilled at that rate;
    the rate the key had when its row was made applies)."""
    rate_period: float | None = None
    trace: str | None = None
    """The trace context of the enqueue (a propagator's carrier as JSON text,
    see :mod:`conveyor.tracing`), stored with the task; None untraced."""


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
    inbox_names: Sequence[str] = ()
    """Coroutine task names: a backend may read the inbox of each such task
    it claims with the claim (``ClaimedTask.inbox``)."""


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
    run_at: datetime | None = None
    """When the task was due (before this claim): the start of its wait."""
    trace: str | None = None
    """The trace context stored with the task (see ``NewTask.trace``)."""
    inbox: list[Message] | None = None
    """The task's inbox as its claim read it (see ``ClaimParams.inbox_names``);
    None: not read, the poll reads it itself."""


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
    busy); its lease keeps the expiry it had. ``registered``: False when the
    store no longer knows the worker (its registration was deleted: a store
    restarted without its data, a restored backup, an operator), which then
    registers again."""

    renewed: frozenset[LeaseToken]
    lost: frozenset[LeaseToken]
    cancel_requested: frozenset[LeaseToken]
    registered: bool = True


@dataclass(frozen=True, slots=True)
class ErrorInfo:
    type: str
    message: str
    traceback: str | None = None


@dataclass(frozen=True, slots=True)
class Transition:
    """A step workflow moving on, or a coroutine task's poll completion: its next
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
    trace: str | None = None
    """The sender's trace context (see ``NewTask.trace``)."""


@dataclass(frozen=True, slots=True)
class Effects:
    """What a coroutine task's poll does besides completing: the inbox messages
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
    """Which tasks :meth:`Inspector.list_tasks` returns: newest (highest id)
    first, each filter optional, at most ``limit`` (0 or more);
    ``before`` pages on: only ids below it (the last id of the page before);
    ``parent``: only the children that coroutine task spawned (read off its
    index of children, whatever the table holds)."""

    state: TaskState | None = None
    name: str | None = None
    queue: str | None = None
    limit: int = 100
    before: int | None = None
    parent: int | None = None

    def __post_init__(self) -> None:
        if isinstance(self.limit, bool) or not isinstance(self.limit, int):
            raise ConfigurationError("limit must be an integer")
        if self.limit < 0:
            raise ConfigurationError("limit must be 0 or more")
        for name, value in (("before", self.before), ("parent", self.parent)):
            if value is not None and (isinstance(value, bool) or not isinstance(value, int)):
                raise ConfigurationError(f"{name} must be a task id")
        if self.name is not None:
            check_name("a task name", self.name)
        if self.queue is not None:
            check_name("queue", self.queue)


SUMMARY_ERROR_CHARS = 500
"""The characters of an error's type and message a :class:`TaskSummary` keeps."""


@dataclass(frozen=True, slots=True)
class LastError:
    """How a task's latest ended attempt failed (see ``TaskSummary.last_error``):
    its outcome, and its error's type and message, each cut to
    :data:`SUMMARY_ERROR_CHARS` characters (None where the attempt has none:
    a lost lease, an interruption)."""

    outcome: Outcome
    error_type: str | None
    error_message: str | None


@dataclass(frozen=True, slots=True)
class TaskSummary:
    """A listed task as the CLI's ``tasks`` and the dashboard's lists show
    it (:meth:`Inspector.list_summaries`): no payload, no result, no
    options, no attempt log, so that a page costs the same whatever its
    tasks carry. ``worker_id`` is the owner of a running task (None in any
    other state). ``last_error``: for a task that is not running and did not
    succeed, its latest ended attempt when that attempt did not succeed
    either (a failure, a lost lease, a timeout, a cancel, an interruption);
    None otherwise, and for a task never run."""

    id: int
    name: str
    queue: str
    state: TaskState
    priority: int
    run_at: datetime
    attempt: int
    max_attempts: int
    created_at: datetime
    finished_at: datetime | None
    worker_id: str | None
    cancel_requested: bool
    step: str | None
    last_error: LastError | None


def last_error_of(
    state: TaskState, outcome: str | None, error_type: str | None, error_message: str | None
) -> LastError | None:
    """The ``last_error`` of a summary from its task's state and its latest
    ended attempt's columns (``outcome`` None: it has none), cut as
    :class:`LastError` says: the one rule every engine applies."""
    if state in (TaskState.IN_PROGRESS, TaskState.SUCCEEDED) or outcome is None:
        return None
    if outcome in (Outcome.SUCCEEDED.value, Outcome.IN_PROGRESS.value):
        return None
    return LastError(
        Outcome(outcome),
        None if error_type is None else error_type[:SUMMARY_ERROR_CHARS],
        None if error_message is None else error_message[:SUMMARY_ERROR_CHARS],
    )


ACTIVITY_SCAN = 100_000
"""The newest succeeded, and failed, tasks that ``Inspector.activity`` reads
at most on PostgreSQL and SQLite."""


@dataclass(frozen=True, slots=True)
class QueueBacklog:
    """A queue's pending tasks: ``due`` now and due ``later``, and the run
    time of its oldest due one (how long the queue has kept work waiting)."""

    queue: str
    due: int
    later: int
    oldest_due_at: datetime | None


@dataclass(frozen=True, slots=True)
class ActivityBucket:
    """Tasks that finished in one bucket of time, from ``start`` (inclusive)
    for :meth:`Inspector.activity`'s ``bucket_seconds``: how many now stand
    ``succeeded`` and how many ``failed``."""

    start: datetime
    succeeded: int
    failed: int


@dataclass(frozen=True, slots=True)
class TaskCount:
    """How many tasks of one name, in one queue, are in one state."""

    state: TaskState
    queue: str
    name: str
    count: int


@dataclass(frozen=True, slots=True)
class TaskSelection:
    """Which tasks one batch of a bulk action takes: tasks in ``states``
    with ids above ``after`` (and, with ``ids``, among them), of ``name``
    and ``queue`` and created in [``since``, ``until``) where given, at most
    ``limit``, oldest first.

    Every engine reads the selection in the same write as the action
    (PostgreSQL and SQLite: one statement; Redis: one script; memory: under
    its lock): a task whose state changed since a caller listed it is judged
    by its state then, so a bulk action never touches a task its filter no
    longer selects. Each action says which ``states`` it takes (``ALLOWED``)."""

    ALLOWED: ClassVar[frozenset[TaskState]] = frozenset()
    ACTION: ClassVar[str] = "act on"

    states: Sequence[TaskState] = ()
    name: str | None = None
    queue: str | None = None
    since: datetime | None = None
    until: datetime | None = None
    ids: Sequence[int] | None = None
    after: int = 0
    limit: int = 500
    now: datetime | None = None

    def __post_init__(self) -> None:
        if not self.states or not all(s in self.ALLOWED for s in self.states):
            allowed = ", ".join(sorted(s.value for s in self.ALLOWED))
            raise ConfigurationError(f"a bulk {self.ACTION} takes tasks in: {allowed}")
        if self.name is not None:
            check_name("a task name", self.name)
        if self.queue is not None:
            check_name("queue", self.queue)
        if isinstance(self.limit, bool) or not isinstance(self.limit, int) or self.limit < 1:
            raise ConfigurationError("limit must be an integer, at least 1")
        if self.ids is not None and not all(
            isinstance(i, int) and not isinstance(i, bool) for i in self.ids
        ):
            raise ConfigurationError("ids must be task ids")


@dataclass(frozen=True, slots=True)
class RetryMany(TaskSelection):
    """One batch of a bulk retry (see :class:`TaskSelection`): failed and
    cancelled tasks (by default failed ones) pending again, as a retry."""

    ALLOWED: ClassVar[frozenset[TaskState]] = frozenset({TaskState.FAILED, TaskState.CANCELLED})
    ACTION: ClassVar[str] = "retry"

    states: Sequence[TaskState] = (TaskState.FAILED,)


@dataclass(frozen=True, slots=True)
class CancelMany(TaskSelection):
    """One batch of a bulk cancel (see :class:`TaskSelection`): pending,
    waiting and running tasks (by default all three), each as a cancel."""

    ALLOWED: ClassVar[frozenset[TaskState]] = frozenset(
        {TaskState.PENDING, TaskState.WAITING, TaskState.IN_PROGRESS}
    )
    ACTION: ClassVar[str] = "cancel"

    states: Sequence[TaskState] = (TaskState.PENDING, TaskState.WAITING, TaskState.IN_PROGRESS)


@dataclass(frozen=True, slots=True)
class DeleteMany(TaskSelection):
    """One batch of a bulk delete (see :class:`TaskSelection`): finished
    tasks only (an unfinished one may have a parent waiting for it: delete
    those one by one), each as a delete."""

    ALLOWED: ClassVar[frozenset[TaskState]] = frozenset(
        {TaskState.SUCCEEDED, TaskState.FAILED, TaskState.CANCELLED}
    )
    ACTION: ClassVar[str] = "delete"

    states: Sequence[TaskState] = (TaskState.FAILED,)


@dataclass(frozen=True, slots=True)
class PruneParams:
    """What one batch of :meth:`Backend.prune` may delete: finished tasks of
    each state in ``before``, finished before its time, at most ``limit``
    (0 or more) in all; and, with ``workers_before``, workers stopped (or
    silent) since before that time."""

    before: Mapping[TaskState, datetime]
    limit: int = 1000
    workers_before: datetime | None = None

    def __post_init__(self) -> None:
        if not all(state.is_terminal for state in self.before):
            raise ConfigurationError("only finished tasks are pruned")
        if isinstance(self.limit, bool) or not isinstance(self.limit, int) or self.limit < 0:
            raise ConfigurationError("limit must be an integer, 0 or more")


@dataclass(frozen=True, slots=True)
class PruneResult:
    """What one batch deleted. ``busy``: another worker is pruning the same
    store right now, and this batch did nothing."""

    tasks: int
    workers: int
    busy: bool = False


@dataclass(frozen=True, slots=True)
class StoredSchedule:
    """A schedule as the store keeps it: its definition (as
    :class:`conveyor.schedules.Schedule` holds it; ``args`` is encoded
    JSON), the fingerprint of that definition, and the last slot fired (a
    new schedule's starts at its first sync) with the task it enqueued."""

    name: str
    task: str
    cron: str | None
    every: float | None
    tz: str
    missed: str
    catch_up: int
    args: str
    fingerprint: str
    last_slot: datetime | None = None
    last_task_id: int | None = None
    synced_at: datetime | None = None
    release: str | None = None
    """The release that stored it (see :class:`ScheduleSync`); None for a
    row stored before releases were recorded."""


RELEASE_LIFETIME = 60.0
"""Seconds a release outranks older ones after its last sync: a worker
syncs its release at least every 20 s while it runs, so one that no worker
has synced for a minute has no worker left (see :class:`ScheduleSync`)."""


def release_of(schedules: Sequence[StoredSchedule], tasks: Sequence[str]) -> str:
    """The release of an app's schedules: 16 hex digits of the SHA-256 of
    its schedules' names and fingerprints and of its task names, whatever
    their order. Two processes of one release (the same code) compute the
    same; a change of any schedule or task name gives another."""
    definition = {
        "schedules": sorted([s.name, s.fingerprint] for s in schedules),
        "tasks": sorted(set(tasks)),
    }
    text = json.dumps(definition, separators=(",", ":"))
    return hashlib.sha256(text.encode("utf-8", "surrogatepass")).hexdigest()[:16]


@dataclass(frozen=True, slots=True)
class ScheduleSync:
    """The schedules an app defines, synced when its worker starts and
    again while it runs: each is stored (a new one starting from now, a
    changed one keeping its last slot), and stored schedules of ``tasks``
    (the app's task names) that it no longer defines are removed.

    ``release`` names this set of definitions (by default
    :func:`release_of` them). The store records each release it is synced
    with: its *generation*, a number the store gives it at its first sync
    (greater than every earlier release's, and kept for good), and when it
    was last synced. A release is *live* while its last sync is at most
    ``lifetime`` seconds old. A sync changes nothing but that record when a
    live release of a greater generation shares a task name with it (a
    newer release of the same app runs: this one is older), and it never
    overwrites nor deletes a stored schedule whose release is live and of a
    greater generation (another app's newer release defines that name)."""

    schedules: Sequence[StoredSchedule]
    tasks: Sequence[str]
    now: datetime | None = None
    release: str = ""
    lifetime: float = RELEASE_LIFETIME

    def __post_init__(self) -> None:
        if not self.release:
            object.__setattr__(self, "release", release_of(self.schedules, self.tasks))


@dataclass(frozen=True, slots=True)
class FireParams:
    """Fire ``slots`` (oldest first) of schedule ``name``: ``tasks`` holds one
    task per slot (with its key)."""

    name: str
    fingerprint: str
    slots: Sequence[datetime]
    tasks: Sequence[NewTask]


@dataclass(frozen=True, slots=True)
class KeyInfo:
    """A flow-control key with pending tasks (or a rate bucket still
    refilling): its running limit, its running and pending tasks, and its
    rate (``tokens`` now; ``next_start_at``: when the next token comes, None
    while one is there or when it has no rate)."""

    key: str
    max_running: int
    running: int
    pending: int
    rate_limit: int | None = None
    rate_period: float | None = None
    tokens: float | None = None
    next_start_at: datetime | None = None

    def as_json(self) -> dict[str, Any]:
        """Its JSON shape (``conveyor keys --json``, ``explain``'s facts)."""
        return {
            "key": self.key,
            "max_running": self.max_running,
            "running": self.running,
            "pending": self.pending,
            "rate_limit": self.rate_limit,
            "rate_period": self.rate_period,
            "tokens": self.tokens,
            "next_start_at": self.next_start_at.isoformat() if self.next_start_at else None,
        }


SILENT_BEATS = 3
"""Heartbeats a worker may miss before it counts as gone (not live)."""
UNKNOWN_BEAT_SECONDS = 10.0
"""The heartbeat pause assumed for a worker that did not record its own."""


@dataclass(frozen=True, slots=True)
class WorkerInfo:
    """A worker as the workers table records it.

    ``tasks`` are the task names its app registers (empty: not recorded, as
    for workers registered before they were); ``beat_seconds`` is the
    longest pause between two of its heartbeats, which update
    ``last_seen_at`` whether or not it holds leases."""

    id: str
    host: str
    pid: int
    queues: tuple[str, ...]
    concurrency: int
    started_at: datetime | None = None
    last_seen_at: datetime | None = None
    stopped_at: datetime | None = None
    tasks: tuple[str, ...] = ()
    beat_seconds: float | None = None

    def live(self, now: datetime) -> bool:
        """Not stopped, and heard from within :data:`SILENT_BEATS` heartbeats
        (plus a second) of ``now``. A worker killed without a chance to stop
        stays live for that long after its last heartbeat."""
        if self.stopped_at is not None or self.last_seen_at is None:
            return False
        beat = self.beat_seconds if self.beat_seconds is not None else UNKNOWN_BEAT_SECONDS
        return (now - self.last_seen_at).total_seconds() <= SILENT_BEATS * beat + 1.0

    def serves(self, name: str, queue: str) -> bool:
        """Whether it claims tasks of ``name`` on ``queue`` (a worker that did
        not record its task names is taken to serve every name)."""
        return queue in self.queues and (not self.tasks or name in self.tasks)


@dataclass(frozen=True, slots=True)
class Migration:
    """A schema migration not applied yet: ``script`` is what applying it
    runs, its record in the migrations table included, ready for a
    database administrator to review and run by hand."""

    version: int
    name: str
    script: str


@dataclass(frozen=True, slots=True)
class CancelHint:
    """A wake-up about a running task: its cancel may have been requested.

    ``task_id`` names it, or is None when the backend cannot tell which task
    (SQLite sees only that another process wrote something). A hint is only
    a hint: the worker asks :meth:`Backend.cancel_requested` before it stops
    anything, and its heartbeat reports cancels anyway."""

    task_id: int | None = None


@dataclass(frozen=True, slots=True)
class HandOff:
    """A task an enqueue leased to this worker (``Capability.HANDOFF``).
    Its lease began at ``leased_at`` on the store's clock (epoch seconds),
    which is also when it was made and due (``task.run_at``)."""

    task: ClaimedTask
    leased_at: float


@dataclass(frozen=True, slots=True)
class HandOffsHeard:
    """The listener hears this worker's hand-offs: ``connected``, from now
    on (its first connection, or a new one after a failure: hand-offs told
    before may not have reached it, see :meth:`HandOffs.adopt`); else the
    notice of the offer that sent ``ping`` arrived (the channel is heard).
    ``lost``: the listener's connection failed; until it is ``connected``
    again, nothing sent on the channel is heard."""

    connected: bool = True
    lost: bool = False
    ping: int | None = None


Wakeup: TypeAlias = str | CancelHint | HandOff | HandOffsHeard
"""What :meth:`Backend.wakeups` yields: a queue name where work may be due,
a :class:`CancelHint`, and (``Capability.HANDOFF``, for the worker named)
:class:`HandOff` and :class:`HandOffsHeard`."""


@dataclass(frozen=True, slots=True)
class OfferParams:
    """A worker's offer of ``free`` more slots (0: only renew the offer)
    for tasks of ``queues`` and ``names``, under ``lease`` seconds for tasks
    that set none, lapsing ``ttl`` seconds from now unless renewed."""

    worker_id: str
    nonce: str
    """Drawn by the worker process: a process that restarts under the same
    worker id replaces its predecessor's offer and hears none of its
    notices."""
    queues: Sequence[str]
    names: Sequence[str]
    free: int
    lease: float
    ttl: float
    ping: int = 0
    """Sent back on the process's hand-off channel (HandOffsHeard.ping)."""
    now: datetime | None = None


@dataclass(frozen=True, slots=True)
class Offered:
    """An offer as stored: ``clock`` is the store's clock (epoch seconds)
    when it was written; ``anew`` says the worker had no offer stored (a
    first offer, or one withdrawn or cleared since)."""

    clock: float
    anew: bool


@dataclass(frozen=True, slots=True)
class WorkFilter:
    names: Sequence[str]
    queues: Sequence[str]
    now: datetime | None = None


Connection: TypeAlias = Any
"""A caller's native database connection (a psycopg ``Connection`` or
``AsyncConnection``, a ``sqlite3.Connection``): a backend checks its type."""


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
        and idempotency keys) and old workers, as ``params`` allow; oldest
        ids first. Never a task that is pending, in progress or waiting, nor
        a finished one whose parent is alive (its end message may yet be
        read). One transaction per batch, whose locks are held only as long
        as it runs; rows locked by others (a claim, a completion) are passed
        by. Stores that many processes share prune in one process at a time:
        a batch that finds another one under way returns ``busy``."""

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


def handoffs_of(backend: Backend) -> HandOffs | None:
    """The backend as :class:`HandOffs`, if it declares it."""
    if Capability.HANDOFF not in backend.capabilities:
        return None
    if isinstance(backend, HandOffs):
        return backend
    raise _undeclared(backend, Capability.HANDOFF)


@runtime_checkable
class Turns(Protocol):
    """``Capability.TURNS``: one lock per kind of worker for wake-up turns."""

    def turn_lock(self, kind: str) -> TurnLock:
        """The turn lock of the workers of ``kind`` (their queues and task
        names), on a session of its own, opened at the first ``take``."""


def turns_of(backend: Backend) -> Turns | None:
    """The backend as :class:`Turns`, if it declares it."""
    if Capability.TURNS not in backend.capabilities:
        return None
    if isinstance(backend, Turns):
        return backend
    raise _undeclared(backend, Capability.TURNS)


def vacuums_of(backend: Backend) -> Vacuums | None:
    """The backend as :class:`Vacuums`, if it declares it."""
    if Capability.VACUUM not in backend.capabilities:
        return None
    if isinstance(backend, Vacuums):
        return backend
    raise _undeclared(backend, Capability.VACUUM)


def transactional_of(backend: Backend) -> TransactionalEnqueue | None:
    """The backend as a :class:`TransactionalEnqueue`, if it declares it."""
    if Capability.TRANSACTIONAL_ENQUEUE not in backend.capabilities:
        return None
    if isinstance(backend, TransactionalEnqueue):
        return backend
    raise _undeclared(backend, Capability.TRANSACTIONAL_ENQUEUE)


def attempt_transactions_of(backend: Backend) -> AttemptTransactions | None:
    """The backend as :class:`AttemptTransactions`, if it declares them."""
    if Capability.ATTEMPT_TRANSACTION not in backend.capabilities:
        return None
    if isinstance(backend, AttemptTransactions):
        return backend
    raise _undeclared(backend, Capability.ATTEMPT_TRANSACTION)


def inspector_of(backend: Backend) -> Inspector | None:
    """The backend as an :class:`Inspector`, if it declares it."""
    if Capability.INSPECT not in backend.capabilities:
        return None
    if isinstance(backend, Inspector):
        return backend
    raise _undeclared(backend, Capability.INSPECT)


def _undeclared(backend: Backend, capability: Capability) -> TypeError:
    return TypeError(f"{type(backend).__name__} declares {capability.value} without its methods")
