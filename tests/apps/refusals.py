"""Tasks for the worker-process test of a completion the store refuses: a
coroutine poll that spawns a child into the queue ``refused`` (which the
test's store refuses) and notes each run in its ``marker`` file, and plain
neighbours."""

from __future__ import annotations

from pathlib import Path

import conveyor
from conveyor import Poll, RetryPolicy


def build(app: conveyor.App) -> conveyor.App:
    """Register the tasks on ``app``."""

    @app.task()
    async def child() -> None:
        return None

    @app.task()
    async def plain(n: int) -> int:
        return n

    @app.coroutine("spawner", retry=RetryPolicy(max_attempts=1))
    async def spawner(poll: Poll) -> conveyor.Done:
        with Path(poll.state["marker"]).open("a") as file:
            file.write("ran\n")
        poll.spawn(child, args={}, queue="refused")
        return conveyor.done(None)

    return app


app = build(conveyor.App())
