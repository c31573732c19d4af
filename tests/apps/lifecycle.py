"""Handlers for the worker-process tests: block, sleep, or kill their own worker.

Each handler records that it started by appending its attempt number to the
``marker`` file, so a test can wait until the handler really runs.
"""

from __future__ import annotations

import asyncio
import os
import time
from dataclasses import dataclass
from pathlib import Path

import conveyor
from conveyor import RetryPolicy, TaskContext

app = conveyor.App()


def _mark(marker: str, attempt: int | str) -> None:
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


@app.task()
def wait_for_stop(marker: str, seconds: float, ctx: TaskContext) -> str:
    """A thread handler that runs until told to stop (or ``seconds``)."""
    _mark(marker, ctx.attempt)
    ctx.wait_for_stop(seconds)
    ctx.check()
    return "never told"


@app.task(retry=RetryPolicy(max_attempts=2))
def crash(marker: str, ctx: TaskContext) -> None:
    """Kill the worker process: no completion is ever written."""
    _mark(marker, ctx.attempt)
    os._exit(1)


journey = app.workflow("journey")


def _first_run_of(marker: str, step: str) -> bool:
    lines = Path(marker).read_text().split("\n") if Path(marker).exists() else []
    return sum(line.startswith(f"{step} ") for line in lines) == 1


@journey.step
@dataclass
class Depart:
    """Its first run hangs (until the worker is killed); then it moves on."""

    marker: str

    async def run(self, ctx: TaskContext) -> conveyor.Next:
        _mark(self.marker, f"Depart {ctx.attempt}")
        if _first_run_of(self.marker, "Depart"):
            await asyncio.sleep(120)
        return conveyor.next(Arrive(self.marker))


@journey.step
@dataclass
class Arrive:
    """Its first run hangs too: a kill after Depart's transition committed."""

    marker: str

    async def run(self, ctx: TaskContext) -> conveyor.Done:
        _mark(self.marker, f"Arrive {ctx.attempt}")
        if _first_run_of(self.marker, "Arrive"):
            await asyncio.sleep(120)
        return conveyor.done("arrived")


@app.coroutine("ledger")
async def ledger(poll: conveyor.Poll) -> conveyor.Suspend | conveyor.Done:
    """Keeps every message it gets; ends with them all on one marked ``last``."""
    for message in poll.inbox:
        poll.state["got"].append(message.body["saw"])
        if message.body.get("last"):
            return conveyor.done(poll.state["got"])
    return conveyor.suspend()


@app.coroutine("relay")
async def relay(poll: conveyor.Poll) -> conveyor.Suspend | conveyor.Done:
    """Notes each poll's attempt, state and inbox as ``<attempt>: <seen> | <inbox>``.

    Each poll adds its messages to ``seen`` and tells the ``ledger`` what it
    saw. Attempt 2 (the second poll) also spawns a child and then hangs (until
    the worker is killed). A poll that sees ``"d"`` ends with everything seen.
    """
    bodies = [message.body for message in poll.inbox]
    _mark(
        poll.state["marker"],
        f"{poll.ctx.attempt}: {' '.join(poll.state['seen'])} | {' '.join(bodies)}",
    )
    poll.state["seen"] += bodies
    last = "d" in bodies
    poll.send(poll.state["ledger"], {"saw": bodies, "last": last})
    if poll.ctx.attempt == 2:
        poll.spawn(nap, args={"marker": poll.state["marker"], "seconds": 0})
        await asyncio.sleep(120)
    if last:
        return conveyor.done(poll.state["seen"])
    return conveyor.suspend()
