"""Retention on PostgreSQL: prune, the counts of what prune would delete, vacuum.

A mixin of :class:`~conveyor.backends.postgres.backend.PostgresBackend`:
each method runs statements of sql/maintenance.sql. One prune at a time:
one that finds another under way does nothing and says ``busy``. A vacuum
runs on the tables the server's autovacuum leaves alone, and skips those it
cannot lock at once.
"""

from __future__ import annotations

from typing import Any

from psycopg import sql

from conveyor.backends.postgres.pools import Pools
from conveyor.records import PruneParams, PruneResult


class Maintenance(Pools):
    """``prune``, ``count_prunable`` and ``vacuum`` (see
    :class:`~conveyor.backends.protocol.Backend`,
    :class:`~conveyor.backends.capabilities.Inspector` and
    :class:`~conveyor.backends.capabilities.Vacuums`)."""

    async def prune(self, params: PruneParams) -> PruneResult:
        held, tasks, workers = (await self._fetchall("prune", _prune_args(params)))[0]
        return PruneResult(tasks=tasks, workers=workers, busy=not held)

    async def count_prunable(self, params: PruneParams) -> PruneResult:
        args = _prune_args(params)
        counts = await self._fetchall_scanning("count_prunable", args)
        tasks = sum(count for _state, count in counts)
        workers = 0
        if params.workers_before is not None:
            workers = (await self._fetchall("count_prunable_workers", args))[0][0]
        return PruneResult(tasks=tasks, workers=workers)

    async def vacuum(self) -> list[str]:
        done = []
        for (table,) in await self._fetchall("tables_to_vacuum", {"schema": self.schema}):
            target = sql.Identifier(self.schema, table)
            async with self._connection() as conn:
                await conn.execute(sql.SQL("vacuum (skip_locked, analyze) {}").format(target))
            done.append(str(table))
        return done


def _prune_args(params: PruneParams) -> dict[str, Any]:
    return {
        "states": [state.value for state in params.before],
        "befores": list(params.before.values()),
        "limit": params.limit,
        "workers_before": params.workers_before,
    }
