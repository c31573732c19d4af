"""conveyor on SQLite: the worker of ``benchmarks/throughput.py`` on a file of its own.

- URL: ``sqlite:////ABS/PATH.db`` (``sqlite_peers.py`` gives each phase a new
  file), through ``conveyor.App(url)`` with the backend's defaults: WAL,
  ``synchronous=full`` (every commit is fsynced, so an acknowledged enqueue
  or completion survives a power cut; ``?synchronous=normal`` is faster and
  may lose the last commits on one), ``busy_timeout`` 10 s.
- Worker: ``python -m conveyor.cli worker benchmarks.bench_app:app --burst
  --concurrency 400`` with ``CONVEYOR_URL`` set, as on PostgreSQL and Redis;
  the default lease and heartbeat. An enqueue from another process wakes an
  idle worker through its ``PRAGMA data_version`` watch (every 2 ms within a
  second of the last commit, every 10 ms after).
- Enqueue: ``enqueue_many_async``, 5000 a call (one transaction per call).
- Completion from conveyor's own tables, read through a read-only
  connection (WAL: it never blocks the workers): ``conveyor_tasks.state``
  (succeeded, and the rest unfinished), and the attempt log's
  ``started_at`` / ``finished_at`` (REAL seconds since the epoch, by SQLite's
  clock, migration 0001).
"""

from __future__ import annotations

import asyncio

from benchmarks.bench_app import make_app
from benchmarks.systems.conveyor_peer import BATCH, Conveyor
from benchmarks.systems.sqlite_system import read_row
from benchmarks.systems.system import Completion, moment

SUCCEEDED = "select count(*) from conveyor_tasks where state = 'succeeded'"
COMPLETION = """
select (select count(*) from conveyor_tasks where state = 'succeeded'),
       (select count(*) from conveyor_tasks where state <> 'succeeded'),
       (select min(started_at) from conveyor_attempts),
       (select max(finished_at) from conveyor_attempts)
"""


class ConveyorSqlite(Conveyor):
    """conveyor's PostgreSQL system, on a SQLite file: no schema, and its
    completion read off the file."""

    configuration = f"--concurrency {{concurrency}}, enqueue_many_async x{BATCH}, synchronous=full"

    async def install(self) -> None:
        self.app = make_app(self.dsn)
        await self.app.backend()  # creates the file and migrates it

    def worker_env(self) -> dict[str, str]:
        return {"CONVEYOR_URL": self.dsn}

    async def progress(self) -> int:
        (succeeded,) = await asyncio.to_thread(read_row, self.dsn, SUCCEEDED)
        return int(succeeded)

    async def completion(self) -> Completion:
        succeeded, unfinished, first, last = await asyncio.to_thread(read_row, self.dsn, COMPLETION)
        return Completion(succeeded, unfinished, moment(first), moment(last))
