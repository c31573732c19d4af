"""Throughput and latency of conveyor on PostgreSQL, with one real worker process.

Throughput (default): for each ``--concurrency`` value, in a fresh schema,
bulk-enqueue ``--tasks`` no-op tasks with ``App.enqueue_many_async`` in batches
of ``--batch`` (timed: enqueue tasks/s), then drain them with ONE worker
process, ``python -m conveyor.cli worker benchmarks.bench_app:app --burst``,
timed from spawn to exit (processed tasks/s, end to end). Afterwards SQL checks
that every task ``succeeded`` and that there is exactly one attempt row each.

Latency (``--latency``): with a worker already running idle (not burst),
enqueue one task at a time at ``--rate`` per second for ``--duration``
seconds and report enqueue-to-start latency from the database
(``attempt_log.started_at - tasks.created_at``), p50/p90/p99/max in ms.

    python benchmarks/throughput.py --tasks 20000
    python benchmarks/throughput.py --tasks 20000 --concurrency 10,50,100,200 --json
    python benchmarks/throughput.py --latency --rate 200 --duration 5
    python benchmarks/throughput.py --tasks 20000 --concurrency 50 --flow plain,keys,rate

``--flow`` drains the same tasks under flow control, each kind in a run of
its own: ``plain`` (none), ``keys`` (each task under one of ``--keys``
concurrency keys of limit 1: ``Concurrency(key=f"k{i % keys}", limit=1)``)
and ``rate`` (every task under one rate limit, ``--rate-limit`` starts a
second: set above the drain rate it measures what the bookkeeping costs).

Each run uses its own schema ``bench_<random>_...``, dropped at the end
unless ``--keep``. The URL comes from ``--url``, else ``CONVEYOR_URL``, else
``postgresql://127.0.0.1:5432/test``.
"""

from __future__ import annotations

import argparse
import asyncio
import contextlib
import json
import os
import platform
import resource
import shutil
import signal
import subprocess
import sys
import time
import uuid
from collections.abc import AsyncIterator, Awaitable, Callable, Sequence
from dataclasses import asdict, dataclass
from datetime import datetime
from pathlib import Path
from typing import IO, Any
from urllib.parse import parse_qsl, urlencode, urlsplit, urlunsplit

import psycopg
from psycopg import sql

ROOT = Path(__file__).resolve().parent.parent
if str(ROOT) not in sys.path:  # run as a script: make ``benchmarks`` importable
    sys.path.insert(0, str(ROOT))

from benchmarks.bench_app import DEFAULT_URL, TASK_NAME, make_app  # noqa: E402
from conveyor import Concurrency, EnqueueOptions, RateLimit  # noqa: E402

WORKER_APP = "benchmarks.bench_app:app"
READY_TIMEOUT = 60.0
STOP_TIMEOUT = 60.0
POLL_SECONDS = 0.05


# -- helpers -------------------------------------------------------------------


def log(message: str) -> None:
    print(message, file=sys.stderr, flush=True)


def parse_concurrency(text: str) -> list[int]:
    try:
        values = [int(part) for part in text.split(",") if part.strip()]
    except ValueError:
        raise argparse.ArgumentTypeError(f"expected integers like 10,50,100: {text!r}") from None
    if not values or any(v < 1 for v in values):
        raise argparse.ArgumentTypeError("concurrency values must be >= 1")
    return values


FLOWS = ("plain", "keys", "rate")


def parse_metrics(text: str) -> list[bool]:
    words = [part.strip() for part in text.split(",") if part.strip()]
    if not words or any(w not in ("off", "on") for w in words):
        raise argparse.ArgumentTypeError(f"metrics are off or on, comma-separated: {text!r}")
    return [w == "on" for w in words]


def parse_flows(text: str) -> list[str]:
    flows = [part.strip() for part in text.split(",") if part.strip()]
    unknown = [f for f in flows if f not in FLOWS]
    if not flows or unknown:
        raise argparse.ArgumentTypeError(f"flows are {', '.join(FLOWS)}: {text!r}")
    return flows


