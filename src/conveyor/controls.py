"""Operator controls of a client: pause and resume queues and task names;
run a pending task now, delete one, retry failed ones in bulk; prune what
retention does not keep; read the stored schedules.

:class:`Controls` is a base of :class:`conveyor.Client` (and so of
:class:`conveyor.App`): every control has a sync form and an ``_async``
form, and runs on the store the client talks to.
"""

from __future__ import annotations

from collections.abc import Awaitable, Callable, Sequence
from dataclasses import dataclass
from datetime import UTC, datetime
from typing import Protocol, TypeVar

from conveyor.backends import Backend
from conveyor.backends.capabilities import Inspector
from conveyor.errors import ConfigurationError
from conveyor.events import EventBus, QueuePaused
from conveyor.model import Pause, PauseKind, TaskState, findable, stored_id
from conveyor.portal import Portal
from conveyor.records import CancelMany, DeleteMany, KeyInfo, PruneResult, RetryMany, StoredSchedule
from conveyor.retention import DEFAULT_RETENTION, Retention

S = TypeVar("S")

CANCELLABLE = (TaskState.PENDING, TaskState.WAITING, TaskState.IN_PROGRESS)
"""The states a cancel takes."""


class _Named(Protocol):
    name: str


def pause_target(queue: str | None, task: str | _Named | None) -> tuple[PauseKind, str]:
    """The one thing a pause names: a queue or a task (a name or a task object)."""
    if (queue is None) == (task is None):
        raise ConfigurationError("name one queue= or one task= to pause or resume")
    if queue is not None:
        return PauseKind.QUEUE, queue
    assert task is not None
    return PauseKind.TASK, task if isinstance(task, str) else task.name


