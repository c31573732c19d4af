"""The dashboard as an ASGI application: :func:`create_app`.

One Starlette application per :class:`conveyor.App`: server-rendered pages
(Jinja2, autoescaped), one stylesheet, one small script (the box that ticks
every failed task), every asset in the package (no network), so a strict
Content-Security-Policy holds (no inline script or style). Every request
passes :class:`~conveyor.dashboard.guard.Guard` first.
Every link and form is built from the request (``url_for``), so the
application works mounted under any prefix: ``Mount("/conveyor", app=...)``
in Starlette or FastAPI, a path in a Django ASGI router.
"""

from __future__ import annotations

import secrets
from collections.abc import Awaitable, Callable, Iterable
from typing import Any

import jinja2
from starlette.applications import Starlette
from starlette.exceptions import HTTPException
from starlette.requests import Request
from starlette.responses import PlainTextResponse, Response
from starlette.routing import Mount, Route
from starlette.staticfiles import StaticFiles
from starlette.templating import Jinja2Templates

from conveyor.client import Client
from conveyor.dashboard import actions, pages
from conveyor.dashboard.guard import Guard, secure_headers
from conveyor.dashboard.hosts import LOCAL_HOSTS, checked_hosts
from conveyor.dashboard.security import Auth, Csrf, Signer, TokenAuth
from conveyor.dashboard.state import Dashboard
from conveyor.errors import (
    BackendError,
    BackendUnavailableError,
    ConfigurationError,
    StoreNotReadyError,
)

DEFAULT_PAGE_SIZE = 50


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
    503 when it is worth trying again, else 500. No traceback."""
    assert isinstance(exc, BackendError | StoreNotReadyError)
    dashboard: Dashboard = request.app.state.dashboard
    status = 503 if isinstance(exc, BackendUnavailableError | StoreNotReadyError) else 500
    message = (str(exc).strip().splitlines() or [type(exc).__name__])[0]
    return dashboard.render(request, "error.html", {"status": status, "message": message}, status)


async def _unexpected(request: Request, exc: Exception) -> Response:
    """Any other error (a driver's own exception the store did not classify,
    a connection lost while a page was drawn): a page that names only its
    kind, 503 for a lost connection or a timeout, else 500; the server's
    log has the traceback (the exception goes on to the server)."""
    status = 503 if isinstance(exc, ConnectionError | TimeoutError) else 500
    message = f"The dashboard could not answer ({type(exc).__name__}): its log says why."
    try:
        dashboard: Dashboard = request.app.state.dashboard
        response = dashboard.render(
            request,
            "error.html",
            {"status": status, "message": message, "signed_out": True},
            status,
        )
    except Exception:  # the page itself failed: plain text then
        response = PlainTextResponse(message, status)
    secure_headers(response.headers, cacheable=False)
    return response


def _allowed_hosts(auth: Auth | None, allowed_hosts: Iterable[str] | None) -> frozenset[str] | None:
    """The Host allow-list of create_app (None: no check)."""
    if allowed_hosts is None:
        return None if auth is not None else frozenset(LOCAL_HOSTS)
    return checked_hosts(allowed_hosts)


def create_app(
    app: Client,
    *,
    auth: Auth | None = None,
    read_only: bool = False,
    secret: bytes | str | None = None,
    page_size: int = DEFAULT_PAGE_SIZE,
    title: str = "conveyor",
    allowed_hosts: Iterable[str] | None = None,
) -> Starlette:
    """The dashboard of ``app``'s store, as a Starlette (ASGI) application.

    ``auth`` is asked about every request (``auth(request)``: a bool, or
    an awaitable of one): :func:`~conveyor.dashboard.token_auth`,
    :func:`~conveyor.dashboard.basic_auth`, or the host application's own
    (which may also have an ``identity(request)`` method naming who signed
    in, to bind the CSRF tokens to: see :mod:`conveyor.dashboard.security`);
    None lets every request in (for a dashboard mounted behind the host's
    own authentication, or on this machine). ``read_only`` shows no action
    and refuses every POST with 403. ``secret`` signs the login and session
    cookies and derives the CSRF tokens (default: random per process, so a
    restart asks to sign in again and forms to be reloaded; pass one to
    share it across processes). ``page_size`` is the number of tasks a list
    shows per page. ``allowed_hosts`` are the host names (no port) the
    dashboard answers to, any other ``Host`` getting 400 (against DNS
    rebinding); ``["*"]`` turns the check off. By default (None) there is no
    check when ``auth`` is given (a rebound page carries no credential), and
    with ``auth=None`` only this machine's names are answered
    (:data:`~conveyor.dashboard.hosts.LOCAL_HOSTS`): a dashboard mounted
    with no auth under a real name must list it. Raises ConfigurationError
    for a ``page_size`` below 1, or a bad host name.
    """
    if isinstance(page_size, bool) or not isinstance(page_size, int) or page_size < 1:
        raise ConfigurationError("page_size must be an integer of 1 or more")
    hosts = _allowed_hosts(auth, allowed_hosts)
    key = secret.encode() if isinstance(secret, str) else secret or secrets.token_bytes(32)
    if isinstance(auth, TokenAuth):
        auth = auth.with_secret(key)
    signer = Signer(key)
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
        Route("/tasks/{task_id:int}/graph", pages.task_graph, name="task_graph"),
        Route(
            "/tasks/{task_id:int}/graph/{action}",
            actions.on_graph,
            methods=["POST"],
            name="graph_act",
        ),
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
        Exception: _unexpected,
    }
    web = Starlette(routes=routes, exception_handlers=handlers)
    web.state.dashboard = Dashboard(
        client=app,
        templates=templates,
        csrf=Csrf(signer),
        read_only=read_only,
        page_size=page_size,
        title=title,
    )
    web.add_middleware(Guard, auth=auth, allowed_hosts=hosts, signer=signer)
    return web
