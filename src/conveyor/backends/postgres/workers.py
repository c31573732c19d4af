"""The worker registry on PostgreSQL: register, stop, list.

A mixin of :class:`~conveyor.backends.postgres.backend.PostgresBackend`:
each method is one statement of sql/workers.sql. A worker that ends
without stopping stays listed as last seen, until a prune whose worker
cutoff is past that removes it (:mod:`.maintenance`).
"""

from __future__ import annotations

from conveyor.backends.postgres.pools import Pools
from conveyor.records import WorkerInfo


class Workers(Pools):
    """``register_worker``, ``stop_worker`` and ``list_workers`` (see
    :class:`~conveyor.backends.protocol.Backend`)."""

    async def register_worker(self, info: WorkerInfo) -> None:
        async with self._connection() as conn:
            await conn.execute(
                self.sql["register_worker"],
                {
                    "id": info.id,
                    "host": info.host,
                    "pid": info.pid,
                    "queues": list(info.queues),
                    "concurrency": info.concurrency,
                    "tasks": list(info.tasks),
                    "beat_seconds": info.beat_seconds,
                },
            )

    async def stop_worker(self, worker_id: str) -> None:
        async with self._connection() as conn:
            await conn.execute(self.sql["stop_worker"], {"id": worker_id})

    async def list_workers(self) -> list[WorkerInfo]:
        rows = await self._fetchall("list_workers", {})
        return [
            WorkerInfo(
                id=r[0],
                host=r[1],
                pid=r[2],
                queues=tuple(r[3]),
                concurrency=r[4],
                started_at=r[5],
                last_seen_at=r[6],
                stopped_at=r[7],
                tasks=tuple(r[8]),
                beat_seconds=r[9],
            )
            for r in rows
        ]
