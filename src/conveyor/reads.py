"""The store's views, read through a client: its clock, an overview (counts,
backlogs, live workers), the last hour's activity, the attempts running per
worker, and the migrations a store still lacks; and its tasks: one with its
attempt log, why it is where it is, the graph of dependencies around it,
listings, counts, and the workers.

:class:`Reads` is a base of :class:`conveyor.Client` (and so of
:class:`conveyor.App`): every read has a sync form and an ``_async`` form,
and reads the store the client talks to. The dashboard and the command
line read the store only through these and the client's own methods.
"""

from __future__ import annotations

import os
from collections.abc import Sequence
from dataclasses import dataclass
from datetime import datetime
from typing import Any

from conveyor.backends import Backend, sqlite_path
from conveyor.backends.capabilities import Inspector, capability_of
from conveyor.backends.protocol import Capability
from conveyor.errors import StoreNotReadyError
from conveyor.explain import Explanation, explain
from conveyor.graph import DEFAULT_LIMIT, TaskGraph, task_graph
from conveyor.model import Task, TaskState, findable
from conveyor.overview import Overview, read_overview
from conveyor.portal import Portal
from conveyor.records import (
    ActivityBucket,
    DependencyEdge,
    DependencyRecord,
    Migration,
    QueueBacklog,
    TaskCount,
    TaskFilter,
    TaskSummary,
    WorkerInfo,
)


@dataclass(frozen=True, slots=True)
class StoreStatus:
    """What :meth:`Reads.store_status_async` found: the migrations the store
    lacks (``pending``, oldest first) and the workers it knows (none read
    while a migration is pending)."""

    pending: list[Migration]
    workers: list[WorkerInfo]


