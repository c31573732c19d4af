"""OpenTelemetry traces of enqueues, sends and attempts (the ``otel`` extra).

``Tracing().install(app)`` traces everything the App and its workers do,
with the global tracer provider (or ``Tracing(tracer_provider=...)``).
A :class:`Tracing` is a middleware (:mod:`conveyor.middleware`):
``install`` is ``app.add_middleware(tracing)``, inside the middleware installed before
it (the App's events among them), and ``uninstall`` removes it.

- ``conveyor.enqueue NAME`` (kind producer) around each enqueue call, with
  the task name, queue, count and ids as attributes (``conveyor.task.*``,
  ``messaging.*``). Its trace context (the global propagator's carrier: W3C
  ``traceparent`` by default) is stored with each task it enqueues.
- ``conveyor.send`` (producer) around ``App.send``; the message carries the
  sender's context.
- One span (kind consumer) per attempt, in the trace of the enqueue: a
  plain task's is ``conveyor.attempt NAME``, a step workflow's step is
  ``conveyor.step NAME.STEP``, a coroutine task's poll ``conveyor.poll
  NAME``. Attributes: ``conveyor.task.id``, ``conveyor.attempt``,
  ``conveyor.worker``, ``conveyor.outcome`` and ``conveyor.next_state``; a
  failed or timed-out attempt has status ERROR and an ``exception`` event.
  The span is current while the handler runs (in its thread, for a sync
  handler): the handler's own spans nest in it, and the tasks it enqueues,
  the children a poll spawns and the messages it sends carry its context.
  A poll's span is linked to the context of each message it read.

So one trace holds a task, its retries, a workflow's steps, a coroutine's
polls and the work they cause. ``Tracing(link=True)`` makes each attempt
the root of a trace of its own, linked to its enqueue instead (for tasks
that run days after their enqueue, or retry for long).

Guarantees and limits:

- Nothing is traced until ``install``; an App without tracing pays nothing
  for it.
- A stored context that does not decode (written around conveyor, or cut)
  is ignored: the attempt's span starts a trace of its own, and the attempt
  runs as always. A carrier over :data:`MAX_TRACE_CHARS` is not stored.
- A process handler (``executor="process"``) is covered by its attempt's
  span, but spans made inside the child process are not joined to it.
- Runs of a schedule, and the end messages the store sends a parent, carry
  no context: no code of the caller's made them.
- An attempt's span ends when its handler ends, with the outcome the worker
  decided. A completion the store then refuses (its lease was lost) is not
  in the span; the ``LeaseLost`` event and the attempt log tell of it.
"""

from __future__ import annotations

import contextlib
import dataclasses
import functools
import json
import logging
from collections.abc import Awaitable, Callable, Iterator, Sequence
from importlib import metadata

from conveyor.backends.params import Completion, Delivery, NewTask
from conveyor.client import Client
from conveyor.errors import ConfigurationError
from conveyor.middleware import AttemptInfo, EnqueueScope, Middleware

try:
    from opentelemetry import context as otel_context
    from opentelemetry import propagate, trace
    from opentelemetry.trace import Link, Span, SpanKind, Status, StatusCode
except ModuleNotFoundError as exc:  # pragma: no cover - exercised without the extra
    if (exc.name or "").partition(".")[0] != "opentelemetry":
        raise
    raise ConfigurationError(
        "traces need opentelemetry-api: pip install 'conveyor[otel]'"
    ) from None
from conveyor.model import Message, Outcome

log = logging.getLogger("conveyor.tracing")

MAX_TRACE_CHARS = 4096
"""The largest carrier stored with a task or message (JSON text)."""

MAX_ID_ATTRIBUTES = 100
"""Ids of an enqueue listed in its span's ``conveyor.task.ids`` at most."""

_ERRORS = frozenset({Outcome.FAILED, Outcome.TIMED_OUT})

try:
    _VERSION = metadata.version("conveyor")
except metadata.PackageNotFoundError:  # pragma: no cover - run from a source tree
    _VERSION = "0"


def carrier() -> str | None:
    """The current context as stored with a task or message: the global
    propagator's carrier as JSON text; None outside any span, or when it is
    over :data:`MAX_TRACE_CHARS`."""
    found: dict[str, str] = {}
    propagate.inject(found)
    if not found:
        return None
    text = json.dumps(found, separators=(",", ":"), sort_keys=True)
    if len(text) > MAX_TRACE_CHARS:
        log.warning("a trace context of %d characters is not stored", len(text))
        return None
    return text


def stored_context(text: str | None) -> otel_context.Context | None:
    """The context a stored carrier holds; None for none, or one that does
    not decode to a valid span context. The tasks of one enqueue share their
    carrier, so the last few thousand are kept decoded."""
    if not text:
        return None
    return _decoded(text)


@functools.lru_cache(maxsize=4096)
def _decoded(text: str) -> otel_context.Context | None:
    try:
        found = json.loads(text)
    except ValueError:
        return None
    if not isinstance(found, dict) or not all(
        isinstance(k, str) and isinstance(v, str) for k, v in found.items()
    ):
        return None
    context = propagate.extract(found)
    if not trace.get_current_span(context).get_span_context().is_valid:
        return None
    return context


class EnqueueSpan(EnqueueScope):
    """The span of one enqueue: ``stamp`` gives tasks its context, ``stored``
    names the ids they got."""

    __slots__ = ("carrier", "span")

    def __init__(self, span: Span) -> None:
        self.span = span
        self.carrier = carrier()

    def stamp(self, tasks: Sequence[NewTask]) -> None:
        for task in tasks:
            task.trace = self.carrier

    def stored(self, ids: Sequence[int]) -> None:
        self.span.set_attribute("conveyor.task.count", len(ids))
        self.span.set_attribute("conveyor.task.ids", list(ids[:MAX_ID_ATTRIBUTES]))
        if len(ids) == 1:
            self.span.set_attribute("messaging.message.id", str(ids[0]))


