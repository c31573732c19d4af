"""The dashboard's pages (GET): each reads the store through the app's
async API and renders one template. A bad filter answers 400, an unknown
task 404, never a server error."""

from __future__ import annotations

import dataclasses
from collections import Counter
from collections.abc import Mapping
from datetime import timedelta
from typing import TYPE_CHECKING

from starlette.exceptions import HTTPException
from starlette.requests import Request
from starlette.responses import Response

from conveyor.dashboard import format
from conveyor.dashboard.hosts import local_redirect
from conveyor.errors import ConfigurationError
from conveyor.model import (
    MAX_TASK_ID_DIGITS,
    PauseKind,
    Task,
    TaskState,
    check_name,
    parse_task_id,
)
from conveyor.overview import Overview, read_overview, store_now
from conveyor.records import TaskFilter, TaskSummary
from conveyor.schedules import next_stored_slot

if TYPE_CHECKING:
    from conveyor.dashboard.app import Dashboard

CHILDREN_SHOWN = 20
"""A coroutine task's newest children shown on its page (the rest: a link)."""
ACTIVITY_BUCKET = 60
"""Seconds per bar of the overview's chart."""
ACTIVITY_BUCKETS = 60
"""Bars of the overview's chart: the last hour, a minute each."""
NOTICES = {
    "retried": "Task {id} is pending again, with a fresh attempt budget.",
    "cancelled": "Task {id} is cancelled.",
    "cancel_requested": "Task {id}: cancel requested; its worker stops it within a second or so.",
    "deleted": "Task {id} is deleted, with its attempt log and messages.",
    "run_now": "Task {id} is due now.",
    "paused": "Queue {queue} is paused: workers start none of its tasks until it is resumed.",
    "resumed": "Queue {queue} is resumed.",
    "retried_many": "{count} failed task(s) are pending again.",
}


def dashboard_of(request: Request) -> Dashboard:
    found: Dashboard = request.app.state.dashboard
    return found


def notice_of(request: Request, queue_paused: Mapping[str, bool]) -> str | None:
    """The sentence for an action's ``?notice=`` (only our own sentences,
    filled only with values an action could have given: a task id, a
    count, a queue named by the rule of names that is paused (``paused``)
    or not (``resumed``) as ``queue_paused``, the queues page's, says);
    anything else shows no notice."""
    q = request.query_params
    name = q.get("notice", "")
    template = NOTICES.get(name)
    if template is None:
        return None
    fields: dict[str, str] = {}
    try:
        if "{id}" in template:
            fields["id"] = str(parse_task_id(q.get("task", "")))
        if "{queue}" in template:
            fields["queue"] = check_name("a queue", q.get("queue", ""))
    except ConfigurationError:
        return None
    if "{queue}" in template and queue_paused.get(fields["queue"]) is not (name == "paused"):
        return None
    if "{count}" in template:
        count = q.get("n", "")
        if not (count.isascii() and count.isdigit() and len(count) <= MAX_TASK_ID_DIGITS):
            return None
        fields["count"] = count
    return template.format(**fields)


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
    dashboard = dashboard_of(request)
    inspector = await dashboard.inspector()
    found = await inspector.list_summaries(
        dataclasses.replace(task_filter, limit=task_filter.limit + 1)
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
    backend = await dashboard.app.backend()
    inspector = await dashboard.inspector()
    found = await read_overview(backend, inspector)
    now = found.now
    since = now.replace(second=0, microsecond=0) - timedelta(
        seconds=ACTIVITY_BUCKET * (ACTIVITY_BUCKETS - 1)
    )
    buckets = await inspector.activity(since, ACTIVITY_BUCKET)
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
    found = await read_overview(await dashboard.app.backend(), await dashboard.inspector())
    now = found.now
    backlogs = {b.queue: b for b in found.backlogs}
    counts = _by_queue(found)
    pauses = await dashboard.app.pauses_async()
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
    now = await store_now(await dashboard.app.backend())
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
    """One task: its payload, result, attempts, explanation, inbox, parent
    and (a coroutine's) newest children."""
    dashboard = dashboard_of(request)
    task_id: int = request.path_params["task_id"]
    found = await dashboard.app.get_async(task_id)
    if found is None:
        raise HTTPException(404, f"No task has id {task_id}: it never existed, or was deleted.")
    explanation = await dashboard.app.explain_async(task_id)
    messages = await dashboard.app.inbox_async(task_id) if found.inbox else []
    children: list[TaskSummary] = []
    if found.inbox:
        inspector = await dashboard.inspector()
        children = await inspector.list_summaries(
            TaskFilter(parent=task_id, limit=CHILDREN_SHOWN + 1)
        )
    now = await store_now(await dashboard.app.backend())
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
            "actions": _actions(found),
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
    now = await store_now(await dashboard.app.backend())
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
    inspector = await dashboard.inspector()
    now = await store_now(await dashboard.app.backend())
    every = await inspector.list_workers()
    live = [w for w in every if w.live(now)]
    by_worker = Counter(await inspector.running_by_worker())
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
    now, rows = await dashboard.app.stored_schedules_async()
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
    await store_metrics.refresh(await dashboard.app.backend(), await dashboard.inspector())
    return Response(generate_latest(store_metrics.registry), media_type=CONTENT_TYPE_LATEST)
