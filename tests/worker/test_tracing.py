"""OpenTelemetry traces (conveyor.tracing) with real workers, on every
backend, seen by the SDK's in-memory exporter: an enqueue's span and the
context stored with its task; each attempt a span in its trace, with its
attributes and outcome; a workflow's steps and a coroutine's polls, spawns
and messages; link mode; and a stored context that does not decode."""

from __future__ import annotations

import asyncio
import threading
from collections.abc import Iterator
from dataclasses import dataclass

import pytest
from opentelemetry.sdk.trace import ReadableSpan, TracerProvider
from opentelemetry.sdk.trace.export import SimpleSpanProcessor
from opentelemetry.sdk.trace.export.in_memory_span_exporter import InMemorySpanExporter
from opentelemetry.trace import SpanKind, StatusCode

import conveyor
from conveyor import Poll, RetryPolicy, TaskContext, TaskState
from conveyor.backends.params import ClaimedTask, ClaimParams
from conveyor.client import ENQUEUE_CHUNK
from conveyor.testing import drain_async
from conveyor.tracing import MAX_TRACE_CHARS, Tracing, carrier, stored_context
from tests.worker.helpers import run_all

FAST = RetryPolicy(max_attempts=3, initial_interval=0, max_interval=0, jitter=0)

Outcomes = conveyor.Sleep | conveyor.Suspend | conveyor.Done


@pytest.fixture
def exporter() -> InMemorySpanExporter:
    return InMemorySpanExporter()


@pytest.fixture
def provider(exporter: InMemorySpanExporter) -> Iterator[TracerProvider]:
    found = TracerProvider()
    found.add_span_processor(SimpleSpanProcessor(exporter))
    yield found
    found.shutdown()


@pytest.fixture
def app(any_app: conveyor.App, provider: TracerProvider) -> conveyor.App:
    Tracing(provider).install(any_app)
    return any_app


def named(spans: tuple[ReadableSpan, ...], prefix: str) -> list[ReadableSpan]:
    return sorted((s for s in spans if s.name.startswith(prefix)), key=lambda s: s.start_time or 0)


def parent_of(span: ReadableSpan) -> int | None:
    return span.parent.span_id if span.parent is not None else None


def span_id(span: ReadableSpan) -> int:
    assert span.context is not None
    return span.context.span_id


def trace_id(span: ReadableSpan) -> int:
    assert span.context is not None
    return span.context.trace_id


async def test_each_attempt_is_a_span_in_the_trace_of_its_enqueue(
    app: conveyor.App, provider: TracerProvider, exporter: InMemorySpanExporter
) -> None:
    tracer = provider.get_tracer("test")
    handler_threads: list[str] = []

    @app.task(retry=FAST)
    async def flaky(n: int) -> int:
        with tracer.start_as_current_span("inside the handler"):
            if len(named(exporter.get_finished_spans(), "conveyor.attempt flaky")) == 0:
                raise ValueError("the first attempt fails")
        await follow.enqueue_async(n=n)
        return n

    @app.task()
    def follow(n: int) -> int:  # a sync handler: it runs in a thread of its own
        handler_threads.append(threading.current_thread().name)
        with tracer.start_as_current_span("inside the thread"):
            return n

    async with app:
        with tracer.start_as_current_span("request"):
            handle = await flaky.enqueue_async(n=3)
        [task] = await run_all(app, [handle], poll_interval=0.05)
        await drain_async(app)
        [child] = [t for t in await app.list_tasks_async() if t.name == "follow"]
    assert task.state is TaskState.SUCCEEDED and child.state is TaskState.SUCCEEDED
    assert handler_threads and handler_threads[0] != threading.current_thread().name
    spans = exporter.get_finished_spans()
    [request] = named(spans, "request")
    [enqueue, enqueue_follow] = named(spans, "conveyor.enqueue")
    assert enqueue.name == "conveyor.enqueue flaky" and enqueue.kind is SpanKind.PRODUCER
    assert parent_of(enqueue) == span_id(request)
    assert enqueue.attributes is not None
    assert enqueue.attributes["conveyor.task.ids"] == (handle.id,)
    assert enqueue.attributes["conveyor.queue"] == "default"
    first, second = named(spans, "conveyor.attempt flaky")
    for number, attempt in enumerate((first, second), start=1):
        assert attempt.kind is SpanKind.CONSUMER
        assert parent_of(attempt) == span_id(enqueue)
        assert trace_id(attempt) == trace_id(request)
        assert attempt.attributes is not None
        assert attempt.attributes["conveyor.task.id"] == handle.id
        assert attempt.attributes["conveyor.attempt"] == number
        assert attempt.attributes["conveyor.worker"] == task.attempts[number - 1].worker_id
    assert first.attributes is not None and second.attributes is not None
    assert first.attributes["conveyor.outcome"] == "failed"
    assert first.attributes["conveyor.next_state"] == "pending"
    assert first.status.status_code is StatusCode.ERROR
    [error] = [e for e in first.events if e.name == "exception"]
    assert error.attributes is not None
    assert error.attributes["exception.type"].endswith("ValueError")
    assert "the first attempt fails" in str(error.attributes["exception.message"])
    assert second.attributes["conveyor.outcome"] == "succeeded"
    assert second.status.status_code is not StatusCode.ERROR
    # The handler's own spans nest in its attempt's; what it enqueues is part
    # of the trace, and so is the sync handler's span, made in its thread.
    inside = named(spans, "inside the handler")
    assert [parent_of(s) for s in inside] == [span_id(first), span_id(second)]
    assert parent_of(enqueue_follow) == span_id(second)
    # The first worker may stop while it runs ``follow``: that attempt is
    # interrupted and the drain runs another, each a span of its own.
    follow_attempts = named(spans, "conveyor.attempt follow")
    assert follow_attempts
    assert all(parent_of(a) == span_id(enqueue_follow) for a in follow_attempts)
    in_thread = named(spans, "inside the thread")
    assert in_thread
    assert all(parent_of(s) in {span_id(a) for a in follow_attempts} for s in in_thread)
    assert all(trace_id(s) == trace_id(request) for s in in_thread)


