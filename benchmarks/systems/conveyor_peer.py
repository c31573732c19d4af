"""conveyor: the worker of ``benchmarks/throughput.py``, on a database of its own."""

from __future__ import annotations

import time
from typing import ClassVar

from benchmarks.bench_app import OBSERVE_ENV, STAMP_NAME, TASK_NAME, make_app, observe
from benchmarks.systems.system import System
from benchmarks.throughput import WorkerSpec, worker_command
from conveyor import App

SCHEMA = "bench"
BATCH = 5_000
"""Tasks per ``enqueue_many_async`` call, as in ``throughput.py``."""


class Conveyor(System):
    name: ClassVar[str] = "conveyor"
    configuration = f"--concurrency {{concurrency}}, enqueue_many_async x{BATCH}"
    default_concurrency: ClassVar[int] = 800
    """Tuned (claims of half the free slots, two in flight): ``peers.py
    --systems conveyor --processes 1,2 --tasks 20000 --concurrency conveyor=N``,
    two rounds each, 400 and 800 in turn twice: 800 drained 5-12% faster than
    400 with one process and with two; at 40,000 tasks, 1200 was 3-5% faster
    than 800, within the machine's drift. The README's section on the worker
    says so."""

    app: App

    async def install(self) -> None:
        self.app = make_app(self.dsn, SCHEMA)
        await self.app.backend()  # opens the pool and migrates the empty schema

    async def enqueue(self, n: int) -> float:
        started = time.perf_counter()
        for first in range(0, n, BATCH):
            payloads = [{"i": i} for i in range(first, min(first + BATCH, n))]
            await self.app.enqueue_many_async(TASK_NAME, payloads)
        return time.perf_counter() - started

    async def enqueue_stamp(self, sent: float) -> None:
        await self.app.enqueue_async(STAMP_NAME, {"sent": sent})

    def worker_command(self, burst: bool) -> list[str]:
        spec = WorkerSpec(self.dsn, self.concurrency, burst, None, self.log_level)
        return worker_command(spec)

    def worker_env(self) -> dict[str, str]:
        return {"CONVEYOR_URL": self.dsn, "CONVEYOR_SCHEMA": SCHEMA}

    async def close(self) -> None:
        await self.app.aclose()


class ConveyorObserved(Conveyor):
    """conveyor with everything an operator turns on: an event callback,
    Prometheus metrics (``--metrics-port``) and OpenTelemetry traces (the
    SDK, a batch processor, an exporter that drops the spans), in the
    enqueuing process and in the workers."""

    name: ClassVar[str] = "conveyor_observed"
    configuration = Conveyor.configuration + "; events, metrics, traces"

    @property
    def tables(self) -> str:
        return Conveyor.name

    async def install(self) -> None:
        await super().install()
        observe(self.app)

    def worker_command(self, burst: bool) -> list[str]:
        spec = WorkerSpec(self.dsn, self.concurrency, burst, None, self.log_level, metrics=True)
        return worker_command(spec)

    def worker_env(self) -> dict[str, str]:
        return {**super().worker_env(), OBSERVE_ENV: "1"}
