"""The dashboard as an ASGI application: :func:`create_app`.

One Starlette application per :class:`conveyor.App`: server-rendered pages
(Jinja2, autoescaped), one stylesheet, no script but a line that ticks the
checkboxes of the failed tasks, every asset in the package (no network).
Every link and form is built from the request (``url_for``), so the
application works mounted under any prefix: ``Mount("/conveyor", app=...)``
in Starlette or FastAPI, a path in a Django ASGI router.
"""

from __future__ import annotations

import inspect
import secrets
from collections.abc import Awaitable, Callable
from dataclasses import dataclass, field
from typing import Any

import jinja2
from starlette.applications import Starlette
from starlette.exceptions import HTTPException
from starlette.requests import Request
from starlette.responses import RedirectResponse, Response
from starlette.routing import Mount, Route
from starlette.staticfiles import StaticFiles
from starlette.templating import Jinja2Templates
from starlette.types import ASGIApp, Receive, Scope, Send

from conveyor.app import App
from conveyor.backends.protocol import Inspector, inspector_of
from conveyor.dashboard import actions, format, pages
from conveyor.dashboard.security import (
    CSRF_COOKIE,
    TOKEN_COOKIE,
    Auth,
    Csrf,
    without_token,
)
from conveyor.errors import (
    BackendError,
    BackendUnavailableError,
    ConfigurationError,
    StoreNotReadyError,
)

DEFAULT_PAGE_SIZE = 50
NAV = (
    ("overview", "Overview"),
    ("queues", "Queues"),
    ("tasks", "Tasks"),
    ("failed", "Failed"),
    ("workers", "Workers"),
    ("schedules", "Schedules"),
)


@dataclass
class Dashboard:
    """What every page of one dashboard shares (``request.app.state.dashboard``)."""

    app: App
    templates: Jinja2Templates
    csrf: Csrf
    read_only: bool
    page_size: int
    title: str
    metrics: Any = None
    extra: dict[str, Any] = field(default_factory=dict)

    async def inspector(self) -> Inspector:
        backend = await self.app.backend()
        found = inspector_of(backend)
        if found is None:
            raise HTTPException(501, f"the {type(backend).__name__} cannot list or count tasks")
        return found

    def render(
        self, request: Request, template: str, context: dict[str, Any], status: int = 200
    ) -> Response:
        """A page: the template with the dashboard's own context, and a CSRF
        cookie when the request had no valid one."""
        token = self.csrf.token_of(request)
        cookie = None
        if token is None:
            token, cookie = self.csrf.issue()
        page = {
            "dashboard": self,
            "nav": NAV,
            "csrf_token": token,
            "read_only": self.read_only,
            "fmt": format,
            "notice": pages.notice_of(request),
            **context,
        }
        response = self.templates.TemplateResponse(request, template, page, status_code=status)
        if cookie is not None:
            _set_cookie(response, request, CSRF_COOKIE, cookie)
        return response


def _set_cookie(response: Response, request: Request, name: str, value: str) -> None:
    """A cookie of this dashboard: its mount's path, HttpOnly, SameSite=Strict,
    Secure over HTTPS."""
    response.set_cookie(
        name,
        value,
        path=(request.scope.get("root_path") or "") + "/",
        httponly=True,
        samesite="strict",
        secure=request.url.scheme == "https",
    )


class _Guard:
    """Asks the auth hook about every request but the stylesheet: 401 when
    it refuses (with its challenge header, if it has one); a first visit
    with a right ``?token=`` sets the token cookie and drops the token from
    the address."""

    def __init__(self, app: ASGIApp, auth: Auth | None) -> None:
        self.app = app
        self.auth = auth

    async def __call__(self, scope: Scope, receive: Receive, send: Send) -> None:
        if scope["type"] != "http" or self.auth is None:
            await self.app(scope, receive, send)
            return
        request = Request(scope, receive)
        root, path = scope.get("root_path", ""), scope["path"]
        if (path[len(root) :] if path.startswith(root) else path).startswith("/static/"):
            await self.app(scope, receive, send)
            return
        allowed = self.auth(request)
        if inspect.isawaitable(allowed):
            allowed = await allowed
        if not allowed:
            response = await _refused(request, self.auth)
            await response(scope, receive, send)
            return
        login = getattr(self.auth, "login_cookie", None)
        cookie = login(request) if login is not None else None
        if cookie is not None and request.method in ("GET", "HEAD"):
            query = without_token(request.url.query)
            target = request.url.replace(query=query)
            redirect = RedirectResponse(str(target), status_code=303)
            _set_cookie(redirect, request, TOKEN_COOKIE, cookie)
            await redirect(scope, receive, send)
            return
        await self.app(scope, receive, send)


