"""Middleware: code of one's own around every enqueue, send and attempt.

Subclass :class:`Middleware`, override the hooks you need, and install an
instance with ``app.add_middleware(middleware)``
(``app.remove_middleware(middleware)`` takes it out; ``app.middleware``
lists what is installed). Every hook of the base
class passes its work through unchanged:

- ``enqueue(tasks)``: a context manager around one enqueue call (the sync
  call inside a caller's transaction, the async call, a batch stored in
  chunks alike). It yields an :class:`EnqueueScope`: ``scope.stamp(tasks)``
  is called with each set of tasks before it is stored (every chunk of a
  large batch; it may change them, as tracing stores its context on them),
  ``scope.stored(ids)`` once the store returned their ids. ``tasks`` are
  the first chunk's for a batch stored in chunks.
- ``send(deliveries)``: a context manager around a send, yielding the
  deliveries to store (it may replace them).
- ``attempt(run, info)``: runs one attempt: ``await run()`` and return its
  completion (None: nothing is recorded). ``info`` (:class:`AttemptInfo`)
  says which task, attempt, worker, kind. It is called when the worker
  starts the attempt, and its awaitable is awaited by the attempt's
  runner: a plain ``def`` may act at once and return ``run()`` itself.
- ``inbox_reader(read)``: wraps a coroutine task's inbox read.

Order: the first middleware installed is the outermost: it enters first and
leaves last. Every client installs its events first
(:mod:`conveyor.events`); ``conveyor.tracing.Tracing().install(app)``
installs the OpenTelemetry spans; a worker puts its attempt log around both.

Guarantees and limits:

- An exception raised by an enqueue or send hook propagates to the caller:
  raised on entry or in ``stamp``, nothing is stored; raised in
  ``stored`` or on exit, the tasks are stored already (inside a caller's
  transaction, the caller decides whether it commits).
- An exception raised by an ``attempt`` hook does not stop the worker: it
  is logged as a crash of that attempt (as one in the worker's own code):
  nothing of the attempt is recorded, its lease is no longer renewed, and
  the task is reclaimed once the lease expires, then run again. A hook
  that raises after ``run()`` ended loses that attempt's outcome.
- A hook that no installed middleware overrides costs one call; the chain
  is composed once per ``add_middleware``/``remove_middleware``, not per enqueue or attempt.
- Install before the workers start: a running worker sees a change at its
  next attempt, an enqueue in flight never.
"""

from __future__ import annotations

import contextlib
from collections.abc import Awaitable, Callable, Iterator, Sequence
from contextlib import AbstractContextManager
from dataclasses import dataclass

from conveyor.backends.params import ClaimedTask, Completion, Delivery, NewTask
from conveyor.model import Message

Run = Callable[[], Awaitable[Completion | None]]
"""An attempt to run: awaited, its completion (None: nothing to record)."""
InboxRead = Callable[[], Awaitable[list[Message]]]
"""A coroutine task's read of its inbox."""


class EnqueueScope:
    """What an enqueue hook learns of its enqueue; the base learns nothing."""

    def stamp(self, tasks: Sequence[NewTask]) -> None:
        """``tasks`` are about to be stored (each chunk of a large batch)."""

    def stored(self, ids: Sequence[int]) -> None:
        """The store returned ``ids`` for the enqueue's tasks, in order."""


PASS_SCOPE = EnqueueScope()
"""The scope of an enqueue no hook looks at."""


@dataclass(slots=True)
class AttemptInfo:
    """One attempt as the worker starts it."""

    task: ClaimedTask
    kind: str
    """``attempt``, ``step`` (a step workflow's step) or ``poll`` (a coroutine task's)."""
    worker_id: str
    started: float
    """When the worker began it (this process's monotonic clock)."""
    handed_off: bool = False
    """Its enqueue leased it to this worker (no claim)."""
    superseded: bool = False
    """The store handed its lease token out again: nothing of it is recorded,
    and hooks should not report its completion."""


