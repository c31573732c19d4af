"""The app the least-privilege tests run as the worker role: a plain task, a
task that outlives its lease (its heartbeat keeps it), a schedule, a keyed
task, and a coroutine that spawns a child and ends with its end message."""

from __future__ import annotations

import time

import conveyor

app = conveyor.App(migrate=False)


@app.task()
def add(a: int, b: int) -> int:
    return a + b


@app.task(lease=3.0)
def outlive(seconds: float) -> str:
    """Runs past its lease: only the heartbeat's renewals keep it."""
    time.sleep(seconds)
    return "kept"


@app.task(concurrency=conveyor.Concurrency(key=lambda args: str(args["key"]), limit=1))
def keyed(key: str) -> str:
    return key


@app.task()
def tick() -> None:
    """Fired by the schedule below."""


app.schedule(tick, every=1.0, name="tick")


@app.coroutine("parent")
async def parent(poll: conveyor.Poll) -> conveyor.Suspend | conveyor.Done:
    """Spawns ``add`` once, then ends with its child's result."""
    if not poll.state.get("spawned"):
        poll.spawn(add, args={"a": 2, "b": 3})
        poll.state["spawned"] = True
    for message in poll.inbox:
        if message.is_end:
            return conveyor.done(message.body["result"])
    return conveyor.suspend()
