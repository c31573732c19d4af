"""Claims in flight: how many, how large, and what came of them.

A worker keeps at most two claims in flight, each for at most half its
slots, so the database prepares the next batch while the process starts the
last one. A second claim overlaps the first only while claims come back full:
a worker woken for one new task sends one claim, not two that race for it
(the loser's round trip would slow the winner's). The slots a claim asked
for are reserved until it returns: a worker never holds more tasks than it
has slots.
"""

from __future__ import annotations

import asyncio
import time
from collections.abc import Awaitable, Callable
from dataclasses import dataclass

from conveyor.backends.params import ClaimedTask

MAX_IN_FLIGHT = 2
RETRY_MIN = 0.1
RETRY_MAX = 5.0


@dataclass(frozen=True, slots=True)
class ClaimOutcome:
    """A claim that returned: its tasks, or why it failed."""

    limit: int
    sent_at: float
    """``time.monotonic()`` before the claim was sent: leases count from here."""
    result: list[ClaimedTask] | BaseException


class Claims:
    """The claims one worker has in flight."""

    def __init__(self, concurrency: int, on_done: Callable[[], None]) -> None:
        self.batch = max(1, (concurrency + 1) // 2)
        self.reserved = 0
        self.flowing = False
        """Whether the last claim that returned filled its limit: more work
        is likely queued, so a second claim may overlap the next."""
        self._on_done = on_done
        self._in_flight: dict[asyncio.Future[list[ClaimedTask]], tuple[int, float]] = {}

    def __len__(self) -> int:
        return len(self._in_flight)

    def size(self, free: int) -> int:
        """How many tasks the next claim asks for, with ``free`` slots unreserved."""
        return min(free, self.batch)

    def may_send(self, free: int) -> bool:
        """Whether to send a claim now: any free slot when none is in flight; a
        whole batch's worth to overlap one that is, while claims come back full."""
        if free <= 0 or len(self._in_flight) >= MAX_IN_FLIGHT:
            return False
        return not self._in_flight or (self.flowing and free >= self.batch)

    def send(self, claim: Callable[[int], Awaitable[list[ClaimedTask]]], free: int) -> None:
        """Start ``claim(limit)`` for the next batch; ``on_done`` runs when it returns."""
        limit = self.size(free)
        sent_at = time.monotonic()
        future = asyncio.ensure_future(claim(limit))
        future.add_done_callback(lambda _: self._on_done())
        self._in_flight[future] = (limit, sent_at)
        self.reserved += limit

    def collect(self) -> list[ClaimOutcome]:
        """The claims that returned since the last call, in the order sent."""
        done = []
        for future in [f for f in self._in_flight if f.done()]:
            limit, sent_at = self._in_flight.pop(future)
            self.reserved -= limit
            result: list[ClaimedTask] | BaseException
            if future.cancelled():
                result = asyncio.CancelledError("the claim was cancelled")
            else:
                result = future.exception() or future.result()
            self.flowing = not isinstance(result, BaseException) and len(result) >= limit
            done.append(ClaimOutcome(limit, sent_at, result))
        return done

    async def settle(self) -> list[ClaimOutcome]:
        """Wait for every claim in flight, then collect them."""
        if self._in_flight:
            await asyncio.wait(set(self._in_flight))
        return self.collect()


@dataclass
class Pace:
    """When to claim: whether work may be due, and the back-off after failures.

    Times are ``time.monotonic()``. A claim that comes back short means
    nothing more was due when it ran: nothing is due until a wake-up or
    ``poll_interval`` later. A wake-up that arrived while that claim was in
    flight may be about work it did not see, so it still counts. A failed
    claim is retried after a delay that doubles up to ``RETRY_MAX``."""

    poll_interval: float
    due: bool = True
    due_again_at: float = 0.0
    retry_at: float = 0.0
    retry_delay: float = RETRY_MIN
    hinted_at: float = float("-inf")

    def hinted(self, now: float) -> None:
        self.due = True
        self.hinted_at = now

    def failed(self, now: float) -> float:
        """Note a failed claim; the delay before the next."""
        delay = self.retry_delay
        self.retry_at = now + delay
        self.retry_delay = min(delay * 2, RETRY_MAX)
        return delay

    def returned(self, claimed: int, limit: int, sent_at: float, now: float) -> None:
        """Note a claim sent at ``sent_at`` that returned ``claimed`` of the
        ``limit`` tasks it asked for."""
        self.retry_delay = RETRY_MIN
        if claimed < limit and self.hinted_at < sent_at:
            self.due, self.due_again_at = False, now + self.poll_interval

    def may_claim(self, now: float) -> bool:
        if not self.due and now >= self.due_again_at:
            self.due = True
        return self.due and now >= self.retry_at

    def timeout(self, now: float) -> float | None:
        """How long to wait for a wake-up before claiming again (None: no limit)."""
        deadlines = [self.retry_at] if self.retry_at > now else []
        if not self.due:
            deadlines.append(self.due_again_at)
        return max(0.0, min(deadlines) - now) if deadlines else None
