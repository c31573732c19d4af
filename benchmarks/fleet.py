"""A fleet of idle workers on one PostgreSQL database: what each task costs
in claims, and how latency and throughput fare as the network gets longer.

For each fleet size (``--workers``), each network delay (``--delays``, ms
each way), wake-up turns on and off (``--turns``) and hand-offs on and off
(``--handoffs``), in a fresh schema:

1. start the fleet: ``python -m conveyor.cli worker benchmarks.bench_app:app``
   processes, idle, ``--concurrency`` slots and ``--poll-interval`` each
   (long by default, so that the claims counted answer wake-ups, not polls);
   with a delay, each connects through a TCP proxy (``tools/proxy.py``, in a
   process of its own) that holds every chunk that long each way;
2. once every worker listens and has gone idle, read each worker's count of
   claims (SIGUSR1 logs it), enqueue ``--rate`` tasks a second for
   ``--duration`` seconds, one call each, wait for them all, and read the
   counts again: **claims per task** is the difference over the tasks
   (**handed off** says how many of them started without a claim);
   **latency** is enqueue to start, from this process's clock before each
   enqueue call to the handler's own start (stamp tasks, see
   ``systems/stamp.py``), p50 and p99;
3. **drain**: enqueue ``--drain-tasks`` at once; the rate is by the database
   clock, from their enqueue to the last one's end.

4. with ``--bouncer N``, the fleet connects through a PgBouncer in
   transaction mode (``tools/bouncer.py``) of N server connections, with
   ``pool_mode=transaction`` and, with ``--listen on``, ``listen`` naming
   the server (LISTEN and turns past it); with ``--listen off`` the workers
   poll only (every ``--poll-interval``). **server conns** is the most
   sessions of the database the fleet used while it was idle (found
   by their ``application_name``: direct, and a bouncer's, which takes the
   name of its clients), **db cpu/worker** the server's CPU time
   (every ``postgres`` process) over 10 idle seconds, per idle worker.

The benchmark's own connections use the unix socket, never the proxy.
``rtt`` is a ``select 1`` round trip through the proxy, measured (the
proxy's event loop rounds a delay up to about a millisecond).

    python benchmarks/fleet.py
    python benchmarks/fleet.py --workers 1,16 --delays 0,0.5,1,2 --turns on,off --json
    python benchmarks/fleet.py --workers 16 --turns on --handoffs on,off
    python benchmarks/fleet.py --workers 200 --concurrency 2 --bouncer 20 --listen off \
        --poll-interval 1 --turns off --handoffs off

Every run checks that each task succeeded once.
"""

from __future__ import annotations

import argparse
import asyncio
import contextlib
import json
import os
import re
import signal
import subprocess
import sys
import tempfile
import time
import uuid
from collections.abc import Iterator, Sequence
from dataclasses import asdict, dataclass
from pathlib import Path
from typing import Any

import psycopg
from psycopg import sql

ROOT = Path(__file__).resolve().parent.parent
if str(ROOT) not in sys.path:  # run as a script: make ``benchmarks`` importable
    sys.path.insert(0, str(ROOT))

from benchmarks.bench_app import STAMP_NAME, TASK_NAME, make_app  # noqa: E402
from benchmarks.systems.stamp import STAMP_ENV, latencies  # noqa: E402
from benchmarks.throughput import drop_schema, log  # noqa: E402

TCP_URL = "postgresql://127.0.0.1:5432/test"
SOCKET_URL = "postgresql:///test?host=/var/run/postgresql"
READY_TIMEOUT = 600.0
IDLE_WINDOW = 10.0
COUNTS = re.compile(
    r"worker (\S+) \(\w+, \d+ running; (\d+) claims returned, (\d+) tasks started, "
    r"(\d+) of them handed off"
)
PROXY_SCRIPT = """
import sys
from tools.proxy import Proxy
proxy = Proxy(sys.argv[1], delay=float(sys.argv[2]))
proxy.start()
print(proxy.url, flush=True)
sys.stdin.read()
proxy.stop()
"""


@dataclass
class FleetResult:
    workers: int
    delay_ms: float
    turns: bool
    handoffs: bool
    rtt_ms: float
    tasks: int
    claims: int
    claims_per_task: float
    handed_off: int
    start_p50_ms: float
    start_p99_ms: float
    drain_tasks: int
    drain_per_second: float
    server_conns: int
    db_cpu_ms_per_worker_s: float
    ok: bool


