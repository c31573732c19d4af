"""Helpers for users' tests: run queued tasks in the test's own process.

``drain(app)`` runs a worker in burst mode until no task of the app's (or
the given) queues is due or running, and returns how many attempts it ran.
It works on every backend; with the in-memory backend
(``memory://NAME``) a test needs no database at all::

    app = conveyor.App("memory://tests")
    signup(user)                      # your code, which enqueues
    assert conveyor.testing.drain(app) == 1

Inline mode (``memory://NAME?inline=true``) drains after every enqueue, so
code under test sees its tasks done when ``enqueue`` returns. An enqueue
made by a task that is itself running inline is run by the same drain.

Limits: only due tasks run. A retry whose backoff has not elapsed, or a task
delayed into the future, stays pending (give test retry policies
``initial_interval=0``). A failing task does not raise at enqueue: its
handle's ``result()`` raises, as it would in production.
"""

from __future__ import annotations

from collections.abc import Sequence

from conveyor.app import App
from conveyor.worker.drain import drain_registry


async def drain_async(
    app: App, *, queues: Sequence[str] | None = None, concurrency: int = 1
) -> int:
    """Async form of :func:`drain`."""
    return await drain_registry(app, queues=queues, concurrency=concurrency)


def drain(app: App, *, queues: Sequence[str] | None = None, concurrency: int = 1) -> int:
    """Run every due task of ``queues`` (default: all the app's queues), and
    the tasks they enqueue, until none is due or running; return how many
    attempts ran. ``concurrency`` 1 runs them one at a time, in claim order."""
    return app.portal.run(drain_async(app, queues=queues, concurrency=concurrency))


__all__ = ["drain", "drain_async"]
