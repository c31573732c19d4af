"""huey on SQLite (``SqliteHuey``), configured for throughput as its docs say.

- Storage: ``SqliteHuey("bench", filename=PATH, fsync=True)``. ``fsync=True``
  is its "use durable writes" (``synchronous=FULL`` on its connections; the
  ``SqliteHuey`` entry of its API docs); without it huey keeps the SQLite
  library's default, which those docs call "typically 1" (NORMAL: the last
  commits may be lost on a power cut). WAL, its default journal mode; each
  write is a ``begin exclusive`` transaction (``huey/storage.py``).
- Not a setting, so not durable whatever the settings: a worker deletes a
  task's row when it dequeues it, before running it
  (``SqliteStorage.dequeue``). "Huey does not guarantee at-least-once
  delivery of messages, and does not do acknowledgement of completed
  tasks" (docs/consumer.rst, "Consumer shutdown"): a consumer killed
  mid-task loses that task.
- Consumer: ``python -m huey.bin.huey_consumer benchmarks.systems.huey_peer.huey
  -w 8 -k thread -n -q`` (``huey_consumer``). Worker type ``thread``: the
  docs' choice for work neither CPU- nor socket-bound ("Anything else: use
  thread ... A safe choice and the default", docs/consumer.rst, ``-k``).
  Eight workers, as in the docs' example (``-w 8 ... -q``): "most
  applications will want to increase this number for greater throughput".
  ``-n``: no periodic tasks; ``-q``: warnings and errors only (its default,
  INFO, logs every task). The threads of one consumer share its one SQLite
  connection, behind a lock (``BaseSqlStorage``).
- Polling, its defaults: each worker thread polls every 0.1 s (``-d``),
  backing off by 1.15 up to 10 s while the queue is empty, so the
  enqueue-to-start latency is that poll. No burst mode: the benchmark stops
  the consumer (SIGTERM) once every task is recorded.
- Enqueue: huey has no bulk enqueue; ``TaskWrapper.map`` (its way to enqueue
  a task per item) is a loop of ``enqueue`` calls, one committed insert each.
- Completion: huey keeps no record of a finished task (the dequeue deleted
  its row; a result is stored only for a task that returns something other
  than None, and a no-op returns None). So the no-op handler appends ``i
  started finished`` to a record file beside the database
  (``stamp.record_run``, as for Dramatiq and taskiq on Redis): the count
  and the window come from there. Not a return value in huey's result store
  nor a table of our own in the same file: either would add a write
  transaction, with its fsync, to every task, which huey's no-op does not do.
"""

from __future__ import annotations

import asyncio
import os
import sys
import time
from dataclasses import dataclass
from pathlib import Path
from typing import Any, ClassVar

from huey import SqliteHuey
from huey.api import TaskWrapper

from benchmarks.systems.sqlite_system import path_of
from benchmarks.systems.stamp import (
    RECORD_ENV,
    count_records,
    read_records,
    record_run,
    record_start,
)
from benchmarks.systems.system import Completion, System, moment

NAME = "bench"
"""huey's name: the queue's key in its tables."""


def bench_noop(i: int = 0) -> None:
    record_run(i, time.time())


def bench_stamp(sent: float = 0.0) -> None:
    record_start(sent)


@dataclass(frozen=True)
class HueyApp:
    """A ``SqliteHuey`` on one file, with the benchmark's tasks registered."""

    huey: SqliteHuey
    noop: TaskWrapper
    stamp: TaskWrapper


def make_huey(url: str) -> HueyApp:
    """huey on the file of ``url`` (``sqlite:////ABS/PATH.db``); creates its tables."""
    huey = SqliteHuey(NAME, filename=path_of(url), fsync=True)
    return HueyApp(huey, huey.task()(bench_noop), huey.task()(bench_stamp))


def __getattr__(name: str) -> Any:
    """``huey``: the instance ``huey_consumer``'s import path names, on the
    worker's file (``BENCH_PEER_DSN``); made when the consumer asks for it,
    so that importing this module opens no file."""
    if name != "huey":
        raise AttributeError(f"module {__name__!r} has no attribute {name!r}")
    return make_huey(os.environ["BENCH_PEER_DSN"]).huey


def record_path(url: str) -> Path:
    """The record file beside the database file of ``url``."""
    return Path(f"{path_of(url)}.records")


class HueySystem(System):
    name: ClassVar[str] = "huey"
    configuration = "fsync=True, -k thread -w {concurrency}, map() one by one"
    default_concurrency: ClassVar[int] = 8

    app: HueyApp
    enqueued: int

    async def install(self) -> None:
        self.app = await asyncio.to_thread(make_huey, self.dsn)
        self.enqueued = 0

    async def enqueue(self, n: int) -> float:
        def send() -> float:
            started = time.perf_counter()
            self.app.noop.map(range(n))
            return time.perf_counter() - started

        seconds = await asyncio.to_thread(send)
        self.enqueued += n
        return seconds

    async def enqueue_stamp(self, sent: float) -> None:
        await asyncio.to_thread(self.app.stamp, sent)

    def worker_command(self, burst: bool) -> list[str]:
        command = [sys.executable, "-m", "huey.bin.huey_consumer", f"{__name__}.huey"]
        command += ["--workers", str(self.concurrency), "--worker-type", "thread"]
        quiet = self.log_level.upper() not in ("DEBUG", "INFO")
        return [*command, "--no-periodic", *(["--quiet"] if quiet else [])]

    def worker_env(self) -> dict[str, str]:
        return {RECORD_ENV: str(record_path(self.dsn))}

    async def close(self) -> None:
        await asyncio.to_thread(self.app.huey.storage.close)

    async def progress(self) -> int:
        return count_records(record_path(self.dsn))

    async def completion(self) -> Completion:
        """From the record file: distinct tasks recorded; the rest unfinished."""
        done, first, last = read_records(record_path(self.dsn))
        return Completion(len(done), self.enqueued - len(done), moment(first), moment(last))
