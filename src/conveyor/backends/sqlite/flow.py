"""Flow control and retention on SQLite: pauses and pruning.

A mixin of :class:`~conveyor.backends.sqlite.backend.SQLiteBackend`. The
claim reads the paused queues and names in its own write transaction
(:func:`served`), so a pause holds from its commit on.
"""

from __future__ import annotations

import dataclasses
import sqlite3
from datetime import datetime

from conveyor.backends import wake
from conveyor.backends.protocol import ClaimParams, PruneParams, PruneResult
from conveyor.backends.sqlite import rows
from conveyor.backends.sqlite.database import Database
from conveyor.backends.sqlite.statements import SQL, clock
from conveyor.model import Pause, PauseKind, check_pause


def served(conn: sqlite3.Connection, params: ClaimParams) -> ClaimParams:
    """``params`` without the queues and names that are paused."""
    paused = conn.execute(SQL["paused"]).fetchall()
    if not paused:
        return params
    queues = {name for kind, name in paused if kind == PauseKind.QUEUE}
    names = {name for kind, name in paused if kind == PauseKind.TASK}
    return dataclasses.replace(
        params,
        queues=[q for q in params.queues if q not in queues],
        names=[n for n in params.names if n not in names],
    )


class FlowControl:
    """Pause, resume, list pauses, prune (see :class:`~conveyor.backends.protocol.Backend`).

    A prune batch is one write transaction: SQLite has one writer at a
    time, so batches of several processes take turns (never ``busy``)."""

    _db: Database
    _wake_key: str

    async def pause(self, kind: PauseKind, name: str, now: datetime | None = None) -> bool:
        kind, name = check_pause(kind, name)

        def pause(conn: sqlite3.Connection) -> bool:
            args = {"kind": kind.value, "name": name, "now": clock(conn, now)}
            return conn.execute(SQL["pause"], args).fetchone() is not None

        return await self._db.write(pause)

    async def resume(self, kind: PauseKind, name: str) -> bool:
        kind, name = check_pause(kind, name)
        args = {"kind": kind.value, "name": name}
        resumed = await self._db.write(
            lambda conn: conn.execute(SQL["resume"], args).fetchone() is not None
        )
        if resumed:
            wake.notify_all(self._wake_key)
        return resumed

    async def list_pauses(self) -> list[Pause]:
        found = await self._db.read(lambda conn: conn.execute(SQL["list_pauses"]).fetchall())
        return [
            Pause(PauseKind(kind), name, rows.moment(at) or rows.EARLIEST)
            for kind, name, at in found
        ]

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
