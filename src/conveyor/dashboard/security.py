"""Who may see the dashboard, and which form posts it trusts.

Authentication is a hook, ``auth(request) -> bool`` (or an awaitable of
one), asked on every request: :func:`token_auth` and :func:`basic_auth`
are the two given here; a host application can pass its own (its session,
its single sign-on). A refused request gets 401, with the hook's
``challenge`` header when it has one (``WWW-Authenticate`` for basic
authentication), and no cookie.

Every action is a POST that carries a CSRF token in a hidden field. The
token is not random and is kept in no cookie: it is an HMAC-SHA256, under
the dashboard's secret, of what the request signed in with (its
*identity*): the bearer token or the login cookie of :class:`TokenAuth`,
the credentials of :class:`BasicAuth`, what a hook's own
``identity(request)`` method names (a user id, say), or, for a hook without
one (and with no hook at all), the dashboard's session cookie, a random id
signed with the secret that is set only on a response to a request the hook
let in. A page of another origin, even one of the same site (another port
of the same host, which shares its cookies), can neither read a token nor
make one: a token is never issued to a request that is not signed in, and
it answers only the identity it was derived from. A POST whose field is not
the token of its own identity is refused with 403 and changes nothing.

What this does not cover, and what covers it (:mod:`conveyor.dashboard.guard`):
with no hook, every visitor is signed in and may obtain a session and its
token, so there the defence is that a POST whose ``Origin`` (or, without
one, ``Sec-Fetch-Site``) is not the dashboard's own is refused before its
form is read, and the Host allow-list. A hook without ``identity`` shares
its session cookie with every user of the browser: a signed-in user of the
host application could plant their own session in a colleague's browser,
and only the Origin check stops a post made with it. Cookies are
``HttpOnly``, ``SameSite=Strict``, expire after :data:`COOKIE_LIFETIME`,
and over HTTPS at the root of a site are named with the ``__Host-`` prefix
(``Secure``, ``Path=/``, no ``Domain``: no other host or path can set one);
under a mount (a ``root_path``) they keep the plain name and the mount's
path, since a ``__Host-`` cookie must have the path ``/``.
"""

from __future__ import annotations

import base64
import binascii
import hashlib
import hmac
import json
import secrets
import time
from collections.abc import Awaitable, Callable
from urllib.parse import parse_qsl, urlencode

from starlette.requests import Request
from starlette.responses import Response

Auth = Callable[[Request], bool | Awaitable[bool]]
"""An authentication hook: True lets the request through, False answers 401."""

CSRF_FIELD = "csrf_token"
TOKEN_COOKIE = "conveyor_token"  # noqa: S105 - a cookie name
SESSION_COOKIE = "conveyor_session"
TOKEN_PARAM = "token"  # noqa: S105 - a query parameter name
COOKIE_LIFETIME = 12 * 3600
"""Seconds a login or session cookie holds (its ``Max-Age`` and its signed expiry)."""
IDENTITY = "conveyor.identity"
"""The key of the request's scope that holds its identity once it is signed in."""


class Signer:
    """HMAC-SHA256 under the dashboard's secret, each use in a domain of its
    own (a CSRF token is never a valid cookie, nor the reverse). Values
    signed under another secret (a restarted process with a random one) do
    not check."""

    def __init__(self, secret: bytes) -> None:
        self._secret = secret

    def sign(self, purpose: str, *parts: str) -> str:
        message = json.dumps([purpose, *parts]).encode()
        return hmac.new(self._secret, message, hashlib.sha256).hexdigest()

    def stamp(self, purpose: str, value: str, now: float | None = None) -> str:
        """``value.expiry.signature``: ``value`` (no dot) good for
        :data:`COOKIE_LIFETIME` seconds from ``now``."""
        expiry = str(int(now if now is not None else time.time()) + COOKIE_LIFETIME)
        return f"{value}.{expiry}.{self.sign(purpose, value, expiry)}"

    def unstamp(self, purpose: str, stamped: str) -> str | None:
        """The value of a stamp made by :meth:`stamp`, if its signature holds
        and it has not expired; else None."""
        value, _, rest = stamped.partition(".")
        expiry, _, signature = rest.partition(".")
        if not (expiry.isascii() and expiry.isdigit() and signature.isascii()):
            return None
        expected = self.sign(purpose, value, expiry)
        if not hmac.compare_digest(signature.encode(), expected.encode()):
            return None
        return value if int(expiry) > time.time() else None


class Csrf:
    """The CSRF tokens of one dashboard (see the module docstring)."""

    def __init__(self, signer: Signer) -> None:
        self._signer = signer

    def token_for(self, identity: str) -> str:
        """The token of the forms shown to ``identity``."""
        return self._signer.sign("csrf", identity)

    def accepts(self, identity: str | None, submitted: object) -> bool:
        """True if ``submitted`` (the form field) is ``identity``'s token."""
        if identity is None or not isinstance(submitted, str):
            return False
        expected = self.token_for(identity).encode()
        return hmac.compare_digest(submitted.encode("utf-8", "surrogatepass"), expected)


