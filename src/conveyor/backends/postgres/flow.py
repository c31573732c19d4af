"""Flow control and retention on PostgreSQL: pauses and pruning.

A mixin of :class:`~conveyor.backends.postgres.backend.PostgresBackend`:
each method is one statement of ``queries.sql`` run through the backend's
``_fetchall``. The claims read the ``pauses`` table themselves (see
``part_served_queues``), so a pause holds from its commit on.
"""

from __future__ import annotations

from collections.abc import Mapping
from datetime import datetime
from typing import Any

from conveyor.backends.protocol import PruneParams, PruneResult
from conveyor.model import Pause, PauseKind, check_pause


class FlowControl:
    """Pause, resume, list pauses, prune (see :class:`~conveyor.backends.protocol.Backend`)."""

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

    async def prune(self, params: PruneParams) -> PruneResult:
        held, tasks, workers = (await self._fetchall("prune", _prune_args(params)))[0]
        return PruneResult(tasks=tasks, workers=workers, busy=not held)

    async def count_prunable(self, params: PruneParams) -> PruneResult:
        args = _prune_args(params)
        tasks = sum(count for _state, count in await self._fetchall("count_prunable", args))
        workers = 0
        if params.workers_before is not None:
            workers = (await self._fetchall("count_prunable_workers", args))[0][0]
        return PruneResult(tasks=tasks, workers=workers)


def _prune_args(params: PruneParams) -> dict[str, Any]:
    return {
        "states": [state.value for state in params.before],
        "befores": list(params.before.values()),
        "limit": params.limit,
        "workers_before": params.workers_before,
    }
