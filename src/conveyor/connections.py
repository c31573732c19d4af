"""A client's connections: one open backend per event loop, opened at its
first use there and closed with the client (``aclose``, ``close``), with the
loop (its shutdown cancels every task, or finalizes async generators), at
interpreter exit (the sync API's), or never in a forked child (the parent's
pools stay the parent's).

:class:`Connections` is a base of :class:`conveyor.Client`: it holds the
store's URL and options, and gives the backend bound to the calling event
loop (:meth:`Connections.backend`); sync calls go through a private loop
thread (:mod:`conveyor.portal`).
"""

from __future__ import annotations

import asyncio
import atexit
import contextlib
import functools
import os
import weakref
from collections.abc import AsyncGenerator
from typing import Any, Self

from conveyor.backends import Backend, backend_from_url, resolve_url
from conveyor.errors import ConfigurationError
from conveyor.portal import INHERITED_AT_FORK, Portal

SCHEMA_ENV = "CONVEYOR_SCHEMA"


class Connections:
    """The backends of one store, one per event loop (see the module docstring)."""

    def __init__(
        self,
        url: str | None = None,
        *,
        schema: str | None = None,
        pool_size: int | None = None,
        migrate: bool = True,
    ) -> None:
        self.url = resolve_url(url)
        schema = schema if schema is not None else os.environ.get(SCHEMA_ENV) or None
        self._backend_options: dict[str, Any] = {}
        if schema is not None:
            self._backend_options["schema"] = schema
        if pool_size is not None:
            self._backend_options["pool_size"] = pool_size
        if not migrate:
            self._backend_options["migrate"] = False
        self.portal = Portal()
        self._backends: weakref.WeakKeyDictionary[asyncio.AbstractEventLoop, Backend] = (
            weakref.WeakKeyDictionary()
        )
        self._opening: weakref.WeakKeyDictionary[asyncio.AbstractEventLoop, asyncio.Lock] = (
            weakref.WeakKeyDictionary()
        )
        self._closers: dict[asyncio.AbstractEventLoop, AsyncGenerator[None, None]] = {}
        self._guards: dict[asyncio.AbstractEventLoop, asyncio.Task[None]] = {}
        atexit.register(_close_at_exit, weakref.ref(self))
        os.register_at_fork(after_in_child=functools.partial(_forget_after_fork, weakref.ref(self)))
        # Validates the URL and schema now; runs sync enqueues on callers' connections.
        self._statements: Backend = backend_from_url(self.url, **self._backend_options)

    def rebind(
        self, url: str | None = None, *, schema: str | None = None, migrate: bool | None = None
    ) -> None:
        """Point this client at another store (``url``) or PostgreSQL schema, as
        ``conveyor worker --url/--schema`` does, or change whether opening it
        migrates (``migrate``, as in the constructor: ``--no-migrate``); None
        keeps the current one. Only before the client has opened a backend:
        raises ConfigurationError after."""
        if self._backends or self.portal.started:
            raise ConfigurationError("rebind() must come before the app opens its store")
        options = dict(self._backend_options)
        if schema is not None:
            options["schema"] = schema
        if migrate is not None:
            options.pop("migrate", None)
            if not migrate:
                options["migrate"] = False
        new_url = resolve_url(url) if url is not None else self.url
        statements = backend_from_url(new_url, **options)  # validates first
        self.url, self._backend_options, self._statements = new_url, options, statements

    def use(self, url: str, *, schema: str | None = None) -> None:
        """Point this client at another store from now on, even after it has
        opened one (``rebind`` refuses then): for tests that move an app
        defined at import time to a fresh store, ``app.use("memory://t1")``
        (:func:`conveyor.testing.in_memory` does it, and undoes it).

        ``schema`` None keeps the current one. The sync API's backend is
        closed now; one opened on another event loop is no longer used and
        closes when that loop ends, or when that loop opens the new store.
        Handles taken before read the new store.
        A worker already running keeps the store it opened: call this while
        none runs. Raises ConfigurationError for an invalid URL, changing
        nothing."""
        options = dict(self._backend_options)
        if schema is not None:
            options["schema"] = schema
        new_url = resolve_url(url)
        statements = backend_from_url(new_url, **options)  # validates first
        if self.portal.started:
            self.portal.run(self.aclose())
        # The backend of another loop closes when that loop ends, or when a
        # backend opened there afterwards replaces its closer (_close_with_loop).
        self._backends = weakref.WeakKeyDictionary()
        self._opening = weakref.WeakKeyDictionary()
        self.url, self._backend_options, self._statements = new_url, options, statements

    @property
    def location(self) -> str:
        """Where this client's store is, as shown to people: the URL with its
        secrets shown as ``***`` (:func:`conveyor.redaction.redact_url`; and
        the PostgreSQL schema), an absolute SQLite path."""
        return self._statements.location

    @property
    def auto_migrate(self) -> bool:
        """Whether opening the store applies its pending migrations (the
        constructor's ``migrate``)."""
        return bool(self._backend_options.get("migrate", True))

    def make_backend(self, **overrides: Any) -> Backend:
        """A new, unopened backend for this client's URL (``migrate=None``:
        one whose open only connects)."""
        return backend_from_url(self.url, **{**self._backend_options, **overrides})

    async def backend(self) -> Backend:
        """The open backend bound to the running event loop."""
        loop = asyncio.get_running_loop()
        found = self._backends.get(loop)
        if found is not None:
            return found
        lock = self._opening.setdefault(loop, asyncio.Lock())
        async with lock:
            found = self._backends.get(loop)
            if found is None:
                found = self.make_backend()
                await found.open()
                self._backends[loop] = found
                # Closed when the loop shuts down, for code that never calls
                # aclose(): at the cancellation of every task (asyncio.run's
                # first step), or when async generators are finalized.
                closer = _close_with_loop(self, loop, found)
                await closer.__anext__()
                self._closers[loop] = closer
                replaced = self._guards.get(loop)
                if replaced is not None:
                    # A backend this loop opened before use(), no longer used:
                    # closed now (its guard, only held here, would otherwise be
                    # collected while it waits, and never close it).
                    replaced.cancel()
                self._guards[loop] = loop.create_task(
                    _close_when_cancelled(self, loop, closer), name="conveyor-close-at-loop-end"
                )
        return found

    async def aclose(self) -> None:
        """Close the backend of the running loop."""
        loop = asyncio.get_running_loop()
        self._closers.pop(loop, None)
        found = self._backends.pop(loop, None)
        guard = self._guards.pop(loop, None)
        if guard is not None:
            guard.cancel()  # it closes ``found``, through its closer
            await asyncio.wait([guard])
        if found is not None:
            await found.close()

    def close(self) -> None:
        """Close the sync API's backend and its loop thread."""
        loop = self.portal._loop
        if loop is not None:
            self.portal.run(self.aclose())
        self.portal.close()

    async def __aenter__(self) -> Self:
        await self.backend()
        return self

    async def __aexit__(self, *exc: object) -> None:
        await self.aclose()

    def __enter__(self) -> Self:
        return self

    def __exit__(self, *exc: object) -> None:
        self.close()


