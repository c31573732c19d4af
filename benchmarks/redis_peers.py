"""conveyor on Redis next to its Python peers on Redis, one table.

The peers: SAQ, arq, Dramatiq (Redis broker), taskiq (taskiq-redis's
``RedisStreamBroker``), RQ and Celery (Redis broker); and ``conveyor-pg``,
conveyor on PostgreSQL (a database of its own beside ``--url``'s), whose
figures the Redis backend is held to: the ``conveyor/pg`` line divides
conveyor's by them. The workload, the
columns and the rounds are those of ``peers.py`` (its machinery runs here:
enqueue/s, processed/s with one and two worker processes from each
system's own records, e2e/s, enqueue-to-start latency, conveyor/best),
each system configured as its module under ``systems/`` says.

Every run starts a Redis server of its own (``tools/redis_server.py``) on a
free port, with 64 databases; every phase of every system gets a database
number of its own, flushed before the phase and after the round (``--keep``
keeps them, and the server's files, in ``--workdir``). ``--appendfsync``
chooses its persistence: ``off`` (the default: no AOF, like the shared
server), or an AOF fsynced ``always`` (before each reply), ``everysec`` or
``no`` (when the kernel writes). One setting per invocation: run it once
per setting to compare.

``--kill-test`` instead enqueues, per system, one task that records its
start and sleeps 5 s into an idle worker, SIGKILLs the worker's process
group 1 s after the start, starts a new worker and reports whether, and
how long after the kill, the task started again (giving up after
``--kill-wait`` seconds).

    pip install -e '.[dev,redis-peers]' && pip install --no-deps arq==0.28.0
    python benchmarks/redis_peers.py --tasks 20000 --rounds 3
    python benchmarks/redis_peers.py --tasks 20000 --systems conveyor --appendfsync always
    python benchmarks/redis_peers.py --kill-test
"""

from __future__ import annotations

import argparse
import asyncio
import contextlib
import os
import secrets
import signal
import sys
import tempfile
import time
from dataclasses import asdict, dataclass, field
from pathlib import Path
from typing import Any

from redis.asyncio import Redis

ROOT = Path(__file__).resolve().parent.parent
if str(ROOT) not in sys.path:  # run as a script: make ``benchmarks`` and ``tools`` importable
    sys.path.insert(0, str(ROOT))

from benchmarks import peers  # noqa: E402
from benchmarks import throughput as tp  # noqa: E402
from benchmarks.systems.stamp import read_stamps  # noqa: E402
from tools.redis_server import RedisServer  # noqa: E402

PG_ROW = "conveyor-pg"
"""conveyor on PostgreSQL (``peers.py``'s system, on a database of its own
beside ``--url``'s), run in the same rounds: the figure the Redis backend is
held to."""
REDIS_SYSTEMS: peers.Registry = {
    "conveyor": ("benchmarks.systems.conveyor_redis_peer", "ConveyorRedis"),
    "saq": ("benchmarks.systems.saq_peer", "SaqSystem"),
    "arq": ("benchmarks.systems.arq_peer", "ArqSystem"),
    "dramatiq": ("benchmarks.systems.dramatiq_peer", "DramatiqSystem"),
    "taskiq": ("benchmarks.systems.taskiq_peer", "TaskiqSystem"),
    "rq": ("benchmarks.systems.rq_peer", "RqSystem"),
    "celery": ("benchmarks.systems.celery_peer", "CelerySystem"),
    PG_ROW: ("benchmarks.systems.conveyor_peer", "Conveyor"),
}
DATABASES = 64
"""Databases of the private server: 7 systems x 3 phases of a round fit."""
APPENDFSYNC = ("off", "always", "everysec", "no")
KILL_SLEEP = 5.0
"""Seconds the kill test's task sleeps."""
KILL_AFTER = 1.0
"""Seconds after its start that the worker is SIGKILLed."""


class RedisStores:
    """A database number of the private server per store, flushed when taken
    and when given back."""

    def __init__(self, server: RedisServer) -> None:
        self.server = server
        self.free = list(range(1, DATABASES))
        self.taken: dict[str, int] = {}

    def url(self, number: int) -> str:
        return f"redis://127.0.0.1:{self.server.port}/{number}"

    async def create(self, name: str) -> str:
        number = self.free.pop(0)
        self.taken[name] = number
        await self._flush(number)
        return self.url(number)

    async def drop(self, name: str) -> None:
        number = self.taken.pop(name)
        await self._flush(number)
        self.free.append(number)

    async def _flush(self, number: int) -> None:
        client = Redis.from_url(self.url(number))
        try:
            await client.flushdb()
        finally:
            await client.aclose()


