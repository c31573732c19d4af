"""Run coroutines from synchronous code on one private event loop thread.

The sync client API (Django, Flask, scripts) goes through a portal: each
call is submitted to a daemon thread running an asyncio loop, so the sync
and async APIs share one implementation and one connection pool.
"""

from __future__ import annotations

import asyncio
import functools
import os
import threading
import weakref
from collections.abc import Coroutine
from typing import Any, TypeVar

from conveyor.errors import ConfigurationError

T = TypeVar("T")


# What a forked child inherits from its parent's portals and pools: kept
# referenced, never closed, so that no finalizer of the child ends a database
# session or closes a socket that still belongs to the parent.
INHERITED_AT_FORK: list[object] = []


class Portal:
    """A lazily started event loop in a daemon thread.

    Fork-safe: in a child process the portal starts afresh on first use (the
    parent's loop thread does not exist there).
    """

    def __init__(self, name: str = "conveyor-portal") -> None:
        self._name = name
        self._loop: asyncio.AbstractEventLoop | None = None
        self._thread: threading.Thread | None = None
        self._lock = threading.Lock()
        os.register_at_fork(after_in_child=functools.partial(_forget, weakref.ref(self)))

    def _forget_after_fork(self) -> None:
        INHERITED_AT_FORK.append((self._loop, self._thread))
        self._loop = None
        self._thread = None
        self._lock = threading.Lock()

    @property
    def loop(self) -> asyncio.AbstractEventLoop:
        with self._lock:
            if self._loop is None:
                loop = asyncio.new_event_loop()
                ready = threading.Event()

                def run() -> None:
                    asyncio.set_event_loop(loop)
                    loop.call_soon(ready.set)
                    loop.run_forever()

                self._thread = threading.Thread(target=run, name=self._name, daemon=True)
                self._thread.start()
                ready.wait()
                self._loop = loop
            return self._loop

    @property
    def started(self) -> bool:
        """Whether the loop thread was ever started (and not closed since)."""
        return self._loop is not None

    def run(self, coro: Coroutine[Any, Any, T]) -> T:
        """Run ``coro`` on the portal loop and return its result (blocking)."""
        try:
            running = asyncio.get_running_loop()
        except RuntimeError:
            running = None
        if running is not None and running is self._loop:
            coro.close()
            raise ConfigurationError("sync API called from inside the portal loop")
        return asyncio.run_coroutine_threadsafe(coro, self.loop).result()

    def close(self) -> None:
        with self._lock:
            loop, thread = self._loop, self._thread
            self._loop = self._thread = None
        if loop is not None and thread is not None:
            loop.call_soon_threadsafe(loop.stop)
            thread.join(timeout=5)
            loop.close()


def _forget(ref: weakref.ref[Portal]) -> None:
    portal = ref()
    if portal is not None:
        portal._forget_after_fork()
