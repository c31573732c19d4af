"""Coroutine tasks: long-lived tasks with a persistent state and an inbox.

A coroutine task is polled: each poll gets the task's stored state and the
messages received so far, and returns one outcome::

    @app.coroutine("tally")
    async def tally(poll: Poll) -> Sleep | Suspend | Done:
        for message in poll.inbox:
            if message.is_end:                       # a child finished
                poll.state["total"] += message.body["result"]
                poll.state["left"] -= 1
            else:
                poll.spawn(square, {"n": message.body["n"]})
                poll.state["left"] += 1
        if poll.state["left"] == 0 and poll.state.get("closed"):
            return conveyor.done(poll.state["total"])
        return conveyor.suspend()                    # until the next message

    handle = tally.start({"total": 0, "left": 0})
    app.send(handle.id, {"n": 3})                    # from anywhere, by id

Outcomes: :func:`suspend` waits for a message (the task is ``waiting`` and
holds no lease); :func:`sleep` waits until a time or a message, whichever
comes first (the task is ``pending`` with a future ``run_at``);
:func:`conveyor.done` ends the task with a result.

Guarantees: the new state, the messages the poll consumed, its sends,
spawns and ``yield_`` are written in the same fenced write that ends the
poll, so they happen once or not at all: a poll that fails, times out or
lost its lease changes nothing, and its messages stay in the inbox for the
next poll. A poll consumes exactly the messages it was given
(``poll.inbox``); a message that arrives while it runs stays in the inbox
and makes the task due again as soon as the poll ends, even if it chose to
suspend (a failed poll instead waits out its retry backoff, unless a
message arrives after it ended). Messages reach a poll in the order of their ids (the order they
were sent, except between senders writing at the same moment). When a
child finishes (succeeded, failed or cancelled, however it ended), its
parent gets an ``end`` message with the child's id, name, state and
result. Cancelling a coroutine task cancels its live children. A poll runs
at least once per outcome: after a crash it runs again, from the state and
inbox the last committed poll left.

Limits: a poll must be ``async def``; its state must be a JSON object;
a spawned child's id is not known to the poll that spawns it (the parent
learns it from the child's messages or its end message); a message sent
from a poll to a task that is missing or finished is dropped (``App.send``
raises instead); messages are kept until consumed, so a task that never
reads its inbox keeps them.
"""

from __future__ import annotations

import asyncio
from collections.abc import Callable, Mapping
from dataclasses import dataclass, field, replace
from datetime import datetime, timedelta
from typing import TYPE_CHECKING, Any, TypeVar, Unpack

from conveyor import payload as codec
from conveyor.backends.params import ClaimedTask, Completion, Delivery, Effects, NewTask, Transition
from conveyor.context import TaskContext
from conveyor.errors import ConfigurationError, Fatal, PayloadError
from conveyor.model import Message, Outcome, TaskState
from conveyor.options import NO_OPTIONS, EnqueueOptions, OptionFields, options_from
from conveyor.task import TaskDef, TaskOptions, run_at_from
from conveyor.workflow import Done

if TYPE_CHECKING:
    from conveyor.client import Client
    from conveyor.handle import TaskHandle

F = TypeVar("F", bound=Callable[..., Any])


class PollError(Fatal):
    """A poll returned something other than sleep/suspend/done, or its
    stored state is not a JSON object. Not retried; ``conveyor retry`` resumes."""


@dataclass(frozen=True, slots=True)
class Sleep:
    """Poll again at ``run_at`` (or ``delay`` seconds from now), or at the next message."""

    run_at: datetime | None = None
    delay: float = 0.0


@dataclass(frozen=True, slots=True)
class Suspend:
    """Poll again when a message arrives."""


def sleep(seconds: float | timedelta | None = None, *, until: datetime | None = None) -> Sleep:
    """Poll again after ``seconds`` or at ``until`` (aware), or sooner on a message."""
    if seconds is None and until is None:
        raise ConfigurationError("sleep needs seconds or until=")
    when, delay = run_at_from(seconds, until)
    return Sleep(when, delay)


def suspend() -> Suspend:
    """Poll again when a message arrives."""
    return Suspend()


_NO_MESSAGE: Any = object()


