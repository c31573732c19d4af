"""The interface every system under benchmark implements, and the parts they share.

A system knows how to install itself into an empty database, bulk-enqueue
no-op tasks, enqueue one stamped task, start a real worker process, and count
what its own tables say completed. Draining with worker processes and the
paced latency run are the same for all of them and live here.
"""

from __future__ import annotations

import abc
import asyncio
import contextlib
import os
import signal
import subprocess
import sys
import tempfile
import time
from collections.abc import Callable
from dataclasses import dataclass
from datetime import UTC, datetime
from pathlib import Path
from typing import Any, ClassVar

import psycopg

from benchmarks.systems.stamp import STAMP_ENV, WARM_UP, latencies, read_stamps
from benchmarks.throughput import POLL_SECONDS, READY_TIMEOUT, ROOT, log, paced, stop_worker
from conveyor.backends.sqlfiles import read_blocks

QUERIES = read_blocks("benchmarks.systems", "queries.sql")
IDLE_SECONDS = 1.0
"""How long a latency worker sits idle after its warm-up task."""
SETTLE_SECONDS = 5.0
"""How long released drains give their worker processes to start (imports,
connections, migrations) before stopping them for the enqueue."""


@dataclass(frozen=True)
class Completion:
    """What a system's own tables say about the tasks of one drain."""

    succeeded: int
    unfinished: int
    """Tasks still queued, running or failed."""
    first_start: datetime | None
    last_finish: datetime | None

    def window(self) -> float:
        """Seconds from the first start to the last finish (0 if unknown)."""
        if self.first_start is None or self.last_finish is None:
            return 0.0
        return (self.last_finish - self.first_start).total_seconds()


@dataclass
class DrainRun:
    processes: int
    wall_seconds: float
    """Spawn of the worker processes to every task seen completed."""
    completion: Completion
    exit_codes: list[int]
    timed_out: bool


def moment(seconds: float | None) -> datetime | None:
    """Epoch seconds as an aware datetime (None stays None)."""
    return None if seconds is None else datetime.fromtimestamp(seconds, UTC)


