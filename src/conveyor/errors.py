"""Every exception conveyor raises on purpose.

The tree::

    ConveyorError
    ├── ConfigurationError          bad URL, schema name, task or queue name, option
    │                               or registration (raised before any I/O)
    │   ├── DuplicateTaskError      a task name registered twice
    │   └── StoreNotReadyError      no store there, or one behind: run ``conveyor migrate``
    ├── PayloadError                a payload or result is not strict JSON
    │   └── PayloadTooLargeError    the encoded payload exceeds the cap
    ├── UnknownTaskError            enqueue of a name the app has not registered
    ├── TaskExistsError             a unique task's key is held (on_conflict="raise")
    ├── TaskNotFoundError           no task with that id
    ├── InvalidTransitionError      cancel/retry of a task in a state that forbids it
    │   ├── TaskFinishedError       a message sent to a task that has finished
    │   └── NoInboxError            a message sent to a task that has no inbox
    ├── ResultTimeoutError          ``handle.result(timeout=…)`` ran out of time
    ├── TaskFailedError             ``handle.result()`` of a task that failed or was cancelled
    ├── BackendError                the store refused the operation for good (a
    │   │                           constraint, a value over a limit): do not repeat it
    │   └── BackendUnavailableError the store cannot serve now (connection lost, server
    │                               down or busy): repeat it later, with the same key
    └── StopAttempt                 raised inside a handler whose attempt must stop
        ├── LeaseLostError          the worker no longer holds the lease
        ├── CancelledByRequest      someone cancelled the task while it ran
        ├── AttemptTimeoutError     the attempt ran past its timeout
        └── WorkerShutdown          the worker is shutting down

    Snooze                          raise it from a handler: due again after a pause,
                                    the attempt not charged to the budget
    Retry                           raise it from a handler: retried after its own
                                    delay (charged to the budget, as any failure)
    Fatal                           raise it (or a subclass) from a handler to fail
    │                               the task at once, skipping the retry policy
    ├── StepError                   a workflow step cannot run as stored (conveyor.workflow)
    └── PollError                   a coroutine poll returned no outcome (conveyor.coroutine)

Every class in the tree is exported from ``conveyor``.

Each backend sorts its store's errors into ``BackendUnavailableError`` and
a plain ``BackendError`` in one place, by cause (PostgreSQL's SQLSTATE,
SQLite's result code, Redis's reply), not by the driver's class; the
message is one line and never echoes the row the store refused (see
docs/guarantees.md, "Errors by cause").

``StopAttempt`` derives from ``BaseException`` on purpose: a handler's broad
``except Exception`` must not swallow the order to stop.
"""

from __future__ import annotations

import math
from datetime import timedelta


class ConveyorError(Exception):
    """Base class of the errors conveyor raises to its callers."""


class ConfigurationError(ConveyorError):
    """A URL, schema name, task or queue name, option or registration is
    invalid. Raised before any I/O."""


class DuplicateTaskError(ConfigurationError):
    """A task name was registered twice on one app."""


class StoreNotReadyError(ConfigurationError):
    """The URL and schema (or key prefix) name no conveyor store, or one with
    migrations still to apply, and this client or command must not create
    or upgrade it (``App(migrate=False)``, ``conveyor worker --no-migrate``,
    the read commands and the dashboard). ``conveyor migrate`` creates or
    upgrades it; nothing was written. Not worth retrying as it is."""


class PayloadError(ConveyorError, ValueError):
    """A payload or result is not strict JSON (NaN, NUL, lone surrogate, ...)."""


class PayloadTooLargeError(PayloadError):
    """The encoded payload is larger than the configured cap."""

    def __init__(self, size: int, limit: int, *, at_least: bool = False) -> None:
        amount = f"at least {size}" if at_least else str(size)
        super().__init__(f"payload is {amount} bytes encoded; the limit is {limit} bytes")
        self.size = size
        """The encoded size, or with ``at_least`` a lower bound of it (the
        check stopped as soon as the strings alone were over the limit)."""
        self.limit = limit


class UnknownTaskError(ConveyorError, LookupError):
    """Enqueue named a task the app has not registered."""


class TaskExistsError(ConveyorError):
    """An enqueue with ``Unique(on_conflict="raise")`` found its key held by
    a stored task (``task_id``): nothing of that enqueue was stored."""

    def __init__(self, name: str, key: str, task_id: int) -> None:
        super().__init__(f"task {task_id} of {name!r} holds the unique key {key!r}")
        self.name = name
        self.key = key
        self.task_id = task_id


