"""The worker registry on Redis: register, stop, list.

A mixin of :class:`~conveyor.backends.redis.backend.RedisBackend`. Each
worker is a hash (see :mod:`.keys`): registering and stopping are one
script each, at the server's clock; a heartbeat marks a registered worker
seen (:mod:`.attempts`); a prune with ``workers_before`` deletes old ones
(:mod:`.maintenance`).
"""

from __future__ import annotations

from typing import cast

import redis.asyncio as aioredis

from conveyor.backends.redis import keys, rows
from conveyor.backends.redis.store import RedisStore, translated
from conveyor.records import WorkerInfo


class Workers(RedisStore):
    """Register, stop and list workers."""

    async def register_worker(self, info: WorkerInfo) -> None:
        """Record the worker as started and seen at the server's now, not
        stopped (one script). Kept until a prune with ``workers_before``."""
        await self._run("register_worker", [rows.now_arg(None), *rows.worker_args(info)])

    async def stop_worker(self, worker_id: str) -> None:
        """Mark a registered worker stopped (an unknown id changes nothing)."""
        await self._run("stop_worker", [rows.now_arg(None), worker_id])

    async def list_workers(self) -> list[WorkerInfo]:
        """Every registered worker, live or stopped, newest start first."""
        with translated():
            return await _registered(self._redis, self.prefix)


async def _registered(client: aioredis.Redis, prefix: str) -> list[WorkerInfo]:
    """Every registered worker, newest start first."""
    ids = cast(list[str], await client.zrevrange(keys.workers(prefix), 0, -1))
    async with client.pipeline(transaction=False) as pipe:
        for worker_id in ids:
            pipe.hgetall(keys.worker(prefix, worker_id))
        hashes = await pipe.execute()
    return [
        rows.worker(worker_id, fields)
        for worker_id, fields in zip(ids, hashes, strict=True)
        if fields
    ]