@dataclass(slots=True)
class Poll:
    """One poll of a coroutine task: its state (change it in place or
    replace it), the messages received so far, and what it does next.

    ``send``, ``spawn`` and ``yield_`` check and encode at once (a message
    over the payload cap raises PayloadError here, before any I/O) and take
    effect only when the poll's outcome is recorded.
    """

    ctx: TaskContext
    state: dict[str, Any]
    inbox: list[Message]
    max_bytes: int
    sends: list[Delivery] = field(default_factory=list)
    spawns: list[NewTask] = field(default_factory=list)

    @property
    def task_id(self) -> int:
        """The id of the coroutine task this poll runs."""
        return self.ctx.task_id

    @property
    def parent_id(self) -> int | None:
        """The coroutine task that spawned this one; None for a root task."""
        return self.ctx.parent_id

    def _encode(self, message: Any) -> str:
        return codec.encode(codec.to_plain(message), self.max_bytes)

    def send(self, task_id: int, message: Any) -> None:
        """Send ``message`` (strict JSON) to coroutine task ``task_id``."""
        self.sends.append(Delivery(task_id, self._encode(message), self.task_id))

    def yield_(self, message: Any) -> None:
        """Send ``message`` to this task's parent."""
        if self.parent_id is None:
            raise ConfigurationError(f"task {self.task_id} has no parent to yield to")
        self.send(self.parent_id, message)

    def spawn(
        self,
        child: Coroutine | TaskDef,
        message: Any = _NO_MESSAGE,
        *,
        state: Mapping[str, Any] | None = None,
        args: Mapping[str, Any] | None = None,
        **options: Unpack[OptionFields],
    ) -> None:
        """Start a child: a coroutine task (with ``state`` and a first
        ``message``) or a plain task (with ``args``). It ends by sending this
        task an ``end`` message. Options as for the child's ``start`` or
        ``options`` (see :class:`conveyor.EnqueueOptions`)."""
        checked = EnqueueOptions.of(options)
        if isinstance(child, Coroutine):
            new = child.new_coroutine(state, message, checked)
        else:
            if message is not _NO_MESSAGE or state is not None:
                raise ConfigurationError("a plain child task takes args=, not a message or state")
            new = child.new_tasks([args], checked)[0]
        self.spawns.append(_with_parent(new, self.task_id))


def _with_parent(new: NewTask, parent_id: int) -> NewTask:
    return replace(new, parent_id=parent_id)


@dataclass(frozen=True, slots=True)
class PollEnd:
    """What a poll returned, with the poll it came from (the worker records it)."""

    outcome: Sleep | Suspend | Done
    poll: Poll