def cookie_name(request: Request, name: str) -> str:
    """``__Host-name`` over HTTPS at the root of a site, else ``name``."""
    if request.url.scheme == "https" and not request.scope.get("root_path"):
        return "__Host-" + name
    return name


def set_cookie(response: Response, request: Request, name: str, value: str) -> None:
    """A cookie of this dashboard (see the module docstring)."""
    response.set_cookie(
        cookie_name(request, name),
        value,
        max_age=COOKIE_LIFETIME,
        path=(request.scope.get("root_path") or "") + "/",
        httponly=True,
        samesite="strict",
        secure=request.url.scheme == "https",
    )


def _digest(secret: bytes) -> str:
    return hashlib.sha256(b"conveyor-dashboard:" + secret).hexdigest()


class TokenAuth:
    """Lets in a request that carries the token: ``Authorization: Bearer
    TOKEN``, or the login cookie set by a first visit to a link with
    ``?token=TOKEN`` (the dashboard then redirects to the same address
    without it, so the token does not stay in the address bar or the
    history). The cookie holds no token: an expiry time and an HMAC over the
    token and that time under ``secret`` (:func:`create_app` gives its
    dashboard's secret); it holds for :data:`COOKIE_LIFETIME` seconds, and
    a dashboard restarted with another secret asks to sign in again.
    Comparisons take constant time."""

    def __init__(self, token: str, *, secret: bytes | None = None) -> None:
        if not token:
            raise ValueError("the token must not be empty")
        self._plain = token
        self._token = token.encode("utf-8", "surrogatepass")
        self._signer = Signer(secret or secrets.token_bytes(32))

    def with_secret(self, secret: bytes) -> TokenAuth:
        """The same token, its cookies signed with ``secret``."""
        return TokenAuth(self._plain, secret=secret)

    def __call__(self, request: Request) -> bool:
        return self.identity(request) is not None

    def identity(self, request: Request) -> str | None:
        """What the request signed in with: the bearer token, the login
        cookie (a new one at each sign-in) or ``?token=``; None if nothing."""
        header = request.headers.get("authorization", "")
        scheme, _, given = header.partition(" ")
        if scheme.lower() == "bearer" and self._matches(given.strip()):
            return "bearer:" + _digest(self._token)
        cookie = request.cookies.get(cookie_name(request, TOKEN_COOKIE), "")
        if cookie and self._signer.unstamp("login", cookie) == _digest(self._token):
            return "cookie:" + cookie
        if self._matches(request.query_params.get(TOKEN_PARAM)):
            return "query:" + _digest(self._token)
        return None

    def login_cookie(self, request: Request) -> str | None:
        """The cookie to set when the request carries the right ``?token=``."""
        if self._matches(request.query_params.get(TOKEN_PARAM)):
            return self._signer.stamp("login", _digest(self._token))
        return None

    def _matches(self, given: str | None) -> bool:
        return given is not None and hmac.compare_digest(
            given.encode("utf-8", "surrogatepass"), self._token
        )


def without_token(query: str) -> str:
    """A query string without its ``token`` parameter."""
    return urlencode([(k, v) for k, v in parse_qsl(query, keep_blank_values=True) if k != "token"])


class BasicAuth:
    """HTTP basic authentication with one user name and password: a
    refused request is challenged (``WWW-Authenticate: Basic``), so a
    browser asks for them. Comparisons take constant time. Use it over
    HTTPS, or on a trusted network: basic authentication sends the
    password with every request."""

    challenge = ("WWW-Authenticate", 'Basic realm="conveyor", charset="UTF-8"')

    def __init__(self, user: str, password: str) -> None:
        if not user or not password:
            raise ValueError("basic authentication needs a user name and a password")
        self._expected = f"{user}:{password}".encode("utf-8", "surrogatepass")

    def __call__(self, request: Request) -> bool:
        return self.identity(request) is not None

    def identity(self, request: Request) -> str | None:
        """The credentials the request carries (a digest of them), if right."""
        header = request.headers.get("authorization", "")
        scheme, _, encoded = header.partition(" ")
        if scheme.lower() != "basic":
            return None
        try:
            given = base64.b64decode(encoded.strip(), validate=True)
        except (binascii.Error, ValueError):
            return None
        if not hmac.compare_digest(given, self._expected):
            return None
        return "basic:" + _digest(given)


def token_auth(token: str) -> TokenAuth:
    """An auth hook that lets in requests carrying ``token`` (see :class:`TokenAuth`)."""
    return TokenAuth(token)


def basic_auth(user: str, password: str) -> BasicAuth:
    """An auth hook for HTTP basic authentication (see :class:`BasicAuth`)."""
    return BasicAuth(user, password)
