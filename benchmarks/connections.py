"""Server connections one worker process holds on PostgreSQL: idle, draining
no-op tasks, and with every slot busy.

For each ``--concurrency``, in a fresh schema, start one worker process
(``python -m conveyor.cli worker benchmarks.bench_app:app``) with its own
``application_name`` (libpq's ``PGAPPNAME``), and count its sessions in
``pg_stat_activity`` every 20 ms:

1. **idle**: from 3 s after it listens, for ``--seconds``;
2. **draining**: while it drains ``--tasks`` no-op tasks enqueued at once;
3. **busy**: while ``concurrency`` tasks that each sleep ``--seconds`` run
   at once (every slot busy, heartbeats due).

Each phase prints the most and the median sessions seen, and the drain's
rate (database clock). ``--url`` may go through PgBouncer (with
``pool_mode=transaction``): the count is then of the worker's direct
sessions (its listen address), and the bouncer's own server sessions
are its pool's, shared by every client.

    python benchmarks/connections.py
    python benchmarks/connections.py --concurrency 10,100 --tasks 20000
"""

from __future__ import annotations

import argparse
import asyncio
import os
import statistics
import subprocess
import sys
import tempfile
import time
import uuid
from pathlib import Path
from typing import Any

import psycopg

ROOT = Path(__file__).resolve().parent.parent
if str(ROOT) not in sys.path:
    sys.path.insert(0, str(ROOT))

from benchmarks.bench_app import DEFAULT_URL, SLEEP_NAME, TASK_NAME, make_app  # noqa: E402

SAMPLE = 0.02


async def sessions(conn: psycopg.AsyncConnection[Any], name: str) -> int:
    cursor = await conn.execute(
        "select count(*) from pg_stat_activity where application_name = %s", (name,)
    )
    row = await cursor.fetchone()
    return int(row[0]) if row else 0


async def sample_while(
    conn: psycopg.AsyncConnection[Any], name: str, done: Any, at_least: float = 0.0
) -> list[int]:
    seen: list[int] = []
    start = time.monotonic()
    while not await done() or time.monotonic() - start < at_least:
        seen.append(await sessions(conn, name))
        await asyncio.sleep(SAMPLE)
    return seen


def spawn(command: list[str], env: dict[str, str], log: Path) -> subprocess.Popen[bytes]:
    with log.open("wb") as out:
        return subprocess.Popen(command, cwd=ROOT, env=env, stdout=out, stderr=out)


def line(phase: str, seen: list[int], extra: str = "") -> str:
    most = max(seen) if seen else 0
    median = statistics.median(seen) if seen else 0
    return f"  {phase:<9} most {most:>3}  median {median:>5}  samples {len(seen):>5}  {extra}"


async def run(url: str, direct: str, concurrency: int, tasks: int, seconds: float) -> None:
    schema = f"bench_conn_{uuid.uuid4().hex[:8]}"
    name = f"conveyor-bench-{uuid.uuid4().hex[:8]}"
    app = make_app(url, schema)
    await app.migrate_async()
    log = Path(tempfile.mkstemp(prefix="conveyor-conn-", suffix=".log")[1])
    env = {
        **os.environ,
        "CONVEYOR_URL": url,
        "CONVEYOR_SCHEMA": schema,
        "PGAPPNAME": name,
        "PYTHONPATH": os.pathsep.join(filter(None, [str(ROOT), os.environ.get("PYTHONPATH")])),
    }
    command = [
        sys.executable,
        "-m",
        "conveyor.cli",
        "worker",
        "benchmarks.bench_app:app",
        "--concurrency",
        str(concurrency),
        "--quiet",
        "--no-schedules",
        "--no-prune",
    ]
    conn = await psycopg.AsyncConnection.connect(direct, autocommit=True)
    worker = spawn(command, env, log)
    try:
        while await sessions(conn, name) == 0:
            if worker.poll() is not None:
                raise SystemExit(f"the worker exited: see {log}")
            await asyncio.sleep(0.05)
        await asyncio.sleep(3)
        print(f"concurrency {concurrency}")
        idle_until = time.monotonic() + seconds

        async def idle_done() -> bool:
            return time.monotonic() >= idle_until

        print(line("idle", await sample_while(conn, name, idle_done)))

        noop = app.tasks[TASK_NAME]
        ids: list[int] = []
        for start in range(0, tasks, 5000):
            handles = await app.enqueue_many_async(
                noop, [{"i": i} for i in range(start, min(tasks, start + 5000))]
            )
            ids.extend(h.id for h in handles)
        table = f'"{schema}".tasks'

        async def drained() -> bool:
            cursor = await conn.execute(f"select count(*) from {table} where state <> 'succeeded'")
            row = await cursor.fetchone()
            return bool(row and row[0] == 0)

        seen = await sample_while(conn, name, drained)
        cursor = await conn.execute(
            f"select extract(epoch from max(finished_at) - min(created_at)) from {table}"
        )
        row = await cursor.fetchone()
        elapsed = float(row[0]) if row and row[0] else float("nan")
        print(line("draining", seen, f"{tasks / elapsed:,.0f} tasks/s"))

        sleep = app.tasks[SLEEP_NAME]
        await app.enqueue_many_async(sleep, [{"seconds": seconds} for _ in range(concurrency)])
        await asyncio.sleep(0.5)
        busy_until = time.monotonic() + seconds - 1

        async def busy_done() -> bool:
            return time.monotonic() >= busy_until

        print(line("busy", await sample_while(conn, name, busy_done)))
    finally:
        worker.terminate()
        await asyncio.to_thread(worker.wait, 30)
        await conn.execute(f'drop schema if exists "{schema}" cascade')
        await conn.close()
        await app.aclose()
        await asyncio.to_thread(log.unlink)


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--url", default=DEFAULT_URL)
    parser.add_argument("--direct", default=DEFAULT_URL, help="for counting (never pooled)")
    parser.add_argument("--concurrency", default="10,100")
    parser.add_argument("--tasks", type=int, default=20000)
    parser.add_argument("--seconds", type=float, default=5.0)
    args = parser.parse_args()
    for concurrency in (int(c) for c in args.concurrency.split(",")):
        asyncio.run(run(args.url, args.direct, concurrency, args.tasks, args.seconds))


if __name__ == "__main__":
    main()
