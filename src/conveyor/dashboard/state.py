"""What every page and action of one dashboard shares: :class:`Dashboard`
(``request.app.state.dashboard``), the client it reads and acts through,
its templates and CSRF tokens; and the one-line notices an action leaves
for the page it redirects to.

The pages (:mod:`conveyor.dashboard.pages`), the actions
(:mod:`conveyor.dashboard.actions`) and the gate
(:mod:`conveyor.dashboard.guard`) import this module, and
:mod:`conveyor.dashboard.app` wires them: none of them imports another's
module back.
"""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass, field
from typing import Any

from starlette.requests import Request
from starlette.responses import Response
from starlette.templating import Jinja2Templates

from conveyor.client import Client
from conveyor.dashboard import format
from conveyor.dashboard.security import IDENTITY, Csrf
from conveyor.errors import ConfigurationError
from conveyor.model import MAX_TASK_ID_DIGITS, check_name, parse_task_id

NAV = (
    ("overview", "Overview"),
    ("queues", "Queues"),
    ("tasks", "Tasks"),
    ("failed", "Failed"),
    ("workers", "Workers"),
    ("schedules", "Schedules"),
)

NOTICES = {
    "retried": "Task {id} is pending again, with a fresh attempt budget.",
    "cancelled": "Task {id} is cancelled.",
    "cancel_requested": "Task {id}: cancel requested; its worker stops it within a second or so.",
    "deleted": "Task {id} is deleted, with its attempt log and messages.",
    "run_now": "Task {id} is due now.",
    "paused": "Queue {queue} is paused: workers start none of its tasks until it is resumed.",
    "resumed": "Queue {queue} is resumed.",
    "retried_many": "{count} failed task(s) are pending again.",
    "graph_cancelled": "{count} task(s) of the graph are cancelled (a running one: its cancel "
    "is requested).",
    "graph_retried": "{count} failed task(s) of the graph are pending again.",
}


@dataclass
class Dashboard:
    """What every page of one dashboard shares (``request.app.state.dashboard``)."""

    client: Client
    templates: Jinja2Templates
    csrf: Csrf
    read_only: bool
    page_size: int
    title: str
    metrics: Any = None
    extra: dict[str, Any] = field(default_factory=dict)

    def render(
        self, request: Request, template: str, context: dict[str, Any], status: int = 200
    ) -> Response:
        """A page: the template with the dashboard's own context; its forms
        carry the CSRF token of the request's identity (none when signed out)."""
        identity = request.scope.get(IDENTITY)
        page = {
            "dashboard": self,
            "nav": NAV,
            "csrf_token": self.csrf.token_for(identity) if identity else "",
            "read_only": self.read_only,
            "fmt": format,
            "notice": notice_of(request, context.get("queue_paused", {})),
            **context,
        }
        return self.templates.TemplateResponse(request, template, page, status_code=status)


def dashboard_of(request: Request) -> Dashboard:
    """The dashboard the request reached."""
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
