"""What a task receives of its dependencies when it runs.

A task enqueued with dependencies (``after``, a chain's previous link, a
chord's members) may name one of its handler's parameters to receive, at
each attempt, what its dependencies ended with: ``result`` (the first
dependency's result: a chain's link), ``results`` (every dependency's
result, in order; None for one that did not succeed) or ``outcomes``
(a :class:`TaskOutcome` per dependency, in order: a chord's callback). The
store keeps that choice as text with the task (``NewTask.receives``); the
worker reads the dependencies (``Backend.dependencies``) when it claims
the task and puts the value in the payload before the handler's arguments
are built, so the value goes through the same type conversion as any
argument. Nothing here does I/O.

The value is read at each attempt: a dependency retried by hand and ended
again since gives its new result to a later attempt.

A task may also run **only if a dependency failed** (``on_failure``: Celery's
``link_error``, RQ's ``on_failure``): it waits under the ``run`` policy, and
the worker that claims it ends it ``cancelled``, without running it, when
every dependency succeeded (error type :data:`NOT_NEEDED`).
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass
from typing import Any, Literal

from conveyor import payload as codec
from conveyor.errors import ConfigurationError, PayloadError
from conveyor.model import TaskState, check_name
from conveyor.records import DependencyRecord

ReceiveKind = Literal["result", "results", "outcomes"]
RECEIVE_KINDS: tuple[ReceiveKind, ...] = ("result", "results", "outcomes")
ONLY_FAILED = "only=failed"
"""The part of a stored ``receives`` of a task that runs only if a dependency failed."""
NOT_NEEDED = "NotNeeded"
"""The error type of the attempt that ends, cancelled, a task meant to run
only if a dependency failed, when every one succeeded."""


@dataclass(frozen=True, slots=True)
class Receives:
    """A stored ``receives`` read back: the parameter that gets the
    dependencies' ``kind`` (None: none), and whether the task runs only if
    one of them did not succeed."""

    kind: ReceiveKind | None
    parameter: str | None
    only_failed: bool = False


@dataclass(frozen=True, slots=True)
class TaskOutcome:
    """How one dependency ended, as a task that receives ``outcomes`` gets
    it (a dict of these fields, or this class where the handler declares it
    and pydantic converts it): its id and name, its state (``succeeded``,
    ``failed``, ``cancelled``; ``pending``, ``waiting`` or ``in_progress``
    only for a task run by hand before its dependencies ended; None if it
    is no longer stored), its result if it succeeded, and the error of its
    last attempt if it did not."""

    task_id: int
    name: str | None
    state: str | None
    result: Any = None
    error_type: str | None = None
    error_message: str | None = None

    @property
    def succeeded(self) -> bool:
        """Whether the dependency ended ``succeeded``."""
        return self.state == "succeeded"


def receives_text(kind: str | None, parameter: str | None, only_failed: bool = False) -> str | None:
    """The stored form of "give ``parameter`` the ``kind`` of my
    dependencies" (and "run only if one failed"); None for neither.
    ConfigurationError for an unknown kind or a parameter name that is not one."""
    parts = []
    if parameter is not None:
        if kind not in RECEIVE_KINDS:
            raise ConfigurationError(
                f"a task receives one of {', '.join(RECEIVE_KINDS)} of its dependencies, "
                f"not {kind!r}"
            )
        if not parameter.isidentifier():
            raise ConfigurationError(f"{parameter!r} is not a parameter name")
        parts.append(f"{kind}:{check_name('a parameter name', parameter)}")
    if only_failed:
        parts.append(ONLY_FAILED)
    return ";".join(parts) or None


def parse_receives(text: str) -> Receives:
    """A stored ``receives`` read back; PayloadError if it does not read
    (written around conveyor)."""
    kind: ReceiveKind | None = None
    parameter: str | None = None
    only_failed = False
    for part in text.split(";"):
        if part == ONLY_FAILED and not only_failed:
            only_failed = True
            continue
        named, _, name = part.partition(":")
        found = next((k for k in RECEIVE_KINDS if k == named), None)
        if found is None or not name.isidentifier() or parameter is not None:
            raise PayloadError(f"the stored receives {text[:80]!r} does not read")
        kind, parameter = found, name
    return Receives(kind, parameter, only_failed)


def not_needed(receives: Receives, records: Sequence[DependencyRecord]) -> bool:
    """Whether a task that runs only if a dependency failed is not needed:
    every one of them succeeded."""
    return receives.only_failed and all(r.state is TaskState.SUCCEEDED for r in records)


def outcome_of(record: DependencyRecord) -> TaskOutcome:
    return TaskOutcome(
        task_id=record.task_id,
        name=record.name,
        state=record.state.value if record.state is not None else None,
        result=record.result,
        error_type=record.error_type,
        error_message=record.error_message,
    )


def received_value(kind: ReceiveKind, records: Sequence[DependencyRecord]) -> Any:
    """The JSON value a task receiving ``kind`` gets of these dependencies."""
    if kind == "result":
        return records[0].result if records else None
    if kind == "results":
        return [record.result for record in records]
    return [
        {
            "task_id": o.task_id,
            "name": o.name,
            "state": o.state,
            "result": o.result,
            "error_type": o.error_type,
            "error_message": o.error_message,
        }
        for o in map(outcome_of, records)
    ]


def with_received(payload: str, receives: Receives, records: Sequence[DependencyRecord]) -> str:
    """``payload`` (a stored JSON object) with the received value in its
    parameter (replacing one given there), if it names one. PayloadError if
    the payload is not an object."""
    if receives.kind is None or receives.parameter is None:
        return payload
    args = codec.decode(payload)
    if not isinstance(args, dict):
        raise PayloadError("the stored payload is not a JSON object")
    args[receives.parameter] = received_value(receives.kind, records)
    return codec.encode(args)
