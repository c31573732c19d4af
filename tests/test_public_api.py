"""The public API is a reviewed artefact: this pins it."""

from __future__ import annotations

import conveyor

EXPECTED = [
    "App",
    "Attempt",
    "AttemptTimeoutError",
    "BackendError",
    "BackendUnavailableError",
    "BoundTask",
    "CancelledByRequest",
    "Chain",
    "ChainHandle",
    "Chord",
    "ChordHandle",
    "Client",
    "Concurrency",
    "ConfigurationError",
    "ConveyorError",
    "Coroutine",
    "Done",
    "DuplicateTaskError",
    "EnqueueOptions",
    "Explanation",
    "Fatal",
    "Group",
    "GroupHandle",
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
    "Progress",
    "RateLimit",
    "ResultTimeoutError",
    "Retention",
    "Retry",
    "RetryPolicy",
    "Signature",
    "Sleep",
    "Snooze",
    "StepError",
    "StopAttempt",
    "StoreNotReadyError",
    "Suspend",
    "Task",
    "TaskContext",
    "TaskDef",
    "TaskExistsError",
    "TaskFailedError",
    "TaskFinishedError",
    "TaskGraph",
    "TaskHandle",
    "TaskNotFoundError",
    "TaskOutcome",
    "TaskState",
    "Unique",
    "UnknownTaskError",
    "Worker",
    "WorkerConfig",
    "WorkerShutdown",
    "Workflow",
    "chain",
    "chord",
    "done",
    "group",
    "next",
    "on_failure",
    "on_success",
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


def test_every_error_is_exported_and_in_the_tree() -> None:
    """Each exception class conveyor raises on purpose is public and listed
    in the tree of errors.py's docstring."""
    import conveyor.errors

    roots = (conveyor.ConveyorError, conveyor.StopAttempt, conveyor.Fatal)
    exported = {
        name
        for name in conveyor.__all__
        if isinstance(getattr(conveyor, name), type) and issubclass(getattr(conveyor, name), roots)
    }
    defined = {
        cls.__name__
        for root in roots
        for cls in [root, *_subclasses(root)]
        if cls.__module__.startswith("conveyor.")
        and not cls.__module__.startswith("conveyor.worker")
    }
    assert defined <= exported, defined - exported
    tree = conveyor.errors.__doc__ or ""
    assert all(f" {name} " in tree or f"    {name}" in tree for name in exported), [
        name for name in exported if name not in tree
    ]


def _subclasses(cls: type) -> list[type]:
    found = []
    for sub in cls.__subclasses__():
        found += [sub, *_subclasses(sub)]
    return found
