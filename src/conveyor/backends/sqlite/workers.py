"""The worker registry on SQLite: register, stop, list.

:class:`Workers` is the section of
:class:`~conveyor.backends.sqlite.backend.SQLiteBackend` that keeps it. A
worker's row says where it runs and what it serves; its heartbeat (see
:mod:`conveyor.backends.sqlite.attempts`) keeps the row's last-seen time,
and a row stays, stopped or silent, until prune removes it.
"""

from __future__ import annotations

import json
import sqlite3

from conveyor.backends.sqlite import rows
from conveyor.backends.sqlite.database import Database
from conveyor.backends.sqlite.statements import SQL, clock
from conveyor.records import WorkerInfo


class Workers:
    """``register_worker`` and ``stop_worker`` (see
    :class:`~conveyor.backends.protocol.Backend`), ``list_workers`` (see
    :class:`~conveyor.backends.capabilities.Inspector`)."""

    _db: Database

    async def register_worker(self, info: WorkerInfo) -> None:
        def register(conn: sqlite3.Connection) -> None:
            conn.execute(
                SQL["register_worker"],
                {
                    "now": clock(conn, None),
                    "id": info.id,
                    "host": info.host,
                    "pid": info.pid,
                    "queues": json.dumps(list(info.queues)),
                    "concurrency": info.concurrency,
                    "tasks": json.dumps(list(info.tasks)),
                    "beat_seconds": info.beat_seconds,
                },
            )

        await self._db.write(register)

    async def stop_worker(self, worker_id: str) -> None:
        await self._db.write(
            lambda conn: conn.execute(
                SQL["stop_worker"], {"id": worker_id, "now": clock(conn, None)}
            )
        )

    async def list_workers(self) -> list[WorkerInfo]:
        found = await self._db.read(lambda conn: conn.execute(SQL["list_workers"]).fetchall())
        return [rows.worker(row) for row in found]
