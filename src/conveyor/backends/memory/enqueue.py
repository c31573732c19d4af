"""Storing new tasks in memory: plain, keyed (unique keys), with first
messages.

A unique key is held by the task in ``Tables.keys`` until it leaves its
unique scope (:meth:`Row.leaves_unique_scope`), its period ends (checked
here, lazily, when the key is wanted again) or it is deleted.
"""

from __future__ import annotations

from collections.abc import Iterable, Sequence
from datetime import datetime, timedelta

from conveyor.backends.memory.rows import Row
from conveyor.backends.memory.schema import Tables, ensure_key, release_key
from conveyor.backends.params import NewTask, check_after, earlier_index
from conveyor.errors import TaskExistsError, TaskNotFoundError
from conveyor.model import Cause, MessageKind, TaskState, check_state_change


def key_holder(store: Tables, name: str, key: str, now: datetime) -> Row | None:
    """The task holding ``key`` of ``name`` (a period that ended releases it)."""
    task_id = store.keys.get((name, key))
    if task_id is None:
        return None
    row = store.tasks[task_id]
    if row.unique_until is not None and row.unique_until <= now:
        release_key(store, row)
        return None
    return row


def refuse_held(store: Tables, batch: Sequence[NewTask], now: datetime) -> None:
    """Raise TaskExistsError, before anything is stored, for the first task of
    ``batch`` with ``on_conflict="raise"`` whose key a stored task holds.
    (A key repeated within one batch is the batch's first task with it.)"""
    for new in batch:
        if new.idempotency_key is not None and new.on_conflict == "raise":
            found = key_holder(store, new.name, new.idempotency_key, now)
            if found is not None:
                raise TaskExistsError(new.name, new.idempotency_key, found.id)


def conflict(store: Tables, row: Row, new: NewTask, now: datetime) -> Row:
    """An enqueue of ``new`` whose key ``row`` holds: ``replace`` gives a
    pending ``row`` the new payload, priority and due time."""
    if new.on_conflict == "replace" and row.state is TaskState.PENDING:
        row.payload = new.payload
        row.priority = new.priority
        row.run_at = new.run_at or now + timedelta(seconds=new.delay)
        store.index.update(row)
    return row


class Enqueue(Tables):
    """``enqueue``, and the insert a spawn and a schedule's firing share."""

    def enqueue(self, tasks: Iterable[NewTask], now: datetime) -> list[int]:
        """Store every task, pending at its ``run_at`` (else ``delay`` seconds
        from ``now``), and return their ids in order. A task whose name and
        unique key are held by a stored task is not stored (nor its first
        message): by its ``on_conflict``, the holder's id comes back, the
        pending holder takes its payload, priority and due time, or
        TaskExistsError is raised and nothing is stored."""
        with self.lock:
            batch = list(tasks)
            check_after(batch)
            self._refuse_unknown_dependencies(batch)  # first, as every store orders them
            refuse_held(self, batch, now)
            mine: set[int] = set()
            ids: list[int] = []
            waiting: list[tuple[Row, NewTask]] = []
            for new in batch:
                stored = len(mine)
                row = self._insert(new, now, Cause.ENQUEUE, mine)
                if new.after and len(mine) > stored:  # stored now, not a key's holder
                    waiting.append((row, new))
                ids.append(row.id)
            # Every task is stored before any edge counts an end: a task its
            # dependencies end at once gives its key up only after the
            # batch's other tasks met it.
            for row, new in waiting:
                self._wait_for(row, [_resolved(ref, ids) for ref in new.after], now)
            return ids

    def _refuse_unknown_dependencies(self, batch: Sequence[NewTask]) -> None:
        for new in batch:
            for reference in new.after:
                if earlier_index(reference) is None and reference not in self.tasks:
                    raise TaskNotFoundError(f"no task with id {reference} (a dependency)")

    def _wait_for(self, row: Row, dependencies: list[int], now: datetime) -> None:
        """``row``, just stored waiting, waits for ``dependencies``: those
        ended already count now, in order."""
        self.dependencies.add(row.id, dependencies)
        for task_id in dict.fromkeys(dependencies):
            dependency = self.tasks[task_id]
            if dependency.state.is_terminal:
                for ended in self._settle(dependency, now):
                    self._ended(ended, now)

    def _insert(
        self, new: NewTask, now: datetime, cause: Cause, mine: set[int] | None = None
    ) -> Row:
        """Store ``new`` (or find the holder of its key); ``mine`` collects the
        ids this enqueue stored (a key repeated in it is its first task's)."""
        key = new.idempotency_key
        if key is not None:
            holder = key_holder(self, new.name, key, now)
            if holder is not None:
                if mine is not None and holder.id in mine:
                    return holder
                return conflict(self, holder, new, now)
        row = Row.new(next(self.ids), new, now)
        if new.after:
            check_state_change(None, cause, TaskState.WAITING)
            row.state = TaskState.WAITING
        else:
            check_state_change(None, cause, TaskState.PENDING)
        self.tasks[row.id] = row
        ensure_key(self, row, now)
        if mine is not None:
            mine.add(row.id)
        if key is not None:
            self.keys[(new.name, key)] = row.id
        self.index.update(row)
        if new.parent_id is not None:
            self.children.setdefault(new.parent_id, set()).add(row.id)
        if new.message is not None:  # its first input: it does not move a delayed start
            self.inboxes.append(
                row.id, new.parent_id, MessageKind.MESSAGE, new.message, now, new.trace
            )
        return row


def _resolved(reference: int, ids: Sequence[int]) -> int:
    """The id a ``NewTask.after`` entry names, given the ids stored so far."""
    position = earlier_index(reference)
    return reference if position is None else ids[position]