class Coroutine(TaskDef):
    """A coroutine task registered on an App (see the module docstring)."""

    payload_from_signature = False

    def __init__(
        self, client: Client, handler: Callable[..., Any], name: str, defaults: TaskOptions
    ) -> None:
        if not asyncio.iscoroutinefunction(handler):
            raise ConfigurationError(f"coroutine {name!r} needs an `async def` poll function")
        self.handler = handler
        super().__init__(client, self._run, name, defaults, "async")
        self.__doc__ = handler.__doc__

    def __repr__(self) -> str:
        return f"<Coroutine {self.name}>"

    def __call__(self, *args: Any, **kwargs: Any) -> Any:
        return self.handler(*args, **kwargs)

    # -- starting ------------------------------------------------------------

    def new_coroutine(
        self,
        state: Mapping[str, Any] | None = None,
        message: Any = _NO_MESSAGE,
        options: EnqueueOptions = NO_OPTIONS,
    ) -> NewTask:
        """The task that starts this coroutine (checked and encoded, no I/O).
        Per call: ``queue``, ``priority``, ``delay`` or ``run_at``,
        ``idempotency_key``; retry, timeout and lease are the coroutine's
        own (they govern every poll)."""
        options.refuse("retry", "timeout", "lease", why="a coroutine's govern every poll")
        options.refuse("after", why="a coroutine waits for other tasks by spawning them")
        max_bytes = self.client.max_payload_bytes
        plain = codec.to_plain(dict(state) if state is not None else {})
        when, seconds = options.due()
        first = None if message is _NO_MESSAGE else codec.encode(codec.to_plain(message), max_bytes)
        payload = codec.encode(plain, max_bytes)
        return self.defaults.apply(options).new_task(
            self.name,
            payload,
            when,
            seconds,
            inbox=True,
            message=first,
            idempotency_key=options.idempotency_key,
        )

    def start(
        self,
        state: Mapping[str, Any] | None = None,
        *,
        message: Any = _NO_MESSAGE,
        connection: Any = None,
        **options: Unpack[OptionFields],
    ) -> TaskHandle:
        """Store a new coroutine task with ``state`` (a JSON object) and,
        optionally, a first ``message``; its handle once durable. Options
        (see :class:`EnqueueOptions`): ``queue``, ``priority``, ``delay`` or
        ``run_at``, ``idempotency_key`` (a start with a key already used for
        this coroutine returns the stored task and stores no second first
        message); ``connection`` as for :meth:`App.enqueue`."""
        return self.options(connection=connection, **options).start(state, message=message)

    async def start_async(
        self,
        state: Mapping[str, Any] | None = None,
        *,
        message: Any = _NO_MESSAGE,
        connection: Any = None,
        **options: Unpack[OptionFields],
    ) -> TaskHandle:
        """Async form of :meth:`start`."""
        bound = self.options(connection=connection, **options)
        return await bound.start_async(state, message=message)

    def options(  # type: ignore[override]
        self, *, connection: Any = None, **options: Unpack[OptionFields]
    ) -> BoundCoroutine:
        """This coroutine with the options of one start, checked now."""
        return BoundCoroutine(self, EnqueueOptions.of(options), connection)

    # -- running -------------------------------------------------------------

    def build_kwargs(self, args: Any, ctx: TaskContext | None) -> dict[str, Any]:
        """The arguments of one poll for the worker: the context and the stored state."""
        return {"ctx": ctx, "state": args}

    async def _run(self, ctx: TaskContext, state: dict[str, Any]) -> PollEnd:
        poll = Poll(ctx, state, await ctx.read_inbox(), self.client.max_payload_bytes)
        outcome = await self.handler(poll)
        if not isinstance(outcome, Sleep | Suspend | Done):
            raise PollError(
                f"coroutine {self.name!r} returned {type(outcome).__name__}; "
                "return conveyor.sleep(...), conveyor.suspend() or conveyor.done(...)"
            )
        if not isinstance(poll.state, dict):
            raise PayloadError(f"coroutine {self.name!r}: poll.state must stay a JSON object")
        return PollEnd(outcome, poll)

    def completion(self, task: ClaimedTask, end: PollEnd, max_bytes: int) -> Completion:
        """How a poll's outcome is recorded: the end, or the state to keep."""
        poll, outcome = end.poll, end.outcome
        effects = Effects(
            consumed=tuple(m.id for m in poll.inbox),
            sends=tuple(poll.sends),
            spawns=tuple(poll.spawns),
        )
        if isinstance(outcome, Done):
            result = codec.encode(codec.to_plain(outcome.result), max_bytes)
            return Completion(
                task.token, Outcome.SUCCEEDED, TaskState.SUCCEEDED, result=result, effects=effects
            )
        options = self.defaults
        sleeping = outcome if isinstance(outcome, Sleep) else None
        transition = Transition(
            step=None,
            state=codec.encode(codec.to_plain(poll.state), max_bytes),
            max_attempts=options.retry.max_attempts,
            retry=options.retry,
            timeout=options.timeout,
            lease=options.lease,
            run_at=sleeping.run_at if sleeping else None,
            delay=sleeping.delay if sleeping else 0.0,
        )
        state = TaskState.PENDING if sleeping else TaskState.WAITING
        return Completion(
            task.token, Outcome.SUCCEEDED, state, transition=transition, effects=effects
        )


class BoundCoroutine:
    """A coroutine with the options of one start: ``coroutine.options(...)``."""

    __slots__ = ("connection", "coroutine", "enqueue_options")

    def __init__(self, coroutine: Coroutine, options: EnqueueOptions, connection: Any) -> None:
        options.refuse("retry", "timeout", "lease", why="a coroutine's govern every poll")
        options.refuse("after", why="a coroutine waits for other tasks by spawning them")
        self.coroutine = coroutine
        self.enqueue_options = options
        self.connection = connection

    def options(self, *, connection: Any = None, **options: Unpack[OptionFields]) -> BoundCoroutine:
        """These options with more on top."""
        merged = options_from(self.enqueue_options, options)
        return BoundCoroutine(self.coroutine, merged, connection or self.connection)

    def start(
        self, state: Mapping[str, Any] | None = None, *, message: Any = _NO_MESSAGE
    ) -> TaskHandle:
        """Store a new coroutine task (see :meth:`Coroutine.start`)."""
        new = [self.coroutine.new_coroutine(state, message, self.enqueue_options)]
        return self.coroutine.client.enqueue_new(new, self.connection)[0]

    async def start_async(
        self, state: Mapping[str, Any] | None = None, *, message: Any = _NO_MESSAGE
    ) -> TaskHandle:
        """Async form of :meth:`start`."""
        new = [self.coroutine.new_coroutine(state, message, self.enqueue_options)]
        return (await self.coroutine.client.enqueue_new_async(new, self.connection))[0]
