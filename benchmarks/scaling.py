"""How conveyor's processing rate scales, and what one worker's memory does.

Three measurements on PostgreSQL, each in fresh schemas, with the no-op task
of ``bench_app`` and worker processes (``python -m conveyor.cli worker ...``,
burst workers for the drains):

- **processes**: enqueue ``--tasks``, then drain them with 1, 2 and 4 worker
  processes started together (``--processes``); the rate is by the database
  clock, from the first attempt's start to the last one's end.
- **history**: before enqueueing, the tasks table already holds 0, 100k and
  1M finished tasks, each with its attempt (``--history``), finished
  ``--history-age`` hours ago (default 1), then ANALYZE, as autovacuum would
  have by then; one worker drains, with retention at its defaults (succeeded
  tasks kept a day): with ``--history-age 25`` it prunes the history while
  it drains, and **pruned** counts the history rows gone by the end.
- **memory**: one worker drains ``--memory-tasks`` (default 100k); its RSS is
  sampled from ``/proc`` with the count of tasks done so far, every 0.1 s
  until a sample sees them all done (then the worker is stopped), and the
  table shows RSS when 10%, 50% and 100% of them were done, and the peak
  (VmHWM).

    python benchmarks/scaling.py
    python benchmarks/scaling.py --tasks 40000 --processes 1,2,4 --history 0,100000,1000000
    python benchmarks/scaling.py --only memory --memory-tasks 100000 --json

Every run checks that each task succeeded once, with one attempt row.
"""

from __future__ import annotations

import argparse
import asyncio
import json
import os
import sys
import time
import uuid
from collections.abc import Sequence
from dataclasses import asdict, dataclass, field
from pathlib import Path
from typing import Any

from psycopg import sql

ROOT = Path(__file__).resolve().parent.parent
if str(ROOT) not in sys.path:  # run as a script: make ``benchmarks`` importable
    sys.path.insert(0, str(ROOT))

from benchmarks.bench_app import DEFAULT_URL  # noqa: E402
from benchmarks.throughput import (  # noqa: E402
    WorkerSpec,
    connect,
    drop_schema,
    enqueue_all,
    fetch_one,
    log,
    parse_concurrency,
    positive_int,
    start_worker,
    stop_worker,
)

HISTORY = """
insert into {tasks} (name, queue, payload, state, max_attempts, retry_policy, attempt,
                     spent, result, created_at, finished_at, worker_id, attempt_started_at)
select 'bench_noop', 'default', jsonb_build_object('i', g), 'succeeded', 5, '{{}}', 1, 1,
       'null', now() - %(age)s::float8 * interval '1 hour',
       now() - %(age)s::float8 * interval '1 hour', 'history',
       now() - %(age)s::float8 * interval '1 hour'
from generate_series(1, %(n)s) as g
"""

# Only the tasks this run enqueued: the history's rows are left out.
VERIFY_NEW = """
select
    count(*),
    count(*) filter (where t.state = 'succeeded'),
    (select count(*) from {attempts} a where a.task_id > %(after)s),
    (select count(*) from {attempts} a where a.task_id > %(after)s and a.outcome = 'succeeded'),
    (select min(started_at) from {attempts} a where a.task_id > %(after)s),
    (select max(finished_at) from {attempts} a where a.task_id > %(after)s),
    (select count(*) from {tasks} h where h.id <= %(after)s)
from {tasks} t where t.id > %(after)s
"""


@dataclass
class Run:
    kind: str
    processes: int
    history: int
    tasks: int
    drain_seconds: float
    drain_per_s: float
    ok: bool
    pruned: int = 0
    """History rows (finished before the drain) gone by its end."""


@dataclass
class MemoryRun:
    tasks: int
    samples: list[tuple[int, int]] = field(default_factory=list)
    """(tasks done, RSS in KiB), in the order sampled."""
    peak_kib: int = 0
    ok: bool = False

    def rss_at(self, done: int) -> int | None:
        """RSS of the first sample taken once ``done`` tasks were done."""
        return next((rss for count, rss in self.samples if count >= done), None)


