"""What the memory store's reads return: snapshots, lists and counts.

Reads only, each under the store's lock; they never move a task.
"""

from __future__ import annotations

import itertools
from collections import Counter
from collections.abc import Iterable, Iterator, Sequence
from datetime import datetime
from typing import TYPE_CHECKING

from conveyor.backends.memory.rows import Row
from conveyor.backends.params import WorkFilter, read_ids
from conveyor.backends.stored import activity_buckets, dependency_record
from conveyor.model import Message, Task, TaskState
from conveyor.records import (
    ActivityBucket,
    DependencyEdge,
    DependencyRecord,
    QueueBacklog,
    TaskCount,
    TaskFilter,
    TaskSummary,
    WorkerInfo,
    last_error_of,
)

if TYPE_CHECKING:
    from conveyor.backends.memory.backend import Store


def get_task(store: Store, task_id: int, with_attempts: bool) -> Task | None:
    with store.lock:
        row = store.tasks.get(task_id)
        return row.snapshot(with_attempts) if row is not None else None


def dependencies(store: Store, task_id: int) -> list[DependencyRecord]:
    """The task's dependencies in the order given (see :class:`DependencyRecord`)."""
    with store.lock:
        records = []
        for edge in store.dependencies.edges.get(task_id, ()):
            row = store.tasks.get(edge.task_id)
            if row is None:
                records.append(dependency_record(edge.task_id, edge.settled))
                continue
            ended = next((a for a in reversed(row.attempts) if a.finished_at is not None), None)
            records.append(
                dependency_record(
                    edge.task_id,
                    edge.settled,
                    row.name,
                    row.state.value,
                    row.result,
                    ended.outcome.value if ended is not None else None,
                    ended.error_type if ended is not None else None,
                    ended.error_message if ended is not None else None,
                )
            )
        return records


def edges(store: Store, ids: Sequence[int]) -> list[DependencyEdge]:
    """Both sides of the edges of ``ids``, by dependent then position: each
    id's own edges, and those to it off the reverse index (which a delete
    of the task empties, as the stores' reads pass by the edges to a task
    no longer stored)."""
    wanted = read_ids(ids)
    with store.lock:
        found: set[tuple[int, int]] = set()
        for task_id in wanted:
            own = store.dependencies.edges.get(task_id, ())
            found.update((task_id, position) for position in range(len(own)))
            if task_id in store.tasks:
                found.update(store.dependencies.dependents.get(task_id, ()))
        shown = []
        for dependent, position in sorted(found):
            edge = store.dependencies.edges[dependent][position]
            shown.append(DependencyEdge(dependent, position, edge.task_id, edge.settled))
        return shown


def list_tasks(store: Store, task_filter: TaskFilter) -> list[Task]:
    """Newest first, each filter optional, at most ``limit``; no attempt logs."""
    with store.lock:
        rows = itertools.islice(_listed(store, task_filter), task_filter.limit)
        return [r.snapshot(False) for r in rows]


def list_summaries(store: Store, task_filter: TaskFilter) -> list[TaskSummary]:
    """What :func:`list_tasks` lists, as summaries: no payload is copied or
    decoded, and the walk stops at ``limit``."""
    with store.lock:
        return [
            _summary(r) for r in itertools.islice(_listed(store, task_filter), task_filter.limit)
        ]


def summaries(store: Store, ids: Sequence[int]) -> list[TaskSummary]:
    """The stored tasks among ``ids``, as summaries, highest id first."""
    wanted = read_ids(ids)
    with store.lock:
        found = (store.tasks.get(task_id) for task_id in sorted(wanted, reverse=True))
        return [_summary(r) for r in found if r is not None]


def _listed(store: Store, task_filter: TaskFilter) -> Iterator[Row]:
    """The rows a listing takes, newest first (the caller holds the lock)."""
    if task_filter.parent is None:
        scope: Iterable[Row] = reversed(store.tasks.values())
    else:
        children = sorted(store.children.get(task_filter.parent, ()), reverse=True)
        scope = (store.tasks[i] for i in children if i in store.tasks)
    return (
        r
        for r in scope
        if (task_filter.before is None or r.id < task_filter.before)
        and (task_filter.state is None or r.state is task_filter.state)
        and (task_filter.name is None or r.name == task_filter.name)
        and (task_filter.queue is None or r.queue == task_filter.queue)
    )