async def _close_with_loop(
    client: Connections, loop: asyncio.AbstractEventLoop, backend: Backend
) -> AsyncGenerator[None, None]:
    try:
        yield
    finally:
        current = client._backends.get(loop)
        if current is backend or current is None:  # a newer backend's closer stays (use())
            client._closers.pop(loop, None)
        if current is backend:
            del client._backends[loop]
            guard = client._guards.pop(loop, None)  # this backend's: finalized first
            if guard is not None and guard is not asyncio.current_task():
                guard.cancel()
        await backend.close()


async def _close_when_cancelled(
    client: Connections, loop: asyncio.AbstractEventLoop, closer: AsyncGenerator[None, None]
) -> None:
    """Wait until cancelled, then finish ``closer`` (which closes its backend).

    A loop's shutdown (``asyncio.run``, ``asyncio.Runner``) cancels every
    task and waits for them all before it finalizes async generators. A
    psycopg pool that is reconnecting then (after a lost connection) takes
    its task's cancellation for a failed connect and goes on: that shutdown
    would never end. Closing the pool here, at this task's cancellation,
    stops the pool's tasks, and the shutdown ends."""
    try:
        await loop.create_future()
    except asyncio.CancelledError:
        task = asyncio.current_task()
        if task is not None:
            # Taken: the closing below is this task's answer to it. The
            # backend's close tells a cancellation of its own from the
            # loop's tasks (a pool's) cancelled around it by that count.
            task.uncancel()
        if client._guards.get(loop) is task:
            del client._guards[loop]
        # A no-op when finished; RuntimeError when finishing now (it cancelled us).
        with contextlib.suppress(RuntimeError):
            await closer.aclose()
        raise
    # A loop closed without cancelling its tasks drops this one unfinished
    # (GeneratorExit when collected): nothing can be awaited then, and the
    # closer is finalized with the loop's async generators, if ever.


def _forget_after_fork(ref: weakref.ref[Connections]) -> None:
    """In a forked child: start afresh, keeping (never closing) the parent's pools."""
    client = ref()
    if client is not None:
        INHERITED_AT_FORK.append(dict(client._backends))
        client._backends = weakref.WeakKeyDictionary()
        client._opening = weakref.WeakKeyDictionary()
        client._guards = {}


def _close_at_exit(ref: weakref.ref[Connections]) -> None:
    """Close the sync API's pool at interpreter exit, for scripts that never do."""
    client = ref()
    if client is not None and client.portal.started:
        with contextlib.suppress(Exception):
            client.close()