class Middleware:
    """Hooks around enqueues, sends and attempts; each passes through (see
    the module docstring). Subclass it and override what you need."""

    def enqueue(self, tasks: Sequence[NewTask]) -> AbstractContextManager[EnqueueScope]:
        """A context manager around an enqueue of ``tasks``, yielding its scope."""
        return contextlib.nullcontext(PASS_SCOPE)

    def send(self, deliveries: Sequence[Delivery]) -> AbstractContextManager[Sequence[Delivery]]:
        """A context manager around a send, yielding the deliveries to store."""
        return contextlib.nullcontext(deliveries)

    def attempt(self, run: Run, info: AttemptInfo) -> Awaitable[Completion | None]:
        """Run one attempt (``async def`` in a subclass): ``await run()``."""
        return run()

    def inbox_reader(self, read: InboxRead) -> InboxRead:
        """``read``, or a read of one's own around it."""
        return read


def _overrides(middleware: Middleware, hook: str) -> bool:
    return getattr(type(middleware), hook) is not getattr(Middleware, hook)


class _Scopes(EnqueueScope):
    __slots__ = ("scopes",)

    def __init__(self, scopes: list[EnqueueScope]) -> None:
        self.scopes = scopes

    def stamp(self, tasks: Sequence[NewTask]) -> None:
        for scope in self.scopes:
            scope.stamp(tasks)

    def stored(self, ids: Sequence[int]) -> None:
        for scope in self.scopes:
            scope.stored(ids)


class Middlewares:
    """Installed middleware, composed once: each hook calls only the
    middleware that override it, the first one outermost."""

    __slots__ = ("_attempt", "_enqueue", "_read", "_send", "items")

    def __init__(self, items: Sequence[Middleware] = ()) -> None:
        self.items: tuple[Middleware, ...] = tuple(items)
        self._enqueue = [m for m in self.items if _overrides(m, "enqueue")]
        self._send = [m for m in self.items if _overrides(m, "send")]
        self._read = [m for m in reversed(self.items) if _overrides(m, "inbox_reader")]
        attempt: Callable[[Run, AttemptInfo], Awaitable[Completion | None]] = _run
        for middleware in reversed(self.items):
            if _overrides(middleware, "attempt"):
                attempt = _around(middleware.attempt, attempt)
        self._attempt = attempt

    def with_(self, *more: Middleware, first: bool = False) -> Middlewares:
        """These and ``more`` (outermost when ``first``)."""
        return Middlewares((*more, *self.items) if first else (*self.items, *more))

    def without(self, middleware: Middleware) -> Middlewares:
        """These but ``middleware`` (by identity)."""
        return Middlewares([m for m in self.items if m is not middleware])

    def enqueue(self, tasks: Sequence[NewTask]) -> AbstractContextManager[EnqueueScope]:
        hooks = self._enqueue
        if len(hooks) == 1:
            return hooks[0].enqueue(tasks)
        if not hooks:
            return contextlib.nullcontext(PASS_SCOPE)
        return _entered(hooks, tasks)

    def send(self, deliveries: Sequence[Delivery]) -> AbstractContextManager[Sequence[Delivery]]:
        hooks = self._send
        if len(hooks) == 1:
            return hooks[0].send(deliveries)
        if not hooks:
            return contextlib.nullcontext(deliveries)
        return _sent(hooks, deliveries)

    def attempt(self, run: Run, info: AttemptInfo) -> Awaitable[Completion | None]:
        return self._attempt(run, info)

    def inbox_reader(self, read: InboxRead) -> InboxRead:
        for middleware in self._read:
            read = middleware.inbox_reader(read)
        return read


def _run(run: Run, info: AttemptInfo) -> Awaitable[Completion | None]:
    return run()


def _around(
    outer: Callable[[Run, AttemptInfo], Awaitable[Completion | None]],
    inner: Callable[[Run, AttemptInfo], Awaitable[Completion | None]],
) -> Callable[[Run, AttemptInfo], Awaitable[Completion | None]]:
    if inner is _run:
        return outer

    def attempt(run: Run, info: AttemptInfo) -> Awaitable[Completion | None]:
        return outer(lambda: inner(run, info), info)

    return attempt


@contextlib.contextmanager
def _entered(hooks: list[Middleware], tasks: Sequence[NewTask]) -> Iterator[EnqueueScope]:
    with contextlib.ExitStack() as stack:
        yield _Scopes([stack.enter_context(m.enqueue(tasks)) for m in hooks])


@contextlib.contextmanager
def _sent(hooks: list[Middleware], deliveries: Sequence[Delivery]) -> Iterator[Sequence[Delivery]]:
    with contextlib.ExitStack() as stack:
        for middleware in hooks:
            deliveries = stack.enter_context(middleware.send(deliveries))
        yield deliveries