def positive_int(text: str) -> int:
    value = int(text)
    if value < 1:
        raise argparse.ArgumentTypeError("must be >= 1")
    return value


def positive_float(text: str) -> float:
    value = float(text)
    if value <= 0:
        raise argparse.ArgumentTypeError("must be > 0")
    return value


def libpq_url(url: str) -> str:
    """``url`` without conveyor's own ``?schema=`` parameter, for psycopg."""
    parts = urlsplit(url)
    query = [(k, v) for k, v in parse_qsl(parts.query) if k != "schema"]
    return urlunsplit(parts._replace(query=urlencode(query)))


def _busy_cpu() -> float | None:
    """Busy CPU seconds summed over all cores since boot (Linux only)."""
    try:
        first = Path("/proc/stat").read_text(encoding="ascii").split("\n", 1)[0]
    except OSError:
        return None
    ticks = [int(v) for v in first.split()[1:9]]
    idle = ticks[3] + ticks[4]  # idle + iowait
    return (sum(ticks) - idle) / os.sysconf("SC_CLK_TCK")


def _postgres_cpu() -> float | None:
    """CPU seconds of the local PostgreSQL processes, exited backends included
    (the postmaster's cutime/cstime); None when no PostgreSQL process is visible."""
    total, found = 0, False
    for entry in Path("/proc").iterdir():
        if not entry.name.isdigit():
            continue
        try:
            text = (entry / "stat").read_text(encoding="utf-8", errors="replace")
        except OSError:
            continue
        name_end = text.rfind(")")
        if text[text.find("(") + 1 : name_end] != "postgres":
            continue
        fields = text[name_end + 2 :].split()
        total += sum(int(v) for v in fields[11:15])  # utime stime cutime cstime
        found = True
    return total / os.sysconf("SC_CLK_TCK") if found else None


def _own_cpu(who: int) -> float:
    usage = resource.getrusage(who)
    return usage.ru_utime + usage.ru_stime


@dataclass
class Usage:
    """Wall and CPU seconds of one measured phase."""

    wall: float
    own_cpu: float
    """This benchmark process."""
    child_cpu: float
    """Waited-for child processes: the worker."""
    postgres_cpu: float | None
    """Local PostgreSQL processes (None if PostgreSQL is remote or invisible)."""
    busy_cpu: float | None
    """Every process on the machine."""


class Meter:
    """Measure the wall time and the CPU time spent inside a ``with`` block."""

    def __enter__(self) -> Meter:
        self._start = (
            time.perf_counter(),
            _own_cpu(resource.RUSAGE_SELF),
            _own_cpu(resource.RUSAGE_CHILDREN),
            _postgres_cpu(),
            _busy_cpu(),
        )
        return self

    def __exit__(self, *exc: object) -> None:
        wall, own, child, pg, busy = self._start
        pg_after, busy_after = _postgres_cpu(), _busy_cpu()
        self.usage = Usage(
            wall=time.perf_counter() - wall,
            own_cpu=_own_cpu(resource.RUSAGE_SELF) - own,
            child_cpu=_own_cpu(resource.RUSAGE_CHILDREN) - child,
            postgres_cpu=pg_after - pg if pg is not None and pg_after is not None else None,
            busy_cpu=busy_after - busy if busy is not None and busy_after is not None else None,
        )


@contextlib.asynccontextmanager
async def connect(url: str) -> AsyncIterator[psycopg.AsyncConnection[Any]]:
    conn = await psycopg.AsyncConnection.connect(libpq_url(url), autocommit=True)
    try:
        yield conn
    finally:
        await conn.close()


Query = sql.SQL | sql.Composed


async def fetch_one(conn: psycopg.AsyncConnection[Any], query: Query) -> tuple[Any, ...]:
    cursor = await conn.execute(query)
    row: tuple[Any, ...] | None = await cursor.fetchone()
    assert row is not None
    return row


async def drop_schema(url: str, schema: str) -> None:
    async with connect(url) as conn:
        await conn.execute(
            sql.SQL("drop schema if exists {} cascade").format(sql.Identifier(schema))
        )


