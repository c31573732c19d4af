"""The worker's pruner: deletes what its :class:`~conveyor.retention.Retention`
does not keep.

Every worker runs a :class:`Pruner` unless its config says
``retention=None``. After each prune it vacuums the store's tables if the
store needs it and its server will not (PostgreSQL with autovacuum off:
see :class:`~conveyor.backends.capabilities.Vacuums`). On PostgreSQL one
worker at a time prunes (the others find the batch ``busy`` and wait for
their next turn).

A batch deletes at most ``batch`` tasks in one short transaction that
passes by rows others hold locked, so claims and completions never queue
behind the pruner: they wait for no lock of it (on SQLite, one writer at
a time, for the batch under way). A backlog goes as fast as one connection
deletes it: full batches follow each other, yielding to the worker's own
claims and completions in between; every ``BATCHES_IN_A_ROW`` of them the
pruner vacuums if need be (the rows deleted so far slow the next batches
down until then) and pauses ``PRUNE_PAUSE``, which gives the writes of
other processes a turn on SQLite. A prune stops after ``MAX_BATCHES``; if that
left a backlog, the next one starts ``PRUNE_PAUSE`` later, not an
``interval`` later.

Not guaranteed: that the pruner keeps pace with any drain rate. One
connection deletes at a time; a drain faster than it deletes (thousands of
tasks a second per pruning store) makes the tables grow until the drain
slows down.
"""

from __future__ import annotations

import asyncio
import logging
import random
from datetime import UTC, datetime

from conveyor.backends.capabilities import capability_of
from conveyor.backends.protocol import Backend, Capability
from conveyor.records import PruneResult
from conveyor.retention import Retention
from conveyor.worker.stopping import Background
from conveyor.worker.texts import reason

log = logging.getLogger("conveyor.worker")

MAX_BATCHES = 100
"""Batches of one prune at most: a longer backlog is worked off by the next
prunes, ``PRUNE_PAUSE`` apart."""
BATCHES_IN_A_ROW = 10
"""Full batches back to back before a look at whether the store needs
vacuuming (each deleted row stays in the indexes a batch walks until it is
vacuumed away) and a ``PRUNE_PAUSE``."""
PRUNE_PAUSE = 0.05
"""Seconds of that pause, and between a prune that stopped at
``MAX_BATCHES`` and the next."""
FIRST_PRUNE_WITHIN = 5.0
"""A worker's first prune comes at a random moment of its first this many
seconds (or of its first ``interval``, if shorter): a worker that runs for
less than an interval (a burst, a crash loop, frequent deploys) still
prunes, and a fleet started at once does not prune all at one moment."""


class Pruner(Background):
    """The worker's pruner: soon after the worker starts (within
    ``FIRST_PRUNE_WITHIN``), then every ``interval`` (spread), batches until one
    deletes less than a full batch, or ``MAX_BATCHES`` (then again after
    ``PRUNE_PAUSE``: see :attr:`backlog`). Failures are logged and retried
    at the next turn; the pruner never stops the worker."""

    name = "conveyor-pruner"

    def __init__(self, backend: Backend, retention: Retention) -> None:
        self.backend = backend
        self.retention = retention
        self.pruned = 0
        """Tasks this pruner deleted so far."""
        self.backlog = False
        """Whether the last prune stopped at ``MAX_BATCHES``, every batch full:
        there is likely more to delete, and the next prune comes soon."""

    async def run_once(self, now: datetime | None = None) -> PruneResult:
        """One prune: its batches, until the backlog is gone, ``MAX_BATCHES``
        (:attr:`backlog` says which), or a batch is ``busy`` (another process
        prunes). What it deleted in all."""
        tasks = workers = 0
        self.backlog = False
        for number in range(MAX_BATCHES):
            moment = now if now is not None else datetime.now(UTC)
            params = self.retention.params(moment, workers=not number)  # workers: once
            done = await self.backend.prune(params)
            if done.busy:
                return PruneResult(tasks, workers, busy=True)
            tasks, workers = tasks + done.tasks, workers + done.workers
            if done.tasks < params.limit:
                break
            if number == MAX_BATCHES - 1:
                self.backlog = True
            elif number % BATCHES_IN_A_ROW == BATCHES_IN_A_ROW - 1:
                await self._vacuum()
                await asyncio.sleep(PRUNE_PAUSE)
            else:
                await asyncio.sleep(0)  # the worker's own claims and completions first
        self.pruned += tasks
        if tasks or workers:
            log.info("pruned %d finished task(s) and %d old worker(s)", tasks, workers)
        await self._vacuum()
        return PruneResult(tasks, workers)

    def first_pause(self) -> float:
        """Seconds from the worker's start to its first prune: a random
        moment of ``FIRST_PRUNE_WITHIN`` (or of the ``interval``, if shorter)."""
        return random.uniform(0.0, min(FIRST_PRUNE_WITHIN, self.retention.interval))

    def next_pause(self) -> float:
        """Seconds from a prune to the next: ``PRUNE_PAUSE`` after a prune
        that left a :attr:`backlog`, else the retention's ``interval`` ±20 %."""
        if self.backlog:
            return PRUNE_PAUSE
        return self.retention.interval * random.uniform(0.8, 1.2)

    async def _vacuum(self) -> None:
        """Vacuum what the store needs and its server will not (see
        :class:`~conveyor.backends.capabilities.Vacuums`)."""
        vacuums = capability_of(self.backend, Capability.VACUUM)
        if vacuums is not None:
            vacuumed = await vacuums.vacuum()
            if vacuumed:
                log.info("vacuumed %s (the server's autovacuum is off)", ", ".join(vacuumed))

    async def _loop(self) -> None:
        pause = self.first_pause()
        while True:
            await asyncio.sleep(pause)
            try:
                await self.run_once()
            except Exception as exc:
                self.backlog = False
                log.warning("prune failed (%s); trying again later", reason(exc))
            pause = self.next_pause()