def _rss_kib(pid: int) -> tuple[int, int]:
    """(VmRSS, VmHWM) of ``pid`` in KiB; zeros once it is gone."""
    try:
        status = Path(f"/proc/{pid}/status").read_text(encoding="ascii")
    except OSError:
        return 0, 0
    fields = dict(line.split(":", 1) for line in status.splitlines() if ":" in line)
    return int(fields["VmRSS"].split()[0]), int(fields["VmHWM"].split()[0])


async def _prepare(args: argparse.Namespace, schema: str, history: int, tasks: int) -> int:
    """A fresh schema with ``history`` finished tasks, then ``tasks`` enqueued;
    the highest id of the history (the new tasks come after it)."""
    enqueue_args = argparse.Namespace(**{**vars(args), "tasks": 0})
    await enqueue_all(enqueue_args, schema)  # creates the schema, enqueues nothing
    async with connect(args.url) as conn:
        if history:
            # Succeeded tasks as a worker leaves them: each attempt in its row.
            tasks_table = sql.Identifier(schema, "tasks")
            history_args = {"n": history, "age": args.history_age}
            await conn.execute(sql.SQL(HISTORY).format(tasks=tasks_table), history_args)
            for table in ("tasks", "attempts"):
                await conn.execute(sql.SQL("analyze {}").format(sql.Identifier(schema, table)))
        (after,) = await fetch_one(
            conn,
            sql.SQL("select coalesce(max(id), 0) from {}").format(sql.Identifier(schema, "tasks")),
        )
    await enqueue_all(argparse.Namespace(**{**vars(args), "tasks": tasks}), schema)
    return int(after)


async def _verify(args: argparse.Namespace, schema: str, after: int, tasks: int) -> Run | None:
    names = {
        "tasks": sql.Identifier(schema, "tasks"),
        "attempts": sql.Identifier(schema, "attempt_log"),
    }
    async with connect(args.url) as conn:
        cursor = await conn.execute(sql.SQL(VERIFY_NEW).format(**names), {"after": after})
        row = await cursor.fetchone()
    assert row is not None
    count, succeeded, attempts, attempts_ok, first, last, left = row
    window = (last - first).total_seconds() if first and last else 0.0
    ok = count == succeeded == attempts == attempts_ok == tasks
    rate = succeeded / window if window > 0 else 0.0
    return Run("", 0, 0, tasks, window, rate, ok, pruned=after - int(left))


async def drain_with(args: argparse.Namespace, processes: int, history: int) -> Run:
    schema = f"{args.prefix}_p{processes}_h{history}"
    log(f"[{schema}] {history} finished tasks, {args.tasks} to drain with {processes} process(es)")
    after = await _prepare(args, schema, history, args.tasks)
    spec = WorkerSpec(args.url, args.concurrency, True, None, "WARNING")
    workers = [start_worker(spec, schema) for _ in range(processes)]
    codes = [await asyncio.to_thread(w.wait, args.timeout) for w in workers]
    run = await _verify(args, schema, after, args.tasks)
    if not args.keep:
        await drop_schema(args.url, schema)
    kind = "history" if history else "processes"
    ok = run.ok and all(code == 0 for code in codes)
    return Run(
        kind, processes, history, args.tasks, run.drain_seconds, run.drain_per_s, ok, run.pruned
    )


async def memory(args: argparse.Namespace) -> MemoryRun:
    schema = f"{args.prefix}_memory"
    tasks = args.memory_tasks
    log(f"[{schema}] one worker draining {tasks} tasks; sampling its RSS")
    after = await _prepare(args, schema, 0, tasks)
    # Not a burst worker: one that exits as it runs dry could leave the last
    # tasks unsampled. This one is stopped once a sample has seen them all.
    spec = WorkerSpec(args.url, args.concurrency, False, None, "WARNING")
    worker = start_worker(spec, schema)
    result = MemoryRun(tasks)
    count = sql.SQL("select count(*) from {} where state = 'succeeded'").format(
        sql.Identifier(schema, "tasks")
    )
    deadline = time.monotonic() + args.timeout
    done = 0
    async with connect(args.url) as conn:
        while done < tasks and worker.poll() is None and time.monotonic() < deadline:
            await asyncio.sleep(0.1)
            rss, peak = _rss_kib(worker.pid)
            (done,) = await fetch_one(conn, count)
            if rss:
                result.samples.append((int(done), rss))
                result.peak_kib = max(result.peak_kib, peak)
    code = await stop_worker(worker)
    run = await _verify(args, schema, after, tasks)
    result.ok = run.ok and code == 0
    if not args.keep:
        await drop_schema(args.url, schema)
    return result


