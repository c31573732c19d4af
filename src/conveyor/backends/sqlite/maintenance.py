"""Retention on SQLite: prune, and counts of what prune would delete.

:class:`Maintenance` is the section of
:class:`~conveyor.backends.sqlite.backend.SQLiteBackend` that does it. A
prune batch is one write transaction: SQLite has one writer at a time, so
batches of several processes take turns (never ``busy``). There is no
vacuum (the capability is PostgreSQL's): SQLite reuses a file's free pages
for later writes.
"""

from __future__ import annotations

import sqlite3

from conveyor.backends.sqlite import rows
from conveyor.backends.sqlite.database import Database
from conveyor.backends.sqlite.statements import SQL
from conveyor.records import PruneParams, PruneResult


class Maintenance:
    """``prune`` (see :class:`~conveyor.backends.protocol.Backend`) and
    ``count_prunable`` (see :class:`~conveyor.backends.capabilities.Inspector`)."""

    _db: Database

    async def prune(self, params: PruneParams) -> PruneResult:
        def prune(conn: sqlite3.Connection) -> PruneResult:
            left = params.limit
            for state, before in params.before.items():
                if left <= 0:
                    break
                args = {"state": state.value, "before": rows.seconds(before), "limit": left}
                left -= len(conn.execute(SQL["prune_tasks"], args).fetchall())
            workers = 0
            if params.workers_before is not None:
                args = {"workers_before": rows.seconds(params.workers_before)}
                workers = len(conn.execute(SQL["prune_workers"], args).fetchall())
            return PruneResult(tasks=params.limit - left, workers=workers)

        return await self._db.write(prune)

    async def count_prunable(self, params: PruneParams) -> PruneResult:
        def count(conn: sqlite3.Connection) -> PruneResult:
            tasks = 0
            for state, before in params.before.items():
                args = {"state": state.value, "before": rows.seconds(before)}
                tasks += conn.execute(SQL["count_prunable"], args).fetchone()[0]
            workers = 0
            if params.workers_before is not None:
                args = {"workers_before": rows.seconds(params.workers_before)}
                workers = conn.execute(SQL["count_prunable_workers"], args).fetchone()[0]
            return PruneResult(tasks=tasks, workers=workers)

        return await self._db.read(count)
