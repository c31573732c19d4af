"""CPU-bound ``process=True`` tasks per second: a fresh handler process per
attempt (``process_pool=0``) next to the worker's reused handler processes.

Each run enqueues ``--tasks`` tasks (``--fresh-tasks`` with a fresh process
per attempt, which is slow) that each spin ``--work`` loop rounds of
pure Python (about 1 ms at the default), then one in-process burst worker
with ``--concurrency`` slots drains them, on a fresh SQLite file; the rate
is tasks over the drain's wall-clock seconds. A thread handler of the same
work is shown for reference (it holds the GIL: one core at most).

    python benchmarks/processes.py
    python benchmarks/processes.py --tasks 1000 --concurrency 2 --rounds 3 --json

Every run checks that each task succeeded once.
"""

from __future__ import annotations

import argparse
import asyncio
import json
import statistics
import sys
import tempfile
import time
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent
if str(ROOT) not in sys.path:  # run as a script: make ``benchmarks`` importable
    sys.path.insert(0, str(ROOT))

import conveyor  # noqa: E402

MODES = ("fresh process", "reused processes", "thread")


def crunch(rounds: int) -> int:
    """The CPU-bound handler: ``rounds`` loop rounds of integer arithmetic."""
    total = 0
    for i in range(rounds):
        total = (total + i * i) % 1_000_003
    return total


async def drain(mode: str, tasks: int, concurrency: int, work: int) -> float:
    """Tasks per second of one burst drain of ``tasks`` tasks in ``mode``."""
    from benchmarks import processes  # by its module name: the handler process imports it

    with tempfile.TemporaryDirectory() as directory:
        app = conveyor.App(f"sqlite:///{directory}/bench.db")
        crunch_task = app.task(name="bench_crunch", process=mode != "thread")(processes.crunch)
        pool = 0 if mode == "fresh process" else None
        try:
            async with app:
                handles = await app.enqueue_many_async(crunch_task, [{"rounds": work}] * tasks)
                worker = app.worker(
                    concurrency=concurrency,
                    burst=True,
                    handle_signals=False,
                    poll_interval=0.01,
                    retention=None,
                    schedules=False,
                    log_attempts=False,
                    process_pool=pool,
                )
                began = time.perf_counter()
                await worker.run()
                elapsed = time.perf_counter() - began
                finished = [await app.get_async(h.id) for h in handles]
        finally:
            app.close()
    done = sum(1 for t in finished if t is not None and t.state is conveyor.TaskState.SUCCEEDED)
    if done != tasks:
        raise SystemExit(f"{mode}: {done} of {tasks} tasks succeeded")
    return tasks / elapsed


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--tasks", type=int, default=2000)
    parser.add_argument(
        "--fresh-tasks", type=int, default=200, help="tasks of the (slow) fresh-process runs"
    )
    parser.add_argument("--concurrency", type=int, default=2)
    parser.add_argument("--work", type=int, default=30_000, help="loop rounds per task")
    parser.add_argument("--rounds", type=int, default=3)
    parser.add_argument("--json", action="store_true")
    args = parser.parse_args()
    rates: dict[str, list[float]] = {mode: [] for mode in MODES}
    for _ in range(args.rounds):
        for mode in MODES:
            count = args.fresh_tasks if mode == "fresh process" else args.tasks
            rate = asyncio.run(drain(mode, count, args.concurrency, args.work))
            rates[mode].append(rate)
    if args.json:
        print(json.dumps(rates))
        return
    fresh = statistics.median(rates["fresh process"])
    print(
        f"{args.tasks} tasks ({args.fresh_tasks} for a fresh process each) of {args.work} "
        f"loop rounds, {args.concurrency} slots, median of {args.rounds} rounds\n"
    )
    print("| handler | tasks/s | rounds | vs fresh process |")
    print("|---|---:|---|---:|")
    for mode in MODES:
        median = statistics.median(rates[mode])
        each = ", ".join(f"{r:,.0f}" for r in rates[mode])
        print(f"| {mode} | {median:,.0f} | {each} | {median / fresh:.1f}x |")


if __name__ == "__main__":
    main()
