"""Wake-up turns: which idle worker of a fleet answers a wake-up.

A wake-up (PostgreSQL's NOTIFY) reaches every idle worker of its queue. If
each answered with a claim, every enqueued task would cost one claim per
worker, all but one of them finding nothing, and a fleet of idle workers
would load the database more than the work does. So the workers of one kind
(the same queues and task names) on one store take turns, at a lock of the
store (:class:`~conveyor.backends.capabilities.TurnLock`):

- **The worker that holds the turn answers wake-ups** with a claim; the
  others let them pass. Taking the turn is itself answered with a claim,
  since wake-ups passed by while the worker waited for it.
- **A worker wants the turn while it has a free slot and its last claim
  came back short** (nothing more was due). It gives the turn back when
  either stops being true: with its slots full it could not answer, and a
  full claim means more work is queued, so the next worker in line takes
  the turn and claims too. A burst thus draws the idle workers in one by
  one, each claiming on its own while its claims come back full.
- **Every worker still polls** (``poll_interval`` after a short claim), so a
  turn held by a worker that froze (SIGSTOP, a GIL-holding call) delays
  tasks by at most the poll interval; it never loses one. A worker that dies
  or loses its connection gives its turn back with its session.
- **Fail open**: while its turn lock cannot be reached, a worker answers
  every wake-up, as without turns.

Limits: a turn lock is held by a session (on PostgreSQL, the session
connection that also listens: :mod:`conveyor.backends.postgres.session`),
and its waiters race for a turn given back. Only PostgreSQL has turns
(``Capability.TURNS``); on SQLite, Redis and memory every idle worker
answers each wake-up.
"""

from __future__ import annotations

import asyncio
import contextlib
import logging
from collections.abc import Callable, Sequence

from conveyor.backends.capabilities import TurnLock
from conveyor.worker.stopping import cancel_and_wait
from conveyor.worker.texts import reason

log = logging.getLogger("conveyor.worker")

RETRY_MIN = 0.1
RETRY_MAX = 5.0
"""Seconds between tries to reach a turn lock that failed (doubling)."""


def worker_kind(queues: Sequence[str], names: Sequence[str]) -> str:
    """What makes two workers interchangeable: their queues and task names."""
    return "\x1f".join(sorted(queues)) + "\x1e" + "\x1f".join(sorted(names))


class Turn:
    """One worker's place in its kind's wake-up turns.

    ``want(flag)`` says whether the worker could answer a wake-up now;
    ``answers`` whether it should; ``on_take`` runs each time it takes the
    turn (the worker then claims)."""

    def __init__(self, lock: TurnLock, on_take: Callable[[], None]) -> None:
        self._lock = lock
        self._on_take = on_take
        self._wanted = asyncio.Event()
        self._unwanted = asyncio.Event()
        self._unwanted.set()
        self.held = False
        self.failing = False
        """The turn lock failed and has not been taken since: answer everything."""
        self.taken = 0
        """Turns taken so far."""
        self._task: asyncio.Task[None] | None = None

    @property
    def answers(self) -> bool:
        """Whether this worker answers wake-ups now."""
        return self.held or self.failing

    def want(self, flag: bool) -> None:
        if flag:
            self._unwanted.clear()
            self._wanted.set()
        else:
            self._wanted.clear()
            self._unwanted.set()

    def start(self) -> None:
        self._task = asyncio.get_running_loop().create_task(self._run(), name="conveyor-turn")

    async def stop(self) -> None:
        self.want(False)
        if self._task is not None:
            await cancel_and_wait(self._task)
        with contextlib.suppress(Exception):
            await self._lock.close()

    async def _run(self) -> None:
        delay = RETRY_MIN
        while True:
            await self._wanted.wait()
            try:
                await self._lock.take()
            except Exception as exc:
                if not self.failing:
                    log.warning(
                        "wake-up turns unavailable (%s): answering every wake-up", reason(exc)
                    )
                self.failing = True
                await asyncio.sleep(delay)
                delay = min(delay * 2, RETRY_MAX)
                continue
            if self.failing:
                log.info("wake-up turns available again")
            self.failing = False
            delay = RETRY_MIN
            self.held = True
            self.taken += 1
            try:
                if self._wanted.is_set():
                    self._on_take()
                    await self._unwanted.wait()
            finally:
                self.held = False
            with contextlib.suppress(Exception):  # a failed give ends the session: given
                await self._lock.give()
