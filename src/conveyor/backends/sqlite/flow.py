"""Flow control on SQLite: pauses.

A mixin of :class:`~conveyor.backends.sqlite.backend.SQLiteBackend`. The
claim reads the paused queues and names in its own write transaction
(:func:`served`), so a pause holds from its commit on.
"""

from __future__ import annotations

import dataclasses
import sqlite3
from datetime import datetime

from conveyor.backends import wake
from conveyor.backends.protocol import ClaimParams
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
    """Pause, resume and list pauses (see :class:`~conveyor.backends.protocol.Backend`)."""

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
