"""How an attempt's ending becomes a completion: retry, fail, or succeed.

Pure functions of the claimed task and what the handler did; no I/O.
Error text is stored truncated and never trusts ``str(exc)`` to work.
"""

from __future__ import annotations

import traceback as tb_module

from conveyor.backends.protocol import ClaimedTask, Completion, ErrorInfo
from conveyor.errors import Fatal, PayloadError
from conveyor.model import Outcome, TaskState
from conveyor.worker.executors import RemoteError

MAX_ERROR_MESSAGE = 4_000
MAX_TRACEBACK = 32_000


def storable(text: str) -> str:
    """``text`` as any backend can store it: no NUL, no lone surrogate."""
    if "\x00" in text:
        text = text.replace("\x00", "\\x00")
    try:
        text.encode("utf-8")
    except UnicodeEncodeError:
        text = text.encode("utf-8", "backslashreplace").decode("utf-8")
    return text


def _truncate(text: str, limit: int) -> str:
    text = storable(text)
    if len(text) <= limit:
        return text
    return text[: limit - 40] + f"... [{len(text) - limit + 40} characters cut]"


def _describe(exc: BaseException) -> str:
    try:
        return str(exc)
    except BaseException:
        try:
            return repr(exc)
        except BaseException:
            return f"<{type(exc).__name__} whose str() and repr() raise>"


def error_info(exc: BaseException) -> ErrorInfo:
    """Type, message and traceback of ``exc``, safe and truncated."""
    if isinstance(exc, RemoteError):
        return ErrorInfo(
            type=_truncate(exc.type_name, MAX_ERROR_MESSAGE),
            message=_truncate(_describe(exc), MAX_ERROR_MESSAGE),
            traceback=_truncate(exc.remote_traceback, MAX_TRACEBACK),
        )
    kind = type(exc)
    type_name = (
        kind.__qualname__
        if kind.__module__ == "builtins"
        else (f"{kind.__module__}.{kind.__qualname__}")
    )
    try:
        trace = "".join(tb_module.format_exception(exc))
    except BaseException:
        trace = f"{type_name}: (traceback unavailable)"
    return ErrorInfo(
        type=_truncate(type_name, MAX_ERROR_MESSAGE),
        message=_truncate(_describe(exc), MAX_ERROR_MESSAGE),
        traceback=_truncate(trace, MAX_TRACEBACK),
    )


def is_fatal(exc: BaseException) -> bool:
    """Errors that no retry can fix: ``Fatal`` and payloads that do not decode."""
    if isinstance(exc, RemoteError):
        return exc.type_name.endswith(".Fatal") or exc.type_name == "conveyor.errors.Fatal"
    return isinstance(exc, Fatal | PayloadError)


def failed(task: ClaimedTask, exc: BaseException, outcome: Outcome = Outcome.FAILED) -> Completion:
    """The attempt failed (or timed out): retry by policy, or fail for good."""
    info = error_info(exc)
    if is_fatal(exc) or task.spent >= task.max_attempts:
        return Completion(task.token, outcome, TaskState.FAILED, error=info)
    delay = task.retry.delay(task.spent)
    return Completion(task.token, outcome, TaskState.PENDING, error=info, retry_delay=delay)


def succeeded(task: ClaimedTask, result: str) -> Completion:
    return Completion(task.token, Outcome.SUCCEEDED, TaskState.SUCCEEDED, result=result)


def cancelled(task: ClaimedTask) -> Completion:
    info = ErrorInfo(type="Cancelled", message="cancelled on request while running")
    return Completion(task.token, Outcome.CANCELLED, TaskState.CANCELLED, error=info)


def interrupted(
    task: ClaimedTask, reason: str = "the worker shut down before the handler ended"
) -> Completion:
    """Released: pending again at once, the attempt not counted against the budget."""
    info = ErrorInfo(type="Interrupted", message=_truncate(reason, MAX_ERROR_MESSAGE))
    return Completion(
        task.token, Outcome.INTERRUPTED, TaskState.PENDING, error=info, retry_delay=0.0
    )
