"""Per-call options: how one enqueue, start or spawn differs from its task's defaults.

Every way of starting work takes the same frozen :class:`EnqueueOptions`:
``task.options(...)``, ``App.enqueue``/``enqueue_many``, ``workflow.start``,
``coroutine.start``, ``poll.spawn`` and ``conveyor enqueue``. A field left
None keeps the task's own default. Options are checked when they are made,
before any I/O: a wrong type or value, or a name that is not an option,
raises ConfigurationError (naming the valid options).
"""

from __future__ import annotations

import dataclasses
from collections.abc import Mapping
from dataclasses import dataclass
from datetime import datetime, timedelta
from typing import Any, TypedDict

from conveyor.errors import ConfigurationError
from conveyor.model import MIN_LEASE_SECONDS, RetryPolicy, check_duration, check_idempotency_key


class OptionFields(TypedDict, total=False):
    """The keyword form of :class:`EnqueueOptions` (``**options`` of every start)."""

    queue: str
    priority: int
    delay: float | timedelta
    run_at: datetime
    retry: RetryPolicy
    timeout: float
    lease: float
    idempotency_key: str


@dataclass(frozen=True, slots=True, kw_only=True)
class EnqueueOptions:
    """Options of one call that starts work; None keeps the task's default.

    ``queue`` and ``priority`` place the task; ``delay`` (seconds or a
    timedelta) or ``run_at`` (an aware datetime), at most one, say when it
    is due; ``retry``, ``timeout`` and ``lease`` govern its attempts (a
    workflow's come from its steps and cannot be given per call);
    ``idempotency_key`` makes the call safe to repeat (see
    :meth:`conveyor.App.enqueue`).
    """

    queue: str | None = None
    priority: int | None = None
    delay: float | timedelta | None = None
    run_at: datetime | None = None
    retry: RetryPolicy | None = None
    timeout: float | None = None
    lease: float | None = None
    idempotency_key: str | None = None

    def __post_init__(self) -> None:
        if self.queue is not None and (not isinstance(self.queue, str) or not self.queue):
            raise ConfigurationError("queue must be a non-empty string")
        if self.priority is not None:
            check_priority(self.priority)
        if self.delay is not None and self.run_at is not None:
            raise ConfigurationError("give delay or run_at, not both")
        if self.run_at is not None:
            if not isinstance(self.run_at, datetime):
                raise ConfigurationError("run_at must be a datetime")
            if self.run_at.tzinfo is None:
                raise ConfigurationError("run_at must be timezone-aware")
        if self.delay is not None:
            seconds = self.delay
            if isinstance(seconds, timedelta):
                seconds = seconds.total_seconds()
            object.__setattr__(self, "delay", check_duration("delay", seconds))
        if self.retry is not None and not isinstance(self.retry, RetryPolicy):
            raise ConfigurationError("retry must be a conveyor.RetryPolicy")
        check_duration("timeout", self.timeout, minimum=0.001)
        check_duration("lease", self.lease, minimum=MIN_LEASE_SECONDS)
        check_idempotency_key(self.idempotency_key)

    @classmethod
    def of(cls, options: Mapping[str, Any]) -> EnqueueOptions:
        """Options from keywords; an unknown name raises ConfigurationError."""
        unknown = sorted(set(options) - NAMES)
        if unknown:
            raise ConfigurationError(
                f"unknown option{'s' if len(unknown) > 1 else ''}: {', '.join(unknown)} "
                f"(the options are: {', '.join(sorted(NAMES))})"
            )
        return cls(**options)

    def given(self) -> dict[str, Any]:
        """The fields set (not None), by name."""
        return {
            f.name: value
            for f in dataclasses.fields(self)
            if (value := getattr(self, f.name)) is not None
        }

    def merge(self, later: EnqueueOptions) -> EnqueueOptions:
        """These options with ``later``'s set fields on top (``delay`` and
        ``run_at`` replace each other)."""
        changes = later.given()
        if "delay" in changes or "run_at" in changes:
            changes.setdefault("delay", None)
            changes.setdefault("run_at", None)
        return dataclasses.replace(self, **changes) if changes else self

    def due(self) -> tuple[datetime | None, float]:
        """(run_at, delay seconds) for a new task."""
        return self.run_at, float(self.delay or 0.0)  # type: ignore[arg-type]

    def refuse(self, *names: str, why: str) -> None:
        """Raise ConfigurationError if any of ``names`` is set."""
        given = [name for name in names if getattr(self, name) is not None]
        if given:
            raise ConfigurationError(f"option {', '.join(given)} cannot be given here: {why}")


NAMES = frozenset(f.name for f in dataclasses.fields(EnqueueOptions))
NO_OPTIONS = EnqueueOptions()


def check_priority(priority: object) -> int:
    """``priority`` if it is an int that fits in 32 bits; else ConfigurationError."""
    if not isinstance(priority, int) or isinstance(priority, bool):
        raise ConfigurationError("priority must be an integer")
    if not -(2**31) <= priority < 2**31:
        raise ConfigurationError("priority must fit in 32 bits")
    return priority


def options_from(options: EnqueueOptions | None, keywords: Mapping[str, Any]) -> EnqueueOptions:
    """``options`` (if any) with the keyword options on top."""
    base = options if options is not None else NO_OPTIONS
    if options is not None and not isinstance(options, EnqueueOptions):
        raise ConfigurationError("options must be a conveyor.EnqueueOptions")
    return base.merge(EnqueueOptions.of(keywords)) if keywords else base
