"""The worker's pruner: deletes what its :class:`~conveyor.retention.Retention`
does not keep.

Every worker runs a :class:`Pruner` unless its config says
``retention=None``. After each prune it vacuums the store's tables if the
store needs it and its server will not (PostgreSQL with autovacuum off:
see :class:`~conveyor.backends.protocol.Vacuums`). On PostgreSQL one
worker at a time prunes (the others find the batch ``busy`` and wait for
their next turn); a batch deletes at
most ``batch`` tasks in one short transaction, and batches are spaced by
``PRUNE_PAUSE`` seconds so claims and completions never queue behind the pruner.
"""

from __future__ import annotations

import asyncio
import logging
import random
from datetime import UTC, datetime

from conveyor.backends.protocol import Backend, PruneResult, vacuums_of
from conveyor.retention import Retention
from conveyor.worker.stopping import Background
from conveyor.worker.texts import reason

log = logging.getLogger("conveyor.worker")

PRUNE_PAUSE = 0.05
"""Seconds between two batches of one prune."""
MAX_BATCHES = 100
"""Batches of one prune at most: a backlog is worked off over several prunes."""
VACUUM_EVERY = 10
"""Batches between two looks at whether the store needs vacuuming: each
deleted row stays in the indexes a batch walks until it is vacuumed away."""


class Pruner(Background):
    """The worker's pruner: every ``interval`` (spread), batches until one
    deletes less than a full batch, or ``MAX_BATCHES``. Failures are logged
    and retried at the next turn; the pruner never stops the worker."""

    name = "conveyor-pruner"

    def __init__(self, backend: Backend, retention: Retention) -> None:
        self.backend = backend
        self.retention = retention
        self.pruned = 0
        """Tasks this pruner deleted so far."""

    async def run_once(self, now: datetime | None = None) -> PruneResult:
        """One prune: its batches, until the backlog is gone (or a batch is
        ``busy``: another process prunes). What it deleted in all."""
        tasks = workers = 0
        for number in range(MAX_BATCHES):
            moment = now if now is not None else datetime.now(UTC)
            params = self.retention.params(moment, workers=not number)  # workers: once
            done = await self.backend.prune(params)
            if done.busy:
                return PruneResult(tasks, workers, busy=True)
            tasks, workers = tasks + done.tasks, workers + done.workers
            if done.tasks < params.limit:
                break
            if number % VACUUM_EVERY == VACUUM_EVERY - 1:
                await self._vacuum()  # the rows deleted so far slow the next batches
            await asyncio.sleep(PRUNE_PAUSE)
        self.pruned += tasks
        if tasks or workers:
            log.info("pruned %d finished task(s) and %d old worker(s)", tasks, workers)
        await self._vacuum()
        return PruneResult(tasks, workers)

    async def _vacuum(self) -> None:
        """Vacuum what the store needs and its server will not (see
        :class:`~conveyor.backends.protocol.Vacuums`)."""
        vacuums = vacuums_of(self.backend)
        if vacuums is not None:
            vacuumed = await vacuums.vacuum()
            if vacuumed:
                log.info("vacuumed %s (the server's autovacuum is off)", ", ".join(vacuumed))

    async def _loop(self) -> None:
        while True:
            await asyncio.sleep(self.retention.interval * random.uniform(0.8, 1.2))
            try:
                await self.run_once()
            except Exception as exc:
                log.warning("prune failed (%s); trying again later", reason(exc))
