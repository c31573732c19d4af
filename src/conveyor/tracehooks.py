"""What the client and the worker call to trace their work, when tracing is
installed (``Client.tracing``; :mod:`conveyor.tracing` is the
OpenTelemetry implementation, an extra that the core never imports)."""

from __future__ import annotations

from collections.abc import Awaitable, Callable, Sequence
from contextlib import AbstractContextManager
from typing import Protocol

from conveyor.backends.params import ClaimedTask, Completion, Delivery, NewTask
from conveyor.model import Message


class EnqueueStamp(Protocol):
    """The span of one enqueue."""

    def stamp(self, tasks: Sequence[NewTask]) -> None:
        """Give ``tasks`` the enqueue's trace context."""

    def stored(self, ids: Sequence[int]) -> None:
        """The ids the enqueue returned."""


class TraceHooks(Protocol):
    def enqueue(self, tasks: Sequence[NewTask]) -> AbstractContextManager[EnqueueStamp]:
        """A span around an enqueue of ``tasks``, their context stamped."""

    def send(self, deliveries: Sequence[Delivery]) -> AbstractContextManager[list[Delivery]]:
        """A span around a send: the deliveries with its context."""

    async def attempt(
        self,
        run: Callable[[], Awaitable[Completion | None]],
        task: ClaimedTask,
        kind: str,
        worker_id: str,
    ) -> Completion | None:
        """Run an attempt (``kind``: attempt, step or poll) inside its span."""

    def inbox_reader(
        self, read: Callable[[], Awaitable[list[Message]]]
    ) -> Callable[[], Awaitable[list[Message]]]:
        """``read``, linking the running poll's span to each message's sender."""
