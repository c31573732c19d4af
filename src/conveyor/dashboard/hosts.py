"""Where a request comes from: the Host allow-list (against DNS rebinding),
the same-origin check of every POST (against cross-site request forgery,
above the CSRF token), and redirects that never name a host.

DNS rebinding: a page of ``http://evil.example:8080`` whose name the
attacker then points at 127.0.0.1 is, to the browser, of its own origin, so
it may read the dashboard's pages and post its forms. Its requests say
``Host: evil.example:8080``: a dashboard that answers only the host names
it is known by refuses them (400). The names are matched without the port.
"""

from __future__ import annotations

from collections.abc import Iterable
from urllib.parse import urlsplit

from starlette.datastructures import URL
from starlette.requests import Request
from starlette.responses import RedirectResponse

from conveyor.errors import ConfigurationError

LOCAL_HOSTS = ("localhost", "127.0.0.1", "[::1]")
"""The names of this machine a browser on it uses (any port)."""
ANY_HOST = "*"
"""An ``allowed_hosts`` entry that turns the check off."""
SAFE_SITES = ("same-origin", "none")
"""``Sec-Fetch-Site`` values of a request the dashboard's own page (or the
person, typing an address) made."""


def checked_hosts(names: Iterable[str]) -> frozenset[str] | None:
    """The allow-list of ``names`` (host names or addresses, no port; an
    IPv6 address with or without brackets), lower-cased; None if one is
    ``*`` (every host). ConfigurationError for an empty list, or a name
    that is empty, has a port, a path or white space."""
    if isinstance(names, str):
        names = [names]
    allowed = set()
    for name in names:
        if name == ANY_HOST:
            return None
        if not isinstance(name, str):
            raise ConfigurationError(f"an allowed host is a string, not {type(name).__name__}")
        bare = name[1:-1] if name.startswith("[") and name.endswith("]") else name
        if bare.count(":") >= 2:
            name = f"[{bare}]"  # an IPv6 address, bracketed as in a Host header
        elif ":" in name or "[" in name or not bare:
            raise ConfigurationError(f"an allowed host is a name without a port, not {name!r}")
        if any(c.isspace() or c in "/@?#" for c in bare) or not bare.isascii():
            raise ConfigurationError(f"not a host name: {name!r}")
        allowed.add(name.lower())
    if not allowed:
        raise ConfigurationError("allowed_hosts names no host: give at least one, or '*'")
    return frozenset(allowed)


def host_name(header: str) -> str | None:
    """The name of a ``Host`` header (lower-cased, an IPv6 address in
    brackets), without its port; None if it is not one."""
    header = header.lower()
    if header.startswith("["):
        name, _, port = header.partition("]")
        name += "]"
        port = port.removeprefix(":") if port.startswith(":") else port
    else:
        name, _, port = header.partition(":")
    if not name or name == "[]" or (port and not (port.isascii() and port.isdigit())):
        return None
    return name


def host_allowed(request: Request, allowed: frozenset[str] | None) -> bool:
    """True if the request's ``Host`` is in ``allowed`` (None: every host)."""
    if allowed is None:
        return True
    name = host_name(request.headers.get("host", ""))
    return name is not None and name in allowed


def same_origin(request: Request) -> bool:
    """True unless the browser says the request came from a page of another
    origin: an ``Origin`` header that is not the dashboard's own (its
    scheme, host and port), or, without one, a ``Sec-Fetch-Site`` other
    than ``same-origin`` or ``none``. A request with neither (a script, an
    old browser) passes: the CSRF token alone decides for it. Behind a
    proxy that ends TLS, an ``https`` origin of the same host and port is
    the dashboard's own; the proxy must pass the ``Host`` header on."""
    origin = request.headers.get("origin")
    if origin is None:
        site = request.headers.get("sec-fetch-site")
        return site is None or site.lower() in SAFE_SITES
    parts = urlsplit(origin.strip())
    host = request.headers.get("host", "").lower()
    return (
        parts.scheme in (request.url.scheme, "https")
        and bool(host)
        and parts.netloc.lower() == host
        and parts.path in ("", "/")
    )


def local_redirect(target: URL | str, query: str = "") -> RedirectResponse:
    """A 303 to a path of this site: ``target``'s path and query only, never
    a host (so no ``Host`` header can send a browser elsewhere), and no
    ``//`` or ``/\\`` at its start, which a browser would read as a host."""
    if isinstance(target, URL):
        path, query = target.path, target.query
    else:
        path = target
    location = "/" + path.lstrip("/\\")
    return RedirectResponse(location + (f"?{query}" if query else ""), status_code=303)
