"""SAQ (Simple Async Queue) on Redis, configured for throughput as its docs say.

- Worker: ``saq benchmarks.systems.saq_peer.settings`` (``python -m saq``),
  one process (``--workers 1``); ``concurrency`` is the knob its docs give for
  jobs run at once per worker (default 10; 50 here, as for the other
  asyncio peers). The handlers are ``async def``. In burst mode
  (``burst=True``, ``dequeue_timeout=1``) the worker exits once the queue is
  empty; otherwise it waits on ``BLMOVE``, so an idle worker starts a new
  job at once.
- Enqueue: SAQ has no bulk enqueue; ``Queue.enqueue`` calls run concurrently
  with ``asyncio.gather``, 5000 at a time, as SAQ's own benchmark
  (``benchmarks/simple.py`` in its repository) enqueues.
- Job defaults kept: ``timeout`` 10 s, ``retries`` 1 (one attempt),
  ``ttl`` 600 s: a finished job stays in Redis for 10 minutes, which is the
  record read here.
- Completion from SAQ's own records: each job's stored JSON (``status``,
  ``started`` and ``completed`` in ms); the drain polls the size of the
  queue's ``incomplete`` set, from which a job leaves when it finishes.

Not every task completes, and the row says so: when a worker starts, SAQ's
sweep (``RedisQueue.sweep``) aborts every job in the queue's active list
whose stored status is not ``active`` yet, and a job the worker's own
dequeue has just moved there is such a job. With ``retries`` 1 it is not
retried: it ends ``aborted`` with the error "swept" (2 of 20000 in a
one-process drain here). The same sweep is what a SIGKILLed worker's job
meets once its ``timeout`` (10 s) is past: aborted, never run again.
"""

from __future__ import annotations

import asyncio
import json
import os
import sys
import time
from typing import Any, ClassVar

from saq import Queue

from benchmarks.systems.redis_system import ENQUEUE_BATCH, QUEUE, RedisSystem, moment
from benchmarks.systems.stamp import record_start
from benchmarks.systems.system import Completion


async def bench_noop(ctx: dict[str, Any], *, i: int = 0) -> None:
    return None


async def bench_stamp(ctx: dict[str, Any], *, sent: float = 0.0) -> None:
    record_start(sent)


async def bench_stamp_sleep(ctx: dict[str, Any], *, sent: float = 0.0, seconds: float = 0) -> None:
    record_start(sent)
    await asyncio.sleep(seconds)


def settings(burst: bool = False) -> dict[str, Any]:
    """The worker's settings, from the environment the benchmark sets."""
    return {
        "queue": Queue.from_url(os.environ["BENCH_PEER_DSN"], name=QUEUE),
        "functions": [bench_noop, bench_stamp, bench_stamp_sleep],
        "concurrency": int(os.environ["BENCH_CONCURRENCY"]),
        "burst": burst,
        "dequeue_timeout": 1.0 if burst else 0.0,
    }


def burst_settings() -> dict[str, Any]:
    """The settings of a worker that exits once the queue is empty."""
    return settings(burst=True)


class SaqSystem(RedisSystem):
    name: ClassVar[str] = "saq"
    configuration = "concurrency {concurrency}, gather(enqueue) x5000"

    queue: Queue
    ids: list[str]

    async def install(self) -> None:
        self.queue = Queue.from_url(self.dsn, name=QUEUE)
        await self.queue.connect()
        self.ids = []

    async def enqueue(self, n: int) -> float:
        started = time.perf_counter()
        for first in range(0, n, ENQUEUE_BATCH):
            calls = (
                self.queue.enqueue("bench_noop", i=i)
                for i in range(first, min(first + ENQUEUE_BATCH, n))
            )
            jobs = await asyncio.gather(*calls)
            self.ids += [job.id for job in jobs if job is not None]
        self.enqueued += n
        return time.perf_counter() - started

    async def enqueue_stamp(self, sent: float) -> None:
        await self.queue.enqueue("bench_stamp", sent=sent)

    async def enqueue_sleep(self, seconds: float) -> None:
        await self.queue.enqueue("bench_stamp_sleep", sent=0.0, seconds=seconds)

    def worker_command(self, burst: bool) -> list[str]:
        chosen = "burst_settings" if burst else "settings"
        return [sys.executable, "-m", "saq", f"{__name__}.{chosen}", "--workers", "1", "--quiet"]

    def worker_env(self) -> dict[str, str]:
        return {**super().worker_env(), "BENCH_CONCURRENCY": str(self.concurrency)}

    async def close(self) -> None:
        await self.queue.disconnect()

    async def progress(self) -> int:
        return self.enqueued - await self.queue.count("incomplete")

    async def completion(self) -> Completion:
        succeeded = 0
        first: int | None = None
        last: int | None = None
        for chunk in range(0, len(self.ids), ENQUEUE_BATCH):
            for raw in await self.redis.mget(self.ids[chunk : chunk + ENQUEUE_BATCH]):
                job = json.loads(raw) if raw else {}
                if job.get("status") == "complete":
                    succeeded += 1
                    first = min(first or job["started"], job["started"])
                    last = max(last or 0, job["completed"])
        return Completion(
            succeeded,
            self.enqueued - succeeded,
            moment(None if first is None else first / 1000),
            moment(None if last is None else last / 1000),
        )
