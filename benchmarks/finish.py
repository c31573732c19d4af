"""What recording completions costs on PostgreSQL, alone: no worker, no
handler, one statement at a time.

A fresh schema gets ``--tasks`` no-op tasks, all claimed at once by one
lease holder, then their completions are written in batches of
``--batch`` (``Backend.finish``, as a worker's completer sends them),
one after another, timed by this process's clock. ``--outcome``: plain
successes (the lean statement), or failures that are retried (the general
statement, each writing an attempt row). Reported: microseconds per
completion, the median of ``--rounds`` rounds (each on a fresh schema).

    python benchmarks/finish.py --tasks 30000 --batch 250 --rounds 3
"""

from __future__ import annotations

import argparse
import asyncio
import statistics
import sys
import time
import uuid
from pathlib import Path
from typing import Any

import psycopg

ROOT = Path(__file__).resolve().parent.parent
if str(ROOT) not in sys.path:
    sys.path.insert(0, str(ROOT))

from benchmarks.bench_app import DEFAULT_URL, TASK_NAME, make_app  # noqa: E402
from benchmarks.throughput import drop_schema, enqueue_all, positive_int  # noqa: E402
from conveyor.backends.params import ClaimedTask, ClaimParams, Completion, FinishParams  # noqa: E402
from conveyor.model import Outcome, TaskState  # noqa: E402

CLAIM_LIMIT = 1000


async def one_round(args: argparse.Namespace) -> tuple[float, float]:
    """Microseconds and WAL bytes per completion in one fresh schema."""
    schema = f"bench_finish_{uuid.uuid4().hex[:8]}"
    app = make_app(args.url, schema)
    try:
        enqueue = argparse.Namespace(url=args.url, tasks=args.tasks, batch=5000, analyze=False)
        await enqueue_all(enqueue, schema)  # creates the schema too
        async with app:
            backend = await app.backend()
            claim = ClaimParams("bench", (TASK_NAME,), ("default",), CLAIM_LIMIT, lease=3600)
            claimed: list[ClaimedTask] = []
            while len(claimed) < args.tasks:
                taken = await backend.claim(claim)
                if not taken:
                    raise RuntimeError(f"claimed {len(claimed)} of {args.tasks} tasks")
                claimed += taken
            if args.outcome == "succeeded":
                ending = (Outcome.SUCCEEDED, TaskState.SUCCEEDED)
            else:
                ending = (Outcome.FAILED, TaskState.PENDING)
            completions = [Completion(c.token, *ending, result="null") for c in claimed]
            async with await psycopg.AsyncConnection.connect(args.url, autocommit=True) as conn:
                wal_before = await wal_position(conn)
                started = time.perf_counter()
                for first in range(0, len(completions), args.batch):
                    batch = completions[first : first + args.batch]
                    recorded = await backend.finish(FinishParams("bench", batch))
                    if len(recorded.applied) != len(batch):
                        raise RuntimeError("a completion was refused")
                seconds = time.perf_counter() - started
                wal = await wal_position(conn) - wal_before
            return seconds * 1e6 / len(completions), wal / len(completions)
    finally:
        await drop_schema(args.url, schema)


async def wal_position(conn: psycopg.AsyncConnection[Any]) -> int:
    """The server's WAL insert position, in bytes."""
    row = await (await conn.execute("select pg_current_wal_insert_lsn() - '0/0'")).fetchone()
    assert row is not None
    return int(row[0])


async def run(args: argparse.Namespace) -> None:
    rounds = [await one_round(args) for _ in range(args.rounds)]
    each = ", ".join(f"{us:.1f}" for us, _ in rounds)
    print(
        f"finish of {args.tasks:,} {args.outcome} attempts in batches of {args.batch}: "
        f"{statistics.median(us for us, _ in rounds):.1f} us per completion "
        f"(median; rounds: {each}), "
        f"{statistics.median(wal for _, wal in rounds):.0f} bytes of WAL per completion"
    )


def parse_args(argv: list[str] | None = None) -> argparse.Namespace:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--url", default=DEFAULT_URL, help="PostgreSQL URL")
    parser.add_argument("--tasks", type=positive_int, default=30000, help="tasks per round")
    parser.add_argument("--batch", type=positive_int, default=250, help="completions per finish")
    parser.add_argument("--rounds", type=positive_int, default=3, help="rounds, each fresh")
    parser.add_argument(
        "--outcome",
        choices=("succeeded", "retried"),
        default="succeeded",
        help="plain successes, or failures retried later",
    )
    return parser.parse_args(argv)


if __name__ == "__main__":
    asyncio.run(run(parse_args()))
