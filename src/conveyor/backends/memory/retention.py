"""Pruning and deleting in memory: what the SQL backends delete, from the store."""

from __future__ import annotations

from conveyor.backends.memory.rows import Row
from conveyor.backends.memory.store import Store
from conveyor.backends.stored import delete_refused
from conveyor.model import TaskState
from conveyor.records import DeleteMany, PruneParams, PruneResult

_ALIVE = (TaskState.PENDING, TaskState.IN_PROGRESS, TaskState.WAITING)


def _prunable(store: Store, params: PruneParams) -> list[Row]:
    """Every task the cutoffs allow, by state in the order given, oldest id first."""
    found = []
    for state, before in params.before.items():
        found += sorted(
            (
                row
                for row in store.tasks.values()
                if row.state is state
                and row.finished_at is not None
                and row.finished_at < before
                and not _parent_alive(store, row)
            ),
            key=lambda row: row.id,
        )
    return found


def _parent_alive(store: Store, row: Row) -> bool:
    parent = store.tasks.get(row.parent_id) if row.parent_id is not None else None
    return parent is not None and parent.state in _ALIVE


def _old_workers(store: Store, params: PruneParams) -> list[str]:
    before = params.workers_before
    if before is None:
        return []
    return [
        w.id
        for w in store.workers.values()
        if (last := w.stopped_at or w.last_seen_at) is not None and last < before
    ]


def forget(store: Store, row: Row) -> None:
    """Delete ``row`` with what the SQL backends delete with it (its
    messages and keys); its children lose their parent. Under the lock."""
    del store.tasks[row.id]
    store.index.forget(row)
    store.inboxes.unread.pop(row.id, None)
    for key in [k for k in store.inboxes.keys if k[0] == row.id]:
        del store.inboxes.keys[key]
    if row.idempotency_key is not None:
        store.keys.pop((row.name, row.idempotency_key), None)
    if row.parent_id is not None:
        store.children.get(row.parent_id, set()).discard(row.id)
    for child_id in store.children.pop(row.id, ()):
        child = store.tasks.get(child_id)
        if child is not None:
            child.parent_id = None


def prune(store: Store, params: PruneParams) -> PruneResult:
    """Delete one batch (see :meth:`conveyor.backends.protocol.Backend.prune`)."""
    with store.lock:
        doomed = _prunable(store, params)[: params.limit]
        for row in doomed:
            forget(store, row)
        workers = _old_workers(store, params)
        for worker_id in workers:
            del store.workers[worker_id]
        return PruneResult(tasks=len(doomed), workers=len(workers))


def count_prunable(store: Store, params: PruneParams) -> PruneResult:
    """What :func:`prune` would delete over all its batches."""
    with store.lock:
        return PruneResult(
            tasks=len(_prunable(store, params)), workers=len(_old_workers(store, params))
        )


def delete(store: Store, task_id: int) -> None:
    """Delete a task (see :meth:`conveyor.backends.protocol.Backend.delete`)."""
    with store.lock:
        row = store.tasks.get(task_id)
        if row is None:
            raise delete_refused(task_id, None, None)
        parent = store.tasks.get(row.parent_id) if row.parent_id is not None else None
        blocked = row.state is TaskState.IN_PROGRESS or (
            not row.state.is_terminal and parent is not None and parent.state in _ALIVE
        )
        if blocked:
            raise delete_refused(task_id, row.state, parent.state if parent else None)
        forget(store, row)


def delete_many(store: Store, selection: DeleteMany) -> list[int]:
    """One batch of a bulk delete (see :class:`DeleteMany`), each as :func:`delete`."""
    with store.lock:
        chosen = store.selected(selection)
        for task_id in chosen:
            forget(store, store.tasks[task_id])
        return chosen
