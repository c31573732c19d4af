"""A fake clock for tests: task time that moves only when a test moves it."""

from __future__ import annotations

import math
import threading
from datetime import UTC, datetime, timedelta

from conveyor.errors import ConfigurationError


class FakeClock:
    """A clock that stands still until told to move.

    A memory store bound to it (``conveyor.testing.in_memory(app,
    clock=clock)``, or the ``conveyor_clock`` fixture) takes all its time
    from it: when a task is due (``delay``, ``run_at``, a retry's back-off,
    a coroutine's ``sleep``, a workflow step's delay), when a lease
    expires, and the times it records. After ``advance(3600)`` the next
    :func:`~conveyor.testing.drain` runs what became due, without waiting.

    It starts at ``start`` (a timezone-aware datetime), else at the time it
    is made, and never goes back. It is the store's clock only: your own
    code's ``datetime.now()`` and the worker's timers (heartbeat, polling)
    keep real time. Leases follow it too: while it stands still no lease
    expires, and moving it past a lease while that task runs expires the
    lease, as a stalled worker's would (the attempt's completion is then
    refused and the task runs again). Move it between drains. Thread-safe.
    """

    def __init__(self, start: datetime | None = None) -> None:
        self._now = _aware(start) if start is not None else datetime.now(UTC)
        self._lock = threading.Lock()

    def __repr__(self) -> str:
        return f"<FakeClock {self.now().isoformat()}>"

    def now(self) -> datetime:
        """The clock's time: a timezone-aware UTC datetime."""
        with self._lock:
            return self._now

    def advance(self, by: float | timedelta) -> datetime:
        """Move forward by ``by`` (seconds, or a timedelta) and return the new
        time. Raises ConfigurationError for a negative or non-finite amount."""
        seconds = by.total_seconds() if isinstance(by, timedelta) else by
        if isinstance(seconds, bool) or not isinstance(seconds, int | float):
            raise ConfigurationError(f"advance() takes seconds or a timedelta, not {by!r}")
        if not math.isfinite(seconds) or seconds < 0:
            raise ConfigurationError(f"the clock only moves forward, not by {by!r}")
        with self._lock:
            self._now += timedelta(seconds=seconds)
            return self._now

    def move_to(self, when: datetime) -> datetime:
        """Move forward to ``when`` (a timezone-aware datetime) and return it.
        Raises ConfigurationError for a naive datetime or one before now."""
        target = _aware(when)
        with self._lock:
            if target < self._now:
                raise ConfigurationError(
                    f"the clock only moves forward: {target.isoformat()} is before "
                    f"{self._now.isoformat()}"
                )
            self._now = target
            return target


def _aware(when: datetime) -> datetime:
    if not isinstance(when, datetime) or when.tzinfo is None or when.utcoffset() is None:
        raise ConfigurationError(f"the clock needs a timezone-aware datetime, not {when!r}")
    return when.astimezone(UTC)
