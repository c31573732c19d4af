"""DBOS (DBOS Transact) queues on a SQLite system database, configured as its docs say.

- System database: ``"system_database_url": "sqlite:////ABS/PATH.db"`` with
  DBOS's own SQLite settings: ``BEGIN IMMEDIATE`` writes, ``busy_timeout``
  30 s, and no journal mode or ``synchronous`` of its own, so SQLite's
  defaults: a rollback journal (not WAL) and ``synchronous=FULL`` (the
  library's default here: every commit syncs the journal and the file).
  That is durable; DBOS has no setting for it. Its docs call SQLite
  "excellent for prototyping and testing" and recommend Postgres for
  production (docs/python/tutorials/database-connection.md).
- Worker: ``python -m benchmarks.systems.dbos_peer``, the docs' queue worker
  (docs/python/examples/queue-worker.md): ``DBOS(config=...)``,
  ``DBOS.launch()``, ``DBOS.register_queue(...)``, then wait; SIGTERM calls
  ``DBOS.destroy()``. Each process has an ``executor_id`` of its own
  (``bench-PID``), which ``worker_concurrency`` needs (the queue tutorial,
  "Worker Concurrency"), and the fixed ``application_version`` "bench", so
  that every worker is the latest version, the one that runs workflows
  enqueued without a version. No burst mode: the benchmark stops the
  workers (SIGTERM) once DBOS counts every workflow succeeded.
- Queue ``bench``: ``worker_concurrency=100``, the kind of limit its docs
  recommend "for most use cases" (over a global ``concurrency``); 100
  drained fastest of 50, 100 and 200 in short runs here. DBOS runs each
  workflow of a sync function on a thread of its executor.
  ``polling_interval_sec=0.1`` instead of its default 1.0: a worker claims
  at most ``worker_concurrency`` workflows per poll, so at 1 s it could not
  start more than 100 a second, whatever the machine. 0.1 is the value of
  the docs' own example of lowering a queue's polling interval (the Kafka
  queues' ``kafka_queue_polling_interval_sec``: "Lowering the interval
  reduces the delay between a message being enqueued and its workflow
  starting, but requires more frequent database polling",
  docs/python/tutorials/kafka-integration.md). An idle worker finds a new
  workflow at its next poll: the enqueue-to-start latency is that poll.
- Task: a no-op ``@DBOS.workflow(name="bench_noop")`` without steps: "two-three
  database writes" per workflow (docs/production/checklist.md).
- Enqueue: ``DBOSClient.enqueue`` (the docs' way to enqueue from outside the
  application, the queue-worker example), one workflow after the other, each
  a transaction of its own: DBOS has no bulk enqueue. (``enqueue_in_transaction``
  could put many in one transaction; its docs present it for atomicity with
  the caller's own writes, not as a batch API, so it is not used.)
- Completion from DBOS's own ``workflow_status`` table (read-only
  connection): the ``SUCCESS`` rows of queue ``bench`` succeeded, the others
  unfinished. Its times (``started_at_epoch_ms``, ``completed_at``) are too
  coarse for the window: on SQLite, DBOS stamps them with
  ``strftime('%s','now') * 1000`` before Python 3.12 (whole seconds;
  ``unixepoch('subsec')`` from 3.12), so the no-op also appends ``i started
  finished`` to a record file beside the database (``stamp.record_run``) and
  the window (first start to last finish) comes from there.
"""

from __future__ import annotations

import asyncio
import os
import signal
import sys
import threading
import time
from pathlib import Path
from typing import ClassVar

from dbos import DBOS, DBOSClient, DBOSConfig, EnqueueOptions

from benchmarks.systems.sqlite_system import path_of, read_row
from benchmarks.systems.stamp import RECORD_ENV, read_records, record_run, record_start
from benchmarks.systems.system import Completion, System, moment

APP = "bench"
"""The application's name: it owns the queue and the workflows."""
VERSION = "bench"
QUEUE = "bench"
POLLING_INTERVAL = 0.1
"""Seconds between a worker's polls of the queue (DBOS's default: 1.0)."""
NOOP: EnqueueOptions = {"queue_name": QUEUE, "workflow_name": "bench_noop"}
STAMP: EnqueueOptions = {"queue_name": QUEUE, "workflow_name": "bench_stamp"}
SUCCEEDED = "select count(*) from workflow_status where queue_name = ? and status = 'SUCCESS'"
COUNTS = """
select count(*) filter (where status = 'SUCCESS'),
       count(*) filter (where status <> 'SUCCESS')
from workflow_status where queue_name = ?
"""


@DBOS.workflow(name="bench_noop")
def bench_noop(i: int = 0) -> None:
    record_run(i, time.time())


@DBOS.workflow(name="bench_stamp")
def bench_stamp(sent: float = 0.0) -> None:
    record_start(sent)


class DbosSystem(System):
    name: ClassVar[str] = "dbos"
    configuration = (
        f"worker_concurrency {{concurrency}}, polling {POLLING_INTERVAL:g}s, enqueue one by one"
    )
    default_concurrency: ClassVar[int] = 100

    client: DBOSClient

    @property
    def record_file(self) -> Path:
        return Path(f"{path_of(self.dsn)}.records")

    async def install(self) -> None:
        def start() -> DBOSClient:
            DBOS.migrate(self.dsn)  # the client never creates the system database
            return DBOSClient(system_database_url=self.dsn, application_name=APP)

        self.client = await asyncio.to_thread(start)

    async def enqueue(self, n: int) -> float:
        def send() -> float:
            started = time.perf_counter()
            for i in range(n):
                self.client.enqueue(NOOP, i)
            return time.perf_counter() - started

        return await asyncio.to_thread(send)

    async def enqueue_stamp(self, sent: float) -> None:
        await asyncio.to_thread(self.client.enqueue, STAMP, sent)

    def worker_command(self, burst: bool) -> list[str]:
        return [sys.executable, "-m", __name__]

    def worker_env(self) -> dict[str, str]:
        return {
            RECORD_ENV: str(self.record_file),
            "BENCH_CONCURRENCY": str(self.concurrency),
            "BENCH_LOG_LEVEL": self.log_level,
        }

    async def close(self) -> None:
        await asyncio.to_thread(self.client.destroy)

    async def progress(self) -> int:
        (succeeded,) = await asyncio.to_thread(read_row, self.dsn, SUCCEEDED, (QUEUE,))
        return int(succeeded)

    async def completion(self) -> Completion:
        succeeded, unfinished = await asyncio.to_thread(read_row, self.dsn, COUNTS, (QUEUE,))
        _done, first, last = read_records(self.record_file)
        return Completion(succeeded, unfinished, moment(first), moment(last))


def config(url: str, log_level: str) -> DBOSConfig:
    """This worker process's configuration."""
    return {
        "name": APP,
        "system_database_url": url,
        "application_version": VERSION,
        "executor_id": f"bench-{os.getpid()}",
        "log_level": log_level,
    }


def work() -> None:
    """The docs' queue worker: launch, register the queue, serve it until SIGTERM."""
    stop = threading.Event()
    signal.signal(signal.SIGTERM, lambda *_: stop.set())
    DBOS(config=config(os.environ["BENCH_PEER_DSN"], os.environ["BENCH_LOG_LEVEL"]))
    DBOS.launch()
    DBOS.register_queue(
        QUEUE,
        worker_concurrency=int(os.environ["BENCH_CONCURRENCY"]),
        polling_interval_sec=POLLING_INTERVAL,
    )
    stop.wait()
    DBOS.destroy()


if __name__ == "__main__":
    work()