class Reads:
    """The store's views (see the module docstring)."""

    portal: Portal
    url: str

    async def backend(self) -> Backend:
        raise NotImplementedError  # the client's own

    async def _inspector(self) -> Inspector:
        raise NotImplementedError  # the client's own

    def make_backend(self, **overrides: Any) -> Backend:
        raise NotImplementedError  # the client's own

    async def now_async(self) -> datetime:
        """The store's clock now (timezone-aware): what its leases, due times
        and worker heartbeats are read by, which may differ from this
        machine's. One read."""
        return await (await self.backend()).store_clock()

    def now(self) -> datetime:
        """Sync form of :meth:`now_async`."""
        return self.portal.run(self.now_async())

    async def overview_async(self) -> Overview:
        """The store's clock, its task counts by state, queue and name, each
        queue's backlog and the live workers (see :mod:`conveyor.overview`:
        four reads, not one transaction; the counts walk every task). Raises
        ConfigurationError on a backend without an inspector."""
        return await read_overview(await self.backend(), await self._inspector())

    def overview(self) -> Overview:
        """Sync form of :meth:`overview_async`."""
        return self.portal.run(self.overview_async())

    async def queue_backlogs_async(self) -> list[QueueBacklog]:
        """Each queue's pending tasks due now and later, and its oldest due
        task's run time, by the store's clock."""
        return await (await self._inspector()).queue_backlogs()

    def queue_backlogs(self) -> list[QueueBacklog]:
        """Sync form of :meth:`queue_backlogs_async`."""
        return self.portal.run(self.queue_backlogs_async())

    async def activity_async(self, since: datetime, bucket_seconds: int) -> list[ActivityBucket]:
        """Tasks finished since ``since`` by outcome, in buckets of
        ``bucket_seconds``, oldest first, only buckets with a task (see
        :meth:`~conveyor.backends.protocol.Inspector.activity` for what each
        engine counts, and its limits). Raises ConfigurationError for a
        ``bucket_seconds`` below 1."""
        return await (await self._inspector()).activity(since, bucket_seconds)

    def activity(self, since: datetime, bucket_seconds: int) -> list[ActivityBucket]:
        """Sync form of :meth:`activity_async`."""
        return self.portal.run(self.activity_async(since, bucket_seconds))

    async def running_by_worker_async(self) -> dict[str, int]:
        """How many tasks each worker runs now, by worker id (a worker
        running none is left out)."""
        return await (await self._inspector()).running_by_worker()

    def running_by_worker(self) -> dict[str, int]:
        """Sync form of :meth:`running_by_worker_async`."""
        return self.portal.run(self.running_by_worker_async())

    async def store_status_async(self, *, workers: bool = True) -> StoreStatus:
        """The migrations the store lacks and, when it lacks none and
        ``workers`` is True, the workers it knows, read on a connection of
        its own that neither applies nor requires migrations, closed after:
        whatever this client's ``migrate`` option, a store that is missing
        or behind is reported, not refused. A backend without an inspector
        reports neither."""
        backend = self.make_backend(migrate=None, pool_size=1)
        await backend.open()
        try:
            inspector = capability_of(backend, Capability.INSPECT)
            if inspector is None:
                return StoreStatus([], [])
            pending = await inspector.pending_migrations()
            known = await inspector.list_workers() if workers and not pending else []
            return StoreStatus(pending, known)
        finally:
            await backend.close()

    def store_status(self, *, workers: bool = True) -> StoreStatus:
        """Sync form of :meth:`store_status_async`."""
        return self.portal.run(self.store_status_async(workers=workers))

    def check_exists(self) -> None:
        """Raise StoreNotReadyError if this client's store is a SQLite file
        that does not exist (no I/O but a look at the path; other stores
        pass): a command that only reads must not create an empty one where
        a path is mistyped, or relative and run from another directory."""
        path = sqlite_path(self.url)
        if path is not None and not os.path.exists(path):
            raise StoreNotReadyError(
                f"no SQLite database at {path} (check --url or CONVEYOR_URL; "
                "`conveyor migrate` or a worker creates it)"
            )

    async def check_ready_async(self) -> None:
        """Raise StoreNotReadyError unless the store is there and current,
        read on a connection of its own (closed after) that applies nothing,
        whatever this client's ``migrate`` option: for a program that serves
        the store and must refuse a missing one at its start."""
        backend = self.make_backend(migrate=False, pool_size=1)
        await backend.open()
        await backend.close()

    def check_ready(self) -> None:
        """Sync form of :meth:`check_ready_async`."""
        self.portal.run(self.check_ready_async())

    # -- tasks -------------------------------------------------------------------

    async def get_async(self, task_id: int) -> Task | None:
        """The task with its attempt log, or None."""
        if not findable(task_id):
            return None
        return await (await self.backend()).get_task(task_id)

    def get(self, task_id: int) -> Task | None:
        """The task with its attempt log, or None."""
        return self.portal.run(self.get_async(task_id))

    async def dependencies_async(self, task_id: int) -> list[DependencyRecord]:
        """The tasks task ``task_id`` waits for (its ``after``), in order,
        each with its state and outcome; [] if it has none or is not stored."""
        if not findable(task_id):
            return []
        return await (await self.backend()).dependencies(task_id)

    def dependencies(self, task_id: int) -> list[DependencyRecord]:
        """Sync form of :meth:`dependencies_async`."""
        return self.portal.run(self.dependencies_async(task_id))

    async def edges_async(self, ids: Sequence[int]) -> list[DependencyEdge]:
        """Every edge of dependencies whose dependent or dependency is among
        ``ids`` (each once, by dependent then position), in one read: at
        most :data:`~conveyor.backends.params.MAX_READ_IDS` ids (else
        ConfigurationError; read more in chunks). See
        :meth:`~conveyor.backends.protocol.Backend.edges`."""
        return await (await self.backend()).edges(ids)

    def edges(self, ids: Sequence[int]) -> list[DependencyEdge]:
        """Sync form of :meth:`edges_async`."""
        return self.portal.run(self.edges_async(ids))

    async def graph_async(self, task_id: int, limit: int = DEFAULT_LIMIT) -> TaskGraph:
        """The graph of dependencies around task ``task_id`` (a chord's
        members and callback, a chain's links, ...), at most ``limit``
        nodes: see :func:`conveyor.graph.task_graph` for what it reads and
        its limits. Raises TaskNotFoundError for a task not stored."""
        return await task_graph(await self.backend(), task_id, limit)

    def graph(self, task_id: int, limit: int = DEFAULT_LIMIT) -> TaskGraph:
        """Sync form of :meth:`graph_async`."""
        return self.portal.run(self.graph_async(task_id, limit))

    async def explain_async(self, task_id: int) -> Explanation:
        """Why task ``task_id`` is not running, or what it is doing: one
        sentence and its facts (see :mod:`conveyor.explain`). Raises
        ConfigurationError on a backend without an inspector."""
        inspector = await self._inspector()
        backend = await self.backend()
        return await explain(backend, inspector, task_id, await backend.store_clock())

    def explain(self, task_id: int) -> Explanation:
        """Sync form of :meth:`explain_async`."""
        return self.portal.run(self.explain_async(task_id))

    async def list_tasks_async(
        self,
        *,
        state: TaskState | str | None = None,
        name: str | None = None,
        queue: str | None = None,
        limit: int = 100,
        before: int | None = None,
        parent: int | None = None,
    ) -> list[Task]:
        """Tasks newest first (highest id first), filtered by state, name and
        queue, at most ``limit``; ``before`` pages on: only tasks with a
        smaller id (pass the last id of the page before); ``parent``: only
        the children that coroutine task spawned. Raises
        ConfigurationError on a bad filter."""
        task_filter = _task_filter(state, name, queue, limit, before, parent)
        return await (await self._inspector()).list_tasks(task_filter)

    def list_tasks(
        self,
        *,
        state: TaskState | str | None = None,
        name: str | None = None,
        queue: str | None = None,
        limit: int = 100,
        before: int | None = None,
        parent: int | None = None,
    ) -> list[Task]:
        """Sync form of :meth:`list_tasks_async`."""
        return self.portal.run(
            self.list_tasks_async(
                state=state, name=name, queue=queue, limit=limit, before=before, parent=parent
            )
        )

    async def list_summaries_async(
        self,
        *,
        state: TaskState | str | None = None,
        name: str | None = None,
        queue: str | None = None,
        limit: int = 100,
        before: int | None = None,
        parent: int | None = None,
    ) -> list[TaskSummary]:
        """The tasks :meth:`list_tasks_async` lists for the same filters (the
        same ids, in the same order), as summaries: what a listing shows
        (state, attempts, times, owner, the latest attempt's error) without
        payloads or results, so that a page costs the same whatever its
        tasks carry. Raises ConfigurationError on a bad filter."""
        task_filter = _task_filter(state, name, queue, limit, before, parent)
        return await (await self._inspector()).list_summaries(task_filter)

    def list_summaries(
        self,
        *,
        state: TaskState | str | None = None,
        name: str | None = None,
        queue: str | None = None,
        limit: int = 100,
        before: int | None = None,
        parent: int | None = None,
    ) -> list[TaskSummary]:
        """Sync form of :meth:`list_summaries_async`."""
        return self.portal.run(
            self.list_summaries_async(
                state=state, name=name, queue=queue, limit=limit, before=before, parent=parent
            )
        )

    async def count_tasks_async(self) -> list[TaskCount]:
        """How many tasks the store holds, by state, queue and name."""
        return await (await self._inspector()).count_tasks()

    def count_tasks(self) -> list[TaskCount]:
        """How many tasks the store holds, by state, queue and name."""
        return self.portal.run(self.count_tasks_async())

    async def list_workers_async(self) -> list[WorkerInfo]:
        """Workers known to the store, with their last heartbeat."""
        return await (await self._inspector()).list_workers()

    def list_workers(self) -> list[WorkerInfo]:
        """Workers known to the store, with their last heartbeat."""
        return self.portal.run(self.list_workers_async())


def _task_filter(
    state: TaskState | str | None,
    name: str | None,
    queue: str | None,
    limit: int,
    before: int | None,
    parent: int | None,
) -> TaskFilter:
    """The filter :meth:`Reads.list_tasks_async` and
    :meth:`Reads.list_summaries_async` both read by."""
    wanted = TaskState(state) if state is not None else None
    return TaskFilter(
        state=wanted, name=name, queue=queue, limit=limit, before=before, parent=parent
    )
