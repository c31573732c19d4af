"""The gate every request of the dashboard passes, in this order:

1. its ``Host`` must be allowed (:mod:`conveyor.dashboard.hosts`), else 400
   and nothing else;
2. a POST (any method but GET and HEAD) must come from the dashboard's own
   origin, else 403 before its body is read;
3. the auth hook must let it in (all but the static files), else 401 with
   no cookie; a first visit with a right ``?token=`` sets the login cookie
   and redirects to the same address without it;
4. it is given its identity (:mod:`conveyor.dashboard.security`), and a
   session cookie if it needs one;
5. a text query parameter with a NUL or a lone surrogate is refused (400);
   a POST's body is bounded: multipart is refused (415), a body over
   :data:`MOST_BODY` bytes answers 413 (at once when its length says so,
   else when the stream crosses the bound).

Every response carries the security headers (:data:`SECURITY_HEADERS`), and
every one but a static file ``Cache-Control: no-store``.
"""

from __future__ import annotations

import inspect
import secrets

from starlette.datastructures import MutableHeaders
from starlette.exceptions import HTTPException
from starlette.requests import Request
from starlette.responses import PlainTextResponse, Response
from starlette.types import ASGIApp, Message, Receive, Scope, Send

from conveyor.dashboard.hosts import host_allowed, local_redirect, same_origin
from conveyor.dashboard.security import (
    IDENTITY,
    SESSION_COOKIE,
    TOKEN_COOKIE,
    Auth,
    Signer,
    cookie_name,
    set_cookie,
    without_token,
)
from conveyor.dashboard.state import Dashboard

MOST_BODY = 64 * 1024
"""The most bytes a POST's body may hold (the dashboard's forms take a few
hundred; "Retry selected" of 1000 tasks some 20 KiB)."""
SECURITY_HEADERS = {
    "content-security-policy": (
        "default-src 'none'; style-src 'self'; script-src 'self'; img-src 'self'; "
        "form-action 'self'; base-uri 'none'; frame-ancestors 'none'"
    ),
    "x-frame-options": "DENY",
    "x-content-type-options": "nosniff",
    "referrer-policy": "same-origin",
}
SAFE_METHODS = ("GET", "HEAD")


def secure_headers(headers: MutableHeaders, *, cacheable: bool) -> None:
    """Set the security headers, and ``Cache-Control: no-store`` unless ``cacheable``."""
    for name, value in SECURITY_HEADERS.items():
        headers[name] = value
    if not cacheable:
        headers["cache-control"] = "no-store"


def _static(scope: Scope) -> bool:
    root, path = scope.get("root_path", ""), scope["path"]
    return str(path[len(root) :] if path.startswith(root) else path).startswith("/static/")


def _bad_text(request: Request) -> str | None:
    """The first query parameter holding a NUL or a lone surrogate."""
    for key, value in request.query_params.multi_items():
        if any(c == "\x00" or "\ud800" <= c <= "\udfff" for c in key + value):
            return key
    return None


class Guard:
    """The ASGI middleware of the module docstring."""

    def __init__(
        self, app: ASGIApp, auth: Auth | None, allowed_hosts: frozenset[str] | None, signer: Signer
    ) -> None:
        self.app = app
        self.auth = auth
        self.allowed_hosts = allowed_hosts
        self.signer = signer

    async def __call__(self, scope: Scope, receive: Receive, send: Send) -> None:
        if scope["type"] != "http":
            await self.app(scope, receive, send)
            return
        request = Request(scope, receive)
        static = _static(scope)
        cookies: list[bytes] = []

        async def secured(message: Message) -> None:
            if message["type"] == "http.response.start":
                headers = MutableHeaders(scope=message)
                secure_headers(headers, cacheable=static)
                for cookie in cookies:
                    headers.append("set-cookie", cookie.decode("latin-1"))
            await send(message)

        if not host_allowed(request, self.allowed_hosts):
            refused = PlainTextResponse("This dashboard does not answer that host name.", 400)
            await refused(scope, receive, secured)
            return
        response = await self._admit(request, static, cookies)
        if response is not None:
            await response(scope, receive, secured)
            return
        await self.app(scope, _bounded(receive), secured)

    async def _admit(self, request: Request, static: bool, cookies: list[bytes]) -> Response | None:
        """None to let the request through, else the response that refuses it."""
        if request.method not in SAFE_METHODS and not same_origin(request):
            return _page(request, 403, "A page of another site may not act on this dashboard.")
        if static:
            return None
        if self.auth is not None:
            allowed = self.auth(request)
            if inspect.isawaitable(allowed):
                allowed = await allowed
            if not allowed:
                return await _refused(request, self.auth)
            login = getattr(self.auth, "login_cookie", None)
            cookie = login(request) if login is not None else None
            if cookie is not None and request.method in SAFE_METHODS:
                redirect = local_redirect(request.url.path, without_token(request.url.query))
                set_cookie(redirect, request, TOKEN_COOKIE, cookie)
                return redirect
        request.scope[IDENTITY] = await self._identity(request, cookies)
        bad = _bad_text(request)
        if bad is not None:
            return _page(
                request, 400, f"{bad} holds a NUL or a lone surrogate: give printable characters."
            )
        if request.method not in SAFE_METHODS:
            return _body_refusal(request)
        return None

    async def _identity(self, request: Request, cookies: list[bytes]) -> str:
        """The signed-in request's identity: the hook's, else its session's
        (a new session, and its cookie, when it has none that holds)."""
        named = getattr(self.auth, "identity", None)
        if named is not None:
            found = named(request)
            if inspect.isawaitable(found):
                found = await found
            if isinstance(found, str) and found:
                return "hook:" + found
        stamped = request.cookies.get(cookie_name(request, SESSION_COOKIE), "")
        session = self.signer.unstamp("session", stamped) if stamped else None
        if session is None:
            session = secrets.token_urlsafe(24)
            carrier = Response()
            set_cookie(carrier, request, SESSION_COOKIE, self.signer.stamp("session", session))
            cookies.extend(v for k, v in carrier.raw_headers if k == b"set-cookie")
        return "session:" + session


def _body_refusal(request: Request) -> Response | None:
    kind = request.headers.get("content-type", "").split(";")[0].strip().lower()
    if kind.startswith("multipart/"):
        return _page(request, 415, "The dashboard takes forms, not uploads.")
    length = request.headers.get("content-length", "")
    if length and (not length.isascii() or not length.isdigit() or int(length) > MOST_BODY):
        return _page(request, 413, f"A form of the dashboard holds at most {MOST_BODY} bytes.")
    return None


def _bounded(receive: Receive) -> Receive:
    """``receive`` that stops a body at :data:`MOST_BODY` bytes with 413."""
    seen = 0

    async def bounded() -> Message:
        nonlocal seen
        message = await receive()
        if message["type"] == "http.request":
            seen += len(message.get("body", b""))
            if seen > MOST_BODY:
                raise HTTPException(
                    413, f"A form of the dashboard holds at most {MOST_BODY} bytes."
                )
        return message

    return bounded


def _page(request: Request, status: int, message: str) -> Response:
    """An error page that shows nothing of the store."""
    dashboard: Dashboard = request.app.state.dashboard
    return dashboard.render(
        request, "error.html", {"status": status, "message": message, "signed_out": True}, status
    )


async def _refused(request: Request, auth: Auth) -> Response:
    response = _page(request, 401, "Sign in to see this dashboard.")
    challenge = getattr(auth, "challenge", None)
    if challenge is not None:
        response.headers[challenge[0]] = challenge[1]
    return response
