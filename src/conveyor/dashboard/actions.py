"""The dashboard's actions (POST): retry, cancel, run now and delete a
task; pause and resume a queue; retry failed tasks in bulk; cancel the
tasks not ended of a task's graph, or retry its failed ones.

Each reaches here only from the dashboard's own origin, signed in, with a
bounded body (:mod:`conveyor.dashboard.guard`). It is refused with 403
before it reads its form on a read-only dashboard, and with 403 when its
CSRF token is not that of the request's identity; then it calls the
client's async API and redirects (303, to a path: never a host) to the page that
shows the change.
A move the task's state forbids answers 409 with the store's reason.
"""

from __future__ import annotations

from starlette.datastructures import FormData
from starlette.exceptions import HTTPException
from starlette.requests import Request
from starlette.responses import Response

from conveyor.controls import CANCELLABLE
from conveyor.dashboard.hosts import local_redirect
from conveyor.dashboard.security import CSRF_FIELD, IDENTITY
from conveyor.dashboard.state import dashboard_of
from conveyor.errors import ConfigurationError, InvalidTransitionError, TaskNotFoundError
from conveyor.model import TaskState, parse_task_id

MOST_SELECTED = 1000
"""The most task ids one "Retry selected" takes."""


async def checked_form(request: Request) -> FormData:
    """The request's form, once the dashboard allows actions and the CSRF
    token matches; else 403."""
    dashboard = dashboard_of(request)
    if dashboard.read_only:
        raise HTTPException(403, "This dashboard is read-only: it takes no action.")
    form = await request.form()
    if not dashboard.csrf.accepts(request.scope.get(IDENTITY), form.get(CSRF_FIELD)):
        raise HTTPException(
            403, "The form's security token is missing or stale: reload the page and try again."
        )
    return form


def _back(request: Request, route: str, **params: str) -> Response:
    return local_redirect(request.url_for(route).include_query_params(**params))


async def on_task(request: Request) -> Response:
    """``retry``, ``cancel``, ``run-now`` or ``delete`` one task."""
    await checked_form(request)
    client = dashboard_of(request).client
    task_id: int = request.path_params["task_id"]
    action = request.path_params["action"]
    try:
        if action == "retry":
            await client.retry_async(task_id)
            notice = "retried"
        elif action == "cancel":
            state = await client.cancel_async(task_id)
            notice = "cancelled" if state is TaskState.CANCELLED else "cancel_requested"
        elif action == "run-now":
            await client.run_now_async(task_id)
            notice = "run_now"
        elif action == "delete":
            await client.delete_async(task_id)
            return _back(request, "tasks", notice="deleted", task=str(task_id))
        else:
            raise HTTPException(404, f"No action {action!r}: retry, cancel, run-now or delete.")
    except TaskNotFoundError:
        raise HTTPException(404, f"No task has id {task_id}.") from None
    except InvalidTransitionError as exc:
        raise HTTPException(409, f"Task {task_id}: {exc}") from None
    target = request.url_for("task", task_id=task_id).include_query_params(
        notice=notice, task=str(task_id)
    )
    return local_redirect(target)


GRAPH_ACTIONS = ("cancel", "retry-failed")
"""The actions on a task's graph."""


async def on_graph(request: Request) -> Response:
    """``cancel`` every task not ended of a task's graph, or ``retry-failed``
    its failed ones: the graph read again now (so the tasks acted on are
    those of the graph as it is, at most
    :data:`~conveyor.graph.DEFAULT_LIMIT`), then the bulk action among their
    ids, :data:`MOST_SELECTED` a call, each batch reading each task's state
    in the same write as the action."""
    await checked_form(request)
    client = dashboard_of(request).client
    task_id: int = request.path_params["task_id"]
    action = request.path_params["action"]
    if action not in GRAPH_ACTIONS:
        raise HTTPException(404, f"No action {action!r} on a graph: cancel or retry-failed.")
    try:
        graph = await client.graph_async(task_id)
    except TaskNotFoundError:
        raise HTTPException(404, f"No task has id {task_id}.") from None
    if action == "cancel":
        ids, act, notice = graph.ids(*CANCELLABLE), client.cancel_many_async, "graph_cancelled"
    else:
        ids, act, notice = graph.ids(TaskState.FAILED), client.retry_many_async, "graph_retried"
    done: list[int] = []
    for start in range(0, len(ids), MOST_SELECTED):
        done += await act(ids=ids[start : start + MOST_SELECTED])
    target = request.url_for("task_graph", task_id=task_id).include_query_params(
        notice=notice, n=str(len(done))
    )
    return local_redirect(target)


def _queue(form: FormData) -> str:
    queue = form.get("queue")
    if not isinstance(queue, str) or not queue.strip():
        raise HTTPException(400, "Name the queue to pause or resume.")
    return queue


async def pause(request: Request) -> Response:
    """Pause one queue (the ``queue`` field)."""
    return await _pause_or_resume(request, paused=True)


async def resume(request: Request) -> Response:
    """Resume one queue (the ``queue`` field)."""
    return await _pause_or_resume(request, paused=False)


async def _pause_or_resume(request: Request, *, paused: bool) -> Response:
    queue = _queue(await checked_form(request))
    client = dashboard_of(request).client
    try:
        await (client.pause_async if paused else client.resume_async)(queue=queue)
    except ConfigurationError as exc:
        raise HTTPException(400, str(exc)) from None
    return _back(request, "queues", notice="paused" if paused else "resumed", queue=queue)


async def retry_selected(request: Request) -> Response:
    """Retry the failed tasks ticked (``task`` fields), in batches in the
    store (``retry_many`` among their ids) that read each task's state in
    the same write: one that is no longer failed (retried, then cancelled,
    by someone else since the page was drawn) is passed by."""
    form = await checked_form(request)
    chosen = form.getlist("task")
    if len(chosen) > MOST_SELECTED:
        raise HTTPException(400, f"Select at most {MOST_SELECTED} tasks at once.")
    try:
        ids = [parse_task_id(value, "a ticked task") for value in chosen]
    except ConfigurationError as exc:
        raise HTTPException(400, str(exc)) from None
    done = await dashboard_of(request).client.retry_many_async(ids=ids)
    return _back(request, "failed", notice="retried_many", n=str(len(done)))


async def retry_all(request: Request) -> Response:
    """Retry every failed task (in batches in the store: ``retry_many``)."""
    await checked_form(request)
    done = await dashboard_of(request).client.retry_many_async()
    return _back(request, "failed", notice="retried_many", n=str(len(done)))