# -- the worker process --------------------------------------------------------


@dataclass(frozen=True)
class WorkerSpec:
    url: str
    concurrency: int
    burst: bool
    poll_interval: float | None
    log_level: str
    profile: Path | None = None
    lease: float | None = None
    metrics: bool = False
    """Count the worker's events into Prometheus metrics (``--metrics-port 0``)."""
    work_connections: int | None = None
    """The worker's ``--work-connections`` (None: its default)."""


def worker_command(spec: WorkerSpec) -> list[str]:
    command = [
        sys.executable,
        "-m",
        "conveyor.cli",
        "worker",
        WORKER_APP,
        "--concurrency",
        str(spec.concurrency),
        "--log-level",
        spec.log_level,
    ]
    if spec.burst:
        command.append("--burst")
    if spec.poll_interval is not None:
        command += ["--poll-interval", str(spec.poll_interval)]
    if spec.lease is not None:
        command += ["--lease", str(spec.lease)]
    if spec.metrics:
        command += ["--metrics-port", "0", "--metrics-addr", "127.0.0.1"]
    if spec.work_connections is not None:
        command += ["--work-connections", str(spec.work_connections)]
    if spec.profile is not None:
        py_spy = shutil.which("py-spy")
        if py_spy is None:
            raise SystemExit("--profile needs py-spy on PATH (pip install py-spy)")
        command = [py_spy, "record", "-o", str(spec.profile), "--format", "speedscope"]
        command += ["--", *worker_command(WorkerSpec(**{**asdict(spec), "profile": None}))]
    return command


def start_worker(
    spec: WorkerSpec, schema: str, extra: Sequence[str] = ()
) -> subprocess.Popen[bytes]:
    """The worker process of ``spec``, with ``extra`` options of ``conveyor worker``."""
    env = dict(os.environ)
    env["CONVEYOR_URL"] = spec.url
    env["CONVEYOR_SCHEMA"] = schema
    env["PYTHONPATH"] = os.pathsep.join(filter(None, [str(ROOT), env.get("PYTHONPATH")]))
    out: IO[str] = sys.stderr  # keep our stdout clean for --json
    command = [*worker_command(spec), *extra]
    return subprocess.Popen(command, cwd=ROOT, env=env, stdout=out, stderr=out)


async def stop_worker(process: subprocess.Popen[bytes]) -> int:
    """SIGTERM (graceful), then SIGKILL if it does not exit in time."""
    if process.poll() is None:
        process.send_signal(signal.SIGTERM)
        try:
            await asyncio.to_thread(process.wait, STOP_TIMEOUT)
        except subprocess.TimeoutExpired:
            process.kill()
            await asyncio.to_thread(process.wait)
    return process.returncode


# -- throughput ----------------------------------------------------------------


@dataclass
class ThroughputResult:
    concurrency: int
    flow: str
    tasks: int
    schema: str
    enqueue_seconds: float
    enqueue_per_s: float
    enqueue_client_cpu_seconds: float
    """CPU of this process while enqueueing (payload checks, encoding, psycopg)."""
    enqueue_postgres_cpu_seconds: float | None
    worker_seconds: float
    """Worker wall time, from spawn to exit (interpreter start and burst exit included)."""
    processed_per_s: float
    startup_seconds: float
    """Spawn to the first claim (interpreter start, imports, pool, registration)."""
    drain_seconds: float
    """First attempt started_at to last attempt finished_at, by the database clock."""
    drain_per_s: float
    exit_seconds: float
    """Last completion recorded to the process exit (burst detection, shutdown)."""
    worker_cpu_seconds: float
    postgres_cpu_seconds: float | None
    """CPU of the local PostgreSQL processes from worker spawn to exit."""
    busy_cores: float | None
    """Cores busy machine-wide, on average, from worker spawn to exit."""
    claim_statements: int
    """Distinct attempt_log.started_at values: one per claim statement."""
    finish_statements: int
    """Distinct attempt_log.finished_at values: one per finish statement."""
    succeeded: int
    attempt_rows: int
    attempts_succeeded: int
    worker_exit_code: int
    ok: bool