async def test_a_workflow_s_steps_are_spans_of_one_trace(
    app: conveyor.App, exporter: InMemorySpanExporter
) -> None:
    orders = app.workflow("order")

    @orders.step()
    @dataclass
    class Reserve:
        order_id: int

        async def run(self, ctx: TaskContext) -> conveyor.Next:
            return conveyor.next(Charge(self.order_id))

    @orders.step()
    @dataclass
    class Charge:
        order_id: int

        async def run(self, ctx: TaskContext) -> conveyor.Done:
            return conveyor.done({"charged": self.order_id})

    async with app:
        handle = await orders.start_async(Reserve(order_id=7))
        [task] = await run_all(app, [handle], poll_interval=0.05)
    assert task.state is TaskState.SUCCEEDED
    spans = exporter.get_finished_spans()
    [enqueue] = named(spans, "conveyor.enqueue")
    steps = named(spans, "conveyor.step")
    assert [s.name for s in steps] == ["conveyor.step order.Reserve", "conveyor.step order.Charge"]
    assert all(parent_of(s) == span_id(enqueue) for s in steps)
    assert [s.attributes["conveyor.step"] for s in steps if s.attributes] == ["Reserve", "Charge"]
    assert [s.attributes["conveyor.next_state"] for s in steps if s.attributes] == [
        "pending",
        "succeeded",
    ]


async def test_a_coroutine_s_polls_spawns_and_messages_carry_their_context(
    app: conveyor.App, provider: TracerProvider, exporter: InMemorySpanExporter
) -> None:
    tracer = provider.get_tracer("test")

    @app.task()
    async def square(n: int) -> int:
        return n * n

    @app.coroutine("collector", retry=FAST)
    async def collector(poll: Poll) -> Outcomes:
        if not poll.state["spawned"]:
            poll.spawn(square, args={"n": 4})
            poll.state["spawned"] = True
        for message in poll.inbox:
            poll.state["got"].append(message.body)
        if len(poll.state["got"]) == 2:  # the child's end, and the outside message
            return conveyor.done(len(poll.state["got"]))
        return conveyor.suspend()

    async with app:
        handle = await collector.start_async({"spawned": False, "got": []})
        with tracer.start_as_current_span("outside"):
            await app.send_async(handle.id, {"hello": 1})
        [task] = await run_all(app, [handle], poll_interval=0.05)
    assert task.state is TaskState.SUCCEEDED
    spans = exporter.get_finished_spans()
    [outside] = named(spans, "outside")
    [send] = named(spans, "conveyor.send")
    assert parent_of(send) == span_id(outside) and send.kind is SpanKind.PRODUCER
    polls = named(spans, "conveyor.poll collector")
    [start] = named(spans, "conveyor.enqueue collector")
    assert polls and all(parent_of(p) == span_id(start) for p in polls)
    # The child spawned by the first poll runs in that poll's trace.
    [square_attempt] = named(spans, "conveyor.attempt square")
    assert parent_of(square_attempt) == span_id(polls[0])
    # The poll that read the outside message is linked to its sender.
    linked = [p for p in polls if any(link.context.span_id == span_id(send) for link in p.links)]
    assert len(linked) == 1


async def test_link_mode_makes_each_attempt_a_trace_linked_to_its_enqueue(
    any_app: conveyor.App, provider: TracerProvider, exporter: InMemorySpanExporter
) -> None:
    Tracing(provider, link=True).install(any_app)

    @any_app.task()
    async def job() -> str:
        return "ok"

    async with any_app:
        handle = await job.enqueue_async()
        await run_all(any_app, [handle], poll_interval=0.05)
    spans = exporter.get_finished_spans()
    [enqueue] = named(spans, "conveyor.enqueue")
    [attempt] = named(spans, "conveyor.attempt")
    assert attempt.parent is None and trace_id(attempt) != trace_id(enqueue)
    assert [link.context.span_id for link in attempt.links] == [span_id(enqueue)]