class Tracing(Middleware):
    """OpenTelemetry spans of an App's enqueues, sends and attempts (see the
    module docstring). One instance may serve several Apps."""

    def __init__(
        self, tracer_provider: trace.TracerProvider | None = None, *, link: bool = False
    ) -> None:
        self.tracer = trace.get_tracer("conveyor", _VERSION, tracer_provider=tracer_provider)
        self.link = link

    def install(self, client: Client) -> Tracing:
        """Trace ``client`` (an App) and its workers from now on:
        ``client.add_middleware(self)``."""
        client.add_middleware(self)
        return self

    def uninstall(self, client: Client) -> None:
        """Stop tracing ``client`` (if this instance traces it)."""
        client.remove_middleware(self)

    # -- producers ---------------------------------------------------------------

    @contextlib.contextmanager
    def enqueue(self, tasks: Sequence[NewTask]) -> Iterator[EnqueueSpan]:
        """A span around an enqueue of ``tasks`` (its first ones, for a batch
        encoded in chunks); its scope stamps the span's context on each chunk."""
        names = {t.name for t in tasks}
        queues = {t.queue for t in tasks}
        name = next(iter(names)) if len(names) == 1 else "tasks"
        attributes: dict[str, str] = {"messaging.system": "conveyor"}
        attributes["messaging.operation.type"] = "send"
        if len(names) == 1:
            attributes["conveyor.task.name"] = name
        if len(queues) == 1:
            attributes["conveyor.queue"] = attributes["messaging.destination.name"] = next(
                iter(queues)
            )
        with self.tracer.start_as_current_span(
            f"conveyor.enqueue {name}", kind=SpanKind.PRODUCER, attributes=attributes
        ) as span:
            yield EnqueueSpan(span)

    @contextlib.contextmanager
    def send(self, deliveries: Sequence[Delivery]) -> Iterator[list[Delivery]]:
        """A span around a send: the deliveries with its context."""
        attributes: dict[str, str | int] = {
            "messaging.system": "conveyor",
            "messaging.operation.type": "send",
            "conveyor.task.id": deliveries[0].task_id,
        }
        with self.tracer.start_as_current_span(
            "conveyor.send", kind=SpanKind.PRODUCER, attributes=attributes
        ):
            stamp = carrier()
            yield [dataclasses.replace(d, trace=stamp) for d in deliveries]

    # -- consumers ---------------------------------------------------------------

    async def attempt(
        self,
        run: Callable[[], Awaitable[Completion | None]],
        info: AttemptInfo,
    ) -> Completion | None:
        """Run one attempt (``run``) inside its span."""
        task, kind, worker_id = info.task, info.kind, info.worker_id
        parent = stored_context(task.trace)
        links: list[Link] = []
        if parent is not None and self.link:
            links.append(Link(trace.get_current_span(parent).get_span_context()))
            parent = None
        token = task.token
        name = f"conveyor.{kind} {task.name}"
        if kind == "step" and task.step is not None:
            name = f"{name}.{task.step}"
        attributes: dict[str, str | int] = {
            "messaging.system": "conveyor",
            "conveyor.task.id": token.task_id,
            "conveyor.task.name": task.name,
            "conveyor.queue": task.queue,
            "conveyor.attempt": token.attempt,
            "conveyor.worker": worker_id,
        }
        if task.step is not None:
            attributes["conveyor.step"] = task.step
        span = self.tracer.start_span(
            name,
            # Not the worker's own context: an attempt is a child of its
            # enqueue, or the root of a trace.
            context=parent if parent is not None else otel_context.Context(),
            kind=SpanKind.CONSUMER,
            attributes=attributes,
            links=links,
        )
        with trace.use_span(span, end_on_exit=True):
            completion = await run()
            if completion is not None:
                _ended(span, completion)
                _stamp_effects(completion)
        return completion

    def inbox_reader(
        self, read: Callable[[], Awaitable[list[Message]]]
    ) -> Callable[[], Awaitable[list[Message]]]:
        """``read`` (a poll's inbox read), linking the poll's span to the
        context of each message it returns."""

        async def traced() -> list[Message]:
            messages = await read()
            span = trace.get_current_span()
            for message in messages:
                context = stored_context(message.trace)
                if context is not None:
                    span.add_link(
                        trace.get_current_span(context).get_span_context(),
                        {"conveyor.message.id": message.id},
                    )
            return messages

        return traced


def _ended(span: Span, completion: Completion) -> None:
    span.set_attributes(
        {
            "conveyor.outcome": completion.outcome.value,
            "conveyor.next_state": completion.next_state.value,
        }
    )
    error = completion.error
    if completion.outcome in _ERRORS:
        span.set_status(Status(StatusCode.ERROR, error.message if error else None))
    if error is not None:
        span.add_event(
            "exception",
            {
                "exception.type": error.type,
                "exception.message": error.message,
                "exception.stacktrace": error.traceback or "",
            },
        )


def _stamp_effects(completion: Completion) -> None:
    """A poll's spawned children and sent messages carry its span's context."""
    effects = completion.effects
    if effects is None or not (effects.spawns or effects.sends):
        return
    stamp = carrier()
    for spawn in effects.spawns:
        spawn.trace = stamp
    if effects.sends:
        sends = tuple(dataclasses.replace(d, trace=stamp) for d in effects.sends)
        completion.effects = dataclasses.replace(effects, sends=sends)
