"""Chancy, configured for throughput as its docs say.

- Executor: ``AsyncExecutor`` (``Chancy.Executor.Async``). Its API docs
  (chancy.executors.asyncex) call it the one for "large numbers of IO-bound
  jobs ... without the high overhead of new processes or threads"; the
  default ``ProcessExecutor`` is documented as "good isolation ... albeit
  with some overhead" (docs/guide/executors.rst). The handlers here are
  ``async def`` no-ops.
- ``concurrency``: the queue's per-worker job count (docs/guide/queues.rst);
  the worker fetches up to its free slots in one query.
- ``eager_polling=True``: "immediately poll for new jobs after a job
  completes ... useful ... where jobs are expected to be continuously
  available" (the Queue field's docs); ``polling_interval=1``, its smallest
  value. NOTIFY (``notifications=True``, the default) wakes an idle worker.
- Enqueue: ``push_many`` (batches of 1000 rows, its default).

The worker is ``python -m benchmarks.systems.chancy_peer``: ``Worker(chancy)``
as in the docs' worker example; it has no burst mode, so the benchmark stops
it (SIGTERM) once the tasks are done.
"""

from __future__ import annotations

import asyncio
import logging
import os
import sys
import time
from typing import ClassVar

from chancy import Chancy, Job, Queue, Worker
from chancy.app import setup_default_logger

from benchmarks.systems.stamp import record_start
from benchmarks.systems.system import System

QUEUE = "bench"
ENQUEUE_BATCH = 5_000


async def bench_noop(i: int = 0) -> None:
    return None


async def bench_stamp(sent: float = 0.0) -> None:
    record_start(sent)


NOOP = Job.from_func(bench_noop, queue=QUEUE)
STAMP = Job.from_func(bench_stamp, queue=QUEUE)


class ChancySystem(System):
    name: ClassVar[str] = "chancy"
    configuration = "AsyncExecutor, concurrency {concurrency}, eager_polling"

    chancy: Chancy

    async def install(self) -> None:
        self.chancy = Chancy(self.dsn, log=setup_default_logger(logging.WARNING))
        await self.chancy.__aenter__()
        await self.chancy.migrate()
        queue = Queue(
            QUEUE,
            concurrency=self.concurrency,
            executor=Chancy.Executor.Async,
            polling_interval=1,
            eager_polling=True,
        )
        await self.chancy.declare(queue)

    async def enqueue(self, n: int) -> float:
        started = time.perf_counter()
        for first in range(0, n, ENQUEUE_BATCH):
            jobs = [NOOP.with_kwargs(i=i) for i in range(first, min(first + ENQUEUE_BATCH, n))]
            async for _ in self.chancy.push_many(jobs):
                pass
        return time.perf_counter() - started

    async def enqueue_stamp(self, sent: float) -> None:
        await self.chancy.push(STAMP.with_kwargs(sent=sent))

    def worker_command(self, burst: bool) -> list[str]:
        return [sys.executable, "-m", __name__]

    def worker_env(self) -> dict[str, str]:
        return {"BENCH_LOG_LEVEL": self.log_level}

    async def close(self) -> None:
        await self.chancy.__aexit__(None, None, None)


async def work() -> None:
    """Run one worker until SIGTERM (the docs' worker example)."""
    # Its default logger says INFO "Pulled ..." for every job: keep to warnings.
    log = setup_default_logger(logging.getLevelName(os.environ.get("BENCH_LOG_LEVEL", "WARNING")))
    async with Chancy(os.environ["BENCH_PEER_DSN"], log=log) as chancy, Worker(chancy) as worker:
        await worker.wait_for_shutdown()


if __name__ == "__main__":
    asyncio.run(work())
