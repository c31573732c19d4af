"""The SQLite backend: one file, several worker processes on one machine.

Guarantees: the same contract as PostgreSQL for leases, fencing, the attempt
log, the crash budget, cancel and timeouts. Every write is one ``BEGIN
IMMEDIATE`` transaction, so a claim, its attempt rows and any reclaim it
does commit together or not at all; SQLite's clock rules lease expiry.

Limits, stated plainly: one writer at a time (writes from all processes
queue on the file's lock, which bounds throughput); processes must share
one machine and a local disk (SQLite's locks do not work over network file
systems); no attempt transactions (a handler holding the write lock for its
whole run would stall every other worker's heartbeats). Idle workers wake
at once for enqueues made in their own process, and within about 10 ms for
commits made by other processes (they watch ``PRAGMA data_version``).

Dependencies (``NewTask.after``) are settled by a trigger (migration 0016)
in the transaction of whatever statement ends a task, a chain of ends by
policy included, at that statement's clock. A write that ends a task with
dependents wakes every idle worker of its process (the trigger cannot say
which queues it released).
"""

from __future__ import annotations

import asyncio
import os
import sqlite3
from collections.abc import AsyncIterator, Sequence
from typing import Any

from conveyor.backends import wake
from conveyor.backends.params import CancelHint, Wakeup
from conveyor.backends.protocol import Capability
from conveyor.backends.sqlite.attempts import Attempts
from conveyor.backends.sqlite.controls import Controls
from conveyor.backends.sqlite.database import (
    DEFAULT_BUSY_TIMEOUT,
    SYNCHRONOUS,
    Database,
    check_version,
    connect,
)
from conveyor.backends.sqlite.enqueue import Enqueuing
from conveyor.backends.sqlite.flow import FlowControl
from conveyor.backends.sqlite.maintenance import Maintenance
from conveyor.backends.sqlite.messages import Messages
from conveyor.backends.sqlite.reads import Listings
from conveyor.backends.sqlite.schema import Schema
from conveyor.backends.sqlite.statements import SQL
from conveyor.backends.sqlite.workers import Workers
from conveyor.backends.sweep import DEFAULT_SWEEP_INTERVAL, Sweep
from conveyor.errors import ConfigurationError

CHANGE_POLL_INTERVAL = 0.01
"""Seconds between checks for commits made by other processes (wake-ups),
once none has come for ``CHANGE_BUSY_WINDOW``."""
CHANGE_POLL_BUSY = 0.002
"""Seconds between those checks within ``CHANGE_BUSY_WINDOW`` of the last
commit seen: while work keeps coming, a commit is seen within 2 ms."""
CHANGE_BUSY_WINDOW = 1.0


class SQLiteBackend(
    Schema,
    Enqueuing,
    Attempts,
    Messages,
    Controls,
    FlowControl,
    Workers,
    Maintenance,
    Listings,
):
    """Tasks in a SQLite file (``sqlite:///relative.db``, ``sqlite:////abs.db``).

    ``migrate`` says what :meth:`open` does: True applies the pending
    migrations (creating the file at first use), False refuses a file that
    does not exist or is behind (StoreNotReadyError) and creates nothing,
    None only opens the file (creating it).

    Each section of the store is a mixin over the one :class:`Database` (see
    the modules of the same names); this class opens and closes it and
    watches for wake-ups."""

    capabilities = frozenset(
        {Capability.TRANSACTIONAL_ENQUEUE, Capability.NOTIFICATIONS, Capability.INSPECT}
    )

    def __init__(
        self,
        path: str,
        *,
        busy_timeout: float = DEFAULT_BUSY_TIMEOUT,
        synchronous: str = "full",
        migrate: bool | None = True,
        sweep_interval: float = DEFAULT_SWEEP_INTERVAL,
        **_options: Any,
    ) -> None:
        check_version()
        if not path or path == ":memory:" or path.startswith("file:"):
            raise ConfigurationError(
                f"SQLite needs a file path, not {path!r}; for a store in memory use memory://NAME"
            )
        if synchronous not in SYNCHRONOUS:
            raise ConfigurationError(f"synchronous must be one of {', '.join(SYNCHRONOUS)}")
        if busy_timeout < 0:
            raise ConfigurationError("busy_timeout must be >= 0 seconds")
        self.path = os.path.abspath(path)
        self._busy_timeout = busy_timeout
        self._synchronous = synchronous
        self._auto_migrate = migrate
        self._sweep = Sweep(sweep_interval)
        self._wake_key = f"sqlite:{os.path.realpath(self.path)}"
        self._db = Database(self.path, busy_timeout, synchronous)

    async def open(self) -> None:
        """Open the file (creating it) and apply the pending migrations; with
        ``migrate=False``, refuse a file that does not exist or is behind,
        read on a read-only connection first: neither created nor changed
        (a file of another program is not even switched to WAL). Nothing
        is left open when it raises."""
        if self._auto_migrate is False:
            await asyncio.to_thread(self._require_file)
        await self._db.open()
        if not self._auto_migrate:
            return
        try:
            await self.migrate()
        except BaseException:
            await self.close()
            raise

    async def close(self) -> None:
        await self._db.close()

    # -- wake-ups --------------------------------------------------------

    async def wakeups(
        self, queues: Sequence[str], handoffs_for: tuple[str, str] | None = None
    ) -> AsyncIterator[Wakeup]:
        """Every queue once at the start; then enqueues (and cancels) of this
        process at once, and commits of other processes (a change of ``PRAGMA
        data_version``) within CHANGE_POLL_BUSY while commits keep coming,
        CHANGE_POLL_INTERVAL after a quiet second: every queue, and a
        CancelHint without an id (the commit may have been a cancel; the
        worker reads whether its tasks' were). The checks cost a few
        microseconds each, on this event loop."""
        subscription = wake.Subscription(self._wake_key, queues)
        try:
            watcher = connect(self.path, self._busy_timeout, self._synchronous)
        except BaseException:
            subscription.close()
            raise
        nearby: asyncio.Future[Wakeup] | None = None
        try:
            version = self._data_version(watcher)
            for queue in queues:
                yield queue
            nearby = asyncio.ensure_future(subscription.next())
            loop = asyncio.get_running_loop()
            changed_at = float("-inf")
            while True:
                busy = loop.time() - changed_at < CHANGE_BUSY_WINDOW
                await asyncio.wait(
                    {nearby}, timeout=CHANGE_POLL_BUSY if busy else CHANGE_POLL_INTERVAL
                )
                if nearby.done():
                    yield nearby.result()
                    nearby = asyncio.ensure_future(subscription.next())
                    continue
                current = self._data_version(watcher)
                if current != version:
                    version, changed_at = current, loop.time()
                    for queue in queues:
                        yield queue
                    yield CancelHint()
        finally:
            if nearby is not None:
                nearby.cancel()
            subscription.close()
            watcher.close()

    @staticmethod
    def _data_version(conn: sqlite3.Connection) -> int | None:
        try:
            version: int = conn.execute(SQL["data_version"]).fetchone()[0]
        except sqlite3.Error:
            return None  # busy or gone for a moment: compare again next time
        return version
