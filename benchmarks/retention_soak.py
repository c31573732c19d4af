"""Retention soak: millions of tasks through one worker that prunes as it
goes; the tables must stay bounded and the drain rate flat.

A producer keeps a backlog of about ``--backlog`` pending no-op tasks (bulk
enqueues of up to 5,000; with ``--rate``, no more than that many a second)
until ``--tasks`` have been enqueued; one worker process
(``--concurrency``) drains them with a short retention (succeeded tasks kept
``--keep`` seconds, pruned every ``--prune-every`` seconds, 1,000 per
batch). Every ``--sample`` seconds the soak prints: tasks enqueued, tasks
done, the drain rate in that window, the rows in the tasks and attempts
tables (the server's live-row statistics: an exact count of millions of
rows would cost the drain a core) and their size on disk.

    python benchmarks/retention_soak.py --tasks 2000000
    # retention at its defaults (a day, a prune a minute) through a long run
    python benchmarks/retention_soak.py --tasks 20000000 --keep 86400 --prune-every 60 \
        --concurrency 400 --sample 60

The last lines say whether the tables stayed bounded (the largest row count
after the first quarter of the run within 3x the retention window's worth of
tasks) and how flat the drain was (the last quarter's rate over the second
quarter's).
"""

from __future__ import annotations

import argparse
import asyncio
import os
import sys
import time
import uuid
from pathlib import Path
from typing import Any

import psycopg
from psycopg import sql

ROOT = Path(__file__).resolve().parent.parent
if str(ROOT) not in sys.path:
    sys.path.insert(0, str(ROOT))

from benchmarks.bench_app import DEFAULT_URL, TASK_NAME, make_app  # noqa: E402
from conveyor import Retention  # noqa: E402

BATCH = 5_000
SCRIPT = str(Path(__file__).resolve())


def run_worker(url: str, schema: str, keep: float, prune_every: float, concurrency: int) -> None:
    """The worker process: drain with a short retention until SIGTERM."""
    app = make_app(url, schema)
    app.run_worker(
        concurrency=concurrency,
        retention=Retention(succeeded=keep, interval=prune_every),
        handle_signals=True,
    )


async def open_tasks(conn: psycopg.AsyncConnection[Any], schema: str) -> int:
    """Pending and running tasks, counted exactly (each state off its own
    partial index, however long the history)."""
    tasks = sql.Identifier(schema, "tasks")
    query = sql.SQL(
        "select (select count(*) from {t} where state = 'pending')"
        " + (select count(*) from {t} where state = 'in_progress')"
    ).format(t=tasks)
    row = await (await conn.execute(query)).fetchone()
    assert row is not None
    return int(row[0])


async def sample(conn: psycopg.AsyncConnection[Any], schema: str) -> tuple[int, int, int]:
    """(tasks rows, attempts rows, bytes on disk): rows as the server's
    statistics count them (``n_live_tup``, flushed about once a second)."""
    query = sql.SQL(
        "select (select n_live_tup from pg_stat_user_tables"
        "        where schemaname = {s} and relname = 'tasks'),"
        " (select n_live_tup from pg_stat_user_tables"
        "  where schemaname = {s} and relname = 'attempts'),"
        " pg_total_relation_size({tn}) + pg_total_relation_size({an})"
    ).format(
        s=sql.Literal(schema),
        tn=sql.Literal(f"{schema}.tasks"),
        an=sql.Literal(f"{schema}.attempts"),
    )
    row = await (await conn.execute(query)).fetchone()
    assert row is not None
    return int(row[0] or 0), int(row[1] or 0), int(row[2])


