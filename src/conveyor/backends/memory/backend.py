"""The memory backend: the async :class:`~conveyor.backends.protocol.Backend`
around a :class:`Store`, the task state machine written as plain Python.

The store is composed of one mixin per section (:mod:`.enqueue`,
:mod:`.attempts`, :mod:`.messages`, :mod:`.controls`, :mod:`.flow`,
:mod:`.workers`) over its tables (:mod:`.schema`); :mod:`.maintenance` and
:mod:`.reads` are functions of it. Every operation is pure and synchronous
(no I/O, no event loop, no clock: each write takes ``now``) and atomic (it
takes the store's lock for its whole run, as a SQL backend runs one
transaction). This is the reference model of the SQL backends: the
Hypothesis state machine of ``tests/conformance/test_state_machine.py``
drives it and a SQL backend with the same operations and clock, and
compares every answer and every stored row. What the sections' docstrings
guarantee, the SQL backends guarantee too.

It adds what the store leaves out: the clock (this process's, a
:class:`Clock` set for the store's name with :meth:`MemoryBackend.set_clock`,
or the ``now`` of one call), one store per name shared by every backend of
that name in this process, and the wake-ups of idle workers (an enqueue, a
task made due) and of running ones (a cancel), sent after the store's lock
is released. Every protocol method is one call of the store.
"""

from __future__ import annotations

import threading
from collections.abc import AsyncIterator, Iterable, Sequence
from datetime import UTC, datetime
from typing import Any, Protocol

from conveyor.backends import wake
from conveyor.backends.memory import flow, maintenance, reads
from conveyor.backends.memory.attempts import Attempts
from conveyor.backends.memory.controls import Controls, delete, delete_many
from conveyor.backends.memory.enqueue import Enqueue
from conveyor.backends.memory.flow import Flow
from conveyor.backends.memory.messages import Messages
from conveyor.backends.memory.schema import Tables
from conveyor.backends.memory.workers import Workers
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
from conveyor.backends.protocol import Capability
from conveyor.backends.stored import check_bucket_seconds
from conveyor.model import LeaseToken, Message, Pause, PauseKind, Task, TaskState, check_pause
from conveyor.records import (
    ActivityBucket,
    CancelMany,
    DeleteMany,
    DependencyEdge,
    DependencyRecord,
    KeyInfo,
    Migration,
    PruneParams,
    PruneResult,
    QueueBacklog,
    RetryMany,
    StoredSchedule,
    TaskCount,
    TaskFilter,
    TaskSummary,
    WorkerInfo,
)
from conveyor.redaction import redact_url

_STORES: dict[str, Store] = {}
_STORES_LOCK = threading.Lock()


class Store(Attempts, Messages, Enqueue, Controls, Flow, Workers, Tables):
    """A memory store: its tables, and every section's operations on them."""


class Clock(Protocol):
    """Where a memory store reads the time (a fake clock, in tests)."""

    def now(self) -> datetime:
        """The current time: a timezone-aware UTC datetime that never goes back."""
        ...


_CLOCKS: dict[str, Clock] = {}
"""The clock set for a store name; a name without one reads this process's."""


