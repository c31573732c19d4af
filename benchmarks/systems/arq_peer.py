"""arq on Redis, configured for throughput as its docs say.

- Worker: ``arq benchmarks.systems.arq_peer.WorkerSettings`` (``--burst`` to
  exit once the queue is empty), one process; ``max_jobs`` is the knob its
  docs give for jobs run at once (default 10; 50 here, as for the other
  asyncio peers). The handlers are ``async def``. ``poll_delay`` stays at
  its default 0.5 s: arq polls its queue (a sorted set) and has no wake-up,
  so an idle worker starts a new job up to half a second late.
- Enqueue: arq has no bulk enqueue; ``ArqRedis.enqueue_job`` calls run
  concurrently with ``asyncio.gather``, 100 at a time (its connection pool
  refuses 5000 at once with ``MaxConnectionsError``).
- Results kept (``keep_result`` 3600 s, the default): arq stores each job's
  pickled result with its ``start_time`` and ``finish_time``, the record
  read here (``arq:result:ID``). ``job_timeout`` 300 s and ``max_tries`` 5
  (defaults).
- arq 0.28.0 requires ``redis<6``, conveyor's extra ``redis>=5`` with
  hiredis resolves to 8.x next to the other peers: it is installed with
  ``pip install --no-deps arq==0.28.0`` and runs on redis-py 8 here.
"""

from __future__ import annotations

import asyncio
import os
import sys
import time
from typing import Any, ClassVar

from arq import create_pool
from arq.connections import ArqRedis, RedisSettings
from arq.constants import result_key_prefix
from arq.jobs import deserialize_result

from benchmarks.systems.redis_system import ENQUEUE_BATCH, RedisSystem, moment
from benchmarks.systems.stamp import record_start
from benchmarks.systems.system import Completion

IN_FLIGHT = 100
"""Concurrent ``enqueue_job`` calls: its pool refuses thousands at once."""


async def bench_noop(ctx: dict[str, Any], i: int = 0) -> None:
    return None


async def bench_stamp(ctx: dict[str, Any], sent: float = 0.0) -> None:
    record_start(sent)


async def bench_stamp_sleep(ctx: dict[str, Any], sent: float = 0.0, seconds: float = 0) -> None:
    record_start(sent)
    await asyncio.sleep(seconds)


class WorkerSettings:
    """The worker's settings (``arq ...WorkerSettings``), from the environment."""

    functions: ClassVar[list[Any]] = [bench_noop, bench_stamp, bench_stamp_sleep]
    redis_settings = RedisSettings.from_dsn(os.environ.get("BENCH_PEER_DSN", "redis://localhost"))
    max_jobs = int(os.environ.get("BENCH_CONCURRENCY", "10"))


class ArqSystem(RedisSystem):
    name: ClassVar[str] = "arq"
    configuration = "max_jobs {concurrency}, gather(enqueue_job) x100, results kept"

    pool: ArqRedis
    ids: list[str]

    async def install(self) -> None:
        self.pool = await create_pool(RedisSettings.from_dsn(self.dsn))
        self.ids = []

    async def enqueue(self, n: int) -> float:
        started = time.perf_counter()
        for first in range(0, n, IN_FLIGHT):
            indexes = range(first, min(first + IN_FLIGHT, n))
            jobs = await asyncio.gather(*(self.pool.enqueue_job("bench_noop", i) for i in indexes))
            self.ids += [job.job_id for job in jobs if job is not None]
        self.enqueued += n
        return time.perf_counter() - started

    async def enqueue_stamp(self, sent: float) -> None:
        await self.pool.enqueue_job("bench_stamp", sent)

    async def enqueue_sleep(self, seconds: float) -> None:
        await self.pool.enqueue_job("bench_stamp_sleep", 0.0, seconds)

    def worker_command(self, burst: bool) -> list[str]:
        command = [sys.executable, "-m", "arq", f"{__name__}.WorkerSettings"]
        return command + (["--burst"] if burst else [])

    def worker_env(self) -> dict[str, str]:
        return {**super().worker_env(), "BENCH_CONCURRENCY": str(self.concurrency)}

    async def close(self) -> None:
        await self.pool.aclose()

    def _keys(self, chunk: int) -> list[str]:
        return [result_key_prefix + i for i in self.ids[chunk : chunk + ENQUEUE_BATCH]]

    async def progress(self) -> int:
        found = 0
        for chunk in range(0, len(self.ids), ENQUEUE_BATCH):
            found += int(await self.redis.exists(*self._keys(chunk)))
        return found

    async def completion(self) -> Completion:
        succeeded = 0
        first: float | None = None
        last: float | None = None
        for chunk in range(0, len(self.ids), ENQUEUE_BATCH):
            for raw in await self.redis.mget(self._keys(chunk)):
                if raw is None:
                    continue
                result = deserialize_result(raw)
                if result.success:
                    succeeded += 1
                    start, finish = result.start_time.timestamp(), result.finish_time.timestamp()
                    first = start if first is None else min(first, start)
                    last = finish if last is None else max(last, finish)
        return Completion(succeeded, self.enqueued - succeeded, moment(first), moment(last))