class TaskNotFoundError(ConveyorError, LookupError):
    """No task has the given id."""


class InvalidTransitionError(ConveyorError):
    """The task's current state forbids the requested change."""


class TaskFinishedError(InvalidTransitionError):
    """A message was sent to a task that has already finished."""


class NoInboxError(InvalidTransitionError):
    """A message was sent to a task that is not a coroutine task (it has no inbox)."""


class ResultTimeoutError(ConveyorError, TimeoutError):
    """The task did not reach a terminal state in time."""


class TaskFailedError(ConveyorError):
    """The awaited task ended ``failed`` or ``cancelled`` instead of succeeding."""

    def __init__(self, task_id: int, state: str, message: str | None) -> None:
        detail = f": {message}" if message else ""
        super().__init__(f"task {task_id} ended {state}{detail}")
        self.task_id = task_id
        self.state = state


class BackendError(ConveyorError):
    """The store refused the operation for good (a constraint, a value over
    one of its limits, a statement it does not allow): repeating it fails
    the same way; a write it refused was not applied. Its subclass
    BackendUnavailableError is the transient case."""


class BackendUnavailableError(BackendError):
    """The backend cannot be reached right now (connection lost, pool exhausted).

    Transient: the same operation may succeed later. But a write whose
    connection dropped after its commit was sent may have been applied:
    repeating an ``enqueue``, ``enqueue_many``, workflow or coroutine
    ``start`` or ``send`` could then store it twice. Give such calls an
    ``idempotency_key`` and repeat them with the same key: the repeat
    returns what the first call stored, if it did. ``cancel`` and ``retry``
    can be repeated as they are (a second one raises InvalidTransitionError
    or finds the state it wanted).
    """


class StopAttempt(BaseException):
    """The running attempt must stop now; nothing it does will be recorded."""


class LeaseLostError(StopAttempt):
    """The worker lost the lease on this attempt (expired or taken over)."""


class CancelledByRequest(StopAttempt):
    """The task was cancelled while this attempt ran."""


class AttemptTimeoutError(StopAttempt):
    """The attempt ran past the task's timeout."""


class WorkerShutdown(StopAttempt):
    """The worker is shutting down; the task will be released, not failed."""


class Fatal(Exception):
    """Raise from a handler to fail the task now, skipping remaining retries."""


LONGEST_PAUSE = 100 * 365.25 * 86400
"""The longest snooze or retry delay, in seconds: 100 years (as every duration)."""


def _pause(name: str, value: object) -> float:
    seconds = value.total_seconds() if isinstance(value, timedelta) else value
    if isinstance(seconds, bool) or not isinstance(seconds, int | float):
        raise ConfigurationError(f"{name} must be a number of seconds or a timedelta")
    if not math.isfinite(seconds) or not 0 <= seconds <= LONGEST_PAUSE:
        raise ConfigurationError(
            f"{name} must be a finite number of seconds from 0 to {LONGEST_PAUSE:.0f}"
        )
    return float(seconds)


class Snooze(Exception):
    """Raise from a handler to run the task again after ``seconds`` (a number
    or a timedelta) without spending an attempt: the attempt is logged
    ``interrupted`` (error type ``conveyor.errors.Snooze``) and given back to
    the budget, so a task may snooze without end. A cancel requested
    meanwhile ends it ``cancelled``. Raises ConfigurationError for a pause
    that is negative, not finite or longer than 100 years."""

    def __init__(self, seconds: float | timedelta) -> None:
        self.seconds = _pause("Snooze seconds", seconds)
        super().__init__(f"snoozed for {self.seconds:g}s by the handler")


class Retry(Exception):
    """Raise from a handler to fail this attempt and run the task again after
    ``delay`` seconds (a number or a timedelta; None: the retry policy's
    back-off), whatever the policy's ``retry_on`` and ``fatal`` say. The
    attempt counts against the budget like any failure: when it is spent
    the task ends ``failed``. ``reason`` is logged as the attempt's error;
    raise it ``from`` an exception to keep that one's traceback too."""

    def __init__(self, delay: float | timedelta | None = None, reason: str | None = None) -> None:
        self.delay = None if delay is None else _pause("Retry delay", delay)
        when = "after the policy's back-off" if self.delay is None else f"in {self.delay:g}s"
        super().__init__(reason if reason else f"retry requested {when}")
