"""Procrastinate, configured for throughput as its docs say.

- ``--concurrency``: "Execute multiple jobs at the same time"
  (docs/howto/concurrency.md): a worker runs one job at a time unless given
  asynchronous sub-workers, ``procrastinate worker --concurrency=30`` in its
  example; the handlers here are ``async def``, so they all overlap.
- LISTEN/NOTIFY stays on (the default), so idle workers wake on a defer.
- Enqueue: ``batch_defer_async`` ("Batch defer multiple jobs",
  docs/howto/basics/batch_defer.md), one call per batch.
- Finished jobs are kept (``delete_jobs`` unset), so they can be counted.

The worker is ``python -m procrastinate --app=benchmarks.systems.procrastinate_peer.app
worker`` (``--one-shot`` to exit once no job is left).
"""

from __future__ import annotations

import os
import sys
import time
from typing import ClassVar

import procrastinate

from benchmarks.systems.stamp import record_start
from benchmarks.systems.system import System

ENQUEUE_BATCH = 5_000

app = procrastinate.App(
    connector=procrastinate.PsycopgConnector(conninfo=os.environ.get("BENCH_PEER_DSN", ""))
)


@app.task(name="bench_noop")
async def bench_noop(i: int = 0) -> None:
    return None


@app.task(name="bench_stamp")
async def bench_stamp(sent: float = 0.0) -> None:
    record_start(sent)


class Procrastinate(System):
    name: ClassVar[str] = "procrastinate"
    configuration = f"--concurrency {{concurrency}}, batch_defer_async x{ENQUEUE_BATCH}"

    app: procrastinate.App

    async def install(self) -> None:
        self.app = procrastinate.App(connector=procrastinate.PsycopgConnector(conninfo=self.dsn))
        await self.app.open_async()
        await self.app.schema_manager.apply_schema_async()

    async def enqueue(self, n: int) -> float:
        deferrer = self.app.configure_task("bench_noop")
        started = time.perf_counter()
        for first in range(0, n, ENQUEUE_BATCH):
            kwargs = [{"i": i} for i in range(first, min(first + ENQUEUE_BATCH, n))]
            await deferrer.batch_defer_async(*kwargs)
        return time.perf_counter() - started

    async def enqueue_stamp(self, sent: float) -> None:
        await self.app.configure_task("bench_stamp").defer_async(sent=sent)

    def worker_command(self, burst: bool) -> list[str]:
        command = [sys.executable, "-m", "procrastinate", f"--app={__name__}.app"]
        command += [f"--log-level={self.log_level.lower()}", "worker"]
        command += [f"--concurrency={self.concurrency}"]
        return command + (["--one-shot"] if burst else [])

    async def close(self) -> None:
        await self.app.close_async()
