"""Enqueue-to-start latency of several versions of conveyor, side by side.

For each source tree given (a checkout or ``git worktree`` of some commit),
one idle worker process runs that tree's code (``PYTHONPATH=<tree>/src``)
on a PostgreSQL schema of its own. This process enqueues one stamp task at
a time to each in turn, ``--tasks`` rounds, ``--gap`` seconds apart: the
versions see the same moments of a noisy machine, interleaved task by task,
which one version's run after another's does not give. Each task's handler
appends the ``time.time()`` taken before its enqueue and its own start to a
file of its tree's (see ``systems/stamp.py``): enqueue-to-start p50, p90
and p99 per tree, in ms.

    git worktree add /tmp/before HEAD~1 --detach
    python benchmarks/latency_trees.py /tmp/before .
    python benchmarks/latency_trees.py /tmp/before . --tasks 2000 --json

The enqueuing side runs this checkout's code; the stamp task and its
worker command are the throughput benchmark's (``bench_app.py``).
"""

from __future__ import annotations

import argparse
import asyncio
import json
import os
import subprocess
import sys
import tempfile
import time
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent
if str(ROOT) not in sys.path:  # run as a script: make ``benchmarks`` importable
    sys.path.insert(0, str(ROOT))

import psycopg  # noqa: E402

from benchmarks.bench_app import STAMP_NAME, make_app  # noqa: E402
from benchmarks.systems.stamp import STAMP_ENV, latencies  # noqa: E402

DEFAULT_URL = "postgresql://root@127.0.0.1:5432/test"
START_UP = 4.0
"""Seconds the workers get to start and listen before the first enqueue."""


def percentile(values: list[float], fraction: float) -> float:
    return values[min(len(values) - 1, int(len(values) * fraction))]


def worker(tree: Path, url: str, schema: str, stamps: Path) -> subprocess.Popen[bytes]:
    env = {
        **os.environ,
        "CONVEYOR_URL": url,
        "CONVEYOR_SCHEMA": schema,
        STAMP_ENV: str(stamps),
        "PYTHONPATH": f"{tree / 'src'}{os.pathsep}{tree}",
    }
    command = [sys.executable, "-m", "conveyor.cli", "worker", "benchmarks.bench_app:app"]
    return subprocess.Popen([*command, "--log-level", "warning"], env=env, cwd=tree)


def drop(url: str, schema: str) -> None:
    with psycopg.connect(url, autocommit=True) as conn:
        conn.execute(
            psycopg.sql.SQL("drop schema if exists {} cascade").format(
                psycopg.sql.Identifier(schema)
            )
        )


async def measure(
    args: argparse.Namespace, trees: list[Path], directory: Path
) -> dict[str, dict[str, float]]:
    schemas = [f"latency_tree_{k}" for k in range(len(trees))]
    stamps = [directory / f"stamps_{k}" for k in range(len(trees))]
    apps = []
    for schema in schemas:
        drop(args.url, schema)
        apps.append(make_app(args.url, schema))
        await apps[-1].backend()  # migrates the schema before its worker starts
    workers = [worker(t, args.url, s, p) for t, s, p in zip(trees, schemas, stamps, strict=True)]
    try:
        await asyncio.sleep(START_UP)
        for _ in range(args.tasks):
            for app in apps:
                await app.enqueue_async(STAMP_NAME, {"sent": time.time()})
                await asyncio.sleep(args.gap)
        await asyncio.sleep(1.0)
    finally:
        for process in workers:
            process.terminate()
            process.wait()
        for app, schema in zip(apps, schemas, strict=True):
            await app.aclose()
            drop(args.url, schema)
    results = {}
    for tree, path in zip(args.trees, stamps, strict=True):
        ms = [s * 1000 for s in latencies(path)]
        if len(ms) < args.tasks:
            raise SystemExit(f"{tree}: {len(ms)} of {args.tasks} tasks started")
        results[tree] = {
            "p50": percentile(ms, 0.5),
            "p90": percentile(ms, 0.9),
            "p99": percentile(ms, 0.99),
        }
    return results


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("trees", nargs="+", help="source trees to compare")
    parser.add_argument("--url", default=DEFAULT_URL, help="PostgreSQL URL (default %(default)s)")
    parser.add_argument("--tasks", type=int, default=1000, help="tasks per tree (%(default)s)")
    parser.add_argument("--gap", type=float, default=0.004, help="seconds between enqueues")
    parser.add_argument("--json", action="store_true", help="print the results as JSON")
    args = parser.parse_args()
    with tempfile.TemporaryDirectory() as directory:
        trees = [Path(t).resolve() for t in args.trees]
        results = asyncio.run(measure(args, trees, Path(directory)))
    if args.json:
        print(json.dumps(results, indent=2))
        return
    print(f"enqueue-to-start, {args.tasks} tasks per tree, interleaved, ms")
    for tree, row in results.items():
        print(f"{tree:40s} p50 {row['p50']:6.2f}  p90 {row['p90']:6.2f}  p99 {row['p99']:6.2f}")


if __name__ == "__main__":
    main()
