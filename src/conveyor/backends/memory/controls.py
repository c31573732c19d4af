"""Operators' actions on tasks in memory: cancel, retry, run now, delete,
and their bulk forms over a selection."""

from __future__ import annotations

from datetime import datetime

from conveyor.backends.memory.maintenance import ALIVE, awaited, forget
from conveyor.backends.memory.schema import Tables
from conveyor.backends.stored import awaited_refusal, delete_refused
from conveyor.errors import InvalidTransitionError
from conveyor.model import Cause, TaskState
from conveyor.records import CancelMany, DeleteMany, RetryMany, TaskSelection


class Controls(Tables):
    """``cancel``, ``retry``, ``run_now`` and the bulk retry and cancel."""

    def cancel(self, task_id: int, now: datetime) -> TaskState:
        """Cancel a task and return its state after: a pending or waiting one
        ends ``cancelled``; a running one stays ``in_progress`` with its
        cancel requested (its worker is told). A cancelled coroutine's live
        children are cancelled too. Raises TaskNotFoundError, or
        InvalidTransitionError for a finished task."""
        with self.lock:
            row = self._row(task_id)
            if row.state.is_terminal:
                raise InvalidTransitionError(f"cannot cancel task {task_id}: it is {row.state}")
            self._cancel(row, now)
            return row.state

    def retry(self, task_id: int, now: datetime) -> TaskState:
        """Make a failed or cancelled task pending, due ``now``, with a fresh
        budget (attempt numbers go on). Raises TaskNotFoundError, or
        InvalidTransitionError for a task in any other state."""
        with self.lock:
            row = self._row(task_id)
            if row.state not in (TaskState.FAILED, TaskState.CANCELLED):
                raise InvalidTransitionError(f"cannot retry task {task_id}: it is {row.state}")
            row.spent, row.run_at = 0, now
            self._move(row, Cause.MANUAL_RETRY, TaskState.PENDING)
            row.cancel_requested, row.result, row.finished_at = False, None, None
            return row.state

    def run_now(self, task_id: int, now: datetime) -> TaskState:
        """A pending task becomes due ``now`` (never later). Raises
        TaskNotFoundError, or InvalidTransitionError for any other state."""
        with self.lock:
            row = self._row(task_id)
            if row.state is not TaskState.PENDING:
                raise InvalidTransitionError(f"cannot run now task {task_id}: it is {row.state}")
            if row.run_at > now:
                row.run_at = now
                self.index.update(row)
            self.woken.add(row.queue)
            return row.state

    def retry_many(self, selection: RetryMany, now: datetime) -> list[int]:
        """One batch of a bulk retry (see :class:`RetryMany`), each as :meth:`retry`."""
        with self.lock:
            chosen = self.selected(selection)
            for task_id in chosen:
                row = self.tasks[task_id]
                row.spent, row.run_at = 0, now
                self._move(row, Cause.MANUAL_RETRY, TaskState.PENDING)
                row.cancel_requested, row.result, row.finished_at = False, None, None
                self.woken.add(row.queue)
            return chosen

    def cancel_many(self, selection: CancelMany, now: datetime) -> list[int]:
        """One batch of a bulk cancel (see :class:`CancelMany`), each as :meth:`cancel`."""
        with self.lock:
            chosen = self.selected(selection)
            for task_id in chosen:
                row = self.tasks.get(task_id)
                if row is not None and not row.state.is_terminal:  # a child cancelled before
                    self._cancel(row, now)
            return chosen

    def selected(self, selection: TaskSelection) -> list[int]:
        """The ids of the tasks ``selection`` takes now (the caller holds the lock)."""
        states = set(selection.states)
        among = None if selection.ids is None else set(selection.ids)
        return sorted(
            row.id
            for row in self.tasks.values()
            if row.state in states
            and row.id > selection.after
            and (among is None or row.id in among)
            and selection.name in (None, row.name)
            and selection.queue in (None, row.queue)
            and (selection.since is None or row.created_at >= selection.since)
            and (selection.until is None or row.created_at < selection.until)
        )[: selection.limit]


def delete(store: Tables, task_id: int) -> None:
    """Delete a task (see :meth:`conveyor.backends.protocol.Backend.delete`)."""
    with store.lock:
        row = store.tasks.get(task_id)
        if row is None:
            raise delete_refused(task_id, None, None)
        parent = store.tasks.get(row.parent_id) if row.parent_id is not None else None
        blocked = row.state is TaskState.IN_PROGRESS or (
            not row.state.is_terminal and parent is not None and parent.state in ALIVE
        )
        if blocked:
            raise delete_refused(task_id, row.state, parent.state if parent else None)
        if awaited(store, row):
            raise awaited_refusal(task_id)
        forget(store, row)


def delete_many(store: Controls, selection: DeleteMany) -> list[int]:
    """One batch of a bulk delete (see :class:`DeleteMany`), each as :func:`delete`."""
    with store.lock:
        chosen = [t for t in store.selected(selection) if not awaited(store, store.tasks[t])]
        for task_id in chosen:
            forget(store, store.tasks[task_id])
        return chosen