def _summary(r: Row) -> TaskSummary:
    last = r.attempts[-1] if r.attempts else None
    return TaskSummary(
        id=r.id,
        name=r.name,
        queue=r.queue,
        state=r.state,
        priority=r.priority,
        run_at=r.run_at,
        attempt=r.attempt,
        max_attempts=r.max_attempts,
        created_at=r.created_at,
        finished_at=r.finished_at,
        worker_id=r.worker_id if r.state is TaskState.IN_PROGRESS else None,
        cancel_requested=r.cancel_requested,
        step=r.step,
        last_error=last_error_of(
            r.state,
            None if last is None else last.outcome.value,
            None if last is None else last.error_type,
            None if last is None else last.error_message,
        ),
    )


def running_by_worker(store: Store) -> dict[str, int]:
    """Running tasks by their owner."""
    with store.lock:
        found = Counter(
            r.worker_id
            for r in store.tasks.values()
            if r.state is TaskState.IN_PROGRESS and r.worker_id is not None
        )
    return dict(found)


def count_tasks(store: Store) -> list[TaskCount]:
    """Tasks by state, queue and name, in that order; no zero counts."""
    with store.lock:
        found = Counter((r.state.value, r.queue, r.name) for r in store.tasks.values())
    return [TaskCount(TaskState(s), q, n, c) for (s, q, n), c in sorted(found.items())]


def queue_backlogs(store: Store, now: datetime) -> list[QueueBacklog]:
    """Pending tasks by queue: due now, due later, the oldest due run time."""
    due: Counter[str] = Counter()
    later: Counter[str] = Counter()
    oldest: dict[str, datetime] = {}
    with store.lock:
        for r in store.tasks.values():
            if r.state is not TaskState.PENDING:
                continue
            if r.run_at <= now:
                due[r.queue] += 1
                oldest[r.queue] = min(oldest.get(r.queue, r.run_at), r.run_at)
            else:
                later[r.queue] += 1
    queues = sorted(set(due) | set(later))
    return [QueueBacklog(q, due[q], later[q], oldest.get(q)) for q in queues]


def count_unfinished(store: Store, work: WorkFilter, now: datetime) -> int:
    """Due pending plus in-progress tasks of these names and queues."""
    names, queues = set(work.names), set(work.queues)
    with store.lock:
        return sum(
            1
            for r in store.tasks.values()
            if r.name in names
            and r.queue in queues
            and (
                r.state is TaskState.IN_PROGRESS
                or (
                    r.state is TaskState.PENDING
                    and r.run_at <= now
                    and store.pauses.serves(r.queue, r.name)
                )
            )
        )


def next_due_at(store: Store, queues: Sequence[str]) -> datetime | None:
    """The earliest run time of a pending task of these queues."""
    wanted = set(queues)
    with store.lock:
        return min(
            (
                r.run_at
                for r in store.tasks.values()
                if r.state is TaskState.PENDING and r.queue in wanted
            ),
            default=None,
        )


def inbox(store: Store, task_id: int) -> list[Message]:
    """The task's unread messages, oldest first."""
    with store.lock:
        return store.inboxes.read(task_id)


def list_workers(store: Store, now: datetime) -> list[WorkerInfo]:
    """Newest first (a worker never registered counts as started ``now``)."""
    with store.lock:
        return sorted(store.workers.values(), key=lambda w: w.started_at or now, reverse=True)


def activity(store: Store, since: datetime, bucket_seconds: int) -> list[ActivityBucket]:
    """Succeeded and failed tasks by the bucket of their finish time."""
    found: dict[int, list[int]] = {}
    with store.lock:
        for r in store.tasks.values():
            if r.finished_at is None or r.finished_at < since:
                continue
            if r.state is not TaskState.SUCCEEDED and r.state is not TaskState.FAILED:
                continue
            number = int((r.finished_at - since).total_seconds() // bucket_seconds)
            counts = found.setdefault(number, [0, 0])
            counts[0 if r.state is TaskState.SUCCEEDED else 1] += 1
    return activity_buckets(since, bucket_seconds, ((n, c[0], c[1]) for n, c in found.items()))
