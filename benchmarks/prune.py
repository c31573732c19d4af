"""How fast retention deletes a history of finished tasks on PostgreSQL,
alone and beside a drain, and what a prune with nothing to delete costs.

A fresh schema holds ``--history`` succeeded tasks (each with its attempt)
finished 25 hours ago, then ANALYZE (so the statistics count no live
task), then ``--tasks`` pending no-op tasks. With ``--tasks`` above 0, one
worker process (``conveyor worker --burst --no-prune``) drains them while
this process prunes with the default retention, prune after prune
(``Pruner.run_once``, as a worker's pruner runs them back to back while a
backlog lasts), until a prune deletes nothing. Reported: the prune's
rate, the drain's wall time (worker start to exit) beside it, and then
three prunes with nothing to delete, on the tables as the run left them.

    python benchmarks/prune.py --history 1000000 --tasks 1000000
    python benchmarks/prune.py --history 300000 --tasks 0
"""

from __future__ import annotations

import argparse
import asyncio
import subprocess
import sys
import time
import uuid
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent
if str(ROOT) not in sys.path:
    sys.path.insert(0, str(ROOT))

from benchmarks.bench_app import DEFAULT_URL, make_app  # noqa: E402
from benchmarks.scaling import _prepare  # noqa: E402
from benchmarks.throughput import WorkerSpec, drop_schema, log, start_worker  # noqa: E402
from conveyor import Retention  # noqa: E402
from conveyor.worker.pruner import Pruner  # noqa: E402


async def run(args: argparse.Namespace, schema: str) -> None:
    settings = {"url": args.url, "concurrency": 400, "history_age": 25.0, "prefix": schema}
    prepare = argparse.Namespace(**settings, batch=5000, analyze=False)
    after = await _prepare(prepare, schema, args.history, args.tasks)
    log(f"[{schema}] {after:,} finished tasks to prune, {args.tasks:,} pending")
    app = make_app(args.url, schema)
    async with app:
        pruner = Pruner(await app.backend(), Retention())
        worker: subprocess.Popen[bytes] | None = None
        started = time.monotonic()
        if args.tasks:
            spec = WorkerSpec(args.url, 400, burst=True, poll_interval=None, log_level="warning")
            worker = start_worker(spec, schema, extra=["--no-prune"])
        pruned = 0
        while True:
            done = await pruner.run_once()
            pruned += done.tasks
            if not done.tasks:
                break
        pruning = time.monotonic() - started
        print(f"pruned {pruned:,} in {pruning:.1f} s: {pruned / pruning:,.0f} tasks/s")
        if worker is not None:
            code = await asyncio.to_thread(worker.wait)
            drained = time.monotonic() - started
            rate = args.tasks / drained
            print(f"drain beside it: {args.tasks:,} in {drained:.1f} s ({rate:,.0f}/s)", end="")
            print(f", worker exit {code}")
        for _ in range(3):
            moment = time.monotonic()
            await pruner.run_once()
            print(f"a prune with nothing to delete: {(time.monotonic() - moment) * 1000:.1f} ms")


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--url", default=DEFAULT_URL)
    parser.add_argument("--history", type=int, default=300_000)
    parser.add_argument("--tasks", type=int, default=0, help="pending tasks one worker drains")
    parser.add_argument("--keep", action="store_true", help="keep the benchmark schema")
    args = parser.parse_args()
    schema = f"bench_prune_{uuid.uuid4().hex[:8]}"
    try:
        asyncio.run(run(args, schema))
    finally:
        if not args.keep:
            asyncio.run(drop_schema(args.url, schema))


if __name__ == "__main__":
    main()