@contextlib.contextmanager
def delay_proxy(delay_ms: float) -> Iterator[str]:
    """The URL workers connect to: PostgreSQL itself, or a delaying proxy."""
    if delay_ms <= 0:
        yield TCP_URL
        return
    env = {**os.environ, "PYTHONPATH": str(ROOT)}
    process = subprocess.Popen(
        [sys.executable, "-c", PROXY_SCRIPT, TCP_URL, str(delay_ms / 1000)],
        stdin=subprocess.PIPE,
        stdout=subprocess.PIPE,
        cwd=ROOT,
        env=env,
        text=True,
    )
    try:
        assert process.stdout is not None
        yield process.stdout.readline().strip()
    finally:
        if process.stdin is not None:
            process.stdin.close()
        try:
            process.wait(10)
        except subprocess.TimeoutExpired:
            process.kill()
            process.wait()


def round_trip_ms(url: str) -> float:
    with psycopg.connect(url, autocommit=True) as conn:
        conn.execute("select 1")
        samples = []
        for _ in range(50):
            began = time.perf_counter()
            conn.execute("select 1")
            samples.append(time.perf_counter() - began)
    return 1000 * sorted(samples)[len(samples) // 2]


class Fleet:
    """Worker processes, each logging to a file of its own."""

    def __init__(
        self, args: argparse.Namespace, url: str, schema: str, turns: bool, handoffs: bool
    ) -> None:
        self.dir = Path(tempfile.mkdtemp(prefix="conveyor-fleet-"))
        env = {
            **os.environ,
            "CONVEYOR_URL": url,
            "CONVEYOR_SCHEMA": schema,
            "PGAPPNAME": f"fleet-{schema}",
            STAMP_ENV: str(self.dir / "stamps"),
            "PYTHONPATH": os.pathsep.join(filter(None, [str(ROOT), os.environ.get("PYTHONPATH")])),
        }
        command = [
            sys.executable,
            "-m",
            "conveyor.cli",
            "worker",
            "benchmarks.bench_app:app",
            "--concurrency",
            str(args.concurrency),
            "--poll-interval",
            str(args.poll_interval),
            "--quiet",
            "--no-schedules",
            "--no-prune",
        ]
        if not turns:
            command.append("--no-wakeup-turns")
        if not handoffs:
            command.append("--no-handoffs")
        self.processes: list[subprocess.Popen[bytes]] = []
        self.logs: list[Path] = []
        for index in range(args.workers):
            path = self.dir / f"worker-{index}.log"
            self.logs.append(path)
            with path.open("wb") as out:
                self.processes.append(
                    subprocess.Popen(command, cwd=ROOT, env=env, stdout=out, stderr=out)
                )

    def alive(self) -> bool:
        return all(p.poll() is None for p in self.processes)

    async def counts(self) -> tuple[int, int]:
        """Claims returned and tasks handed off, summed over the fleet (SIGUSR1)."""
        sizes = [path.stat().st_size for path in self.logs]
        for process in self.processes:
            process.send_signal(signal.SIGUSR1)
        claims = handed_off = 0
        for path, size in zip(self.logs, sizes, strict=True):
            deadline = time.monotonic() + 10
            while True:
                with path.open("rb") as log_file:
                    log_file.seek(size)
                    found = COUNTS.search(log_file.read().decode(errors="replace"))
                if found:
                    claims += int(found.group(2))
                    handed_off += int(found.group(4))
                    break
                if time.monotonic() > deadline:
                    raise SystemExit(f"no counts in {path}")
                await asyncio.sleep(0.02)
        return claims, handed_off

    async def stop(self) -> None:
        for process in self.processes:
            if process.poll() is None:
                process.send_signal(signal.SIGTERM)
        for process in self.processes:
            try:
                await asyncio.to_thread(process.wait, 30)
            except subprocess.TimeoutExpired:
                process.kill()
                await asyncio.to_thread(process.wait)


async def scalar(conn: psycopg.AsyncConnection[Any], query: sql.Composable) -> Any:
    cursor = await conn.execute(query)
    row = await cursor.fetchone()
    assert row is not None
    return row[0]


async def wait_count(
    conn: psycopg.AsyncConnection[Any], query: sql.Composable, want: int, fleet: Fleet
) -> None:
    deadline = time.monotonic() + READY_TIMEOUT
    while await scalar(conn, query) < want:
        if time.monotonic() > deadline or not fleet.alive():
            raise SystemExit(f"the fleet did not get there: {query.as_string(conn)}")
        await asyncio.sleep(0.05)


def postgres_cpu_seconds() -> float:
    """CPU time (user and system) of every ``postgres`` process now running."""
    ticks = os.sysconf("SC_CLK_TCK")
    total = 0
    for entry in Path("/proc").iterdir():
        if not entry.name.isdigit():
            continue
        try:
            stat = (entry / "stat").read_text()
        except OSError:
            continue
        name = stat[stat.index("(") + 1 : stat.rindex(")")]
        if name.startswith("postgres"):
            fields = stat[stat.rindex(")") + 2 :].split()
            total += int(fields[11]) + int(fields[12])
    return total / ticks


@contextlib.contextmanager
def through_bouncer(url: str, pool_size: int, listen: bool) -> Iterator[str]:
    """``url``, or (``pool_size`` > 0) a PgBouncer's in front of it."""
    if pool_size <= 0:
        yield url
        return
    from tools.bouncer import Bouncer

    with Bouncer(url, pool_size=pool_size, max_client_conn=10_000) as bouncer:
        yield bouncer.url if listen else bouncer.polling_url


async def run_case(
    args: argparse.Namespace, workers: int, delay_ms: float, turns: bool, handoffs: bool
) -> FleetResult:
    schema = f"bench_{uuid.uuid4().hex[:8]}_fleet"
    app = make_app(SOCKET_URL, schema)
    await app.backend()  # the schema, before the workers start
    case = argparse.Namespace(**{**vars(args), "workers": workers})
    label = (
        f"[{workers} workers, {delay_ms:g} ms, turns {'on' if turns else 'off'}, "
        f"hand-offs {'on' if handoffs else 'off'}]"
    )
    try:
        with (
            delay_proxy(delay_ms) as direct,
            through_bouncer(direct, args.bouncer, args.listen == "on") as url,
        ):
            rtt = round_trip_ms(direct)
            fleet = Fleet(case, url, schema, turns, handoffs)
            try:
                async with await psycopg.AsyncConnection.connect(
                    SOCKET_URL, autocommit=True
                ) as conn:
                    tasks_table = sql.Identifier(schema, "tasks")
                    done = sql.SQL("select count(*) from {} where state = 'succeeded'").format(
                        tasks_table
                    )
                    # A heartbeat landed: on the session connection, once it
                    # listens (polling through a bouncer: once it started).
                    listening = sql.SQL(
                        "select count(*) from {} where stopped_at is null"
                        " and last_seen_at > started_at"
                    ).format(sql.Identifier(schema, "workers"))
                    await wait_count(conn, listening, workers, fleet)
                    await app.enqueue_async(TASK_NAME, {"i": -1})  # warm-up
                    await wait_count(conn, done, 1, fleet)
                    await asyncio.sleep(args.settle)
                    sessions = sql.SQL(
                        "select count(*) from pg_stat_activity where application_name = {}"
                    ).format(sql.Literal(f"fleet-{schema}"))
                    cpu_before, idle_start = postgres_cpu_seconds(), time.monotonic()
                    server_conns = 0
                    while time.monotonic() - idle_start < IDLE_WINDOW:
                        server_conns = max(server_conns, int(await scalar(conn, sessions)))
                        await asyncio.sleep(0.5)
                    idle_cpu = postgres_cpu_seconds() - cpu_before
                    idle_seconds = time.monotonic() - idle_start
                    claims_before, handed_before = await fleet.counts()
                    total = max(1, round(args.rate * args.duration))
                    log(f"{label} {total} tasks at {args.rate:g}/s")
                    loop = asyncio.get_running_loop()
                    begin = loop.time()
                    for i in range(total):
                        pause = begin + i / args.rate - loop.time()
                        if pause > 0:
                            await asyncio.sleep(pause)
                        await app.enqueue_async(STAMP_NAME, {"sent": time.time()})
                    await wait_count(conn, done, total + 1, fleet)
                    claims_after, handed_after = await fleet.counts()
                    started = latencies(fleet.dir / "stamps")
                    p50, p99 = quantile(started, 0.5), quantile(started, 0.99)
                    log(f"{label} drain of {args.drain_tasks}")
                    handles = await app.enqueue_many_async(
                        TASK_NAME, [{"i": i} for i in range(args.drain_tasks)]
                    )
                    drained = total + 1 + args.drain_tasks
                    await wait_count(conn, done, drained, fleet)
                    window = sql.SQL(
                        "select extract(epoch from max(t.finished_at) - min(t.created_at)) "
                        "from {} t where t.id >= {}"
                    ).format(tasks_table, handles[0].id)
                    seconds = float(await scalar(conn, window))
                    attempts = await scalar(
                        conn,
                        sql.SQL("select count(*) from {}").format(
                            sql.Identifier(schema, "attempt_log")
                        ),
                    )
            finally:
                await fleet.stop()
    finally:
        await app.aclose()
        await drop_schema(TCP_URL, schema)
    claims = claims_after - claims_before
    return FleetResult(
        workers=workers,
        delay_ms=delay_ms,
        turns=turns,
        handoffs=handoffs,
        rtt_ms=rtt,
        tasks=total,
        claims=claims,
        claims_per_task=claims / total,
        handed_off=handed_after - handed_before,
        start_p50_ms=1000 * p50,
        start_p99_ms=1000 * p99,
        drain_tasks=args.drain_tasks,
        drain_per_second=args.drain_tasks / seconds,
        server_conns=server_conns,
        db_cpu_ms_per_worker_s=1000 * idle_cpu / idle_seconds / workers,
        ok=attempts == drained,
    )


def quantile(ordered: Sequence[float], q: float) -> float:
    """The ``q`` quantile of sorted values (nearest rank)."""
    return ordered[min(len(ordered) - 1, int(q * len(ordered)))]


def table(results: Sequence[FleetResult]) -> str:
    lines = [
        "| workers | delay ms | rtt ms | turns | hand-offs | claims/task | handed off "
        "| start p50 ms | start p99 ms | drain tasks/s | server conns | db cpu ms/worker/s "
        "| check |",
        "|---:|---:|---:|---|---|---:|---:|---:|---:|---:|---:|---:|---|",
    ]
    for r in results:
        lines.append(
            f"| {r.workers} | {r.delay_ms:g} | {r.rtt_ms:.2f} | {'on' if r.turns else 'off'} "
            f"| {'on' if r.handoffs else 'off'} | {r.claims_per_task:.2f} "
            f"| {r.handed_off}/{r.tasks} | {r.start_p50_ms:.1f} | {r.start_p99_ms:.1f} "
            f"| {r.drain_per_second:,.0f} | {r.server_conns} | {r.db_cpu_ms_per_worker_s:.3f} "
            f"| {'ok' if r.ok else 'FAILED'} |"
        )
    return "\n".join(lines)


def numbers(text: str, kind: type) -> list[Any]:
    return [kind(part) for part in text.split(",") if part.strip()]


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--workers", default="1,16")
    parser.add_argument("--delays", default="0")
    parser.add_argument("--turns", default="on,off")
    parser.add_argument("--handoffs", default="on")
    parser.add_argument("--concurrency", type=int, default=10)
    parser.add_argument("--poll-interval", type=float, default=30.0)
    parser.add_argument("--rate", type=float, default=100.0)
    parser.add_argument("--duration", type=float, default=5.0)
    parser.add_argument("--drain-tasks", type=int, default=10_000)
    parser.add_argument("--settle", type=float, default=1.5, help="seconds idle before counting")
    parser.add_argument("--bouncer", type=int, default=0, help="PgBouncer server connections")
    parser.add_argument("--listen", choices=("on", "off"), default="on")
    parser.add_argument("--json", action="store_true")
    args = parser.parse_args()
    results = []
    for delay in numbers(args.delays, float):
        for workers in numbers(args.workers, int):
            for turns in [t.strip() == "on" for t in args.turns.split(",")]:
                if workers == 1 and not turns and "on" in args.turns:
                    continue  # one worker: turns change nothing
                for handoffs in [h.strip() == "on" for h in args.handoffs.split(",")]:
                    case = run_case(args, workers, delay, turns, handoffs)
                    results.append(asyncio.run(case))
    if args.json:
        print(json.dumps([asdict(r) for r in results], indent=2))
    else:
        print(table(results))


if __name__ == "__main__":
    main()