def flow_options(args: argparse.Namespace, flow: str) -> EnqueueOptions:
    """The enqueue options of a ``--flow`` kind (``plain`` reads no other
    argument: scripts that reuse the enqueue have none)."""
    if flow == "keys":
        keys: int = args.keys
        return EnqueueOptions(concurrency=Concurrency(key=lambda a: f"k{a['i'] % keys}", limit=1))
    if flow == "rate":
        return EnqueueOptions(rate=RateLimit(limit=args.rate_limit, per=1, key="bench"))
    return EnqueueOptions()


async def enqueue_all(args: argparse.Namespace, schema: str, flow: str = "plain") -> Usage:
    """Create the schema, then enqueue ``--tasks`` in batches of ``--batch`` (measured)."""
    app = make_app(args.url, schema)
    options = flow_options(args, flow)
    async with app:  # opens the pool and migrates the fresh schema, unmeasured
        with Meter() as meter:
            for first in range(0, args.tasks, args.batch):
                payloads = [{"i": i} for i in range(first, min(first + args.batch, args.tasks))]
                await app.enqueue_many_async(TASK_NAME, payloads, options=options)
    if args.analyze:
        async with connect(args.url) as conn:
            await conn.execute(sql.SQL("analyze {}").format(sql.Identifier(schema, "tasks")))
    return meter.usage


VERIFY = """
select
    (select count(*) from {s}.tasks),
    (select count(*) from {s}.tasks where state = 'succeeded'),
    (select count(*) from {s}.attempt_log),
    (select count(*) from {s}.attempt_log where outcome = 'succeeded'),
    (select count(distinct started_at) from {s}.attempt_log),
    (select count(distinct finished_at) from {s}.attempt_log),
    (select min(started_at) from {s}.attempt_log),
    (select max(finished_at) from {s}.attempt_log)
"""


@dataclass
class Drain:
    exit_code: int
    usage: Usage
    db_started: datetime
    db_ended: datetime


async def drain(spec: WorkerSpec, schema: str, timeout: float) -> Drain:
    """Run one burst worker to its exit; its wall and CPU, and database-clock bounds."""
    clock = sql.SQL("select clock_timestamp()")
    async with connect(spec.url) as conn:
        (db_started,) = await fetch_one(conn, clock)
        with Meter() as meter:
            process = start_worker(spec, schema)
            try:
                exit_code = await asyncio.to_thread(process.wait, timeout)
            except subprocess.TimeoutExpired:
                log(f"the worker did not finish in {timeout}s; stopping it")
                exit_code = await stop_worker(process)
        (db_ended,) = await fetch_one(conn, clock)
    return Drain(exit_code, meter.usage, db_started, db_ended)


