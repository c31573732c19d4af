"""How often a claim also sweeps: looks for expired leases and stuck rows.

A sweep costs a claim more than the claim itself (a scan of the leases, the
quarantine's scan of the attempt counters), so the SQL backends can do it
on one claim per ``interval`` seconds instead of on every claim (the
default, 0: every claim sweeps). A worker's claims come often when it is
busy and once per poll interval when it is idle; a worker builds its
backend with ``sweep_interval`` equal to its poll interval, so that an
expired lease waits for a sweep no longer than it waits for an idle
worker's poll. The interval is measured on this process's monotonic
clock: it paces work, it decides nothing about leases.
"""

from __future__ import annotations

import contextlib
import time
from collections.abc import Iterator

from conveyor.model import check_duration

DEFAULT_SWEEP_INTERVAL = 0.0


class Sweep:
    """Says when the next claim sweeps (see the module docstring)."""

    def __init__(self, interval: float = DEFAULT_SWEEP_INTERVAL) -> None:
        self.interval = check_duration("sweep_interval", interval) or 0.0
        self._last = float("-inf")

    def due(self) -> bool:
        """True at most once per interval; the caller sweeps on this claim."""
        now = time.monotonic()
        if now - self._last < self.interval:
            return False
        self._last = now
        return True

    def missed(self) -> None:
        """The claim that was to sweep failed: the next claim sweeps."""
        self._last = float("-inf")

    @contextlib.contextmanager
    def turn(self) -> Iterator[bool]:
        """``with sweep.turn() as sweeping:`` around one claim: whether it
        sweeps; if the claim raises, the sweep is left to the next claim."""
        sweeping = self.due()
        try:
            yield sweeping
        except BaseException:
            if sweeping:
                self.missed()
            raise
