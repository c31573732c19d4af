"""The dashboard's pages (GET): each reads the store through the client's
async API (nothing else: no backend, no inspector) and renders one
template. A bad filter answers 400, an unknown task 404, never a server
error."""

from __future__ import annotations

from collections import Counter
from datetime import timedelta

from starlette.exceptions import HTTPException
from starlette.requests import Request
from starlette.responses import Response

from conveyor.controls import CANCELLABLE
from conveyor.dashboard import drawing, format
from conveyor.dashboard.hosts import local_redirect
from conveyor.dashboard.state import dashboard_of
from conveyor.errors import ConfigurationError, TaskNotFoundError
from conveyor.graph import DEFAULT_LIMIT
from conveyor.model import PauseKind, Task, TaskState, parse_task_id
from conveyor.overview import Overview
from conveyor.records import DependencyRecord, TaskFilter, TaskSummary
from conveyor.schedules import next_stored_slot

CHILDREN_SHOWN = 20
"""A coroutine task's newest children shown on its page (the rest: a link)."""
DEPENDENCIES_SHOWN = 50
"""A task's dependencies listed on its page (all are counted by state)."""
ACTIVITY_BUCKET = 60
"""Seconds per bar of the overview's chart."""
ACTIVITY_BUCKETS = 60
"""Bars of the overview's chart: the last hour, a minute each."""


def _integer(request: Request, name: str) -> int | None:
    value = request.query_params.get(name, "").strip()
    if not value:
        return None
    try:
        return parse_task_id(value, name)
    except ConfigurationError as exc:
        raise HTTPException(400, str(exc)) from None


def _state(request: Request) -> TaskState | None:
    value = request.query_params.get("state", "").strip()
    if not value:
        return None
    try:
        return TaskState(value)
    except ValueError:
        known = ", ".join(s.value for s in TaskState)
        raise HTTPException(400, f"unknown state {value!r}: one of {known}") from None


def _text(request: Request, name: str) -> str | None:
    value = request.query_params.get(name, "").strip()
    if len(value) > 500:
        raise HTTPException(400, f"{name} is too long")
    return value or None


async def _page(request: Request, task_filter: TaskFilter) -> tuple[list[TaskSummary], int | None]:
    """One page of tasks, summarized (no payload is read), and the id to
    page on from (None: the last page)."""
    found = await dashboard_of(request).client.list_summaries_async(
        state=task_filter.state,
        name=task_filter.name,
        queue=task_filter.queue,
        limit=task_filter.limit + 1,
        before=task_filter.before,
        parent=task_filter.parent,
    )
    shown = found[: task_filter.limit]
    return shown, shown[-1].id if len(found) > task_filter.limit else None


def _by_queue(found: Overview) -> dict[str, Counter[TaskState]]:
    """The overview's task counts, by queue then state."""
    by_queue: dict[str, Counter[TaskState]] = {}
    for count in found.counts:
        by_queue.setdefault(count.queue, Counter())[count.state] += count.count
    return by_queue


async def overview(request: Request) -> Response:
    """Counts by state and queue, the last hour's finished tasks, live workers."""
    dashboard = dashboard_of(request)
    found = await dashboard.client.overview_async()
    now = found.now
    since = now.replace(second=0, microsecond=0) - timedelta(
        seconds=ACTIVITY_BUCKET * (ACTIVITY_BUCKETS - 1)
    )
    buckets = await dashboard.client.activity_async(since, ACTIVITY_BUCKET)
    by_queue = _by_queue(found)
    totals: Counter[TaskState] = sum(by_queue.values(), Counter())
    return dashboard.render(
        request,
        "overview.html",
        {
            "page": "overview",
            "now": now,
            "states": list(TaskState),
            "by_queue": sorted(by_queue.items()),
            "totals": totals,
            "chart": format.chart(buckets, since, ACTIVITY_BUCKET, ACTIVITY_BUCKETS),
            "workers": found.live_workers,
            "backlogs": {b.queue: b for b in found.backlogs},
        },
    )


