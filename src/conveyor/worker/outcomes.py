"""How an attempt's outcome becomes a completion: retry, fail, or succeed.

Pure functions of the claimed task and what the handler did; no I/O.
Error text is stored cut to size (cut first, then cleaned: the cost does not
grow with the error) and never trusts ``str(exc)`` to work.
"""

from __future__ import annotations

from datetime import datetime

from conveyor.backends.params import ClaimedTask, Completion, ErrorInfo
from conveyor.dependencies import NOT_NEEDED
from conveyor.errors import Fatal, PayloadError, PayloadTooLargeError, Retry, Snooze
from conveyor.model import Outcome, TaskState, error_types
from conveyor.worker.executors import RemoteError
from conveyor.worker.texts import (
    MAX_ERROR_MESSAGE,
    MAX_TRACEBACK,
    cut,
    describe,
    format_traceback,
    type_name,
)


def error_info(exc: BaseException) -> ErrorInfo:
    """Type, message and traceback of ``exc``, safe and truncated."""
    if isinstance(exc, RemoteError):
        return ErrorInfo(
            type=cut(exc.type_name, MAX_ERROR_MESSAGE),
            message=cut(describe(exc), MAX_ERROR_MESSAGE),
            traceback=cut(exc.remote_traceback, MAX_TRACEBACK),
        )
    return ErrorInfo(
        type=cut(type_name(type(exc)), MAX_ERROR_MESSAGE),
        message=cut(describe(exc), MAX_ERROR_MESSAGE),
        traceback=format_traceback(exc, MAX_TRACEBACK),
    )


EXPIRED = "Expired"
"""The error type an expired task's attempt log names (see :func:`expired`)."""

REMOTE_FATAL = frozenset(
    f"conveyor.errors.{kind.__name__}" for kind in (Fatal, PayloadError, PayloadTooLargeError)
)
"""What a process handler's child reports for the errors no retry can fix."""
SNOOZE = type_name(Snooze)
RETRY = type_name(Retry)


def _types(exc: BaseException) -> tuple[str, ...]:
    """The qualified names of the error's class and of each it derives from."""
    return exc.types if isinstance(exc, RemoteError) else error_types(exc)


def is_fatal(exc: BaseException) -> bool:
    """Errors that no retry can fix: ``Fatal`` and payloads that do not decode."""
    if isinstance(exc, RemoteError):
        return (
            exc.type_name.endswith(".Fatal")
            or exc.type_name in REMOTE_FATAL
            or any(name in REMOTE_FATAL for name in exc.types)
        )
    return isinstance(exc, Fatal | PayloadError)


def failed(task: ClaimedTask, exc: BaseException, outcome: Outcome = Outcome.FAILED) -> Completion:
    """The attempt failed (or timed out): snoozed (``Snooze``), retried by
    policy or by the handler's ``Retry``, or failed for good: a fatal error,
    one the policy does not retry, or a spent budget."""
    types = _types(exc)
    pause = exc.pause if isinstance(exc, RemoteError) else getattr(exc, "delay", None)
    if SNOOZE in types:
        return snoozed(task, exc, exc.seconds if isinstance(exc, Snooze) else pause)
    info = error_info(exc)
    asked = RETRY in types
    if is_fatal(exc) or task.spent >= task.max_attempts:
        return Completion(task.token, outcome, TaskState.FAILED, error=info)
    if outcome is Outcome.FAILED and not asked and task.retry.gives_up_on(types):
        return Completion(task.token, outcome, TaskState.FAILED, error=info)
    delay = pause if asked and pause is not None else task.retry.delay(task.spent)
    return Completion(task.token, outcome, TaskState.PENDING, error=info, retry_delay=delay)


def snoozed(task: ClaimedTask, exc: BaseException, seconds: float | None) -> Completion:
    """A ``Snooze``: pending again after its pause, the attempt given back
    to the budget (logged ``interrupted``)."""
    info = ErrorInfo(type=SNOOZE, message=cut(describe(exc), MAX_ERROR_MESSAGE))
    return Completion(
        task.token, Outcome.INTERRUPTED, TaskState.PENDING, error=info, retry_delay=seconds or 0.0
    )


REFUSED = "CompletionRefused"
"""The error type of an attempt whose completion the store refused for good."""


def refused(task: ClaimedTask, reason: str) -> Completion:
    """The store refused for good to record the attempt's completion (with
    ``reason``): the attempt failed, without its result, its next step or a
    poll's effects, and the task follows its retry policy (``fatal`` and
    ``retry_on`` name ``CompletionRefused``)."""
    info = ErrorInfo(
        type=REFUSED,
        message=cut(f"the store refused this attempt's completion: {reason}", MAX_ERROR_MESSAGE),
    )
    if task.spent >= task.max_attempts or task.retry.gives_up_on((REFUSED,)):
        return Completion(task.token, Outcome.FAILED, TaskState.FAILED, error=info)
    delay = task.retry.delay(task.spent)
    return Completion(task.token, Outcome.FAILED, TaskState.PENDING, error=info, retry_delay=delay)


def succeeded(task: ClaimedTask, result: str) -> Completion:
    return Completion(task.token, Outcome.SUCCEEDED, TaskState.SUCCEEDED, result=result)


def cancelled(task: ClaimedTask) -> Completion:
    info = ErrorInfo(type="Cancelled", message="cancelled on request while running")
    return Completion(task.token, Outcome.CANCELLED, TaskState.CANCELLED, error=info)


def expired(task: ClaimedTask, expired_at: datetime) -> Completion:
    """A task whose first attempt its claim started past its expiry time
    (``expires``) ends cancelled without running; its attempt log says why."""
    info = ErrorInfo(
        type=EXPIRED, message=f"not started by its expiry time, {expired_at.isoformat()}"
    )
    return Completion(task.token, Outcome.CANCELLED, TaskState.CANCELLED, error=info)


def not_needed(task: ClaimedTask) -> Completion:
    """A task that runs only if a dependency failed (``on_failure``) ends
    cancelled without running when every one succeeded; its attempt log says why."""
    info = ErrorInfo(
        type=NOT_NEEDED, message="every dependency succeeded: it runs only if one fails"
    )
    return Completion(task.token, Outcome.CANCELLED, TaskState.CANCELLED, error=info)


def interrupted(
    task: ClaimedTask, reason: str = "the worker shut down before the handler ended"
) -> Completion:
    """Released: pending again at once, the attempt not counted against the budget."""
    info = ErrorInfo(type="Interrupted", message=cut(reason, MAX_ERROR_MESSAGE))
    return Completion(
        task.token, Outcome.INTERRUPTED, TaskState.PENDING, error=info, retry_delay=0.0
    )


def makes_work_due(completion: Completion) -> bool:
    """Whether writing ``completion`` may make work due at once: its task
    pending again without delay (a workflow's next step, a release, a retry
    without backoff), or a coroutine poll's children and messages. (A poll
    that rests while messages came meanwhile is woken by its store, which
    announces it on the wake-up channel: every poll completion is not a hint.)"""
    effects = completion.effects
    if effects is not None and (effects.spawns or effects.sends):
        return True
    if completion.next_state is not TaskState.PENDING:
        return False
    move = completion.transition
    if move is not None:
        return move.run_at is None and move.delay <= 0
    return completion.retry_delay is not None and completion.retry_delay <= 0
