"""In-process wake-ups: an enqueue tells idle workers of this process at once.

Backends without a server-side notification channel (SQLite, memory) use
this registry, keyed by what identifies their store (a database file, a
store name). ``notify`` may be called from any thread; every subscription
gets the queue name on its own event loop, and ``notify_cancel`` a
:class:`~conveyor.backends.params.CancelHint`. A wake-up is a hint: a
worker that misses one still finds the work at its next poll, and the
cancel at its next heartbeat.
"""

from __future__ import annotations

import asyncio
import contextlib
import threading
from collections.abc import AsyncIterator, Iterable, Sequence

from conveyor.backends.params import CancelHint, Wakeup

_subscriptions: dict[str, set[Subscription]] = {}
_lock = threading.Lock()


class Subscription:
    """Wake-ups for ``queues`` on ``key``, delivered to the running loop.

    Registered when created, so nothing notified afterwards is missed.
    """

    def __init__(self, key: str, queues: Sequence[str]) -> None:
        self.key = key
        self.queues = frozenset(queues)
        self._loop = asyncio.get_running_loop()
        self._inbox: asyncio.Queue[Wakeup] = asyncio.Queue()
        with _lock:
            _subscriptions.setdefault(key, set()).add(self)

    def _deliver(self, wakeup: Wakeup) -> None:
        if isinstance(wakeup, CancelHint) or wakeup in self.queues:
            with contextlib.suppress(RuntimeError):  # its loop has closed
                self._loop.call_soon_threadsafe(self._inbox.put_nowait, wakeup)

    async def next(self) -> Wakeup:
        """The next queue name (or cancel hint) notified."""
        return await self._inbox.get()

    def close(self) -> None:
        with _lock:
            found = _subscriptions.get(self.key)
            if found is not None:
                found.discard(self)
                if not found:
                    del _subscriptions[self.key]


def notify(key: str, queues: Iterable[str]) -> None:
    """Wake every subscription on ``key`` that serves one of ``queues``."""
    with _lock:
        subscribed = list(_subscriptions.get(key, ()))
    if subscribed:
        for queue_name in set(queues):
            for subscription in subscribed:
                subscription._deliver(queue_name)


def notify_all(key: str) -> None:
    """Wake every subscription on ``key`` for each queue it serves (the
    caller does not know which queues have new work)."""
    with _lock:
        subscribed = list(_subscriptions.get(key, ()))
    for subscription in subscribed:
        for queue_name in subscription.queues:
            subscription._deliver(queue_name)


def notify_cancel(key: str, task_ids: Iterable[int | None]) -> None:
    """Tell every subscription on ``key`` that these running tasks' cancels
    were requested (None: some task's, which one is not known)."""
    with _lock:
        subscribed = list(_subscriptions.get(key, ()))
    for task_id in task_ids:
        for subscription in subscribed:
            subscription._deliver(CancelHint(task_id))


async def listen(key: str, queues: Sequence[str]) -> AsyncIterator[Wakeup]:
    """Every queue once (work may have arrived before we listened), then each
    queue name ``notify`` names on ``key``."""
    subscription = Subscription(key, queues)
    try:
        for queue_name in queues:
            yield queue_name
        while True:
            yield await subscription.next()
    finally:
        subscription.close()
