"""Backends and the one place that maps a URL to a concrete backend.

``postgresql://`` (and ``postgres://``) selects PostgreSQL; ``sqlite:///PATH``
SQLite (three slashes: a path relative to the working directory, four: an
absolute one; ``?busy_timeout=SECONDS&synchronous=full|normal``);
``redis://HOST:PORT/DB`` (``rediss://`` for TLS) Redis, with the
``redis`` extra (``?prefix=NAME``, or the App's ``schema``, names its key
prefix); ``memory://NAME`` the in-memory backend (not durable; for tests;
``?inline=true`` runs tasks at enqueue). With no
URL and no ``CONVEYOR_URL``, SQLite in ``./conveyor.db`` is the default.
"""

from __future__ import annotations

import os
from typing import Any
from urllib.parse import parse_qsl, urlsplit

from conveyor.backends.protocol import Backend, Capability
from conveyor.backends.urlquery import without
from conveyor.errors import ConfigurationError
from conveyor.redaction import redact_message, redact_url

__all__ = ["Backend", "Capability", "backend_from_url", "resolve_url", "sqlite_path"]

URL_ENV = "CONVEYOR_URL"
DEFAULT_URL = "sqlite:///conveyor.db"


def resolve_url(url: str | None) -> str:
    """Return ``url``; when it is None, ``CONVEYOR_URL``, else ``DEFAULT_URL``.
    Raises ConfigurationError for a URL that does not parse (a bracket left
    open around an IPv6 address, say)."""
    if url is not None:
        if not url:
            raise ConfigurationError("the backend URL is empty")
        return parsed(url)
    return parsed(os.environ.get(URL_ENV) or DEFAULT_URL)


def parsed(url: str) -> str:
    """``url``, if it parses as a URL; else ConfigurationError (which shows
    no secret of the URL, though the parser's reason may quote its host)."""
    try:
        urlsplit(url)
    except ValueError as exc:
        reason = redact_message(str(exc), url)
        raise ConfigurationError(f"the backend URL does not parse: {reason}") from None
    return url


def sqlite_path(url: str) -> str | None:
    """The absolute path of the file a ``sqlite:///`` URL names (relative
    paths resolve against the working directory); None for other URLs."""
    parts = urlsplit(url)
    if parts.scheme.lower() != "sqlite" or parts.netloc or len(parts.path) < 2:
        return None
    return os.path.abspath(parts.path[1:])


def backend_from_url(url: str, **options: Any) -> Backend:
    """Build the backend a URL names; ``?schema=NAME`` sets the PostgreSQL schema."""
    parts = urlsplit(parsed(url))
    scheme = parts.scheme.lower()
    if scheme in ("postgresql", "postgres"):
        from conveyor.backends.postgres import PostgresBackend

        rest, taken = without(url, ("schema",))
        if "schema" in taken:
            options.setdefault("schema", taken["schema"])
        return PostgresBackend(rest, **options)
    if scheme == "sqlite":
        from conveyor.backends.sqlite import SQLiteBackend

        if parts.netloc:
            raise ConfigurationError(
                f"invalid SQLite URL {redact_url(url)!r}: use sqlite:///relative.db or sqlite:////abs/path.db"
            )
        return SQLiteBackend(parts.path[1:], **_sqlite_options(parts.query), **options)
    if scheme == "memory":
        from conveyor.backends.memory import MemoryBackend

        name = parts.netloc or parts.path.strip("/") or "default"
        return MemoryBackend(name, **_memory_options(parts.query), **options)
    if scheme in ("redis", "rediss"):
        return _redis_backend(url, **options)
    expected = "expected postgresql://, sqlite:///, redis:// or memory://"
    if not parts.scheme:
        # Not a URL at all: perhaps a libpq "host=... password=..." string.
        raise ConfigurationError(f"the backend URL has no scheme ({expected})")
    raise ConfigurationError(
        f"unsupported backend URL scheme {parts.scheme!r} in {redact_url(url)!r} ({expected})"
    )


def _redis_backend(url: str, **options: Any) -> Backend:
    """A Redis store: ``schema`` (the App's, or ``CONVEYOR_SCHEMA``) is its
    key prefix, as ``?prefix=NAME`` in the URL is."""
    try:
        from conveyor.backends.redis import RedisBackend
    except ModuleNotFoundError as exc:
        if (exc.name or "").partition(".")[0] != "redis":
            raise
        raise ConfigurationError(
            "the Redis backend needs redis-py: pip install 'conveyor[redis]'"
        ) from None
    schema = options.pop("schema", None)
    if schema is not None:
        options.setdefault("prefix", schema)
    return RedisBackend(url, **options)


def _sqlite_options(query: str) -> dict[str, Any]:
    found: dict[str, Any] = {}
    for key, value in parse_qsl(query):
        if key == "busy_timeout":
            try:
                found[key] = float(value)
            except ValueError:
                raise ConfigurationError(f"busy_timeout must be seconds, not {value!r}") from None
        elif key == "synchronous":
            found[key] = value.lower()
        else:
            raise ConfigurationError(f"unknown SQLite URL option {key!r}")
    return found


def _memory_options(query: str) -> dict[str, Any]:
    found: dict[str, Any] = {}
    for key, value in parse_qsl(query):
        if key != "inline":
            raise ConfigurationError(f"unknown memory URL option {key!r}")
        if value.lower() not in ("true", "false", "1", "0"):
            raise ConfigurationError(f"inline must be true or false, not {value!r}")
        found["inline"] = value.lower() in ("true", "1")
    return found
