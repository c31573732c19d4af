"""conveyor on Redis: the worker of ``benchmarks/throughput.py`` on a Redis database.

- URL: ``redis://HOST:PORT/N?prefix=bench``, through ``conveyor.App(url)``;
  every key of the store is under ``{bench}`` (``backends/redis/keys.py``).
- Worker: ``python -m conveyor.cli worker benchmarks.bench_app:app --burst
  --concurrency 400`` with ``CONVEYOR_URL`` set, as on PostgreSQL; the default
  lease and heartbeat.
- Enqueue: ``enqueue_many_async``, 5000 a call (one Lua script per call).
- Completion from conveyor's own records: ``{bench}:state:succeeded`` (ids of
  the succeeded tasks) against every state's index (every task), and each
  task's attempt log (``{bench}:attempts:ID``, JSON rows with ``started_at``
  and ``finished_at`` in ms, by the Redis server's clock).
"""

from __future__ import annotations

import json
import time
from typing import ClassVar

from benchmarks.bench_app import STAMP_NAME, STAMP_SLEEP_NAME, TASK_NAME, make_app
from benchmarks.systems.redis_system import ENQUEUE_BATCH, RedisSystem, moment
from benchmarks.systems.system import Completion
from benchmarks.throughput import WorkerSpec, worker_command
from conveyor import App
from conveyor.model import TaskState

PREFIX = "bench"
BASE = "{" + PREFIX + "}"


class ConveyorRedis(RedisSystem):
    name: ClassVar[str] = "conveyor"
    configuration = f"--concurrency {{concurrency}}, enqueue_many_async x{ENQUEUE_BATCH}"
    default_concurrency: ClassVar[int] = 400

    app: App

    @property
    def url(self) -> str:
        return f"{self.dsn}?prefix={PREFIX}"

    async def install(self) -> None:
        self.app = make_app(self.url)
        await self.app.backend()

    async def enqueue(self, n: int) -> float:
        started = time.perf_counter()
        for first in range(0, n, ENQUEUE_BATCH):
            payloads = [{"i": i} for i in range(first, min(first + ENQUEUE_BATCH, n))]
            await self.app.enqueue_many_async(TASK_NAME, payloads)
        self.enqueued += n
        return time.perf_counter() - started

    async def enqueue_stamp(self, sent: float) -> None:
        await self.app.enqueue_async(STAMP_NAME, {"sent": sent})

    async def enqueue_sleep(self, seconds: float) -> None:
        await self.app.enqueue_async(STAMP_SLEEP_NAME, {"sent": 0.0, "seconds": seconds})

    def worker_command(self, burst: bool) -> list[str]:
        spec = WorkerSpec(self.url, self.concurrency, burst, None, self.log_level)
        return worker_command(spec)

    def worker_env(self) -> dict[str, str]:
        return {"CONVEYOR_URL": self.url}

    async def close(self) -> None:
        await self.app.aclose()

    async def progress(self) -> int:
        return int(await self.redis.zcard(f"{BASE}:state:succeeded"))

    async def completion(self) -> Completion:
        succeeded = int(await self.redis.zcard(f"{BASE}:state:succeeded"))
        states = [f"{BASE}:state:{state.value}" for state in TaskState]
        total = sum([int(await self.redis.zcard(index)) for index in states])
        ids = [i for index in states for i in await self.redis.zrange(index, 0, -1)]
        first: int | None = None
        last: int | None = None
        for chunk in range(0, len(ids), ENQUEUE_BATCH):
            async with self.redis.pipeline(transaction=False) as pipe:
                for task_id in ids[chunk : chunk + ENQUEUE_BATCH]:
                    pipe.lrange(f"{BASE}:attempts:{task_id.decode()}", 0, -1)
                logs = await pipe.execute()
            for rows in logs:
                for row in map(json.loads, rows):
                    first = min(first or row["started_at"], row["started_at"])
                    if row.get("finished_at") is not None:
                        last = max(last or 0, row["finished_at"])
        return Completion(
            succeeded,
            total - succeeded,
            moment(None if first is None else first / 1000),
            moment(None if last is None else last / 1000),
        )
