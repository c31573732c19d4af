"""In-process events: what a client and its workers did, for callbacks.

Every :class:`~conveyor.client.Client` (and so every App) has an
:class:`EventBus`, ``app.events``; the workers of an App emit on it, and so
do the App's enqueues. ``app.events.subscribe(callback)`` calls
``callback(event)`` for each event, in the thread that emits it (a worker's
event-loop thread; the caller's for an enqueue) and right there: a callback
must be quick and must not block (hand slow work to a queue of your own).
Metrics (:mod:`conveyor.metrics`) are built on these events. The client
emits TaskEnqueued, AttemptStarted and AttemptEnded through its
middleware (:class:`EventsMiddleware`, the first it installs, so the
outermost: see :mod:`conveyor.middleware`).

Guarantees and limits:

- Events are facts this process saw, not the store's record: an enqueue
  inside the caller's transaction (``connection=``) is reported when the
  call returns, whether or not the transaction then commits, and a worker
  killed between two events emits neither the rest nor any excuse.
- A callback that raises is logged (once per callback and exception type)
  and the emitter goes on: a metrics bug never stops a worker.
- Nobody listening costs one attribute test per event site: no event
  object is made.
"""

from __future__ import annotations

import contextlib
import logging
import threading
import time
from collections.abc import Awaitable, Callable, Iterator, Sequence
from contextlib import AbstractContextManager
from dataclasses import dataclass

from conveyor.backends.params import Completion, NewTask
from conveyor.middleware import PASS_SCOPE, AttemptInfo, EnqueueScope, Middleware, Run
from conveyor.model import Outcome, TaskState

log = logging.getLogger("conveyor.events")


@dataclass(frozen=True, slots=True)
class TaskEnqueued:
    """Tasks of one name and queue were stored (ids ascending in call order)."""

    name: str
    queue: str
    task_ids: tuple[int, ...]


@dataclass(frozen=True, slots=True)
class ClaimSent:
    """A worker asked the store for up to ``limit`` due tasks."""

    worker_id: str
    limit: int


@dataclass(frozen=True, slots=True)
class ClaimReturned:
    """A claim came back with ``count`` tasks after ``seconds`` (or failed:
    ``failed`` holds the error's text and ``count`` is 0)."""

    worker_id: str
    limit: int
    count: int
    seconds: float
    failed: str | None = None


@dataclass(frozen=True, slots=True)
class AttemptStarted:
    """A worker started an attempt. ``delay`` is the seconds from when the
    task was due to this start, by the store's clock and this process's (so
    a skew between them shows here), None when the store did not say.
    ``handed_off``: its enqueue leased it to this worker (no claim)."""

    task_id: int
    attempt: int
    name: str
    queue: str
    worker_id: str
    delay: float | None
    handed_off: bool = False


@dataclass(frozen=True, slots=True)
class AttemptEnded:
    """An attempt's handler ended: its outcome, the state it asks its task to
    take, and how long it ran (seconds, this process's monotonic clock).
    The finish that records it is written afterwards, in a batch; one whose
    lease was lost meanwhile is rejected (see :class:`LeaseLost`)."""

    task_id: int
    attempt: int
    name: str
    queue: str
    worker_id: str
    outcome: Outcome
    state: TaskState
    duration: float


@dataclass(frozen=True, slots=True)
class LeaseRenewed:
    """A heartbeat renewed ``count`` leases of this worker."""

    worker_id: str
    count: int


@dataclass(frozen=True, slots=True)
class LeaseLost:
    """A lease of this worker was found lost (expired and reclaimed, or its
    task deleted): its handler is stopped and its result will not count.
    ``name`` and ``queue`` are "" when the attempt had ended already."""

    worker_id: str
    task_id: int
    attempt: int
    name: str
    queue: str


@dataclass(frozen=True, slots=True)
class ProgressStored:
    """A progress report of an attempt of this worker was stored on its task
    (reports are written at most once per progress interval: this is the
    one that was written, not every call of ``TaskContext.progress``)."""

    worker_id: str
    task_id: int
    attempt: int
    name: str
    queue: str
    done: int
    total: int | None
    note: str | None


@dataclass(frozen=True, slots=True)
class ScheduleFired:
    """A worker's scheduler enqueued the run of a schedule due at ``due``
    (epoch seconds), task ``task_id`` of task name ``name``. A slot another
    process fired first is not reported here."""

    schedule: str
    name: str
    due: float
    task_id: int


