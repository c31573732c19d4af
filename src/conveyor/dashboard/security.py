"""Who may see the dashboard, and which form posts it trusts.

Authentication is a hook, ``auth(request) -> bool`` (or an awaitable of
one), asked on every request: :func:`token_auth` and :func:`basic_auth`
are the two given here; a host application can pass its own (its session,
its single sign-on). A refused request gets 401, with the hook's
``challenge`` header when it has one (``WWW-Authenticate`` for basic
authentication).

Every action is a POST that carries a CSRF token in a hidden field: the
token is a random value, also kept in a cookie signed with the dashboard's
secret (HMAC-SHA256), so a page of another site can neither read it nor
make one up. A POST whose field does not match its cookie is refused with
403 and changes nothing. The cookie is ``HttpOnly`` and ``SameSite=Strict``.
"""

from __future__ import annotations

import base64
import binascii
import hashlib
import hmac
import secrets
from collections.abc import Awaitable, Callable
from urllib.parse import parse_qsl, urlencode

from starlette.requests import Request

Auth = Callable[[Request], bool | Awaitable[bool]]
"""An authentication hook: True lets the request through, False answers 401."""

CSRF_COOKIE = "conveyor_csrf"
CSRF_FIELD = "csrf_token"
TOKEN_COOKIE = "conveyor_token"  # noqa: S105 - a cookie name
TOKEN_PARAM = "token"  # noqa: S105 - a query parameter name


def _sign(secret: bytes, value: str) -> str:
    return hmac.new(secret, value.encode(), hashlib.sha256).hexdigest()


class Csrf:
    """Issues and checks the CSRF tokens of one dashboard (see the module
    docstring). ``secret`` signs the cookies: tokens issued under another
    secret (a restarted process with a random one) are refused, and the
    next page view issues a new one."""

    def __init__(self, secret: bytes) -> None:
        self._secret = secret

    def token_of(self, request: Request) -> str | None:
        """The token the request's cookie holds, if its signature holds."""
        cookie = request.cookies.get(CSRF_COOKIE, "")
        token, _, signature = cookie.partition(".")
        expected = _sign(self._secret, token).encode()
        if not token or not hmac.compare_digest(signature.encode(), expected):
            return None
        return token

    def issue(self) -> tuple[str, str]:
        """A new token and the cookie value that carries it."""
        token = secrets.token_urlsafe(32)
        return token, f"{token}.{_sign(self._secret, token)}"

    def accepts(self, request: Request, submitted: object) -> bool:
        """True if ``submitted`` (the form field) is the cookie's token."""
        expected = self.token_of(request)
        if expected is None or not isinstance(submitted, str):
            return False
        return hmac.compare_digest(submitted.encode(), expected.encode())


class TokenAuth:
    """Lets in a request that carries the token: ``Authorization: Bearer
    TOKEN``, or the cookie set by a first visit to a link with
    ``?token=TOKEN`` (the dashboard then redirects to the same address
    without it, so the token does not stay in the address bar or the
    history). The cookie holds a digest of the token, not the token.
    Comparisons take constant time."""

    def __init__(self, token: str) -> None:
        if not token:
            raise ValueError("the token must not be empty")
        self._token = token.encode()
        self._cookie = hashlib.sha256(b"conveyor-dashboard:" + self._token).hexdigest()

    def __call__(self, request: Request) -> bool:
        header = request.headers.get("authorization", "")
        scheme, _, given = header.partition(" ")
        if scheme.lower() == "bearer" and hmac.compare_digest(given.strip().encode(), self._token):
            return True
        cookie = request.cookies.get(TOKEN_COOKIE, "")
        if cookie and hmac.compare_digest(cookie.encode(), self._cookie.encode()):
            return True
        return self.login_cookie(request) is not None

    def login_cookie(self, request: Request) -> str | None:
        """The cookie to set when the request carries the right ``?token=``."""
        given = request.query_params.get(TOKEN_PARAM)
        if given is not None and hmac.compare_digest(given.encode(), self._token):
            return self._cookie
        return None


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
        self._expected = f"{user}:{password}".encode()

    def __call__(self, request: Request) -> bool:
        header = request.headers.get("authorization", "")
        scheme, _, encoded = header.partition(" ")
        if scheme.lower() != "basic":
            return False
        try:
            given = base64.b64decode(encoded.strip(), validate=True)
        except (binascii.Error, ValueError):
            return False
        return hmac.compare_digest(given, self._expected)


def token_auth(token: str) -> TokenAuth:
    """An auth hook that lets in requests carrying ``token`` (see :class:`TokenAuth`)."""
    return TokenAuth(token)


def basic_auth(user: str, password: str) -> BasicAuth:
    """An auth hook for HTTP basic authentication (see :class:`BasicAuth`)."""
    return BasicAuth(user, password)
