"""Backends and the one place that maps a URL to a concrete backend.

``postgresql://`` (and ``postgres://``) selects PostgreSQL, ``memory://NAME``
the in-memory backend (not durable; for tests). SQLite and Redis will be
added behind the same protocol.
"""

from __future__ import annotations

import os
from typing import Any
from urllib.parse import parse_qsl, urlencode, urlsplit, urlunsplit

from conveyor.backends.protocol import Backend, Capability
from conveyor.errors import ConfigurationError

__all__ = ["Backend", "Capability", "backend_from_url", "resolve_url"]

URL_ENV = "CONVEYOR_URL"


def resolve_url(url: str | None) -> str:
    """Return ``url``, or ``CONVEYOR_URL`` when it is None."""
    resolved = url if url is not None else os.environ.get(URL_ENV)
    if not resolved:
        raise ConfigurationError(f"no backend URL: pass one (App(url=...), --url) or set {URL_ENV}")
    return resolved


def backend_from_url(url: str, **options: Any) -> Backend:
    """Build the backend a URL names; ``?schema=NAME`` sets the PostgreSQL schema."""
    parts = urlsplit(url)
    scheme = parts.scheme.lower()
    if scheme in ("postgresql", "postgres"):
        from conveyor.backends.postgres import PostgresBackend

        query = dict(parse_qsl(parts.query))
        schema = query.pop("schema", None)
        if schema is not None:
            options.setdefault("schema", schema)
        clean = urlunsplit(parts._replace(query=urlencode(query)))
        return PostgresBackend(clean, **options)
    if scheme == "memory":
        from conveyor.backends.memory import MemoryBackend

        return MemoryBackend(parts.netloc or parts.path.strip("/") or "default", **options)
    raise ConfigurationError(
        f"unsupported backend URL scheme {parts.scheme!r} in {url!r} "
        "(expected postgresql:// or memory://)"
    )