class Controls:
    """Pauses (see :meth:`pause_async`)."""

    portal: Portal
    events: EventBus

    async def backend(self) -> Backend:
        raise NotImplementedError  # the client's own

    async def _inspector(self) -> Inspector:
        raise NotImplementedError  # the client's own

    async def pause_async(
        self, *, queue: str | None = None, task: str | _Named | None = None
    ) -> bool:
        """Pause a queue or a task (its name, or the task object): within
        about a second no worker starts an attempt of a task it holds back
        (claims read the pause; none starts once this returns, save a claim
        already under way); running attempts go on. Enqueues still store
        tasks. The pause is stored and lasts until :meth:`resume_async`,
        across restarts. True if this call paused it (False: it was
        already). Raises ConfigurationError unless exactly one is named."""
        kind, name = pause_target(queue, task)
        changed = await (await self.backend()).pause(kind, name)
        if changed and self.events.active:
            self.events.emit(QueuePaused(name, kind.value, paused=True))
        return changed

    def pause(self, *, queue: str | None = None, task: str | _Named | None = None) -> bool:
        """Sync form of :meth:`pause_async`."""
        return self.portal.run(self.pause_async(queue=queue, task=task))

    async def resume_async(
        self, *, queue: str | None = None, task: str | _Named | None = None
    ) -> bool:
        """Undo a pause; idle workers hear of it at once. True if it was paused."""
        kind, name = pause_target(queue, task)
        changed = await (await self.backend()).resume(kind, name)
        if changed and self.events.active:
            self.events.emit(QueuePaused(name, kind.value, paused=False))
        return changed

    def resume(self, *, queue: str | None = None, task: str | _Named | None = None) -> bool:
        """Sync form of :meth:`resume_async`."""
        return self.portal.run(self.resume_async(queue=queue, task=task))

    async def pauses_async(self) -> list[Pause]:
        """Every paused queue and task name."""
        return await (await self.backend()).list_pauses()

    def pauses(self) -> list[Pause]:
        """Sync form of :meth:`pauses_async`."""
        return self.portal.run(self.pauses_async())

    async def prune_async(
        self, retention: Retention | None = None, *, dry_run: bool = False
    ) -> PruneResult:
        """Delete what ``retention`` (default: :class:`Retention`'s defaults)
        does not keep, now, batch after batch, as workers do on their own;
        with ``dry_run``, only count it. What was (or would be) deleted; a
        prune that finds another under way (PostgreSQL) stops ``busy``."""
        keep = retention if retention is not None else DEFAULT_RETENTION
        now = datetime.now(UTC)
        if dry_run:
            return await (await self._inspector()).count_prunable(keep.params(now))
        backend = await self.backend()
        tasks = workers = 0
        while True:
            done = await backend.prune(keep.params(now, workers=not tasks))
            tasks, workers = tasks + done.tasks, workers + done.workers
            if done.busy or done.tasks < keep.batch:
                return PruneResult(tasks, workers, busy=done.busy)

    def prune(self, retention: Retention | None = None, *, dry_run: bool = False) -> PruneResult:
        """Sync form of :meth:`prune_async`."""
        return self.portal.run(self.prune_async(retention, dry_run=dry_run))

    async def stored_schedules_async(self) -> tuple[datetime, list[StoredSchedule]]:
        """The store's clock, and every schedule stored by the workers that
        synced them (of this app and any other on the same store), by name."""
        return await (await self.backend()).list_schedules()

    def stored_schedules(self) -> tuple[datetime, list[StoredSchedule]]:
        """Sync form of :meth:`stored_schedules_async`."""
        return self.portal.run(self.stored_schedules_async())

    async def run_now_async(self, task_id: int) -> TaskState:
        """Make a pending task due now: a delay, a retry's back-off, a snooze
        or a coroutine's sleep cut short; idle workers of its queue hear of it
        at once. Raises TaskNotFoundError, or InvalidTransitionError for a
        task that is not pending."""
        return await (await self.backend()).run_now(stored_id(task_id))

    def run_now(self, task_id: int) -> TaskState:
        """Sync form of :meth:`run_now_async`."""
        return self.portal.run(self.run_now_async(task_id))

    async def delete_async(self, task_id: int) -> None:
        """Delete a task with its attempt log and messages, for good. Raises
        TaskNotFoundError, or InvalidTransitionError for a running task
        (cancel it first) or an unfinished child whose parent waits for it
        (cancel it instead: the parent then hears of its end)."""
        await (await self.backend()).delete(stored_id(task_id))

    def delete(self, task_id: int) -> None:
        """Sync form of :meth:`delete_async`."""
        self.portal.run(self.delete_async(task_id))

    async def retry_many_async(
        self,
        *,
        states: Sequence[TaskState | str] = (TaskState.FAILED,),
        name: str | None = None,
        queue: str | None = None,
        since: datetime | None = None,
        until: datetime | None = None,
        ids: Sequence[int] | None = None,
        batch: int = 500,
    ) -> list[int]:
        """Run again every failed (or, in ``states``, cancelled) task of
        ``name`` and ``queue`` created in [``since``, ``until``) (and, with
        ``ids``, among those), each filter optional: pending now with a
        fresh budget, as :meth:`retry`, in batches of ``batch`` in the store
        (one statement or script each, oldest first). Each batch reads its
        filter in the same write as the retry: a task no longer in
        ``states`` (one another operator cancelled after it failed) is left
        as it is. A task that fails again meanwhile is not retried twice by
        one call; one locked by a worker at that moment is passed by. The
        ids retried. Raises ConfigurationError for a state that cannot be
        retried."""
        selection = _Selection(states, name, queue, since, until, ids, batch)
        return await selection.act((await self.backend()).retry_many, RetryMany)

    def retry_many(
        self,
        *,
        states: Sequence[TaskState | str] = (TaskState.FAILED,),
        name: str | None = None,
        queue: str | None = None,
        since: datetime | None = None,
        until: datetime | None = None,
        ids: Sequence[int] | None = None,
        batch: int = 500,
    ) -> list[int]:
        """Sync form of :meth:`retry_many_async`."""
        return self.portal.run(
            self.retry_many_async(
                states=states,
                name=name,
                queue=queue,
                since=since,
                until=until,
                ids=ids,
                batch=batch,
            )
        )

    async def cancel_many_async(
        self,
        *,
        states: Sequence[TaskState | str] = CANCELLABLE,
        name: str | None = None,
        queue: str | None = None,
        since: datetime | None = None,
        until: datetime | None = None,
        ids: Sequence[int] | None = None,
        batch: int = 500,
    ) -> list[int]:
        """Cancel every pending, waiting or running task (those of
        ``states``) of ``name`` and ``queue`` created in [``since``,
        ``until``) (and, with ``ids``, among those), as :meth:`cancel`, in
        batches of ``batch`` in the store, oldest first. Each batch reads its
        filter in the same write as the cancel: a task that finished, or
        left ``states``, meanwhile is left as it is. The ids cancelled (a
        running one has its cancel requested). Raises ConfigurationError
        for a state that cannot be cancelled."""
        selection = _Selection(states, name, queue, since, until, ids, batch)
        return await selection.act((await self.backend()).cancel_many, CancelMany)

    def cancel_many(
        self,
        *,
        states: Sequence[TaskState | str] = CANCELLABLE,
        name: str | None = None,
        queue: str | None = None,
        since: datetime | None = None,
        until: datetime | None = None,
        ids: Sequence[int] | None = None,
        batch: int = 500,
    ) -> list[int]:
        """Sync form of :meth:`cancel_many_async`."""
        return self.portal.run(
            self.cancel_many_async(
                states=states,
                name=name,
                queue=queue,
                since=since,
                until=until,
                ids=ids,
                batch=batch,
            )
        )

    async def delete_many_async(
        self,
        *,
        states: Sequence[TaskState | str] = (TaskState.FAILED,),
        name: str | None = None,
        queue: str | None = None,
        since: datetime | None = None,
        until: datetime | None = None,
        ids: Sequence[int] | None = None,
        batch: int = 500,
    ) -> list[int]:
        """Delete every finished task of ``states`` (default: failed ones)
        of ``name`` and ``queue`` created in [``since``, ``until``) (and,
        with ``ids``, among those), with its attempt log and messages, as
        :meth:`delete`, in batches of ``batch`` in the store, oldest first.
        Each batch reads its filter in the same write as the delete: a task
        retried meanwhile is not deleted. The ids deleted. Raises
        ConfigurationError for an unfinished state (delete those one by
        one: a parent may wait for them)."""
        selection = _Selection(states, name, queue, since, until, ids, batch)
        return await selection.act((await self.backend()).delete_many, DeleteMany)

    def delete_many(
        self,
        *,
        states: Sequence[TaskState | str] = (TaskState.FAILED,),
        name: str | None = None,
        queue: str | None = None,
        since: datetime | None = None,
        until: datetime | None = None,
        ids: Sequence[int] | None = None,
        batch: int = 500,
    ) -> list[int]:
        """Sync form of :meth:`delete_many_async`."""
        return self.portal.run(
            self.delete_many_async(
                states=states,
                name=name,
                queue=queue,
                since=since,
                until=until,
                ids=ids,
                batch=batch,
            )
        )

    async def list_keys_async(self, limit: int = 1000) -> list[KeyInfo]:
        """The flow-control keys (concurrency keys and rate limits) the store
        tracks, with their running and pending tasks and, for a rate, its
        tokens now and when the next comes (see :class:`KeyInfo`)."""
        return await (await self._inspector()).list_keys(limit)

    def list_keys(self, limit: int = 1000) -> list[KeyInfo]:
        """Sync form of :meth:`list_keys_async`."""
        return self.portal.run(self.list_keys_async(limit))


@dataclass(frozen=True, slots=True)
class _Selection:
    """A bulk action's filters, as its caller gave them."""

    states: Sequence[TaskState | str]
    name: str | None
    queue: str | None
    since: datetime | None
    until: datetime | None
    ids: Sequence[int] | None
    batch: int

    async def act(
        self, action: Callable[[S], Awaitable[list[int]]], kind: Callable[..., S]
    ) -> list[int]:
        """``action`` on every batch of the selection (a ``kind``: RetryMany,
        CancelMany or DeleteMany), each after the last id of the one
        before, until one comes back short: the ids acted on. An id no task
        can have selects nothing."""
        states = tuple(TaskState(s) for s in self.states)
        ids = None if self.ids is None else tuple(i for i in self.ids if findable(i))
        done: list[int] = []
        while True:
            after = done[-1] if done else 0
            found = await action(
                kind(states, self.name, self.queue, self.since, self.until, ids, after, self.batch)
            )
            done += found
            if len(found) < self.batch:
                return done
