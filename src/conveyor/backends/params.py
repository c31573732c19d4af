"""The write params the engines take, and what their writes give back:
enqueue, claim, heartbeat, finish, send, schedules, wake-ups and hand-offs.

Each :class:`~conveyor.backends.protocol.Backend` operation takes one of
these and returns domain objects; ``now`` on a params object overrides the
store's clock, for tests only. The records of the read side are in
:mod:`conveyor.records`.
"""

from __future__ import annotations

import hashlib
import json
from collections.abc import Iterable, Sequence
from dataclasses import dataclass
from datetime import datetime
from typing import TypeAlias

from conveyor.errors import ConfigurationError
from conveyor.model import LeaseToken, Message, Outcome, RetryPolicy, TaskState, findable
from conveyor.records import StoredSchedule


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
    expires_at: datetime | None = None
    """No attempt of the task starts after this time: a claim that would
    start its first one later hands it over expired (``ClaimedTask.expired_at``)
    and the worker ends it cancelled. None: it never expires."""
    after: tuple[int, ...] = ()
    """The task's dependencies, in order: ids of stored tasks, or (as
    :func:`earlier`) earlier tasks of the same enqueue. With any, it is
    stored ``waiting`` and made pending when the last of them has ended as
    ``after_policy`` asks (see :data:`AFTER_POLICIES`)."""
    after_policy: str = "cancel"
    """What a dependency that ends failed or cancelled does to this task:
    ``cancel`` ends it cancelled, ``fail`` ends it failed, ``run`` counts it
    as ended (the task runs once every dependency has ended, whatever way)."""
    receives: str | None = None
    """What the worker hands the task of its dependencies' outcomes when it
    runs (see :mod:`conveyor.composition`); stored as it is, given back as
    ``ClaimedTask.receives``."""


AFTER_POLICIES = ("cancel", "fail", "run")
"""The values of ``NewTask.after_policy``."""


def earlier(index: int) -> int:
    """The reference, in ``NewTask.after``, to the task at ``index`` (from 0)
    of the same enqueue: it must come before the task that names it."""
    return -1 - index


def earlier_index(reference: int) -> int | None:
    """The batch index a ``NewTask.after`` entry names, or None for a stored id."""
    return -1 - reference if reference < 0 else None


def check_after(batch: Sequence[NewTask]) -> None:
    """Raise ConfigurationError, before any I/O, for a batch whose
    dependencies could form a cycle or name nothing: a reference to the
    task itself or a later task of the batch, an id of 0, or an unknown
    policy. A stored id that does not exist is the store's to find
    (TaskNotFoundError)."""
    for index, task in enumerate(batch):
        if task.after_policy not in AFTER_POLICIES:
            raise ConfigurationError(
                f"after_policy must be one of {', '.join(AFTER_POLICIES)}, "
                f"not {task.after_policy!r}"
            )
        for reference in task.after:
            position = earlier_index(reference)
            if reference == 0 or (position is not None and position >= index):
                raise ConfigurationError(
                    "a task can wait only for stored tasks and earlier tasks of its enqueue "
                    "(no cycles)"
                )


MAX_READ_IDS = 10_000
"""The most task ids one batched read by ids takes (``Backend.edges``,
``Inspector.summaries``): a caller with more reads them in chunks."""


def read_ids(ids: Sequence[int]) -> list[int]:
    """The ids a batched read by ids looks up: each once, in the order
    given, those no task can have (0, negative, past the largest id) left
    out, so that no store is handed a number it cannot take. Raises
    ConfigurationError, before any I/O, for what is not a task id, or for
    more than :data:`MAX_READ_IDS` ids (a caller reads more in chunks)."""
    if isinstance(ids, str | bytes) or not isinstance(ids, Sequence):
        raise ConfigurationError("ids must be a sequence of task ids")
    if len(ids) > MAX_READ_IDS:
        raise ConfigurationError(
            f"at most {MAX_READ_IDS:,} ids per read, not {len(ids):,}: read them in chunks"
        )
    return [task_id for task_id in dict.fromkeys(ids) if findable(task_id)]


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
    expired_at: datetime | None = None
    """The task's expiry time (``NewTask.expires_at``) when this claim started
    its first attempt past it, by the store's clock: the worker then ends
    the task cancelled without running it. None otherwise (a retry or a
    reclaim never expires)."""
    receives: str | None = None
    """``NewTask.receives`` as stored: the worker reads the task's
    dependencies (``Backend.dependencies``) and hands their outcomes to it."""


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
class ProgressReport:
    """One attempt's latest progress, for :class:`ProgressParams`: its lease
    token and the report as stored (``stored.progress_text``: JSON of done,
    total, note and the attempt number)."""

    token: LeaseToken
    text: str


@dataclass(frozen=True, slots=True)
class ProgressParams:
    """Progress reports of one worker's running attempts, each stored on its
    task only while its lease is live (fenced as a heartbeat)."""

    worker_id: str
    reports: Sequence[ProgressReport]
    now: datetime | None = None


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
class CancelHint:
    """A wake-up about a running task: its cancel may have been requested.

    ``task_id`` names it, or is None when the backend cannot tell which task
    (SQLite sees only that another process wrote something). A hint is only
    a hint: the worker asks
    :meth:`~conveyor.backends.protocol.Backend.cancel_requested` before it
    stops anything, and its heartbeat reports cancels anyway."""

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
    before may not have reached it, see
    :meth:`~conveyor.backends.capabilities.HandOffs.adopt`); else the notice
    of the offer that sent ``ping`` arrived (the channel is heard).
    ``lost``: the listener's connection failed; until it is ``connected``
    again, nothing sent on the channel is heard."""

    connected: bool = True
    lost: bool = False
    ping: int | None = None


Wakeup: TypeAlias = str | CancelHint | HandOff | HandOffsHeard
"""What :meth:`~conveyor.backends.protocol.Backend.wakeups` yields: a queue
name where work may be due, a :class:`CancelHint`, and
(``Capability.HANDOFF``, for the worker named) :class:`HandOff` and
:class:`HandOffsHeard`."""


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