async def _refused(request: Request, auth: Auth) -> Response:
    dashboard: Dashboard = request.app.state.dashboard
    response = dashboard.render(
        request,
        "error.html",
        {"status": 401, "message": "Sign in to see this dashboard.", "signed_out": True},
        status=401,
    )
    challenge = getattr(auth, "challenge", None)
    if challenge is not None:
        response.headers[challenge[0]] = challenge[1]
    return response


async def _http_error(request: Request, exc: Exception) -> Response:
    assert isinstance(exc, HTTPException)
    dashboard: Dashboard = request.app.state.dashboard
    return dashboard.render(
        request, "error.html", {"status": exc.status_code, "message": exc.detail}, exc.status_code
    )


async def _store_error(request: Request, exc: Exception) -> Response:
    """A store that refused (a role without the right for an action: see
    docs/operations.md), is away or is not there: a page that says so in
    one line (the first of the error: a server's DETAIL may echo a row),
    503 when it is worth trying again, else 500."""
    assert isinstance(exc, BackendError | StoreNotReadyError)
    dashboard: Dashboard = request.app.state.dashboard
    status = 503 if isinstance(exc, BackendUnavailableError | StoreNotReadyError) else 500
    message = (str(exc).strip().splitlines() or [type(exc).__name__])[0]
    return dashboard.render(request, "error.html", {"status": status, "message": message}, status)


def create_app(
    app: App,
    *,
    auth: Auth | None = None,
    read_only: bool = False,
    secret: bytes | str | None = None,
    page_size: int = DEFAULT_PAGE_SIZE,
    title: str = "conveyor",
) -> Starlette:
    """The dashboard of ``app``'s store, as a Starlette (ASGI) application.

    ``auth`` is asked about every request (``auth(request)``: a bool, or
    an awaitable of one): :func:`~conveyor.dashboard.token_auth`,
    :func:`~conveyor.dashboard.basic_auth`, or the host application's own;
    None lets every request in (for a dashboard mounted behind the host's
    own authentication, or bound to 127.0.0.1). ``read_only`` shows no
    action and refuses every POST with 403. ``secret`` signs the CSRF
    cookies (default: random per process, so a restart asks forms to be
    reloaded; pass one to share it across processes). ``page_size`` is the
    number of tasks a list shows per page. Raises ConfigurationError for a
    ``page_size`` below 1.
    """
    if isinstance(page_size, bool) or not isinstance(page_size, int) or page_size < 1:
        raise ConfigurationError("page_size must be an integer of 1 or more")
    key = secret.encode() if isinstance(secret, str) else secret or secrets.token_bytes(32)
    environment = jinja2.Environment(
        loader=jinja2.PackageLoader("conveyor.dashboard", "templates"),
        autoescape=True,
        undefined=jinja2.StrictUndefined,
        trim_blocks=True,
        lstrip_blocks=True,
    )
    templates = Jinja2Templates(env=environment)
    routes = [
        Route("/", pages.overview, name="overview"),
        Route("/queues", pages.queues, name="queues"),
        Route("/queues/pause", actions.pause, methods=["POST"], name="pause"),
        Route("/queues/resume", actions.resume, methods=["POST"], name="resume"),
        Route("/tasks", pages.tasks, name="tasks"),
        Route("/tasks/{task_id:int}", pages.task, name="task"),
        Route("/tasks/{task_id:int}/{action}", actions.on_task, methods=["POST"], name="act"),
        Route("/failed", pages.failed, name="failed"),
        Route("/failed/retry", actions.retry_selected, methods=["POST"], name="retry_selected"),
        Route("/failed/retry-all", actions.retry_all, methods=["POST"], name="retry_all"),
        Route("/workers", pages.workers, name="workers"),
        Route("/schedules", pages.schedules, name="schedules"),
        Route("/metrics", pages.metrics, name="metrics"),
        Mount("/static", StaticFiles(packages=[("conveyor.dashboard", "static")]), name="static"),
    ]
    handlers: dict[Any, Callable[[Request, Exception], Awaitable[Response]]] = {
        HTTPException: _http_error,
        BackendError: _store_error,
        StoreNotReadyError: _store_error,
    }
    web = Starlette(routes=routes, exception_handlers=handlers)
    web.state.dashboard = Dashboard(
        app=app,
        templates=templates,
        csrf=Csrf(key),
        read_only=read_only,
        page_size=page_size,
        title=title,
    )
    web.add_middleware(_Guard, auth=auth)
    return web