async def run_throughput(
    args: argparse.Namespace,
    prefix: str,
    concurrency: int,
    flow: str = "plain",
    metrics: bool = False,
) -> ThroughputResult:
    schema = f"{prefix}_c{concurrency}_{flow}{'_m' if metrics else ''}"
    tasks: int = args.tasks
    log(
        f"[c={concurrency} {flow}] schema {schema}: enqueueing {tasks} tasks "
        f"in batches of {args.batch}"
    )
    enqueued = await enqueue_all(args, schema, flow)
    log(f"[c={concurrency}] enqueued in {enqueued.wall:.3f}s; draining with one worker")

    profile = None
    if args.profile is not None:
        args.profile.mkdir(parents=True, exist_ok=True)
        profile = args.profile / f"worker_c{concurrency}.speedscope.json"
    spec = WorkerSpec(
        args.url,
        concurrency,
        True,
        args.poll_interval,
        args.worker_log_level,
        profile,
        metrics=metrics,
        work_connections=args.work_connections,
    )
    run = await drain(spec, schema, args.timeout)
    usage = run.usage

    async with connect(args.url) as conn:
        row = await fetch_one(conn, sql.SQL(VERIFY).format(s=sql.Identifier(schema)))
    count, succeeded, attempt_rows, attempts_ok, claims, finishes, first, last = row
    window = (last - first).total_seconds() if first and last else 0.0
    ok = run.exit_code == 0 and count == succeeded == attempt_rows == attempts_ok == tasks
    return ThroughputResult(
        concurrency=concurrency,
        flow=f"{flow}+m" if metrics else flow,
        tasks=tasks,
        schema=schema,
        enqueue_seconds=enqueued.wall,
        enqueue_per_s=tasks / enqueued.wall,
        enqueue_client_cpu_seconds=enqueued.own_cpu,
        enqueue_postgres_cpu_seconds=enqueued.postgres_cpu,
        worker_seconds=usage.wall,
        processed_per_s=succeeded / usage.wall,
        startup_seconds=(first - run.db_started).total_seconds() if first else 0.0,
        drain_seconds=window,
        drain_per_s=succeeded / window if window > 0 else 0.0,
        exit_seconds=(run.db_ended - last).total_seconds() if last else 0.0,
        worker_cpu_seconds=usage.child_cpu,
        postgres_cpu_seconds=usage.postgres_cpu,
        busy_cores=usage.busy_cpu / usage.wall if usage.busy_cpu is not None else None,
        claim_statements=claims,
        finish_statements=finishes,
        succeeded=succeeded,
        attempt_rows=attempt_rows,
        attempts_succeeded=attempts_ok,
        worker_exit_code=run.exit_code,
        ok=ok,
    )


def _us_per_task(seconds: float | None, tasks: int) -> str:
    return f"{1e6 * seconds / tasks:.0f}" if seconds is not None else "n/a"


def throughput_table(results: Sequence[ThroughputResult]) -> str:
    rate = (
        f"{'conc':>5} {'flow':>8} {'tasks':>7} {'enqueue/s':>10} {'worker s':>9} "
        f"{'processed/s':>12} "
        f"{'startup s':>10} {'drain s':>8} {'drain/s':>8} {'exit s':>7} {'check':>6}"
    )
    cost = (
        f"{'conc':>5} {'claims':>7} {'avg claim':>10} {'finishes':>9} {'avg finish':>11} "
        f"{'worker cpu':>11} {'worker us/task':>15} {'pg us/task':>11} {'busy cores':>11} "
        f"{'enq client us/task':>19} {'enq pg us/task':>15}"
    )
    lines = [rate, "-" * len(rate)]
    for r in results:
        lines.append(
            f"{r.concurrency:>5} {r.flow:>8} {r.tasks:>7} {r.enqueue_per_s:>10,.0f} "
            f"{r.worker_seconds:>9.2f} "
            f"{r.processed_per_s:>12,.0f} {r.startup_seconds:>10.2f} {r.drain_seconds:>8.2f} "
            f"{r.drain_per_s:>8,.0f} {r.exit_seconds:>7.2f} {'ok' if r.ok else 'FAIL':>6}"
        )
    lines += ["", cost, "-" * len(cost)]
    for r in results:
        cores = f"{r.busy_cores:.2f}" if r.busy_cores is not None else "n/a"
        lines.append(
            f"{r.concurrency:>5} {r.claim_statements:>7} "
            f"{r.tasks / max(r.claim_statements, 1):>10.1f} {r.finish_statements:>9} "
            f"{r.tasks / max(r.finish_statements, 1):>11.1f} "
            f"{100 * r.worker_cpu_seconds / r.worker_seconds:>10.0f}% "
            f"{_us_per_task(r.worker_cpu_seconds, r.tasks):>15} "
            f"{_us_per_task(r.postgres_cpu_seconds, r.tasks):>11} {cores:>11} "
            f"{_us_per_task(r.enqueue_client_cpu_seconds, r.tasks):>19} "
            f"{_us_per_task(r.enqueue_postgres_cpu_seconds, r.tasks):>15}"
        )
    return "\n".join(lines)


# -- latency ---------------------------------------------------------------------