@pytest.mark.parametrize(
    "stored",
    [
        "not json",
        "[1, 2]",
        '{"traceparent": 7}',
        '{"traceparent": "00-zz-yy-01"}',
        '{"traceparent": "00-00000000000000000000000000000000-0000000000000000-01"}',
        "{" * 10_000,
    ],
)
async def test_a_stored_context_that_does_not_decode_starts_a_trace_and_the_task_runs(
    any_app: conveyor.App,
    provider: TracerProvider,
    exporter: InMemorySpanExporter,
    stored: str,
) -> None:
    ran: list[int] = []

    @any_app.task()
    async def job(n: int) -> int:
        ran.append(n)
        return n

    async with any_app:
        # Stored as written around conveyor: through the store, untraced.
        [new] = job.new_tasks([{"n": 1}])
        new.trace = stored
        [handle] = await any_app.enqueue_new_async([new])
        Tracing(provider).install(any_app)
        [task] = await run_all(any_app, [handle], poll_interval=0.05)
    assert task.state is TaskState.SUCCEEDED and ran == [1]
    [attempt] = named(exporter.get_finished_spans(), "conveyor.attempt job")
    assert attempt.parent is None and not attempt.links


async def test_an_untraced_app_makes_no_span_and_stores_no_context(
    any_app: conveyor.App, exporter: InMemorySpanExporter
) -> None:
    @any_app.task()
    async def job() -> None:
        return None

    tracing = Tracing()
    tracing.install(any_app)
    tracing.uninstall(any_app)
    assert not any(isinstance(m, Tracing) for m in any_app.middleware)
    async with any_app:
        [new] = job.new_tasks([{}])
        handle = (await any_app.enqueue_new_async([new]))[0]
        await run_all(any_app, [handle], poll_interval=0.05)
    assert new.trace is None
    assert exporter.get_finished_spans() == ()


def test_a_carrier_is_stored_only_within_its_bound(provider: TracerProvider) -> None:
    tracer = provider.get_tracer("test")
    assert carrier() is None  # outside any span
    with tracer.start_as_current_span("s") as span:
        text = carrier()
        assert text is not None and len(text) <= MAX_TRACE_CHARS
        context = stored_context(text)
        assert context is not None
        from opentelemetry import trace

        found = trace.get_current_span(context).get_span_context()
        assert found.span_id == span.get_span_context().span_id


async def test_a_batch_enqueued_in_chunks_stores_the_context_in_every_chunk(
    app: conveyor.App, exporter: InMemorySpanExporter
) -> None:
    @app.task()
    async def item(n: int) -> int:
        return n

    total = ENQUEUE_CHUNK + 200  # chunks of 125, 250, 500 and 325 tasks
    async with app:
        handles = await app.enqueue_many_async(item, [{"n": n} for n in range(total)])
        backend = await app.backend()
        claimed: list[ClaimedTask] = []
        while batch := await backend.claim(ClaimParams("w", ["item"], ["default"], 500, 30)):
            claimed += batch
    [enqueue] = named(exporter.get_finished_spans(), "conveyor.enqueue")
    assert enqueue.attributes is not None
    assert enqueue.attributes["conveyor.task.count"] == len(handles) == total
    assert len(claimed) == total
    assert {t.trace for t in claimed} == {carrier_of(enqueue)}


def carrier_of(span: ReadableSpan) -> str:
    assert span.context is not None
    return (
        '{"traceparent":"00-'
        f"{span.context.trace_id:032x}-{span.context.span_id:016x}-"
        f'{int(span.context.trace_flags):02x}"}}'
    )


async def test_many_attempts_at_once_each_get_their_own_span(
    app: conveyor.App, exporter: InMemorySpanExporter
) -> None:
    @app.task()
    async def nap(n: int) -> int:
        await asyncio.sleep(0.01)
        return n

    async with app:
        handles = await app.enqueue_many_async(nap, [{"n": n} for n in range(40)])
        await drain_async(app, concurrency=10)
    attempts = named(exporter.get_finished_spans(), "conveyor.attempt nap")
    assert sorted(s.attributes["conveyor.task.id"] for s in attempts if s.attributes) == sorted(
        h.id for h in handles
    )
    assert len({span_id(s) for s in attempts}) == 40


def test_a_sync_enqueue_is_a_child_of_the_caller_s_span(
    app: conveyor.App, provider: TracerProvider, exporter: InMemorySpanExporter
) -> None:
    @app.task()
    async def job() -> None:
        return None

    with provider.get_tracer("test").start_as_current_span("caller"):
        handle = job.enqueue()  # the sync API: stored from the client's own loop thread
    [caller] = named(exporter.get_finished_spans(), "caller")
    [enqueue] = named(exporter.get_finished_spans(), "conveyor.enqueue job")
    assert parent_of(enqueue) == span_id(caller)
    assert enqueue.attributes is not None
    assert enqueue.attributes["conveyor.task.ids"] == (handle.id,)
