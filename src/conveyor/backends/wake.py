"""In-process wake-ups: an enqueue tells idle workers of this process at once.

Backends without a server-side notification channel (SQLite, memory) use
this registry, keyed by what identifies their store (a database file, a
store name). ``notify`` may be called from any thread; every listener gets
the queue name on its own event loop. A wake-up is a hint: a worker that
misses one still finds the work at its next poll.
"""

from __future__ import annotations

import asyncio
import contextlib
import threading
from collections.abc import AsyncGenerator, Iterable, Sequence

_listeners: dict[str, set[tuple[asyncio.AbstractEventLoop, asyncio.Queue[str]]]] = {}
_lock = threading.Lock()


def notify(key: str, queues: Iterable[str]) -> None:
    """Wake every listener on ``key`` that serves one of ``queues``."""
    with _lock:
        listeners = list(_listeners.get(key, ()))
    if not listeners:
        return
    for queue_name in set(queues):
        for loop, inbox in listeners:
            with contextlib.suppress(RuntimeError):  # its loop has closed
                loop.call_soon_threadsafe(inbox.put_nowait, queue_name)


async def listen(key: str, queues: Sequence[str]) -> AsyncGenerator[str, None]:
    """Yield a queue name of ``queues`` each time ``notify`` names it on ``key``."""
    wanted = set(queues)
    entry = (asyncio.get_running_loop(), asyncio.Queue[str]())
    with _lock:
        _listeners.setdefault(key, set()).add(entry)
    try:
        while True:
            queue_name = await entry[1].get()
            if queue_name in wanted:
                yield queue_name
    finally:
        with _lock:
            found = _listeners.get(key)
            if found is not None:
                found.discard(entry)
                if not found:
                    del _listeners[key]