@dataclass
class LatencyResult:
    concurrency: int
    schema: str
    sent: int
    rate_target: float
    rate_achieved: float
    enqueue_call_p50_ms: float
    enqueue_call_p99_ms: float
    start_p50_ms: float
    start_p90_ms: float
    start_p99_ms: float
    start_max_ms: float
    finish_p50_ms: float
    finish_p99_ms: float
    succeeded: int
    worker_exit_code: int
    ok: bool


LATENCIES = """
select
    count(*) filter (where t.state = 'succeeded'),
    percentile_cont(array[0.5, 0.9, 0.99]) within group (
        order by extract(epoch from a.started_at - t.created_at)),
    max(extract(epoch from a.started_at - t.created_at)),
    percentile_cont(array[0.5, 0.99]) within group (
        order by extract(epoch from t.finished_at - t.created_at))
from {s}.tasks t
join {s}.attempt_log a on a.task_id = t.id and a.number = 1
where t.id >= {first}
"""

LISTENING = """
select count(*) from {workers} where stopped_at is null and last_seen_at > started_at
"""
"""Workers whose heartbeat landed: on PostgreSQL it goes through the session
connection once that listens (see conveyor.backends.postgres.session)."""


async def paced(total: int, rate: float, send: Callable[[int], Awaitable[object]]) -> float:
    """Call ``send(i)`` for i in 0..total-1 on a fixed schedule of ``rate`` per
    second (a late call does not shift the ones after it); the seconds it took."""
    loop = asyncio.get_running_loop()
    begin = loop.time()
    for i in range(total):
        delay = begin + i / rate - loop.time()
        if delay > 0:
            await asyncio.sleep(delay)
        await send(i)
    return loop.time() - begin


def quantile(sorted_values: Sequence[float], q: float) -> float:
    if not sorted_values:
        return 0.0
    index = min(len(sorted_values) - 1, max(0, round(q * (len(sorted_values) - 1))))
    return sorted_values[index]


async def wait_for(
    conn: psycopg.AsyncConnection[Any],
    query: Query,
    want: int,
    timeout: float,
    process: subprocess.Popen[bytes],
) -> bool:
    """Poll ``query`` (one count) until it reaches ``want``; False on timeout or exit."""
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline and process.poll() is None:
        (value,) = await fetch_one(conn, query)
        if value >= want:
            return True
        await asyncio.sleep(POLL_SECONDS)
    return False


async def run_latency(args: argparse.Namespace, prefix: str, concurrency: int) -> LatencyResult:
    schema = f"{prefix}_l{concurrency}"
    url: str = args.url
    app = make_app(url, schema)
    await app.backend()  # create the schema before the worker starts
    spec = WorkerSpec(url, concurrency, False, args.poll_interval, args.worker_log_level)
    process = start_worker(spec, schema)
    exit_code = -1
    try:
        async with connect(url) as conn:
            table = sql.Identifier(schema, "tasks")
            done = sql.SQL("select count(*) from {} where state = 'succeeded'").format(table)
            workers = sql.Identifier(schema, "workers")
            # Ready = the worker ran a warm-up task and its wake-up listener is connected.
            await app.enqueue_async(TASK_NAME, {"i": -1})
            ready = await wait_for(conn, done, 1, READY_TIMEOUT, process)
            ready = ready and await wait_for(
                conn, sql.SQL(LISTENING).format(workers=workers), 1, READY_TIMEOUT, process
            )
            if not ready:
                raise SystemExit(f"[latency c={concurrency}] the worker did not become ready")
            await asyncio.sleep(1.0)  # let it go idle: waiting for a wake-up

            total = max(1, round(args.rate * args.duration))
            interval = 1.0 / args.rate
            log(f"[latency c={concurrency}] enqueueing {total} tasks at {args.rate:g}/s")
            calls: list[float] = []
            first_id: int | None = None
            loop = asyncio.get_running_loop()
            begin = loop.time()
            for i in range(total):
                delay = begin + i * interval - loop.time()
                if delay > 0:
                    await asyncio.sleep(delay)
                sent_at = time.perf_counter()
                handle = await app.enqueue_async(TASK_NAME, {"i": i})
                calls.append(time.perf_counter() - sent_at)
                if first_id is None:
                    first_id = handle.id
            sent_seconds = loop.time() - begin
            assert first_id is not None
            finished = await wait_for(conn, done, total + 1, args.timeout, process)
            if not finished:
                log(f"[latency c={concurrency}] not every task finished in {args.timeout}s")
            exit_code = await stop_worker(process)
            query = sql.SQL(LATENCIES).format(s=sql.Identifier(schema), first=first_id)
            succeeded, start_q, start_max, finish_q = await fetch_one(conn, query)
    finally:
        if process.poll() is None:
            await stop_worker(process)
        await app.aclose()
    calls.sort()
    start_q = start_q or [0.0, 0.0, 0.0]
    finish_q = finish_q or [0.0, 0.0]
    return LatencyResult(
        concurrency=concurrency,
        schema=schema,
        sent=total,
        rate_target=args.rate,
        rate_achieved=total / sent_seconds if sent_seconds > 0 else float(total),
        enqueue_call_p50_ms=1000 * quantile(calls, 0.5),
        enqueue_call_p99_ms=1000 * quantile(calls, 0.99),
        start_p50_ms=1000 * start_q[0],
        start_p90_ms=1000 * start_q[1],
        start_p99_ms=1000 * start_q[2],
        start_max_ms=1000 * float(start_max or 0.0),
        finish_p50_ms=1000 * finish_q[0],
        finish_p99_ms=1000 * finish_q[1],
        succeeded=succeeded,
        worker_exit_code=exit_code,
        ok=finished and succeeded == total and exit_code == 0,
    )