class MemoryBackend:
    """Tasks in this process's memory; see :mod:`conveyor.backends.memory` for the limits."""

    capabilities = frozenset({Capability.NOTIFICATIONS, Capability.INSPECT})

    def __init__(self, name: str = "default", *, inline: bool = False, **_options: Any) -> None:
        self.name = name
        if inline:
            self.capabilities = self.capabilities | {Capability.INLINE}
        self._wake_key = f"memory:{name}"
        with _STORES_LOCK:
            self._store = _STORES.setdefault(name, Store())

    @property
    def location(self) -> str:
        return redact_url(f"memory://{self.name}")

    async def open(self) -> None:
        return None

    async def close(self) -> None:
        return None

    async def migrate(self) -> list[int]:
        return []

    async def require_migrated(self) -> None:
        """Nothing to check: a store in memory has no schema, and is made by
        its first use."""

    async def destroy(self) -> None:
        with _STORES_LOCK:
            _STORES.pop(self.name, None)
            self._store = _STORES.setdefault(self.name, Store())

    # -- the clock -----------------------------------------------------------

    def set_clock(self, clock: Clock | None) -> None:
        """From now on, every backend of this store's name in this process
        takes the time from ``clock`` (None: this process's clock again):
        run times, leases and their expiry, attempt and worker times. The
        ``now`` of a call's params still overrides it. A clock that goes
        back in time breaks the store's guarantees (a lease could outlive
        its expiry); moving it past a lease expires that lease, as for a
        stalled worker."""
        if clock is None:
            _CLOCKS.pop(self.name, None)
        else:
            _CLOCKS[self.name] = clock

    def _now(self, given: datetime | None) -> datetime:
        if given is not None:
            return given
        clock = _CLOCKS.get(self.name)
        return clock.now() if clock is not None else datetime.now(UTC)

    # -- enqueue -----------------------------------------------------------

    async def enqueue(self, params: EnqueueParams) -> list[int]:
        ids = self._store.enqueue(params.tasks, self._now(params.now))
        wake.notify(self._wake_key, (t.queue for t in params.tasks))
        return ids

    async def enqueue_chunks(self, chunks: Iterable[Sequence[NewTask]]) -> list[int]:
        return await self.enqueue(EnqueueParams.gathered(chunks))

    # -- claim, heartbeat, finish ----------------------------------------

    async def claim(self, params: ClaimParams) -> list[ClaimedTask]:
        return self._store.claim(params, self._now(params.now))

    async def heartbeat(self, params: HeartbeatParams) -> HeartbeatResult:
        return self._store.heartbeat(params, self._now(params.now))

    async def cancel_requested(
        self, worker_id: str, tokens: Sequence[LeaseToken]
    ) -> frozenset[LeaseToken]:
        return self._store.cancel_requested(worker_id, tokens)

    async def report_progress(self, params: ProgressParams) -> frozenset[LeaseToken]:
        return self._store.report_progress(params, self._now(params.now))

    async def finish(self, params: FinishParams) -> FinishResult:
        result = self._store.finish(params, self._now(params.now))
        self._notify_woken()
        return result

    def _notify_woken(self) -> None:
        woken, cancelling = self._store.take_wakeups()
        if woken:
            wake.notify(self._wake_key, woken)
        if cancelling:
            wake.notify_cancel(self._wake_key, sorted(cancelling))

    # -- control -------------------------------------------------------------

    async def cancel(self, task_id: int, now: datetime | None = None) -> TaskState:
        state = self._store.cancel(task_id, self._now(now))
        self._notify_woken()
        return state

    async def retry(self, task_id: int, now: datetime | None = None) -> TaskState:
        return self._store.retry(task_id, self._now(now))

    async def run_now(self, task_id: int, now: datetime | None = None) -> TaskState:
        state = self._store.run_now(task_id, self._now(now))
        self._notify_woken()
        return state

    async def delete(self, task_id: int) -> None:
        delete(self._store, task_id)

    async def retry_many(self, selection: RetryMany) -> list[int]:
        ids = self._store.retry_many(selection, self._now(selection.now))
        self._notify_woken()
        return ids

    async def cancel_many(self, selection: CancelMany) -> list[int]:
        ids = self._store.cancel_many(selection, self._now(selection.now))
        self._notify_woken()
        return ids

    async def delete_many(self, selection: DeleteMany) -> list[int]:
        return delete_many(self._store, selection)

    async def sync_schedules(self, params: ScheduleSync) -> bool:
        return flow.sync(self._store, params, self._now(params.now))

    async def list_schedules(self) -> tuple[datetime, list[StoredSchedule]]:
        return self._now(None), flow.listed_schedules(self._store)

    async def store_clock(self) -> datetime:
        return self._now(None)

    async def fire_schedule(self, params: FireParams) -> list[int]:
        ids = flow.fire(self._store, params, self._now(None))
        self._notify_woken()
        return ids

    async def prune(self, params: PruneParams) -> PruneResult:
        return maintenance.prune(self._store, params)

    async def list_keys(self, limit: int = 1000, now: datetime | None = None) -> list[KeyInfo]:
        return flow.listed_keys(self._store, self._now(now), limit)

    async def queue_backlogs(self, now: datetime | None = None) -> list[QueueBacklog]:
        return reads.queue_backlogs(self._store, self._now(now))

    async def activity(self, since: datetime, bucket_seconds: int) -> list[ActivityBucket]:
        return reads.activity(self._store, since, check_bucket_seconds(bucket_seconds))

    async def key_holders(self, key: str, limit: int = 20) -> list[int]:
        with self._store.lock:
            return sorted(self._store.index.keyed_running.get(key, ()))[:limit]

    async def count_prunable(self, params: PruneParams) -> PruneResult:
        return maintenance.count_prunable(self._store, params)

    async def pause(self, kind: PauseKind, name: str, now: datetime | None = None) -> bool:
        kind, name = check_pause(kind, name)
        return self._store.pause(kind, name, self._now(now))

    async def resume(self, kind: PauseKind, name: str) -> bool:
        kind, name = check_pause(kind, name)
        resumed = self._store.resume(kind, name)
        self._notify_woken()
        return resumed

    async def list_pauses(self) -> list[Pause]:
        return self._store.list_pauses()

    # -- messages --------------------------------------------------------------

    async def send(self, params: SendParams) -> list[int]:
        ids = self._store.send(params.deliveries, self._now(params.now))
        self._notify_woken()
        return ids

    async def inbox(self, task_id: int) -> list[Message]:
        return reads.inbox(self._store, task_id)

    # -- reads ---------------------------------------------------------------

    async def get_task(self, task_id: int, with_attempts: bool = True) -> Task | None:
        return reads.get_task(self._store, task_id, with_attempts)

    async def dependencies(self, task_id: int) -> list[DependencyRecord]:
        return reads.dependencies(self._store, task_id)

    async def edges(self, ids: Sequence[int]) -> list[DependencyEdge]:
        return reads.edges(self._store, ids)

    async def list_tasks(self, task_filter: TaskFilter) -> list[Task]:
        return reads.list_tasks(self._store, task_filter)

    async def list_summaries(self, task_filter: TaskFilter) -> list[TaskSummary]:
        return reads.list_summaries(self._store, task_filter)

    async def summaries(self, ids: Sequence[int]) -> list[TaskSummary]:
        return reads.summaries(self._store, ids)

    async def running_by_worker(self) -> dict[str, int]:
        return reads.running_by_worker(self._store)

    async def count_tasks(self) -> list[TaskCount]:
        return reads.count_tasks(self._store)

    async def count_unfinished(self, work: WorkFilter) -> int:
        return reads.count_unfinished(self._store, work, self._now(work.now))

    async def next_due_at(self, queues: Sequence[str]) -> datetime | None:
        return reads.next_due_at(self._store, queues)

    # -- workers -------------------------------------------------------------

    async def register_worker(self, info: WorkerInfo) -> None:
        self._store.register_worker(info, self._now(None))

    async def stop_worker(self, worker_id: str) -> None:
        self._store.stop_worker(worker_id, self._now(None))

    async def pending_migrations(self) -> list[Migration]:
        return []  # nothing to migrate: the store lives as long as the process

    async def list_workers(self) -> list[WorkerInfo]:
        return reads.list_workers(self._store, self._now(None))

    async def wakeups(
        self, queues: Sequence[str], handoffs_for: tuple[str, str] | None = None
    ) -> AsyncIterator[Wakeup]:
        async for wakeup in wake.listen(self._wake_key, queues):
            yield wakeup
