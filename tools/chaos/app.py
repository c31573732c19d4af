"""The App that chaos workers run: a task that sleeps and keeps an effects ledger.

Each execution of ``chaos_work`` appends a ``start`` line when it begins and
an ``end`` line when its body has finished (before the worker records the
attempt's ending) to the ledger file named by ``CONVEYOR_CHAOS_LEDGER``, so
an execution whose ending the fence rejected, or that was killed, is still
visible to the checker. Lines are single ``write`` calls on a file opened
with ``O_APPEND``: concurrent workers never interleave within a line.
"""

from __future__ import annotations

import asyncio
import json
import os
import time

from conveyor import App, RetryPolicy, TaskContext

TASK_NAME = "chaos_work"
LEDGER_ENV = "CONVEYOR_CHAOS_LEDGER"
# Faults reclaim tasks again and again: a budget this size is not spent by
# them, so every task can end succeeded and a lost one stands out.
RETRY = RetryPolicy(max_attempts=50, initial_interval=0.05, max_interval=0.5, jitter=0.0)

app = App()


def record(event: str, ctx: TaskContext) -> None:
    """Append one ledger line for this execution."""
    line = json.dumps(
        {
            "event": event,
            "task": ctx.task_id,
            "attempt": ctx.attempt,
            "worker": ctx.worker_id,
            "pid": os.getpid(),
            "at": time.time(),
        }
    )
    fd = os.open(os.environ[LEDGER_ENV], os.O_WRONLY | os.O_APPEND | os.O_CREAT, 0o644)
    try:
        os.write(fd, (line + "\n").encode())
    finally:
        os.close(fd)


@app.task(name=TASK_NAME, retry=RETRY)
async def chaos_work(ctx: TaskContext, i: int, sleep_ms: int) -> int:
    """Sleep ``sleep_ms`` (some tasks outlive their lease: the heartbeat must
    keep it) and return ``i``."""
    record("start", ctx)
    await asyncio.sleep(sleep_ms / 1000)
    record("end", ctx)
    return i
