"""Run coroutines from synchronous code on one private event loop thread.

The sync client API (Django, Flask, scripts) goes through a portal: each
call is submitted to a daemon thread running an asyncio loop, so the sync
and async APIs share one implementation and one connection pool.
"""

from __future__ import annotations

import asyncio
import threading
from collections.abc import Coroutine
from typing import Any, TypeVar

from conveyor.errors import ConfigurationError

T = TypeVar("T")


class Portal:
    """A lazily started event loop in a daemon thread."""

    def __init__(self, name: str = "conveyor-portal") -> None:
        self._name = name
        self._loop: asyncio.AbstractEventLoop | None = None
        self._thread: threading.Thread | None = None
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
