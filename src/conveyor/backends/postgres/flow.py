"""Flow control on PostgreSQL: pauses and schedules.

A mixin of :class:`~conveyor.backends.postgres.backend.PostgresBackend`:
each method is one statement of sql/flow.sql run through ``_fetchall``, or
a few in one transaction (a schedules' sync, a schedule's firing). The
claims read the ``pauses`` table themselves (see ``part_served``), so a
pause holds from its commit on. Concurrency keys, rate limits and unique
keys are read and written by the enqueues and claims that use them
(sql/flow.sql, :mod:`.enqueue`, :mod:`.attempts`).
"""

from __future__ import annotations

from datetime import datetime

from conveyor.backends.params import FireParams, ScheduleSync
from conveyor.backends.postgres.enqueue import insert_tasks
from conveyor.backends.postgres.pools import Pools
from conveyor.backends.stored import schedule_args
from conveyor.model import Pause, PauseKind, check_pause
from conveyor.records import StoredSchedule


class FlowControl(Pools):
    """Pause, resume, list pauses; sync, list and fire schedules (see
    :class:`~conveyor.backends.protocol.Backend`)."""

    async def sync_schedules(self, params: ScheduleSync) -> bool:
        release = {
            "release": params.release,
            "tasks": list(dict.fromkeys(params.tasks)),
            "now": params.now,
            "lifetime": params.lifetime,
        }
        async with self._connection() as conn, conn.transaction():
            cursor = await conn.execute(self.sql["sync_release"], release)
            generation, superseded = (await cursor.fetchall())[0]
            if superseded:
                return False
            fence = {**release, "generation": generation}
            for stored in params.schedules:
                await conn.execute(
                    self.sql["sync_schedule"], {**schedule_args(stored, params.now), **fence}
                )
            await conn.execute(
                self.sql["drop_schedules"], {**fence, "names": [s.name for s in params.schedules]}
            )
            return True

    async def list_schedules(self) -> tuple[datetime, list[StoredSchedule]]:
        rows = await self._fetchall("list_schedules", {})
        if not rows:
            return (await self._fetchall("store_clock", {}))[0][0], []
        return rows[0][-1], [StoredSchedule(*row[:-1]) for row in rows]

    async def fire_schedule(self, params: FireParams) -> list[int]:
        if not params.slots:
            return []
        args = {
            "name": params.name,
            "fingerprint": params.fingerprint,
            "first": params.slots[0],
            "last": params.slots[-1],
        }
        async with self._connection() as conn, conn.transaction():
            cursor = await conn.execute(self.sql["fire_schedule"], args)
            if await cursor.fetchone() is None:
                return []
            ids = await insert_tasks(conn, self.sql, params.tasks, None)
            if ids:
                await conn.execute(
                    self.sql["fired_task"], {"name": params.name, "task_id": ids[-1]}
                )
            return ids

    async def pause(self, kind: PauseKind, name: str, now: datetime | None = None) -> bool:
        kind, name = check_pause(kind, name)
        rows = await self._fetchall("pause", {"kind": kind.value, "name": name, "now": now})
        return bool(rows)

    async def resume(self, kind: PauseKind, name: str) -> bool:
        kind, name = check_pause(kind, name)
        rows = await self._fetchall("resume", {"kind": kind.value, "name": name})
        return bool(rows and rows[0][0])

    async def list_pauses(self) -> list[Pause]:
        rows = await self._fetchall("list_pauses", {})
        return [Pause(PauseKind(kind), name, paused_at) for kind, name, paused_at in rows]