def table(runs: Sequence[Run], mem: MemoryRun | None, concurrency: int) -> str:
    lines = []
    if runs:
        head = (
            f"{'processes':>9} {'finished rows':>14} {'tasks':>7} {'drain s':>8} "
            f"{'drain/s':>9} {'pruned':>9} {'check':>6}"
        )
        lines += [f"drain rate, --concurrency {concurrency} per process", head, "-" * len(head)]
        for r in runs:
            lines.append(
                f"{r.processes:>9} {r.history:>14,} {r.tasks:>7} {r.drain_seconds:>8.2f} "
                f"{r.drain_per_s:>9,.0f} {r.pruned:>9,} {'ok' if r.ok else 'FAIL':>6}"
            )
    if mem is not None:
        marks = [mem.tasks // 10, mem.tasks // 2, mem.tasks]
        head = "".join(f"{f'RSS at {m:,}':>16}" for m in marks) + f"{'peak RSS':>12} {'check':>6}"
        cells = "".join(
            f"{(f'{rss / 1024:.1f} MiB' if (rss := mem.rss_at(m)) else 'n/a'):>16}" for m in marks
        )
        lines += ["", f"one worker draining {mem.tasks:,} tasks", head, "-" * len(head)]
        lines.append(
            f"{cells}{f'{mem.peak_kib / 1024:.1f} MiB':>12} {'ok' if mem.ok else 'FAIL':>6}"
        )
    return "\n".join(lines)


async def run(args: argparse.Namespace) -> int:
    args.prefix = f"bench_{uuid.uuid4().hex[:8]}"
    args.batch = 5_000
    args.analyze = False
    runs: list[Run] = []
    if args.only in (None, "processes"):
        for processes in args.processes:
            runs.append(await drain_with(args, processes, 0))
    if args.only in (None, "history"):
        for history in args.history:
            if history or args.only == "history":
                runs.append(await drain_with(args, 1, history))
    mem = await memory(args) if args.only in (None, "memory") else None
    if args.json:
        report: dict[str, Any] = {
            "runs": [asdict(r) for r in runs],
            "memory": asdict(mem) if mem else None,
            "concurrency": args.concurrency,
        }
        print(json.dumps(report, indent=2))
    else:
        print(table(runs, mem, args.concurrency))
    ok = all(r.ok for r in runs) and (mem is None or mem.ok)
    return 0 if ok else 1


def parse_args(argv: Sequence[str] | None = None) -> argparse.Namespace:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--url", default=os.environ.get("CONVEYOR_URL") or DEFAULT_URL)
    parser.add_argument("--tasks", type=positive_int, default=40_000, help="tasks per drain")
    parser.add_argument("--concurrency", type=positive_int, default=400, help="per process")
    parser.add_argument("--processes", type=parse_concurrency, default=[1, 2, 4])
    parser.add_argument(
        "--history",
        type=lambda text: [int(v) for v in text.split(",")],
        default=[0, 100_000, 1_000_000],
        help="finished tasks already in the table (0 is the 1-process run)",
    )
    parser.add_argument(
        "--history-age",
        type=float,
        default=1.0,
        help="hours since the history finished (over 24: the worker's retention prunes it)",
    )
    parser.add_argument("--memory-tasks", type=positive_int, default=100_000)
    parser.add_argument("--only", choices=["processes", "history", "memory"], default=None)
    parser.add_argument("--timeout", type=float, default=900.0, help="seconds per worker")
    parser.add_argument("--keep", action="store_true", help="keep the benchmark schemas")
    parser.add_argument("--json", action="store_true")
    return parser.parse_args(argv)


def main(argv: Sequence[str] | None = None) -> int:
    return asyncio.run(run(parse_args(argv)))


if __name__ == "__main__":
    sys.exit(main())