class BenchStores:
    """The Redis server's databases for every system, but a PostgreSQL
    database for ``conveyor-pg``'s stores (their names carry the system's)."""

    def __init__(self, redis: RedisStores, postgres: peers.PostgresStores) -> None:
        self.redis = redis
        self.postgres = postgres

    def _of(self, name: str) -> peers.Stores:
        return self.postgres if f"_{PG_ROW}_" in name else self.redis

    async def create(self, name: str) -> str:
        return await self._of(name).create(name)

    async def drop(self, name: str) -> None:
        await self._of(name).drop(name)


def start_server(args: argparse.Namespace) -> RedisServer:
    """The benchmark's own redis-server, with ``--appendfsync``'s persistence."""
    workdir = Path(args.workdir or tempfile.mkdtemp(prefix="bench_redis_"))
    if args.appendfsync == "off":
        server = RedisServer(workdir, appendonly=False, appendfsync="everysec")
    else:
        server = RedisServer(workdir, appendonly=True, appendfsync=args.appendfsync)
    server.settings["databases"] = str(DATABASES)
    server.start()
    return server


async def redis_version(server: RedisServer) -> str:
    client = Redis.from_url(server.url)
    try:
        info = await client.info("server")
    finally:
        await client.aclose()
    return str(info["redis_version"])


# -- the kill test ---------------------------------------------------------------


@dataclass
class KillResult:
    system: str
    outcome: str
    """``redelivered``, ``lost`` (no new start within the wait) or ``error``."""
    restarted_after_kill_s: float | None = None
    starts: int = 0
    detail: str = ""
    notes: list[str] = field(default_factory=list)


async def wait_for_starts(path: Path, want: int, seconds: float) -> float | None:
    """Wait for ``want`` stamp lines; the last one's start time, or None."""
    deadline = time.monotonic() + seconds
    while time.monotonic() < deadline:
        stamps = read_stamps(path)
        if len(stamps) >= want:
            return stamps[want - 1][1]
        await asyncio.sleep(tp.POLL_SECONDS)
    return None


def kill_group(process: Any) -> None:
    """SIGKILL the worker and every process it forked (its own session)."""
    with contextlib.suppress(ProcessLookupError):
        os.killpg(process.pid, signal.SIGKILL)
    process.wait()


async def kill_one(args: argparse.Namespace, stores: BenchStores, name: str) -> KillResult:
    cls = peers.load_system(name, REDIS_SYSTEMS)
    concurrency = args.concurrency.get(name, cls.default_concurrency)  # type: ignore[attr-defined]
    system = cls(concurrency, args.worker_log_level)
    store = f"kill_{name}_{args.token}"
    await system.setup(await stores.create(store))
    stamps = system.folder / "stamps"
    first: Any = None
    second: Any = None
    try:
        first = system.spawn(burst=False, stamp_file=stamps, session=True)
        await system.enqueue_sleep(KILL_SLEEP)
        started = await wait_for_starts(stamps, 1, tp.READY_TIMEOUT)
        if started is None:
            kill_group(first)
            return KillResult(name, "error", detail="the task never started")
        await asyncio.sleep(max(0.0, started + KILL_AFTER - time.time()))
        kill_group(first)
        killed = time.time()
        tp.log(f"[{name}] SIGKILLed the worker {killed - started:.2f}s into the task")
        second = system.spawn(burst=False, stamp_file=stamps, session=True)
        again = await wait_for_starts(stamps, 2, args.kill_wait)
        await asyncio.sleep(0.5)  # a third start would show a double redelivery
        starts = len(read_stamps(stamps))
        if again is None:
            detail = f"no new start within {args.kill_wait:g}s of the kill"
            return KillResult(name, "lost", None, starts, detail)
        return KillResult(name, "redelivered", again - killed, starts)
    finally:
        for process in (first, second):
            if process is not None and process.poll() is None:
                kill_group(process)
        await system.teardown()
        if not args.keep:
            await stores.drop(store)


