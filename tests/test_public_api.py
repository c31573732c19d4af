"""The public API is a reviewed artefact: this pins it."""

from __future__ import annotations

import conveyor

EXPECTED = [
    "App",
    "Attempt",
    "AttemptTimeoutError",
    "BackendError",
    "CancelledByRequest",
    "ConfigurationError",
    "ConveyorError",
    "Coroutine",
    "Done",
    "DuplicateTaskError",
    "Fatal",
    "InvalidTransitionError",
    "LeaseLostError",
    "LeaseToken",
    "Message",
    "MessageKind",
    "Next",
    "NoInboxError",
    "Outcome",
    "PayloadError",
    "PayloadTooLargeError",
    "Poll",
    "PollError",
    "ResultTimeoutError",
    "RetryPolicy",
    "Sleep",
    "StepError",
    "StopAttempt",
    "Suspend",
    "Task",
    "TaskContext",
    "TaskDef",
    "TaskFailedError",
    "TaskFinishedError",
    "TaskHandle",
    "TaskNotFoundError",
    "TaskState",
    "UnknownTaskError",
    "Worker",
    "WorkerConfig",
    "WorkerShutdown",
    "Workflow",
    "done",
    "next",
    "sleep",
    "suspend",
]


def test_exported_members() -> None:
    assert conveyor.__all__ == sorted(conveyor.__all__)
    assert conveyor.__all__ == EXPECTED
    for name in conveyor.__all__:
        assert getattr(conveyor, name) is not None


def test_stop_orders_escape_broad_except() -> None:
    assert not issubclass(conveyor.StopAttempt, Exception)
    assert issubclass(conveyor.LeaseLostError, conveyor.StopAttempt)
