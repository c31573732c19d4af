"""RQ (Redis Queue), configured for throughput as its docs say.

- Worker: ``rq worker bench --burst --worker-class rq.worker.SimpleWorker``:
  one process runs one job at a time (RQ's unit of concurrency is the worker
  process; ``rq worker-pool`` only starts several). The default ``Worker``
  forks a work horse per job; its docs' "Performance notes" name that fork
  (and the imports after it) as the cost per job, and ``SimpleWorker`` as the
  worker class that runs jobs in the worker process itself, which is what a
  no-op workload wants. ``--burst`` exits once the queue is empty; without
  it the worker waits on ``BLPOP`` (with a timeout), so it wakes at once.
- Enqueue: ``Queue.enqueue_many`` with ``Queue.prepare_data``, one pipeline
  per 5000 jobs ("Bulk Job Enqueueing" in its docs).
- Results kept (``result_ttl`` 500 s, the default): each job's hash
  (``rq:job:ID``) keeps ``status``, ``started_at`` and ``ended_at``, the
  record read here; the drain polls the queue's ``FinishedJobRegistry``.
"""

from __future__ import annotations

import asyncio
import sys
import time
from datetime import UTC, datetime
from typing import ClassVar

from redis import Redis as SyncRedis
from rq import Queue
from rq.registry import FinishedJobRegistry

from benchmarks.systems.redis_system import ENQUEUE_BATCH, QUEUE, RedisSystem
from benchmarks.systems.stamp import record_start
from benchmarks.systems.system import Completion

TIMESTAMP = "%Y-%m-%dT%H:%M:%S.%fZ"
"""RQ's stored time format (``rq.utils.utcformat``), UTC."""


def bench_noop(i: int = 0) -> None:
    return None


def bench_stamp(sent: float = 0.0) -> None:
    record_start(sent)


def bench_stamp_sleep(sent: float = 0.0, seconds: float = 0.0) -> None:
    record_start(sent)
    time.sleep(seconds)


def parse(value: bytes | None) -> datetime | None:
    if not value:
        return None
    return datetime.strptime(value.decode(), TIMESTAMP).replace(tzinfo=UTC)


class RqSystem(RedisSystem):
    name: ClassVar[str] = "rq"
    configuration = "SimpleWorker (one job at a time), enqueue_many x5000"
    default_concurrency: ClassVar[int] = 1

    sync: SyncRedis
    queue: Queue
    ids: list[str]

    async def install(self) -> None:
        self.sync = SyncRedis.from_url(self.dsn)
        self.queue = Queue(QUEUE, connection=self.sync)
        self.ids = []

    async def enqueue(self, n: int) -> float:
        def send() -> float:
            started = time.perf_counter()
            for first in range(0, n, ENQUEUE_BATCH):
                batch = range(first, min(first + ENQUEUE_BATCH, n))
                jobs = self.queue.enqueue_many(
                    [Queue.prepare_data(bench_noop, kwargs={"i": i}) for i in batch]
                )
                self.ids += [job.id for job in jobs]
            return time.perf_counter() - started

        seconds = await asyncio.to_thread(send)
        self.enqueued += n
        return seconds

    async def enqueue_stamp(self, sent: float) -> None:
        await asyncio.to_thread(self.queue.enqueue, bench_stamp, sent)

    async def enqueue_sleep(self, seconds: float) -> None:
        await asyncio.to_thread(self.queue.enqueue, bench_stamp_sleep, 0.0, seconds)

    def worker_command(self, burst: bool) -> list[str]:
        command = [sys.executable, "-m", "rq.cli", "worker", QUEUE, "--url", self.dsn]
        command += ["--worker-class", "rq.worker.SimpleWorker", "--quiet"]
        return command + (["--burst"] if burst else [])

    async def close(self) -> None:
        self.sync.close()

    async def progress(self) -> int:
        key = FinishedJobRegistry(QUEUE, connection=self.sync).key
        return int(await self.redis.zcard(key))

    async def completion(self) -> Completion:
        succeeded = 0
        first: datetime | None = None
        last: datetime | None = None
        for chunk in range(0, len(self.ids), ENQUEUE_BATCH):
            async with self.redis.pipeline(transaction=False) as pipe:
                for job_id in self.ids[chunk : chunk + ENQUEUE_BATCH]:
                    pipe.hmget(f"rq:job:{job_id}", "status", "started_at", "ended_at")
                rows = await pipe.execute()
            for status, started, ended in rows:
                start, end = parse(started), parse(ended)
                if status == b"finished" and start and end:
                    succeeded += 1
                    first = start if first is None else min(first, start)
                    last = end if last is None else max(last, end)
        return Completion(succeeded, self.enqueued - succeeded, first, last)