def kill_table(results: list[KillResult]) -> str:
    lines = [f"{'system':<10} {'outcome':<12} {'restart after kill':>18} {'starts':>6}  detail"]
    lines.append("-" * len(lines[0]))
    for r in results:
        after = "-" if r.restarted_after_kill_s is None else f"{r.restarted_after_kill_s:.1f}s"
        lines.append(f"{r.system:<10} {r.outcome:<12} {after:>18} {r.starts:>6}  {r.detail}")
    return "\n".join(lines)


async def kill_test(args: argparse.Namespace, stores: BenchStores) -> list[KillResult]:
    results = []
    for name in args.systems:
        try:
            results.append(await kill_one(args, stores, name))
        except Exception as error:  # report it in the table, go on with the rest
            tp.log(f"[{name}] kill test failed: {error!r}")
            results.append(KillResult(name, "error", detail=repr(error)))
        tp.log(kill_table(results[-1:]))
    return results


# -- main ------------------------------------------------------------------------


async def run(args: argparse.Namespace) -> int:
    args.token = secrets.token_hex(4)
    args.registry = REDIS_SYSTEMS
    server = await asyncio.to_thread(start_server, args)
    try:
        stores = BenchStores(RedisStores(server), peers.PostgresStores(args.url))
        args.stores = stores
        version = await redis_version(server)
        persistence = (
            "no AOF" if args.appendfsync == "off" else f"AOF appendfsync {args.appendfsync}"
        )
        environment = {"redis": version, "persistence": persistence, "cpus": os.cpu_count()}
        report: dict[str, Any] = {"environment": environment, "parameters": vars_of(args)}
        if args.kill_test:
            kills = await kill_test(args, stores)
            report["kill_test"] = [asdict(k) for k in kills]
            text = (
                f"Redis {version} ({persistence}); one task sleeping {KILL_SLEEP:g}s, "
                f"its worker's process group SIGKILLed {KILL_AFTER:g}s in, a new worker "
                f"started\n{kill_table(kills)}"
            )
            return peers.report_out(args, report, text, [])
        results, rounds = await peers.run_rounds(args)
        report["rounds"] = [[asdict(r) for r in one] for one in rounds]
        report["results"] = [asdict(r) for r in results]
        text = (
            f"Redis {version} ({persistence}, private server), Python {sys.version.split()[0]}, "
            f"{os.cpu_count()} CPUs; {peers.workload(args)}\n"
            + peers.table(results, None, rounds)
            + own_ratio(results)
        )
        return peers.report_out(args, report, text, results)
    finally:
        if args.keep:
            tp.log(f"kept the Redis server's files in {server.workdir}")
        await asyncio.to_thread(server.stop)


def own_ratio(results: list[peers.Result]) -> str:
    """conveyor on Redis over conveyor on PostgreSQL, per column, when both ran."""
    names = {r.system for r in results}
    if not {"conveyor", PG_ROW} <= names:
        return ""
    shown = peers.columns(results)
    cells = peers.ratio_cells(peers.ratio_values(results, reference=PG_ROW, shown=shown))
    return "\n" + peers.line("conveyor/pg", cells, shown)


def vars_of(args: argparse.Namespace) -> dict[str, Any]:
    keys = ("tasks", "systems", "rate", "duration", "concurrency", "appendfsync", "rounds")
    return {k: getattr(args, k) for k in keys}


def parse_args(argv: list[str] | None = None) -> argparse.Namespace:
    parser = argparse.ArgumentParser(
        description="conveyor on Redis next to SAQ, arq, Dramatiq, taskiq, RQ and Celery."
    )
    peers.add_workload_arguments(parser, REDIS_SYSTEMS)
    parser.add_argument(
        "--appendfsync",
        choices=APPENDFSYNC,
        default="off",
        help="the private Redis server's persistence: no AOF (off), or an AOF with this "
        "appendfsync (default %(default)s)",
    )
    parser.add_argument("--workdir", help="the Redis server's directory (default: a temporary one)")
    parser.add_argument(
        "--url",
        default=peers.DEFAULT_URL,
        help=f"{PG_ROW}: any database on the PostgreSQL server; its stores are made beside it "
        "(default %(default)s)",
    )
    parser.add_argument(
        "--kill-test", action="store_true", help="the SIGKILL test instead of the benchmark"
    )
    parser.add_argument(
        "--kill-wait",
        type=tp.positive_float,
        default=60.0,
        help="kill test: seconds to wait for the task to start again",
    )
    return parser.parse_args(argv)


if __name__ == "__main__":
    sys.exit(asyncio.run(run(parse_args())))
