"""Celery with its Redis broker, configured for throughput as its docs say.

- Worker: ``celery -A benchmarks.systems.celery_peer worker -Q bench
  --pool prefork --concurrency 2 --prefetch-multiplier 64 --without-gossip
  --without-mingle --without-heartbeat``: one worker (the benchmark starts
  one or two), its default prefork pool with one child per CPU (2 here).
  The "Optimizing" guide: "If you have many tasks with a short duration ...
  a large prefetch multiplier" (default 4; 64 here, fixed-size batches the
  children take in turn); gossip, mingle and heartbeat events are cluster
  chatter a benchmark of one node does not need. Celery has no burst mode:
  the benchmark stops it (SIGTERM, a warm shutdown) once every task is
  recorded.
- Results off: ``task_ignore_result=True`` and no result backend ("Optimizing":
  "ignore results you don't want"). Acks early (the default,
  ``task_acks_late=False``): a task is acknowledged when a child takes it.
- Enqueue: ``group(...).apply_async()`` of 5000 signatures a call, sent over
  one producer connection (Celery's "Canvas: group" for many tasks at once).
- Completion: without a result backend Celery keeps no record of a run, so
  the no-op handler appends ``i started finished`` to the benchmark's record
  file (``stamp.record_run``); the count and the window come from there.
"""

from __future__ import annotations

import asyncio
import os
import sys
import time
from typing import ClassVar

from celery import Celery, group

from benchmarks.systems.redis_system import ENQUEUE_BATCH, QUEUE, RedisSystem
from benchmarks.systems.stamp import record_run, record_start

PREFETCH = 64


def make_app(url: str) -> Celery:
    app = Celery("bench", broker=url)
    app.conf.update(
        task_ignore_result=True,
        result_backend=None,
        task_default_queue=QUEUE,
        worker_prefetch_multiplier=PREFETCH,
        broker_connection_retry_on_startup=True,
    )
    return app


app = make_app(os.environ.get("BENCH_PEER_DSN", "redis://localhost"))


@app.task(name="bench_noop")
def bench_noop(i: int = 0) -> None:
    record_run(i, time.time())


@app.task(name="bench_stamp")
def bench_stamp(sent: float = 0.0) -> None:
    record_start(sent)


@app.task(name="bench_stamp_sleep")
def bench_stamp_sleep(sent: float = 0.0, seconds: float = 0.0) -> None:
    record_start(sent)
    time.sleep(seconds)


class CelerySystem(RedisSystem):
    name: ClassVar[str] = "celery"
    configuration = f"prefork --concurrency {{concurrency}}, prefetch x{PREFETCH}, group x5000"
    default_concurrency: ClassVar[int] = os.cpu_count() or 2
    records = True

    client: Celery

    async def install(self) -> None:
        self.client = make_app(self.dsn)

    async def enqueue(self, n: int) -> float:
        def send() -> float:
            started = time.perf_counter()
            for first in range(0, n, ENQUEUE_BATCH):
                batch = range(first, min(first + ENQUEUE_BATCH, n))
                group(
                    self.client.signature("bench_noop", kwargs={"i": i}) for i in batch
                ).apply_async()
            return time.perf_counter() - started

        seconds = await asyncio.to_thread(send)
        self.enqueued += n
        return seconds

    async def _send(self, name: str, **kwargs: float) -> None:
        await asyncio.to_thread(self.client.send_task, name, kwargs=kwargs)

    async def enqueue_stamp(self, sent: float) -> None:
        await self._send("bench_stamp", sent=sent)

    async def enqueue_sleep(self, seconds: float) -> None:
        await self._send("bench_stamp_sleep", sent=0.0, seconds=seconds)

    def worker_command(self, burst: bool) -> list[str]:
        command = [sys.executable, "-m", "celery", "-A", __name__, "worker", "-Q", QUEUE]
        command += ["--pool", "prefork", "--concurrency", str(self.concurrency)]
        command += ["--prefetch-multiplier", str(PREFETCH), "--without-gossip"]
        return [*command, "--without-mingle", "--without-heartbeat", "-l", self.log_level]

    async def close(self) -> None:
        await asyncio.to_thread(self.client.close)
