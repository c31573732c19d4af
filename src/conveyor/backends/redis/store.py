"""The Redis store under a backend: its URL and key prefix, the client, the
persistence warning, and the running of the scripts.

:class:`RedisStore` is the base of every section mixin of
:class:`~.backend.RedisBackend`: it holds the connection and runs an
operation's script (``_run``); :func:`translated` turns redis-py's errors
into conveyor's.
"""

from __future__ import annotations

import contextlib
import logging
from collections.abc import Iterator
from typing import Any
from urllib.parse import urlsplit

import redis.asyncio as aioredis
from redis import exceptions as redis_errors

from conveyor.backends.redis import (
    keys,
    persistence,
)
from conveyor.backends.redis.scripts import Scripts
from conveyor.backends.refusals import one_line
from conveyor.backends.urlquery import without
from conveyor.errors import (
    BackendError,
    BackendUnavailableError,
    ConfigurationError,
)
from conveyor.redaction import redact_url

SCHEMES = ("redis", "rediss")
_CHECKED: set[str] = set()
"""The servers whose persistence this process has checked (host:port)."""
log = logging.getLogger("conveyor.redis")


UNAVAILABLE_REPLIES = frozenset(
    [
        "LOADING",
        "BUSY",
        "READONLY",
        "MASTERDOWN",
        "TRYAGAIN",
        "CLUSTERDOWN",
        "NOREPLICAS",
        "MISCONF",
        "OOM",
    ]
)
"""The error codes of a server that cannot serve now: loading its data,
running a long script, a replica or a master without its link, a cluster
reconfiguring, writes stopped because the last snapshot failed (MISCONF),
or its memory full (OOM: with ``maxmemory`` and no eviction, Redis refuses
writes until memory is freed; pruning finished tasks, or more memory,
lets them through again, as a full disk does on SQLite and PostgreSQL)."""
_REPLY_CLASSES = (
    redis_errors.ReadOnlyError,
    redis_errors.OutOfMemoryError,
    redis_errors.TryAgainError,
    redis_errors.ClusterDownError,
)
"""redis-py's classes for some of those codes (it strips the code from the
message); the others keep the code as the message's first word."""


def unavailable(exc: redis_errors.RedisError) -> bool:
    """Whether ``exc`` says the server cannot serve now (no connection, no
    answer in time, or a reply in ``UNAVAILABLE_REPLIES``), rather than that
    it refuses the operation for good (a script's error, a value refused)."""
    if isinstance(exc, redis_errors.ConnectionError | redis_errors.TimeoutError):
        return True  # LOADING included (BusyLoadingError)
    if isinstance(exc, _REPLY_CLASSES):
        return True
    if isinstance(exc, redis_errors.ResponseError):
        code = str(exc).split(" ", 1)[0]
        return code in UNAVAILABLE_REPLIES
    return False


@contextlib.contextmanager
def translated() -> Iterator[None]:
    """redis-py's errors as conveyor's, by the server's reply: see
    :func:`unavailable` for BackendUnavailableError (worth retrying);
    anything else (a script that fails, a value refused, a command not
    allowed) is a permanent BackendError. The message is one line."""
    try:
        yield
    except redis_errors.RedisError as exc:
        if unavailable(exc):
            raise BackendUnavailableError(f"Redis is unavailable: {one_line(str(exc))}") from exc
        raise BackendError(f"Redis refused the operation: {one_line(str(exc))}") from exc


class RedisStore:
    """One Redis store (``redis://HOST:PORT/DB``, ``rediss://`` for TLS) under
    a key prefix (``prefix``, or ``?prefix=`` in the URL; default
    ``conveyor``), and its connection once open.

    ``functions`` (default True) runs the operations as Redis functions
    where the server has them (Redis 7 and later); False, or a server that
    refuses the library, runs them as scripts by SHA, which costs more
    server time per call (see :mod:`.scripts`).

    ``migrate`` says what :meth:`open` does about the store's layout: True
    marks a new store with this layout's version (or converts an older
    one); False refuses a prefix that holds no store, or one of an older
    layout (StoreNotReadyError), and writes nothing; None only connects.
    Either check is one GET of the layout key."""

    def __init__(
        self,
        url: str,
        *,
        prefix: str | None = None,
        functions: bool = True,
        migrate: bool | None = True,
        **_options: Any,
    ) -> None:
        parts = urlsplit(url)
        if parts.scheme.lower() not in SCHEMES:
            raise ConfigurationError(
                f"a Redis URL starts with redis:// or rediss://, not {redact_url(url)!r}"
            )
        rest, taken = without(url, ("prefix",))
        in_url = taken.get("prefix")
        if prefix is not None and in_url is not None and prefix != in_url:
            raise ConfigurationError(
                f"two key prefixes: {in_url!r} in the URL and {prefix!r} as an option"
            )
        self.prefix = keys.check_prefix(prefix or in_url or keys.DEFAULT_PREFIX)
        self._base = keys.base(self.prefix)
        self._url = rest
        # Where the store is, read from the URL with its secrets hidden: a
        # password holding a raw "/" or "?" would otherwise spill into the
        # host, the port or the path.
        shown = urlsplit(redact_url(url))
        host = shown.hostname or "localhost"
        try:
            port = f":{shown.port}" if shown.port else ""
        except ValueError as exc:
            raise ConfigurationError(f"the Redis URL's port does not parse: {exc}") from None
        self._server = f"{host}{port}"
        self._location = f"{shown.scheme}://{host}{port}{shown.path or '/0'}?prefix={self.prefix}"
        self._client: aioredis.Redis | None = None
        self._scripts: Scripts | None = None
        self._functions = functions
        self._auto_migrate = migrate

    @property
    def location(self) -> str:
        return self._location

    async def _check_persistence(self, client: aioredis.Redis) -> None:
        """Warn, once per process and server, of each persistence setting
        that can lose acknowledged work (see :mod:`.persistence`); a read
        that fails is tried again at the next ``open``."""
        if self._server in _CHECKED:
            return
        with translated():
            found = await persistence.read(client)
        _CHECKED.add(self._server)
        for problem in found.problems():
            log.warning("Redis at %s: %s", self._server, problem)

    @property
    def _redis(self) -> aioredis.Redis:
        if self._client is None:
            raise ConfigurationError("the Redis backend is not open: call open() first")
        return self._client

    async def _run(self, name: str, args: list[Any]) -> Any:
        if self._scripts is None:
            raise ConfigurationError("the Redis backend is not open: call open() first")
        with translated():
            return await self._scripts.run(name, self._base, args)