async def soak(args: argparse.Namespace) -> int:
    schema = f"soak_{uuid.uuid4().hex[:8]}"
    app = make_app(args.url, schema)
    await app.migrate_async()
    env = {**os.environ, "PYTHONPATH": f"{ROOT / 'src'}:{ROOT}"}
    worker = await asyncio.create_subprocess_exec(
        *[
            sys.executable,
            SCRIPT,
            "--worker",
            "--url",
            args.url,
            "--schema",
            schema,
            "--keep",
            str(args.keep),
            "--prune-every",
            str(args.prune_every),
            "--concurrency",
            str(args.concurrency),
        ],
        env=env,
    )
    enqueued = 0
    rows: list[tuple[float, int, int, int, int, int]] = []
    started = time.monotonic()
    try:
        async with app, await psycopg.AsyncConnection.connect(args.url, autocommit=True) as conn:
            next_sample = started
            last_done, last_at = 0, started
            while True:
                now = time.monotonic()
                unfinished = await open_tasks(conn, schema)
                done = enqueued - unfinished
                if now >= next_sample:
                    task_rows, attempt_rows, size = await sample(conn, schema)
                    rate = (done - last_done) / max(now - last_at, 1e-9)
                    rows.append((now - started, enqueued, done, task_rows, attempt_rows, size))
                    print(
                        f"{now - started:7.0f}s enqueued {enqueued:>9,} done {done:>9,} "
                        f"drain {rate:>7,.0f}/s tasks {task_rows:>8,} attempts {attempt_rows:>8,} "
                        f"{size / 2**20:7.1f} MiB",
                        flush=True,
                    )
                    last_done, last_at, next_sample = done, now, now + args.sample
                if enqueued >= args.tasks and unfinished == 0:
                    break
                allowed = args.tasks
                if args.rate:  # steady traffic: no more than rate x elapsed so far
                    allowed = min(allowed, int(args.rate * (now - started)))
                if enqueued < allowed and unfinished < args.backlog:
                    count = min(BATCH, allowed - enqueued)
                    await app.enqueue_many_async(TASK_NAME, [{"i": i} for i in range(count)])
                    enqueued += count
                else:
                    await asyncio.sleep(0.2)
    finally:
        worker.terminate()
        await asyncio.wait_for(worker.wait(), 60)
        async with await psycopg.AsyncConnection.connect(args.url, autocommit=True) as conn:
            drop = sql.SQL("drop schema if exists {} cascade").format(sql.Identifier(schema))
            await conn.execute(drop)
    return report(rows, args)


def report(rows: list[tuple[float, int, int, int, int, int]], args: argparse.Namespace) -> int:
    if len(rows) < 8:
        print("too short a run to judge")
        return 1
    quarter = len(rows) // 4
    most = max(r[3] for r in rows[quarter:])
    elapsed = rows[-1][0]
    rate = rows[-1][2] / elapsed
    bound = 3 * rate * (args.keep + args.prune_every) + args.backlog
    second = (rows[2 * quarter][2] - rows[quarter][2]) / (rows[2 * quarter][0] - rows[quarter][0])
    last = (rows[-1][2] - rows[-quarter][2]) / (rows[-1][0] - rows[-quarter][0])
    print(
        f"tasks rows at most {most:,} after the first quarter (bound {bound:,.0f}): "
        f"{'bounded' if most <= bound else 'GROWING'}; "
        f"drain {second:,.0f}/s in the second quarter, {last:,.0f}/s in the last "
        f"({last / second:.2f}x)"
    )
    return 0 if most <= bound else 1


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--url", default=os.environ.get("CONVEYOR_URL") or DEFAULT_URL)
    parser.add_argument("--tasks", type=int, default=2_000_000)
    parser.add_argument("--backlog", type=int, default=50_000)
    parser.add_argument("--keep", type=float, default=10.0, help="seconds succeeded tasks stay")
    parser.add_argument("--prune-every", type=float, default=5.0)
    parser.add_argument("--sample", type=float, default=10.0)
    parser.add_argument("--concurrency", type=int, default=50, help="the worker's")
    parser.add_argument(
        "--rate", type=float, default=0.0, help="tasks enqueued a second (0: as fast as drained)"
    )
    parser.add_argument("--worker", action="store_true", help=argparse.SUPPRESS)
    parser.add_argument("--schema", help=argparse.SUPPRESS)
    args = parser.parse_args()
    if args.worker:
        run_worker(args.url, args.schema, args.keep, args.prune_every, args.concurrency)
        return 0
    return asyncio.run(soak(args))


if __name__ == "__main__":
    sys.exit(main())
