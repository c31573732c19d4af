"""Cancels of running tasks, heard through the wake-up channel.

A cancel of a running task only flags it in the store; its worker learns of
it from its next heartbeat (a third of a lease later, 10 s by default) or,
much sooner, from a :class:`~conveyor.backends.params.CancelHint` on the
wake-up channel (PostgreSQL: NOTIFY on the cancel channel; SQLite: at once
in the cancelling process, and within ~10 ms in the others; memory: at
once). A hint is only a hint: this component asks the store which of the
leases it holds were cancelled (one read, bounded in time) and hands those
to the worker to stop. Hints that arrive while a check is under way are
folded into the next one, and checks are at least ``MIN_INTERVAL`` apart,
so a stream of hints (a busy SQLite file) costs a few reads a second.
"""

from __future__ import annotations

import asyncio
import logging
import time
from collections.abc import Callable, Sequence
from dataclasses import dataclass

from conveyor.backends.protocol import Backend
from conveyor.model import LeaseToken
from conveyor.worker.outage import Outage
from conveyor.worker.stopping import cancel_and_wait
from conveyor.worker.texts import reason

log = logging.getLogger("conveyor.worker.cancels")

MIN_INTERVAL = 0.1
"""Seconds between two checks, however many hints arrive."""
CHECK_TIMEOUT = 5.0
"""Seconds a check may take before it is given up (the heartbeat remains)."""


@dataclass(frozen=True, slots=True)
class CancelConfig:
    worker_id: str
    min_interval: float = MIN_INTERVAL
    timeout: float = CHECK_TIMEOUT


class CancelWatch:
    """Start/stop component; ``run_once`` does one check (for tests)."""

    def __init__(
        self,
        config: CancelConfig,
        backend: Backend,
        held: Callable[[], Sequence[LeaseToken]],
        on_cancelled: Callable[[frozenset[LeaseToken]], None],
        outage: Outage | None = None,
    ) -> None:
        self.config = config
        self.outage = outage if outage is not None else Outage()
        self._backend = backend
        self._held = held
        self._on_cancelled = on_cancelled
        self._wanted: set[int] | None = set()
        """Task ids hinted since the last check; None: any held task."""
        self._hinted = asyncio.Event()
        self._task: asyncio.Task[None] | None = None
        self.checks = 0

    def hint(self, task_id: int | None) -> None:
        """A cancel hint arrived: check ``task_id`` (None: every held task)
        soon, if this worker holds it."""
        if task_id is None:
            self._wanted = None
        elif self._wanted is not None:
            self._wanted.add(task_id)
        self._hinted.set()

    def start(self) -> None:
        self._task = asyncio.get_running_loop().create_task(
            self._run(), name="conveyor-cancel-watch"
        )

    async def stop(self) -> None:
        if self._task is not None:
            await cancel_and_wait(self._task)

    async def run_once(self) -> frozenset[LeaseToken]:
        """Check the hinted leases now; stop (report) those cancelled."""
        wanted, self._wanted = self._wanted, set()
        self._hinted.clear()
        tokens = [t for t in self._held() if wanted is None or t.task_id in wanted]
        if not tokens:
            return frozenset()
        self.checks += 1
        try:
            async with asyncio.timeout(self.config.timeout):
                found = await self._backend.cancel_requested(self.config.worker_id, tokens)
        except Exception as exc:  # the heartbeat still reports cancels
            # An outage is logged by the parts that report it; the heartbeat
            # reports cancels anyway.
            level = logging.DEBUG if self.outage.down else logging.WARNING
            log.log(level, "cannot check for cancels: %s", reason(exc))
            return frozenset()
        if found:
            self._on_cancelled(found)
        return found

    async def _run(self) -> None:
        last = float("-inf")
        while True:
            await self._hinted.wait()
            wait = last + self.config.min_interval - time.monotonic()
            if wait > 0:
                await asyncio.sleep(wait)
            last = time.monotonic()
            await self.run_once()
