"""Retention in memory: prune, and the counts of what prune would delete;
and what deleting a task takes with it."""

from __future__ import annotations

from conveyor.backends.memory.rows import Row
from conveyor.backends.memory.schema import Tables
from conveyor.model import TaskState
from conveyor.records import PruneParams, PruneResult

ALIVE = (TaskState.PENDING, TaskState.IN_PROGRESS, TaskState.WAITING)


def _prunable(store: Tables, params: PruneParams) -> list[Row]:
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
                and not awaited(store, row)
            ),
            key=lambda row: row.id,
        )
    return found


def _parent_alive(store: Tables, row: Row) -> bool:
    parent = store.tasks.get(row.parent_id) if row.parent_id is not None else None
    return parent is not None and parent.state in ALIVE


def awaited(store: Tables, row: Row) -> bool:
    """Whether an unfinished task depends on ``row`` (and may yet read its outcome)."""
    return any(
        (dependent := store.tasks.get(task_id)) is not None and dependent.state in ALIVE
        for task_id in store.dependencies.waited_by(row.id)
    )


def _old_workers(store: Tables, params: PruneParams) -> list[str]:
    before = params.workers_before
    if before is None:
        return []
    return [
        w.id
        for w in store.workers.values()
        if (last := w.stopped_at or w.last_seen_at) is not None and last < before
    ]


def forget(store: Tables, row: Row) -> None:
    """Delete ``row`` with what the SQL backends delete with it (its
    messages and keys); its children lose their parent. Under the lock."""
    del store.tasks[row.id]
    store.index.forget(row)
    store.inboxes.unread.pop(row.id, None)
    for key in [k for k in store.inboxes.keys if k[0] == row.id]:
        del store.inboxes.keys[key]
    if row.idempotency_key is not None:
        store.keys.pop((row.name, row.idempotency_key), None)
    store.dependencies.forget(row.id)
    if row.parent_id is not None:
        store.children.get(row.parent_id, set()).discard(row.id)
    for child_id in store.children.pop(row.id, ()):
        child = store.tasks.get(child_id)
        if child is not None:
            child.parent_id = None


def prune(store: Tables, params: PruneParams) -> PruneResult:
    """Delete one batch (see :meth:`conveyor.backends.protocol.Backend.prune`)."""
    with store.lock:
        doomed = _prunable(store, params)[: params.limit]
        for row in doomed:
            forget(store, row)
        workers = _old_workers(store, params)
        for worker_id in workers:
            del store.workers[worker_id]
        return PruneResult(tasks=len(doomed), workers=len(workers))


def count_prunable(store: Tables, params: PruneParams) -> PruneResult:
    """What :func:`prune` would delete over all its batches."""
    with store.lock:
        return PruneResult(
            tasks=len(_prunable(store, params)), workers=len(_old_workers(store, params))
        )
