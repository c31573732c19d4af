"""What the systems on Redis share: a Redis database of their own and, for
those that keep no start and finish times, the record file.

``self.dsn`` is ``redis://HOST:PORT/N``: database N of the benchmark's own
Redis server (``redis_peers.py`` starts it and flushes N before a phase).
A system whose records say when each task started and finished overrides
:meth:`RedisSystem.completion` (and :meth:`~RedisSystem.progress`, the cheap
count the drain polls); the others set ``records = True``, their no-op
handler calls :func:`stamp.record_run`, and the count and window come from
that file. What each system does is in its module's docstring.
"""

from __future__ import annotations

import shutil
import tempfile
from pathlib import Path
from typing import ClassVar

from redis.asyncio import Redis

from benchmarks.systems.stamp import RECORD_ENV, count_records, read_records
from benchmarks.systems.system import Completion, System, moment

QUEUE = "bench"
"""The queue every system on Redis uses, where it has names for queues."""
ENQUEUE_BATCH = 5_000
"""Tasks per bulk call (or per batch of concurrent calls)."""


class RedisSystem(System):
    """One task system on a Redis database of its own."""

    records: ClassVar[bool] = False
    """True: the no-op handler records ``i started finished`` to a file
    (:func:`stamp.record_run`), as the system keeps no times of its own."""

    redis: Redis
    enqueued: int
    folder: Path

    async def setup(self, dsn: str) -> None:
        self.dsn = dsn
        self.redis = Redis.from_url(dsn)
        self.enqueued = 0
        self.folder = Path(tempfile.mkdtemp(prefix=f"bench_{self.name}_"))
        await self.install()

    async def teardown(self) -> None:
        try:
            await self.close()
        finally:
            await self.redis.aclose()
            shutil.rmtree(self.folder, ignore_errors=True)

    @property
    def record_file(self) -> Path:
        return self.folder / "records"

    def worker_env(self) -> dict[str, str]:
        return {RECORD_ENV: str(self.record_file)} if self.records else {}

    async def progress(self) -> int:
        if self.records:
            return count_records(self.record_file)
        return (await self.completion()).succeeded

    async def completion(self) -> Completion:
        """From the record file: distinct tasks recorded; the rest unfinished."""
        done, first, last = read_records(self.record_file)
        return Completion(len(done), self.enqueued - len(done), moment(first), moment(last))