async def queues(request: Request) -> Response:
    """Each queue's due and later tasks, oldest due task, running, pause."""
    dashboard = dashboard_of(request)
    found = await dashboard.client.overview_async()
    now = found.now
    backlogs = {b.queue: b for b in found.backlogs}
    counts = _by_queue(found)
    pauses = await dashboard.client.pauses_async()
    paused = {p.name: p for p in pauses if p.kind is PauseKind.QUEUE}
    names = sorted(set(backlogs) | set(counts) | set(paused))
    rows = [
        {
            "queue": name,
            "backlog": backlogs.get(name),
            "counts": counts.get(name, Counter()),
            "pause": paused.get(name),
        }
        for name in names
    ]
    paused_tasks = [p for p in pauses if p.kind is PauseKind.TASK]
    return dashboard.render(
        request,
        "queues.html",
        {
            "page": "queues",
            "now": now,
            "rows": rows,
            "paused_tasks": paused_tasks,
            "queue_paused": {name: name in paused for name in names},
        },
    )


async def tasks(request: Request) -> Response:
    """Tasks newest first, filtered, a page at a time (``before``: keyset)."""
    dashboard = dashboard_of(request)
    jump = request.query_params.get("id", "").strip()
    if jump:
        task_id = _integer(request, "id")
        return local_redirect(request.url_for("task", task_id=task_id))
    try:
        task_filter = TaskFilter(
            state=_state(request),
            name=_text(request, "name"),
            queue=_text(request, "queue"),
            limit=dashboard.page_size,
            before=_integer(request, "before"),
            parent=_integer(request, "parent"),
        )
    except ConfigurationError as exc:
        raise HTTPException(400, str(exc)) from None
    shown, next_before = await _page(request, task_filter)
    now = await dashboard.client.now_async()
    filters = {
        k: v
        for k, v in {
            "state": task_filter.state.value if task_filter.state else None,
            "name": task_filter.name,
            "queue": task_filter.queue,
            "parent": task_filter.parent,
        }.items()
        if v
    }
    return dashboard.render(
        request,
        "tasks.html",
        {
            "page": "tasks",
            "now": now,
            "tasks": shown,
            "filters": filters,
            "states": list(TaskState),
            "before": task_filter.before,
            "next_before": next_before,
        },
    )


async def task(request: Request) -> Response:
    """One task: its payload, result, attempts, explanation, inbox, parent,
    (a coroutine's) newest children, and the tasks it depends on, counted by
    state (the first ``DEPENDENCIES_SHOWN`` listed), how many depend on it,
    and a link to its graph when it has either."""
    dashboard = dashboard_of(request)
    task_id: int = request.path_params["task_id"]
    found = await dashboard.client.get_async(task_id)
    if found is None:
        raise HTTPException(404, f"No task has id {task_id}: it never existed, or was deleted.")
    explanation = await dashboard.client.explain_async(task_id)
    messages = await dashboard.client.inbox_async(task_id) if found.inbox else []
    children: list[TaskSummary] = []
    if found.inbox:
        children = await dashboard.client.list_summaries_async(
            parent=task_id, limit=CHILDREN_SHOWN + 1
        )
    dependencies: list[DependencyRecord] = []
    if found.waiting_for is not None:
        dependencies = await dashboard.client.dependencies_async(task_id)
    edges = await dashboard.client.edges_async([task_id])
    dependents = len({e.dependent for e in edges if e.dependency == task_id})
    by_state = Counter(d.state.value if d.state is not None else "deleted" for d in dependencies)
    now = await dashboard.client.now_async()
    return dashboard.render(
        request,
        "task.html",
        {
            "page": "tasks",
            "now": now,
            "task": found,
            "payload": format.pretty(found.payload),
            "result": format.pretty(found.result) if found.result is not None else None,
            "explanation": explanation,
            "facts": format.pretty(explanation.facts),
            "messages": [(m, format.pretty(m.body)) for m in messages],
            "children": children[:CHILDREN_SHOWN],
            "more_children": len(children) > CHILDREN_SHOWN,
            "dependencies": dependencies[:DEPENDENCIES_SHOWN],
            "dependency_count": len(dependencies),
            "dependency_states": sorted(by_state.items()),
            "dependents": dependents,
            "actions": _actions(found),
        },
    )