class System(abc.ABC):
    """One task system under benchmark, installed in its own database."""

    name: ClassVar[str]
    default_concurrency: ClassVar[int] = 50
    """Worker concurrency unless ``--concurrency name=N`` says otherwise."""
    configuration: ClassVar[str]
    """How it is configured, for the table; ``{concurrency}`` is filled in."""

    @property
    def tables(self) -> str:
        """Whose tables it keeps (``queries.sql`` names its queries so)."""
        return self.name

    def __init__(self, concurrency: int, log_level: str) -> None:
        self.concurrency = concurrency
        self.log_level = log_level
        self.dsn = ""

    # -- what each system provides -------------------------------------------------

    @property
    def note(self) -> str:
        """How it is configured, for the table."""
        return self.configuration.format(concurrency=self.concurrency)

    @abc.abstractmethod
    async def install(self) -> None:
        """Create the system's tables in the empty database ``self.dsn``; open clients."""

    @abc.abstractmethod
    async def enqueue(self, n: int) -> float:
        """Bulk-enqueue ``n`` no-op tasks the way the system's docs recommend; seconds."""

    @abc.abstractmethod
    async def enqueue_stamp(self, sent: float) -> None:
        """Enqueue one task whose handler calls ``record_start(sent)``."""

    @abc.abstractmethod
    def worker_command(self, burst: bool) -> list[str]:
        """A worker process; ``burst``: exit once the queue is empty, where supported."""

    def worker_env(self) -> dict[str, str]:
        """Extra environment for the worker process."""
        return {}

    async def close(self) -> None:  # noqa: B027 - optional: not every system opens one
        """Close the clients ``install`` opened."""

    async def enqueue_sleep(self, seconds: float) -> None:
        """Enqueue one task whose handler calls ``record_start(0.0)`` and then
        sleeps ``seconds`` (``redis_peers.py --kill-test``); optional."""
        raise NotImplementedError(f"{self.name} has no kill test")

    async def progress(self) -> int:
        """Tasks completed so far, as the drain polls it every 50 ms: by default
        :meth:`completion`; a system whose full count is costly gives a cheap one."""
        return (await self.completion()).succeeded

    # -- shared --------------------------------------------------------------------

    async def setup(self, dsn: str) -> None:
        self.dsn = dsn
        await self.install()

    async def teardown(self) -> None:
        await self.close()

    def spawn(
        self, burst: bool, stamp_file: Path | None = None, session: bool = False
    ) -> subprocess.Popen[bytes]:
        """Start a worker process; ``session``: in a session (process group) of its
        own, so that the kill test can SIGKILL it with every child it forked."""
        env = dict(os.environ)
        env["BENCH_PEER_DSN"] = self.dsn
        env["PYTHONPATH"] = os.pathsep.join(filter(None, [str(ROOT), env.get("PYTHONPATH")]))
        if stamp_file is not None:
            env[STAMP_ENV] = str(stamp_file)
        env.update(self.worker_env())
        command = self.worker_command(burst)
        return subprocess.Popen(
            command,
            cwd=ROOT,
            env=env,
            stdout=sys.stderr,
            stderr=sys.stderr,
            start_new_session=session,
        )

    async def completion(self) -> Completion:
        async with await psycopg.AsyncConnection.connect(self.dsn, autocommit=True) as conn:
            cursor = await conn.execute(QUERIES[f"{self.tables}_completion"])
            row: tuple[Any, ...] | None = await cursor.fetchone()
        assert row is not None
        return Completion(*row)

    async def _until_done(self, n: int, deadline: float, gone: Callable[[], bool]) -> bool:
        """Poll until ``n`` tasks completed, the workers are ``gone`` or the
        ``deadline`` (``time.perf_counter()``) passes; whether it timed out."""
        while time.perf_counter() < deadline:
            if await self.progress() >= n:
                return False
            if gone():
                return await self.progress() < n
            await asyncio.sleep(POLL_SECONDS)
        return True

    async def drain(self, processes: int, n: int, timeout: float) -> DrainRun:
        """Start ``processes`` workers on ``n`` queued tasks; time until all completed."""
        started = time.perf_counter()
        workers = [self.spawn(burst=True) for _ in range(processes)]
        try:
            # Burst workers exit when done: the last ones may have just committed.
            timed_out = await self._until_done(n, started + timeout, lambda: all(exited(workers)))
            wall = time.perf_counter() - started
        finally:
            codes = [await stop_worker(w) for w in workers]
        return DrainRun(processes, wall, await self.completion(), codes, timed_out)

    async def drain_released(
        self, processes: int, n: int, timeout: float
    ) -> tuple[DrainRun, float]:
        """Start ``processes`` workers on an empty queue and give them
        ``SETTLE_SECONDS`` to start; stop them (SIGSTOP, each with its process
        group), enqueue ``n`` tasks (timed: the second value), release them
        together (SIGCONT); time until all completed. The window then holds
        neither an interpreter's start-up nor one process starting later than
        another. The workers run as they would serve, not in burst mode."""
        workers = [self.spawn(burst=False, session=True) for _ in range(processes)]
        try:
            await asyncio.sleep(SETTLE_SECONDS)
            if any(exited(workers)):
                raise RuntimeError(f"{self.name}: a worker exited before the tasks came")
            for worker in workers:
                os.killpg(worker.pid, signal.SIGSTOP)
            enqueue_seconds = await self.enqueue(n)
            started = time.perf_counter()
            for worker in workers:
                os.killpg(worker.pid, signal.SIGCONT)
            timed_out = await self._until_done(n, started + timeout, lambda: any(exited(workers)))
            wall = time.perf_counter() - started
        finally:
            for worker in workers:
                with contextlib.suppress(ProcessLookupError):
                    os.killpg(worker.pid, signal.SIGCONT)
            codes = [await stop_worker(w) for w in workers]
        return DrainRun(processes, wall, await self.completion(), codes, timed_out), enqueue_seconds

    async def latency(self, rate: float, duration: float, timeout: float) -> list[float]:
        """Enqueue one stamped task at a time at ``rate``/s for ``duration`` s into an
        idle worker; enqueue-to-start seconds, sorted (missing tasks are left out)."""
        total = max(1, round(rate * duration))
        with tempfile.TemporaryDirectory(prefix=f"bench_{self.name}_") as folder:
            stamp_file = Path(folder) / "stamps"
            worker = self.spawn(burst=False, stamp_file=stamp_file)
            try:
                await self.enqueue_stamp(WARM_UP)
                if not await wait_stamps(stamp_file, 1, READY_TIMEOUT, worker):
                    raise RuntimeError(f"{self.name}: the latency worker did not start")
                await asyncio.sleep(IDLE_SECONDS)
                await paced(total, rate, lambda _: self.enqueue_stamp(time.time()))
                if not await wait_stamps(stamp_file, total + 1, timeout, worker):
                    log(f"{self.name}: {total + 1 - len(read_stamps(stamp_file))} stamps missing")
            finally:
                await stop_worker(worker)
            return latencies(stamp_file)


def exited(workers: list[subprocess.Popen[bytes]]) -> list[bool]:
    """Whether each worker process has exited."""
    return [w.poll() is not None for w in workers]


async def wait_stamps(
    path: Path, want: int, timeout: float, worker: subprocess.Popen[bytes]
) -> bool:
    """Wait until the stamp file has ``want`` lines; False on timeout or worker exit."""
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline and worker.poll() is None:
        if len(read_stamps(path)) >= want:
            return True
        await asyncio.sleep(POLL_SECONDS)
    return False
