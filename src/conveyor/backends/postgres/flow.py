"""Flow control on PostgreSQL: pauses (and the controls that come with them).

A mixin of :class:`~conveyor.backends.postgres.backend.PostgresBackend`:
each method is one statement of ``queries.sql`` run through the backend's
``_fetchall``. The claims read the ``pauses`` table themselves (see
``part_served_queues``), so a pause holds from its commit on.
"""

from __future__ import annotations

from collections.abc import Mapping
from datetime import datetime
from typing import Any

from conveyor.model import Pause, PauseKind, check_pause


class FlowControl:
    """Pause, resume and list pauses (see :class:`~conveyor.backends.protocol.Backend`)."""

    async def _fetchall(self, name: str, args: Mapping[str, Any]) -> list[tuple[Any, ...]]:
        raise NotImplementedError  # the backend's own

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
