"""Helpers for testing your own tasks (see docs/testing.md).

- :func:`drain` (and :func:`drain_async`) runs a worker in burst mode in
  the test's process until no task of the app's (or the given) queues is
  due or running, and returns how many attempts it ran. It works on every
  backend; with the memory backend (``memory://NAME``) a test needs no
  database::

      app = conveyor.App("memory://tests")
      signup(user)                      # your code, which enqueues
      assert conveyor.testing.drain(app) == 1

- :func:`in_memory` binds an app created at import time to a fresh memory
  store for a ``with`` block, optionally with a :class:`FakeClock`, the
  store's time that moves only when the test moves it (``advance(3600)``
  makes an hour of delays and back-offs due, with no real waiting).
- :func:`enqueued`, :func:`assert_enqueued` and :func:`assert_not_enqueued`
  look at the pending tasks of one task definition.
- The pytest plugin (:mod:`conveyor.testing.plugin`, loaded by pytest
  itself once conveyor is installed) gives the ``conveyor_app`` and
  ``conveyor_clock`` fixtures.

Inline mode (``memory://NAME?inline=true``, or ``in_memory(app,
inline=True)``) drains after every enqueue, so code under test sees its
tasks done when ``enqueue`` returns. An enqueue made by a task that is
itself running inline is run by the same drain.

Limits: only due tasks run. A retry whose back-off has not elapsed, or a
task delayed into the future, stays pending until the clock reaches it
(real time, or a :class:`FakeClock` moved forward). A failing task does not
raise at enqueue or drain: its handle's ``result()`` raises, as it would in
production. A frozen ``time.monotonic`` (freezegun's default
``freeze_time()``) makes :func:`drain` and inline mode raise
ConfigurationError: the worker's timers would never fire.
"""

from __future__ import annotations

from conveyor.testing.clock import FakeClock
from conveyor.testing.isolation import in_memory
from conveyor.testing.queued import (
    assert_enqueued,
    assert_not_enqueued,
    enqueued,
    enqueued_async,
)
from conveyor.testing.runs import drain, drain_async

__all__ = [
    "FakeClock",
    "assert_enqueued",
    "assert_not_enqueued",
    "drain",
    "drain_async",
    "enqueued",
    "enqueued_async",
    "in_memory",
]
