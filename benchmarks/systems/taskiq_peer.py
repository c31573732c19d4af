"""taskiq with taskiq-redis's ``RedisStreamBroker``, configured for throughput as its docs say.

- Broker: ``RedisStreamBroker`` (a Redis stream read by a consumer group),
  the broker of taskiq-redis's README usage example and the one it says
  supports acknowledgements (``ListQueueBroker`` and ``PubSubBroker`` lose a
  message whose worker dies). Defaults: ``xread_count`` 100 messages a read,
  ``idle_timeout`` 10 minutes before another consumer claims a message left
  unacknowledged. No result backend (taskiq's default ``DummyResultBackend``).
- Worker: ``taskiq worker benchmarks.systems.taskiq_peer:broker --workers 1
  --max-async-tasks 100``: one process (the CLI's default is 2), and its
  default limit of 100 async tasks at once; the default ack type
  (``when_saved``: after the result is saved). taskiq has no burst mode: the
  benchmark stops it (SIGTERM) once every task is recorded.
- Enqueue: taskiq has no bulk enqueue; ``task.kiq(i)`` calls run
  concurrently with ``asyncio.gather``, 100 at a time.
- Completion: taskiq keeps no record without a result backend (and its
  results carry no start time), so the no-op handler appends
  ``i started finished`` to the benchmark's record file
  (``stamp.record_run``); the count and the window come from there.
"""

from __future__ import annotations

import asyncio
import os
import sys
import time
from typing import ClassVar

from taskiq_redis import RedisStreamBroker

from benchmarks.systems.redis_system import QUEUE, RedisSystem
from benchmarks.systems.stamp import record_run, record_start

IN_FLIGHT = 100
"""Concurrent ``kiq`` calls while enqueueing."""


def make_broker(url: str) -> RedisStreamBroker:
    return RedisStreamBroker(url=url, queue_name=QUEUE)


broker = make_broker(os.environ.get("BENCH_PEER_DSN", "redis://localhost"))


@broker.task(task_name="bench_noop")
async def bench_noop(i: int = 0) -> None:
    record_run(i, time.time())


@broker.task(task_name="bench_stamp")
async def bench_stamp(sent: float = 0.0) -> None:
    record_start(sent)


@broker.task(task_name="bench_stamp_sleep")
async def bench_stamp_sleep(sent: float = 0.0, seconds: float = 0.0) -> None:
    record_start(sent)
    await asyncio.sleep(seconds)


class TaskiqSystem(RedisSystem):
    name: ClassVar[str] = "taskiq"
    configuration = "RedisStreamBroker, --max-async-tasks {concurrency}, gather(kiq) x100"
    default_concurrency: ClassVar[int] = 100
    records = True

    broker: RedisStreamBroker

    async def install(self) -> None:
        self.broker = make_broker(self.dsn)
        await self.broker.startup()

    async def enqueue(self, n: int) -> float:
        noop = bench_noop.kicker().with_broker(self.broker)
        started = time.perf_counter()
        for first in range(0, n, IN_FLIGHT):
            await asyncio.gather(*(noop.kiq(i) for i in range(first, min(first + IN_FLIGHT, n))))
        self.enqueued += n
        return time.perf_counter() - started

    async def enqueue_stamp(self, sent: float) -> None:
        await bench_stamp.kicker().with_broker(self.broker).kiq(sent)

    async def enqueue_sleep(self, seconds: float) -> None:
        await bench_stamp_sleep.kicker().with_broker(self.broker).kiq(0.0, seconds)

    def worker_command(self, burst: bool) -> list[str]:
        command = [sys.executable, "-m", "taskiq", "worker", f"{__name__}:broker"]
        command += ["--workers", "1", "--max-async-tasks", str(self.concurrency)]
        return [*command, "--log-level", self.log_level]

    async def close(self) -> None:
        await self.broker.shutdown()
