"""The App the benchmark's worker runs: a no-op ``async def`` task, a
workflow of no-op steps, a coroutine that plays ping-pong with a child, and
what ``reactions.py`` needs (a task that sleeps or waits to be stopped, one
that raises a huge error, and a coroutine that times its inbox).

``throughput.py`` starts ``python -m conveyor.cli worker benchmarks.bench_app:app``
with ``CONVEYOR_URL`` and ``CONVEYOR_SCHEMA`` set, so the worker process imports
``app`` from here; the benchmark itself builds its own App with :func:`make_app`
(same task, explicit URL and schema) to enqueue.
"""

from __future__ import annotations

import asyncio
import os
from dataclasses import dataclass
from datetime import UTC, datetime
from typing import Any

import conveyor
from benchmarks.systems.stamp import record_start
from conveyor import App, TaskContext

DEFAULT_URL = "postgresql://127.0.0.1:5432/test"
TASK_NAME = "bench_noop"
FLOW_NAME = "bench_flow"
PING_NAME = "bench_ping"
COLLECT_NAME = "bench_collect"
STAMP_NAME = "bench_stamp"
STAMP_SLEEP_NAME = "bench_stamp_sleep"
SLEEP_NAME = "bench_sleep"
WAIT_NAME = "bench_wait"
HUGE_ERROR_NAME = "bench_huge_error"
INBOX_NAME = "bench_inbox"
OBSERVE_ENV = "CONVEYOR_BENCH_OBSERVE"
"""Set (to anything) in a worker's environment: :func:`observe` its App."""


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

    @application.task(name=COLLECT_NAME)
    async def bench_collect(outcomes: list[Any] | None = None) -> int:
        """A chord's callback: how many outcomes it received."""
        return len(outcomes or [])

    @application.task(name=STAMP_NAME)
    async def bench_stamp(sent: float = 0.0) -> None:
        """Record when it started, for the peer benchmark's latency run."""
        record_start(sent)

    @application.task(name=STAMP_SLEEP_NAME)
    async def bench_stamp_sleep(sent: float = 0.0, seconds: float = 0.0) -> None:
        """Record when it started, then sleep: the kill test of ``redis_peers.py``."""
        record_start(sent)
        await asyncio.sleep(seconds)

    application.workflow(FLOW_NAME).step(Hop)

    add_reaction_tasks(application)
    if os.environ.get(OBSERVE_ENV):
        observe(application)

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


def add_reaction_tasks(application: App) -> None:
    """What ``reactions.py`` runs: a task that sleeps, one that waits to be
    stopped, one that raises a huge error, and a coroutine timing its inbox."""

    @application.task(name=SLEEP_NAME)
    async def bench_sleep(seconds: float = 0.0) -> None:
        """Sleep on the worker's loop (a neighbour, or a task to cancel)."""
        await asyncio.sleep(seconds)

    @application.task(name=WAIT_NAME)
    def bench_wait(ctx: TaskContext, seconds: float = 0.0) -> None:
        """A thread handler that runs until told to stop (or ``seconds``)."""
        ctx.wait_for_stop(seconds)
        ctx.check()

    @application.task(name=HUGE_ERROR_NAME, retry=conveyor.RetryPolicy(max_attempts=1))
    async def bench_huge_error(megabytes: int = 10, nul: bool = True) -> None:
        """Fail with a message of ``megabytes`` million characters (NUL or x)."""
        raise RuntimeError(("\x00" if nul else "x") * (megabytes * 1_000_000))

    @application.coroutine(INBOX_NAME)
    async def bench_inbox(poll: conveyor.Poll) -> conveyor.Suspend | conveyor.Done:
        """Record each message's delay from its delivery (the backend's clock)
        to the start of the poll that reads it; end at ``{"stop": true}``."""
        received = datetime.now(UTC)
        for message in poll.inbox:
            if message.body.get("stop"):
                return conveyor.done(poll.state["delays"])
            delay_ms = (received - message.created_at).total_seconds() * 1000
            poll.state["delays"].append(round(delay_ms, 2))
        return conveyor.suspend()


def merge(into: dict[str, Any], more: dict[str, Any]) -> None:
    """Add the counts of histogram ``more`` into ``into``."""
    for bucket, count in more.items():
        into[bucket] = into.get(bucket, 0) + count


def observe(application: App) -> None:
    """Turn on what an operator would, at its full cost: an event callback,
    and OpenTelemetry traces through the SDK and a batch span processor
    whose exporter drops the spans (the worker's Prometheus metrics are its
    ``--metrics-port``)."""
    from opentelemetry.sdk.trace import TracerProvider
    from opentelemetry.sdk.trace.export import BatchSpanProcessor, SpanExporter, SpanExportResult

    from conveyor.tracing import Tracing

    class Dropped(SpanExporter):
        def export(self, spans: Any) -> SpanExportResult:
            return SpanExportResult.SUCCESS

    seen = [0]

    def count(event: object) -> None:
        seen[0] += 1

    application.events.subscribe(count)
    provider = TracerProvider()
    provider.add_span_processor(BatchSpanProcessor(Dropped()))
    Tracing(provider).install(application)


app = make_app()