def latency_table(results: Sequence[LatencyResult]) -> str:
    header = (
        f"{'conc':>5} {'sent':>6} {'rate/s':>7} {'enq call p50':>12} {'start p50':>10} "
        f"{'start p90':>10} {'start p99':>10} {'start max':>10} {'finish p50':>11} "
        f"{'finish p99':>11} {'check':>6}"
    )
    lines = [header + "   (ms)", "-" * len(header)]
    for r in results:
        lines.append(
            f"{r.concurrency:>5} {r.sent:>6} {r.rate_achieved:>7.0f} "
            f"{r.enqueue_call_p50_ms:>12.2f} {r.start_p50_ms:>10.2f} {r.start_p90_ms:>10.2f} "
            f"{r.start_p99_ms:>10.2f} {r.start_max_ms:>10.2f} {r.finish_p50_ms:>11.2f} "
            f"{r.finish_p99_ms:>11.2f} {'ok' if r.ok else 'FAIL':>6}"
        )
    return "\n".join(lines)


# -- main --------------------------------------------------------------------------


async def environment(url: str) -> dict[str, Any]:
    async with connect(url) as conn:
        (version,) = await fetch_one(conn, sql.SQL("show server_version"))
        (sync_commit,) = await fetch_one(conn, sql.SQL("show synchronous_commit"))
    return {
        "python": platform.python_version(),
        "platform": platform.platform(),
        "cpus": os.cpu_count(),
        "postgresql": version,
        "synchronous_commit": sync_commit,
    }