async def task_graph(request: Request) -> Response:
    """The graph of dependencies around one task (at most
    :data:`~conveyor.graph.DEFAULT_LIMIT` tasks read): its tasks counted by
    state, and its drawing (:mod:`conveyor.dashboard.drawing`), with the
    actions on its tasks not ended and its failed ones."""
    dashboard = dashboard_of(request)
    task_id: int = request.path_params["task_id"]
    try:
        found = await dashboard.client.graph_async(task_id)
    except TaskNotFoundError:
        raise HTTPException(
            404, f"No task has id {task_id}: it never existed, or was deleted."
        ) from None
    now = await dashboard.client.now_async()
    return dashboard.render(
        request,
        "task_graph.html",
        {
            "page": "tasks",
            "now": now,
            "graph": found,
            "drawing": drawing.draw(found),
            "limit": DEFAULT_LIMIT,
            "not_ended": len(found.ids(*CANCELLABLE)),
            "failed": len(found.ids(TaskState.FAILED)),
        },
    )


def _actions(found: Task) -> list[tuple[str, str, str]]:
    """The actions valid for a task now: (action, label, style)."""
    shown = []
    if found.state in (TaskState.FAILED, TaskState.CANCELLED):
        shown.append(("retry", "Retry", "primary"))
    if found.state is TaskState.PENDING:
        shown.append(("run-now", "Run now", "primary"))
    if not found.state.is_terminal and not found.cancel_requested:
        shown.append(("cancel", "Cancel", "warning"))
    if found.state is not TaskState.IN_PROGRESS:
        shown.append(("delete", "Delete", "danger"))
    return shown


async def failed(request: Request) -> Response:
    """Failed tasks newest first, to retry some or all."""
    dashboard = dashboard_of(request)
    try:
        task_filter = TaskFilter(
            state=TaskState.FAILED,
            limit=dashboard.page_size,
            before=_integer(request, "before"),
        )
    except ConfigurationError as exc:
        raise HTTPException(400, str(exc)) from None
    shown, next_before = await _page(request, task_filter)
    now = await dashboard.client.now_async()
    last_errors = {t.id: t.last_error for t in shown if t.last_error is not None}
    return dashboard.render(
        request,
        "failed.html",
        {
            "page": "failed",
            "now": now,
            "tasks": shown,
            "last_errors": last_errors,
            "before": task_filter.before,
            "next_before": next_before,
        },
    )


async def workers(request: Request) -> Response:
    """Live workers: queues and names served, last heartbeat, running attempts."""
    dashboard = dashboard_of(request)
    now = await dashboard.client.now_async()
    every = await dashboard.client.list_workers_async()
    live = [w for w in every if w.live(now)]
    by_worker = Counter(await dashboard.client.running_by_worker_async())
    return dashboard.render(
        request,
        "workers.html",
        {
            "page": "workers",
            "now": now,
            "workers": live,
            "gone": len(every) - len(live),
            "running": by_worker,
        },
    )


async def schedules(request: Request) -> Response:
    """Stored schedules with their next and last slot."""
    dashboard = dashboard_of(request)
    now, rows = await dashboard.client.stored_schedules_async()
    shown = [(row, next_stored_slot(row, now)) for row in rows]
    return dashboard.render(
        request, "schedules.html", {"page": "schedules", "now": now, "schedules": shown}
    )


async def metrics(request: Request) -> Response:
    """The store's Prometheus gauges (:class:`~conveyor.metrics.StoreMetrics`),
    read from the store at each scrape."""
    dashboard = dashboard_of(request)
    try:
        from prometheus_client import CONTENT_TYPE_LATEST, generate_latest

        from conveyor.metrics import StoreMetrics
    except ImportError:
        raise HTTPException(
            501, "install the metrics extra: pip install 'conveyor[metrics]'"
        ) from None
    if dashboard.metrics is None:
        dashboard.metrics = StoreMetrics()
    store_metrics: StoreMetrics = dashboard.metrics
    await store_metrics.refresh(dashboard.client)
    return Response(generate_latest(store_metrics.registry), media_type=CONTENT_TYPE_LATEST)
