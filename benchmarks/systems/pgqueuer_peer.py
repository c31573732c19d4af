"""PgQueuer, configured for throughput as its docs say.

- Driver: asyncpg. PgQueuer's benchmark page (docs/comparisons/benchmarks.md,
  "asyncpg vs psycopg") measures the asyncpg driver at about 1.7x the psycopg
  one; the worker holds one dedicated connection, as "Performance Tuning"
  (docs/guides/performance-tuning.md, "Use a dedicated connection for
  LISTEN") recommends for the QueueManager.
- ``--batch-size 500``: "Increase ``batch_size`` when jobs are short-lived"
  (Performance Tuning, "Batch Size"); the default is 10. 500 drained fastest
  of 100, 250, 500 and 1000 here (8.3k, 9.1k, 10.3k and 9.4k tasks/s with
  one process, each next to conveyor in one invocation). No
  ``--max-concurrent-tasks``: unlimited is the default, and the docs call it
  a safety ceiling, not a throughput knob.
- ``pgq autovac`` settings applied after install (Performance Tuning,
  "Autovacuum Tuning" and its checklist). Durability stays ``durable``, the
  default, like every other system here: the faster levels lose jobs on a
  crash.
- Enqueue: ``Queries.enqueue`` with lists, one statement per batch.

The worker is ``python -m benchmarks.systems.pgqueuer_peer BATCH [drain]``:
``pgqueuer.run(create, batch_size=..., mode=...)``, what ``pgq run`` calls
(docs/guides/programmatic-run.md); PgQueuer 1.6.0's ``pgq run`` itself stops
at start-up in its logging setup (``'str' object has no attribute 'name'``).
``drain`` mode exits once the queue is empty.
"""

from __future__ import annotations

import asyncio
import os
import sys
import time
from collections.abc import AsyncIterator
from contextlib import asynccontextmanager
from typing import Any, ClassVar

import asyncpg
import pgqueuer
from pgqueuer import Job, PgQueuer
from pgqueuer.db import AsyncpgDriver
from pgqueuer.queries import Queries
from pgqueuer.types import QueueExecutionMode

from benchmarks.systems.stamp import record_start
from benchmarks.systems.system import System

TASK_NAME = "bench_noop"
STAMP_NAME = "bench_stamp"
BATCH_SIZE = 500
ENQUEUE_BATCH = 5_000


@asynccontextmanager
async def create() -> AsyncIterator[PgQueuer]:
    """The worker's factory: a PgQueuer on one asyncpg connection, two entrypoints."""
    connection = await asyncpg.connect(os.environ["BENCH_PEER_DSN"])
    pgq = PgQueuer(AsyncpgDriver(connection))

    @pgq.entrypoint(TASK_NAME)
    async def bench_noop(job: Job) -> None:
        return None

    @pgq.entrypoint(STAMP_NAME)
    async def bench_stamp(job: Job) -> None:
        record_start(float(job.payload or b"0"))

    try:
        yield pgq
    finally:
        await connection.close()


class PgQueuerSystem(System):
    name: ClassVar[str] = "pgqueuer"
    configuration = "asyncpg, --batch-size {concurrency}, autovac, durable"
    default_concurrency: ClassVar[int] = BATCH_SIZE
    """Here: the batch size (the worker runs every job it picks concurrently)."""

    connection: Any
    queries: Queries

    async def install(self) -> None:
        self.connection = await asyncpg.connect(self.dsn)
        self.queries = Queries(AsyncpgDriver(self.connection))
        await self.queries.install()
        await self.queries.optimize_autovacuum()

    async def enqueue(self, n: int) -> float:
        started = time.perf_counter()
        for first in range(0, n, ENQUEUE_BATCH):
            size = min(ENQUEUE_BATCH, n - first)
            await self.queries.enqueue([TASK_NAME] * size, [None] * size, [0] * size)
        return time.perf_counter() - started

    async def enqueue_stamp(self, sent: float) -> None:
        await self.queries.enqueue(STAMP_NAME, repr(sent).encode())

    def worker_command(self, burst: bool) -> list[str]:
        command = [sys.executable, "-m", __name__, str(self.concurrency)]
        return command + (["drain"] if burst else [])

    async def close(self) -> None:
        await self.connection.close()


def work(batch_size: int, drain: bool) -> None:
    """Run one worker: until the queue is empty (``drain``), else until SIGTERM."""
    mode = QueueExecutionMode.drain if drain else QueueExecutionMode.continuous
    asyncio.run(pgqueuer.run(create, batch_size=batch_size, mode=mode))


if __name__ == "__main__":
    work(int(sys.argv[1]), sys.argv[2:] == ["drain"])