async def run(args: argparse.Namespace) -> int:
    prefix = f"bench_{uuid.uuid4().hex[:8]}"
    report: dict[str, Any] = {"environment": await environment(args.url)}
    report["parameters"] = {
        "mode": "latency" if args.latency else "throughput",
        "tasks": args.tasks,
        "batch": args.batch,
        "concurrency": args.concurrency,
        "rate": args.rate,
        "duration": args.duration,
        "poll_interval": args.poll_interval,
        "flow": args.flow,
        "metrics": args.metrics,
        "keys": args.keys,
        "rate_limit": args.rate_limit,
        "analyze": args.analyze,
    }
    schemas: list[str] = []
    throughput: list[ThroughputResult] = []
    latency: list[LatencyResult] = []
    try:
        for concurrency in args.concurrency:
            if args.latency:
                schemas.append(f"{prefix}_l{concurrency}")
                latency.append(await run_latency(args, prefix, concurrency))
            else:
                for flow in args.flow:
                    for n, metrics in enumerate(args.metrics):
                        # Each run its own schema: --metrics may repeat a value.
                        own = f"{prefix}_{n}" if len(args.metrics) > 1 else prefix
                        schemas.append(f"{own}_c{concurrency}_{flow}{'_m' if metrics else ''}")
                        found = await run_throughput(args, own, concurrency, flow, metrics)
                        throughput.append(found)
    finally:
        if args.keep:
            log(f"kept schemas: {', '.join(schemas)}")
        else:
            for schema in schemas:
                await drop_schema(args.url, schema)
    table = latency_table(latency) if args.latency else throughput_table(throughput)
    report["results"] = [asdict(r) for r in (latency if args.latency else throughput)]
    if args.json:
        log(table)
        print(json.dumps(report, indent=2))
    else:
        env = report["environment"]
        print(
            f"PostgreSQL {env['postgresql']} (synchronous_commit={env['synchronous_commit']}), "
            f"Python {env['python']}, {env['cpus']} CPUs"
        )
        print(table)
    results: Sequence[ThroughputResult | LatencyResult] = latency if args.latency else throughput
    return 0 if all(r.ok for r in results) else 1


def parse_args(argv: Sequence[str] | None = None) -> argparse.Namespace:
    parser = argparse.ArgumentParser(
        description="Measure conveyor enqueue/processing throughput and start latency.",
    )
    parser.add_argument(
        "--url",
        default=os.environ.get("CONVEYOR_URL") or DEFAULT_URL,
        help="PostgreSQL URL (default: CONVEYOR_URL, else %(default)s)",
    )
    parser.add_argument("--tasks", type=positive_int, default=20_000, help="tasks per run")
    parser.add_argument("--batch", type=positive_int, default=5_000, help="tasks per enqueue")
    parser.add_argument(
        "--concurrency",
        type=parse_concurrency,
        default=[10, 50, 100, 200],
        help="worker concurrency values, comma-separated (one run each; default 10,50,100,200)",
    )
    parser.add_argument(
        "--poll-interval",
        type=positive_float,
        default=None,
        help="pass --poll-interval to the worker (default: the worker's own, 1s)",
    )
    parser.add_argument(
        "--analyze",
        action="store_true",
        help="ANALYZE the tasks table after enqueueing, before the worker starts",
    )
    parser.add_argument("--timeout", type=positive_float, default=600.0, help="seconds per run")
    parser.add_argument(
        "--work-connections",
        type=positive_int,
        help="the worker's --work-connections (default: its own default)",
    )
    parser.add_argument("--worker-log-level", default="WARNING", help="the worker's --log-level")
    parser.add_argument(
        "--profile",
        type=Path,
        default=None,
        metavar="DIR",
        help="run each throughput worker under py-spy record; speedscope files into DIR",
    )
    parser.add_argument(
        "--latency", action="store_true", help="measure enqueue-to-start latency instead"
    )
    parser.add_argument("--rate", type=positive_float, default=200.0, help="latency: tasks/s")
    parser.add_argument(
        "--duration", type=positive_float, default=5.0, help="latency: seconds of enqueueing"
    )
    parser.add_argument(
        "--flow",
        type=parse_flows,
        default=["plain"],
        help="flow control of the drained tasks, comma-separated: plain, keys, rate",
    )
    parser.add_argument(
        "--metrics",
        type=parse_metrics,
        default=[False],
        help="the worker's Prometheus metrics, comma-separated: off, on (each a run: on "
        "counts every event; the table marks those runs +m)",
    )
    parser.add_argument(
        "--keys", type=positive_int, default=1000, help="flow keys: concurrency keys (limit 1)"
    )
    parser.add_argument(
        "--rate-limit", type=positive_int, default=1_000_000, help="flow rate: starts a second"
    )
    parser.add_argument("--keep", action="store_true", help="keep the benchmark schemas")
    parser.add_argument("--json", action="store_true", help="print the results as JSON")
    return parser.parse_args(argv)


def main(argv: Sequence[str] | None = None) -> int:
    return asyncio.run(run(parse_args(argv)))


if __name__ == "__main__":
    sys.exit(main())
