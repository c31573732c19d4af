"""What a lease costs on Redis, alone: claim, heartbeat and finish, no worker.

A Redis server of this run's own (``tools/redis_server.py``, no
persistence) gets ``--tasks`` no-op tasks; then, until every one has
ended, one lease holder claims ``--batch`` of them, renews their leases
once and writes their completions (plain successes), one call after
another, each timed by this process's clock. Reported: microseconds per
task for each call, their total, and the server's own time for them
(``server``: the ``FCALL`` time of ``INFO commandstats``, which a loaded
machine's scheduling disturbs less), per round and the medians of
``--rounds`` rounds (each on a fresh server). Run it with the tree to
measure first on the path (``PYTHONPATH=src``).

    PYTHONPATH=src python benchmarks/redis_leases.py --tasks 20000 --rounds 5
"""

from __future__ import annotations

import argparse
import asyncio
import statistics
import sys
import tempfile
import time
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent
if str(ROOT) not in sys.path:
    sys.path.insert(0, str(ROOT))

from conveyor.backends.params import (  # noqa: E402
    ClaimParams,
    Completion,
    EnqueueParams,
    FinishParams,
    HeartbeatParams,
    NewTask,
)
from conveyor.backends.redis import RedisBackend  # noqa: E402
from conveyor.model import DEFAULT_RETRY, Outcome, TaskState  # noqa: E402
from tools.redis_server import RedisServer  # noqa: E402

CALLS = ("claim", "heartbeat", "finish")
SHOWN = (*CALLS, "server")


async def one_round(tasks: int, batch: int) -> dict[str, float]:
    """Microseconds per task of each call, on a fresh server."""
    workdir = Path(tempfile.mkdtemp(prefix="conveyor-leases-"))
    server = RedisServer(workdir / "redis", appendonly=False)
    server.start()
    spent = dict.fromkeys(CALLS, 0.0)
    try:
        backend = RedisBackend(server.url, prefix="leases")
        await backend.open()
        new = NewTask("bench", "default", "{}", 0, 3, DEFAULT_RETRY)
        for start in range(0, tasks, 5000):
            await backend.enqueue(EnqueueParams([new] * min(5000, tasks - start)))
        await backend._redis.config_resetstat()
        done = 0
        while done < tasks:
            t0 = time.perf_counter()
            claimed = await backend.claim(ClaimParams("w1", ["bench"], ["default"], batch, 30.0))
            t1 = time.perf_counter()
            await backend.heartbeat(HeartbeatParams("w1", [c.token for c in claimed], 30.0))
            t2 = time.perf_counter()
            completions = [
                Completion(c.token, Outcome.SUCCEEDED, TaskState.SUCCEEDED, result='"ok"')
                for c in claimed
            ]
            applied = (await backend.finish(FinishParams("w1", completions))).applied
            t3 = time.perf_counter()
            if len(applied) != len(claimed):
                raise RuntimeError("a completion of a live lease was refused")
            spent["claim"] += t1 - t0
            spent["heartbeat"] += t2 - t1
            spent["finish"] += t3 - t2
            done += len(claimed)
        stats = await backend._redis.info("commandstats")
        server_us = float(stats.get("cmdstat_fcall", {}).get("usec", 0))
        server_us += float(stats.get("cmdstat_evalsha", {}).get("usec", 0))
        await backend.close()
    finally:
        server.kill()
    found = {call: seconds / tasks * 1e6 for call, seconds in spent.items()}
    return {**found, "server": server_us / tasks}


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--tasks", type=int, default=20000)
    parser.add_argument("--batch", type=int, default=100)
    parser.add_argument("--rounds", type=int, default=3)
    args = parser.parse_args()
    rounds = []
    for number in range(args.rounds):
        found = asyncio.run(one_round(args.tasks, args.batch))
        rounds.append(found)
        total = sum(found[call] for call in CALLS)
        shown = "  ".join(f"{call} {found[call]:.1f}" for call in SHOWN)
        print(f"round {number + 1}: {shown}  total {total:.1f} us/task")
    medians = {call: statistics.median(r[call] for r in rounds) for call in SHOWN}
    shown = "  ".join(f"{call} {medians[call]:.1f}" for call in SHOWN)
    total = statistics.median(sum(r[call] for call in CALLS) for r in rounds)
    print(f"medians of {args.rounds}: {shown}  total {total:.1f} us/task")


if __name__ == "__main__":
    main()
