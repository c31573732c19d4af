"""Handlers for the worker-process tests: block, sleep, or kill their own worker.

Each handler records that it started by appending its attempt number to the
``marker`` file, so a test can wait until the handler really runs.
"""

from __future__ import annotations

import asyncio
import os
import time
from pathlib import Path

import conveyor
from conveyor import RetryPolicy, TaskContext

app = conveyor.App()


def _mark(marker: str, attempt: int) -> None:
    with Path(marker).open("a") as file:
        file.write(f"{attempt}\n")


@app.task()
def hang_first(marker: str, ctx: TaskContext) -> int:
    """Attempt 1 blocks (until the worker is killed); later attempts succeed."""
    _mark(marker, ctx.attempt)
    if ctx.attempt == 1:
        time.sleep(120)
    return ctx.attempt


@app.task()
def nap(marker: str, seconds: float, ctx: TaskContext) -> str:
    _mark(marker, ctx.attempt)
    time.sleep(seconds)
    return "rested"


@app.task()
async def long_nap(marker: str, seconds: float, ctx: TaskContext) -> str:
    """Attempt 1 sleeps ``seconds``; later attempts succeed at once."""
    _mark(marker, ctx.attempt)
    if ctx.attempt == 1:
        await asyncio.sleep(seconds)
    return "resumed"


@app.task(retry=RetryPolicy(max_attempts=2))
def crash(marker: str, ctx: TaskContext) -> None:
    """Kill the worker process: no completion is ever written."""
    _mark(marker, ctx.attempt)
    os._exit(1)