@dataclass(frozen=True, slots=True)
class QueuePaused:
    """This client paused (``paused``) or resumed a queue, or a task name."""

    target: str
    kind: str
    paused: bool


Event = (
    TaskEnqueued
    | ClaimSent
    | ClaimReturned
    | AttemptStarted
    | AttemptEnded
    | LeaseRenewed
    | LeaseLost
    | ProgressStored
    | ScheduleFired
    | QueuePaused
)
"""Every event a bus carries."""

Callback = Callable[[Event], object]


class EventBus:
    """Callbacks subscribed to a client's events (see the module docstring)."""

    __slots__ = ("_callbacks", "_lock", "_warned")

    def __init__(self) -> None:
        self._callbacks: tuple[Callback, ...] = ()
        self._lock = threading.Lock()
        self._warned: set[tuple[int, type[BaseException]]] = set()

    @property
    def active(self) -> bool:
        """Whether anything listens: emitters test this before making an event."""
        return bool(self._callbacks)

    def subscribe(self, callback: Callback) -> Callable[[], None]:
        """Call ``callback(event)`` for every event from now on; returns the
        function that unsubscribes it. Safe from any thread."""
        with self._lock:
            self._callbacks = (*self._callbacks, callback)

        def unsubscribe() -> None:
            with self._lock:
                callbacks = list(self._callbacks)
                if callback in callbacks:
                    callbacks.remove(callback)
                self._callbacks = tuple(callbacks)

        return unsubscribe

    def emit(self, event: Event) -> None:
        """Give ``event`` to every callback; one that raises is logged once
        per exception type and the rest still run."""
        for callback in self._callbacks:
            try:
                callback(event)
            except Exception as exc:
                key = (id(callback), type(exc))
                if key not in self._warned:
                    self._warned.add(key)
                    log.exception("an event callback raised on %s", type(event).__name__)


class _Enqueued(EnqueueScope):
    __slots__ = ("ids", "tasks")

    def __init__(self) -> None:
        self.tasks: list[NewTask] = []
        self.ids: Sequence[int] | None = None

    def stamp(self, tasks: Sequence[NewTask]) -> None:
        self.tasks.extend(tasks)

    def stored(self, ids: Sequence[int]) -> None:
        self.ids = ids


class EventsMiddleware(Middleware):
    """Emits TaskEnqueued, AttemptStarted and AttemptEnded on ``bus``, only
    while something listens (tested when an enqueue or an attempt starts):
    nobody listening costs one attribute test per enqueue and attempt.

    TaskEnqueued is emitted once the enqueue's hooks have all left (it is
    the outermost), one per name and queue; AttemptStarted when the worker
    starts the attempt, AttemptEnded when its handler ended with a
    completion to record (not for an attempt the worker crashed on,
    abandoned or found superseded)."""

    __slots__ = ("bus",)

    def __init__(self, bus: EventBus) -> None:
        self.bus = bus

    def enqueue(self, tasks: Sequence[NewTask]) -> AbstractContextManager[EnqueueScope]:
        if not self.bus.active:
            return contextlib.nullcontext(PASS_SCOPE)
        return self._told()

    @contextlib.contextmanager
    def _told(self) -> Iterator[EnqueueScope]:
        scope = _Enqueued()
        yield scope
        if scope.ids is None:
            return
        grouped: dict[tuple[str, str], list[int]] = {}
        for task, task_id in zip(scope.tasks, scope.ids, strict=True):
            grouped.setdefault((task.name, task.queue), []).append(task_id)
        for (name, queue), task_ids in grouped.items():
            self.bus.emit(TaskEnqueued(name, queue, tuple(task_ids)))

    def attempt(self, run: Run, info: AttemptInfo) -> Awaitable[Completion | None]:
        if not self.bus.active:
            return run()
        task = info.task
        token = task.token
        delay = None if task.run_at is None else time.time() - task.run_at.timestamp()
        self.bus.emit(
            AttemptStarted(
                token.task_id,
                token.attempt,
                task.name,
                task.queue,
                info.worker_id,
                delay,
                info.handed_off,
            )
        )
        return self._ended(run(), info)

    async def _ended(
        self, running: Awaitable[Completion | None], info: AttemptInfo
    ) -> Completion | None:
        completion = await running
        if completion is not None and not info.superseded:
            task, token = info.task, completion.token
            self.bus.emit(
                AttemptEnded(
                    token.task_id,
                    token.attempt,
                    task.name,
                    task.queue,
                    info.worker_id,
                    completion.outcome,
                    completion.next_state,
                    time.monotonic() - info.started,
                )
            )
        return completion
