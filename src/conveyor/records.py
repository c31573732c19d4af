"""The records a store's reads give back, and the selections its bulk
actions and prunes take: what the CLI, the dashboard, the client and the
worker read, whatever the engine.

Plain frozen dataclasses: nothing here does I/O or knows a backend. Each
one checks what it is given when it is built (ConfigurationError), so an
engine takes it as valid. The protocols that return them are
:class:`~conveyor.backends.protocol.Backend` and
:class:`~conveyor.backends.capabilities.Inspector`.
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from dataclasses import dataclass
from datetime import datetime
from typing import Any, ClassVar

from conveyor.errors import ConfigurationError
from conveyor.model import Outcome, TaskState, check_name


@dataclass(frozen=True, slots=True)
class TaskFilter:
    """Which tasks :meth:`~conveyor.backends.capabilities.Inspector.list_tasks`
    returns: newest (highest id) first, each filter optional, at most
    ``limit`` (0 or more);
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
    it (:meth:`~conveyor.backends.capabilities.Inspector.list_summaries`): no payload, no result, no
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


@dataclass(frozen=True, slots=True)
class DependencyRecord:
    """One dependency of a task (an entry of its ``after``), as
    ``Backend.dependencies`` reads it: the task waited for, its state now,
    its result (decoded JSON; None unless it succeeded), the error of its
    latest ended attempt when it did not succeed (None otherwise, and for a
    task that never ran), and whether its end was counted (``settled``: a
    dependency's end is counted once; a manual retry of it afterwards moves
    no dependent again). ``state`` None: the task is no longer stored."""

    task_id: int
    name: str | None
    state: TaskState | None
    result: Any
    error_type: str | None
    error_message: str | None
    settled: bool


@dataclass(frozen=True, slots=True)
class DependencyEdge:
    """One edge of the graph of dependencies, as ``Backend.edges`` reads it:
    task ``dependent`` waits for task ``dependency``, entry ``position``
    (from 0) of its ``after``; ``settled``: the dependency's end was counted
    (once: a manual retry of it afterwards moves no dependent again). A
    group's or chord's members and a chain's links are such edges (see
    :mod:`conveyor.composition`)."""

    dependent: int
    position: int
    dependency: int
    settled: bool


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
    for the ``bucket_seconds`` of
    :meth:`~conveyor.backends.capabilities.Inspector.activity`: how many now
    stand ``succeeded`` and how many ``failed``."""

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
    """What one batch of :meth:`~conveyor.backends.protocol.Backend.prune`
    may delete: finished tasks of each state in ``before``, finished before
    its time, at most ``limit`` (0 or more) in all; and, with
    ``workers_before``, workers stopped (or silent) since before that time."""

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
    """The release that stored it (see :class:`~conveyor.backends.params.ScheduleSync`); None for a
    row stored before releases were recorded."""


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
