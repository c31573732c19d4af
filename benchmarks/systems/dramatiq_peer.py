"""Dramatiq with its Redis broker, configured for throughput as its docs say.

- Worker: ``dramatiq benchmarks.systems.dramatiq_peer --processes 1
  --threads 8``: one worker process (the benchmark starts one or two) with
  its default thread count, 8 (``--threads``, "Worker threads" in its CLI
  docs); Dramatiq runs sync actors on threads. Dramatiq has no burst mode:
  the benchmark stops it (SIGTERM) once every task is recorded.
- Broker: ``RedisBroker(url=...)`` with its defaults (acks: a message stays
  in the worker's unacked set until it succeeds; a dead worker's messages
  are requeued by the broker's maintenance once its heartbeat is older than
  ``heartbeat_timeout``, 60 s). Default middleware (AgeLimit, TimeLimit,
  ShutdownNotifications, Callbacks, Pipelines, Retries); no Results
  middleware, so no result backend.
- Enqueue: Dramatiq has no bulk enqueue; ``broker.enqueue(actor.message(i=i))``
  one message after the other (``Actor.send`` does the same), in a thread.
- Completion: Dramatiq keeps no record of a processed message, so the no-op
  handler appends ``i started finished`` to the benchmark's record file
  (``stamp.record_run``); the count and the window come from there.
"""

from __future__ import annotations

import asyncio
import os
import sys
import time
from typing import ClassVar

import dramatiq
from dramatiq.brokers.redis import RedisBroker

from benchmarks.systems.redis_system import RedisSystem
from benchmarks.systems.stamp import record_run, record_start

QUEUE = "bench"
broker = RedisBroker(url=os.environ.get("BENCH_PEER_DSN", "redis://localhost"))
dramatiq.set_broker(broker)


@dramatiq.actor(queue_name=QUEUE)
def bench_noop(i: int = 0) -> None:
    record_run(i, time.time())


@dramatiq.actor(queue_name=QUEUE)
def bench_stamp(sent: float = 0.0) -> None:
    record_start(sent)


@dramatiq.actor(queue_name=QUEUE)
def bench_stamp_sleep(sent: float = 0.0, seconds: float = 0.0) -> None:
    record_start(sent)
    time.sleep(seconds)


class DramatiqSystem(RedisSystem):
    name: ClassVar[str] = "dramatiq"
    configuration = "--processes 1 --threads {concurrency}, enqueue one by one"
    default_concurrency: ClassVar[int] = 8
    records = True

    broker: RedisBroker

    async def install(self) -> None:
        self.broker = RedisBroker(url=self.dsn)
        self.broker.declare_queue(QUEUE)

    async def enqueue(self, n: int) -> float:
        def send() -> float:
            started = time.perf_counter()
            for i in range(n):
                self.broker.enqueue(bench_noop.message(i=i))
            return time.perf_counter() - started

        seconds = await asyncio.to_thread(send)
        self.enqueued += n
        return seconds

    async def enqueue_stamp(self, sent: float) -> None:
        await asyncio.to_thread(self.broker.enqueue, bench_stamp.message(sent=sent))

    async def enqueue_sleep(self, seconds: float) -> None:
        message = bench_stamp_sleep.message(sent=0.0, seconds=seconds)
        await asyncio.to_thread(self.broker.enqueue, message)

    def worker_command(self, burst: bool) -> list[str]:
        command = [sys.executable, "-m", "dramatiq", __name__, "--processes", "1"]
        return [*command, "--threads", str(self.concurrency)]

    async def close(self) -> None:
        await asyncio.to_thread(self.broker.close)
