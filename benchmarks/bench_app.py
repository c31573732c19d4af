"""The App the benchmark's worker runs: a no-op ``async def`` task, a
workflow of no-op steps, and a coroutine that plays ping-pong with a child.

``throughput.py`` starts ``python -m conveyor.cli worker benchmarks.bench_app:app``
with ``CONVEYOR_URL`` and ``CONVEYOR_SCHEMA`` set, so the worker process imports
``app`` from here; the benchmark itself builds its own App with :func:`make_app`
(same task, explicit URL and schema) to enqueue.
"""

from __future__ import annotations

import os
from dataclasses import dataclass
from datetime import UTC, datetime
from typing import Any

import conveyor
from benchmarks.peers.stamp import record_start
from conveyor import App, TaskContext

DEFAULT_URL = "postgresql://127.0.0.1:5432/test"
TASK_NAME = "bench_noop"
FLOW_NAME = "bench_flow"
PING_NAME = "bench_ping"
STAMP_NAME = "bench_stamp"


@dataclass
class Hop:
    """A no-op workflow step: ``left`` more hops, then done."""

    left: int

    async def run(self, ctx: TaskContext) -> conveyor.Next | conveyor.Done:
        return conveyor.next(Hop(self.left - 1)) if self.left > 0 else conveyor.done()


def make_app(url: str | None = None, schema: str | None = None) -> App:
    """An App with the no-op task; None reads CONVEYOR_URL / CONVEYOR_SCHEMA."""
    application = App(url or os.environ.get("CONVEYOR_URL") or DEFAULT_URL, schema=schema)

    @application.task(name=TASK_NAME)
    async def bench_noop(i: int = 0) -> None:
        """Do nothing: the benchmark measures conveyor, not the handler."""
        return None

    @application.task(name=STAMP_NAME)
    async def bench_stamp(sent: float = 0.0) -> None:
        """Record when it started, for the peer benchmark's latency run."""
        record_start(sent)

    application.workflow(FLOW_NAME).step(Hop)

    @application.coroutine(PING_NAME)
    async def bench_ping(poll: conveyor.Poll) -> conveyor.Suspend | conveyor.Done:
        """Ping-pong: the root spawns its partner with ball 0; each side sends
        the ball back, one higher, until it reaches ``rounds``. Each records
        the delay from a message's delivery to the poll that reads it."""
        state = poll.state
        if state["role"] == "ping" and not state.get("served"):
            state["served"] = True
            child = {"role": "pong", "rounds": state["rounds"], "hist": {}}
            poll.spawn(bench_ping, {"ball": 0}, state=child)
            return conveyor.suspend()
        received = datetime.now(UTC)
        for message in poll.inbox:
            if message.is_end:  # the partner is done: merge its histogram
                merge(state["hist"], message.body["result"]["hist"])
                last = max(state.get("ball", 0), message.body["result"]["ball"])
                return conveyor.done({"hist": state["hist"], "ball": last})
            delay_ms = (received - message.created_at).total_seconds() * 1000
            bucket = f"{max(delay_ms, 0.0):.1f}"
            state["hist"][bucket] = state["hist"].get(bucket, 0) + 1
            ball = message.body["ball"]
            state["ball"] = ball
            if ball >= state["rounds"]:
                return conveyor.done({"hist": state["hist"], "ball": ball})
            if state["role"] == "pong":
                poll.yield_({"ball": ball + 1})
            else:
                poll.send(message.sender_id or 0, {"ball": ball + 1})
        return conveyor.suspend()

    return application


def merge(into: dict[str, Any], more: dict[str, Any]) -> None:
    """Add the counts of histogram ``more`` into ``into``."""
    for bucket, count in more.items():
        into[bucket] = into.get(bucket, 0) + count


app = make_app()
