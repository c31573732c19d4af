"""Put an app on a fresh memory store for a while: :func:`in_memory`."""

from __future__ import annotations

import contextlib
import itertools
import threading
from collections.abc import Iterator
from typing import Protocol, TypeVar, runtime_checkable

from conveyor.client import Client
from conveyor.testing.clock import FakeClock

C = TypeVar("C", bound=Client)

STORE_PREFIX = "conveyor-test-"
"""Memory stores of :func:`in_memory` are named ``memory://conveyor-test-N``."""

_numbers = itertools.count(1)
_free: list[str] = []
_free_lock = threading.Lock()


@runtime_checkable
class _Clocked(Protocol):
    """A backend whose clock a test can set (the memory backend)."""

    def set_clock(self, clock: FakeClock | None) -> None: ...

    async def destroy(self) -> None: ...


@contextlib.contextmanager
def in_memory(app: C, *, clock: FakeClock | None = None, inline: bool = False) -> Iterator[C]:
    """Bind ``app`` (an App or a Client) to a fresh, empty memory store for
    the ``with`` block, then back to the store it had::

        with conveyor.testing.in_memory(myproject.tasks.app) as app:
            myproject.signup("ada@example.com")       # enqueues on the memory store
            assert conveyor.testing.drain(app) == 1

    For apps created at import time (``App(os.environ.get(...))``): no
    environment variable needs setting before the import. With ``clock``,
    the store takes its time from that :class:`FakeClock`; with ``inline``,
    every enqueue runs its tasks before it returns (``memory://NAME?inline=true``).

    The store is emptied and forgotten at the end of the block, and its
    name reused by a later block. Do not start a worker of the app inside
    the block that outlives it, and do not nest two blocks for one app.
    Another app, or a ``Client`` of the store's URL (``app.url``), sees the
    same store. Raises ConfigurationError if called from the app's own
    event loop thread (a task handler that runs on it).
    """
    name = _take_name()
    previous = app.url
    try:
        app.use(f"memory://{name}?inline=true" if inline else f"memory://{name}")
        store = app.make_backend()
        assert isinstance(store, _Clocked)  # a memory URL makes a memory backend
        if clock is not None:
            store.set_clock(clock)
        try:
            yield app
        finally:
            store.set_clock(None)
            app.portal.run(store.destroy())
            app.use(previous)
    finally:
        with _free_lock:
            _free.append(name)


def _take_name() -> str:
    """A store name no other :func:`in_memory` block uses now."""
    with _free_lock:
        if _free:
            return _free.pop()
    return f"{STORE_PREFIX}{next(_numbers)}"
