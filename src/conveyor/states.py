"""Task states and their legal moves: the state machine every store keeps.

:data:`STATE_CHANGES` is the one table of moves (``docs/state_machine.md``
draws it); a store checks each move it makes with
:func:`check_state_change`, and tests read :func:`causes` and
:func:`allowed`. Nothing here does I/O. :mod:`conveyor.model` re-exports
these names.
"""

from __future__ import annotations

import enum
from dataclasses import dataclass


class TaskState(enum.StrEnum):
    """Where a task is in its life cycle.

    ``succeeded``, ``failed`` and ``cancelled`` are terminal: nothing moves a
    task out of them except an explicit manual retry (failed, cancelled).
    Every legal move is a row of :data:`STATE_CHANGES`, explained in
    ``docs/state_machine.md``.
    """

    PENDING = "pending"
    IN_PROGRESS = "in_progress"
    WAITING = "waiting"
    SUCCEEDED = "succeeded"
    FAILED = "failed"
    CANCELLED = "cancelled"

    @property
    def is_terminal(self) -> bool:
        """True for ``succeeded``, ``failed`` and ``cancelled``: no worker runs
        the task again unless a ``retry`` restarts a failed or cancelled one."""
        return self in TERMINAL_STATES


TERMINAL_STATES = frozenset({TaskState.SUCCEEDED, TaskState.FAILED, TaskState.CANCELLED})


class Cause(enum.StrEnum):
    """Why a task moves from one state to another (a column of :data:`STATE_CHANGES`)."""

    ENQUEUE = "enqueue"
    SPAWN = "spawn"
    CLAIM = "claim"
    RECLAIM = "reclaim"
    SUCCEED = "succeed"
    FAIL = "fail"
    RETRY = "retry"
    RELEASE = "release"
    NEXT_STEP = "next step"
    SLEEP = "sleep"
    SUSPEND = "suspend"
    MESSAGE = "message"
    CANCEL = "cancel"
    MANUAL_RETRY = "manual retry"
    QUARANTINE = "quarantine"
    DEPENDENCY = "dependency"


@dataclass(frozen=True, slots=True)
class StateChange:
    """One legal move of a task: from ``from_state`` (None: a task not stored
    yet) to ``to_state`` because of ``cause``. Some moves keep the state: a
    reclaim starts a new attempt of a task in progress, a cancel of a running
    task only requests it, a message brings a sleeping task's run time forward."""

    from_state: TaskState | None
    cause: Cause
    to_state: TaskState
    notes: str


class IllegalStateChangeError(AssertionError):
    """A store moved a task in a way :data:`STATE_CHANGES` does not list: a
    bug in conveyor, never a user's mistake (a cancel or retry the task's
    state forbids raises :class:`~conveyor.errors.InvalidTransitionError`)."""


STATE_CHANGES: tuple[StateChange, ...] = (
    StateChange(
        None,
        Cause.ENQUEUE,
        TaskState.PENDING,
        "an enqueue stores it: due at once, or at its `run_at` (a delayed task); "
        "an enqueue of a name and idempotency key stored already moves nothing",
    ),
    StateChange(
        None,
        Cause.ENQUEUE,
        TaskState.WAITING,
        "an enqueue with dependencies (`after`) stores it waiting for them; those already "
        "ended count at once (dependency)",
    ),
    StateChange(
        None,
        Cause.SPAWN,
        TaskState.PENDING,
        "a coroutine's poll spawns it as its child, with the poll's applied completion",
    ),
    StateChange(
        TaskState.PENDING,
        Cause.CLAIM,
        TaskState.IN_PROGRESS,
        "a worker claims it once due (`run_at` reached): "
        "a new attempt under a fresh lease, charged to its budget",
    ),
    StateChange(
        TaskState.IN_PROGRESS,
        Cause.RECLAIM,
        TaskState.IN_PROGRESS,
        "its lease expired, its budget is not spent and no cancel was requested: "
        "the lost attempt is logged `lease_lost` and a claim starts a new one",
    ),
    StateChange(
        TaskState.IN_PROGRESS,
        Cause.RECLAIM,
        TaskState.FAILED,
        "its lease expired and its crash budget is spent: the lost attempt is logged `lease_lost`",
    ),
    StateChange(
        TaskState.IN_PROGRESS,
        Cause.RECLAIM,
        TaskState.CANCELLED,
        "its lease expired after its cancel was requested: the lost attempt is logged `lease_lost`",
    ),
    StateChange(
        TaskState.IN_PROGRESS,
        Cause.SUCCEED,
        TaskState.SUCCEEDED,
        "its worker reports success and the result (a cancel requested meanwhile changes nothing)",
    ),
    StateChange(
        TaskState.IN_PROGRESS,
        Cause.FAIL,
        TaskState.FAILED,
        "the attempt failed or timed out and is not retried: its attempts are spent, or no "
        "retry can fix its error (`Fatal`, a payload that does not decode)",
    ),
    StateChange(
        TaskState.IN_PROGRESS,
        Cause.RETRY,
        TaskState.PENDING,
        "the attempt failed or timed out and the retry policy runs it again after its backoff",
    ),
    StateChange(
        TaskState.IN_PROGRESS,
        Cause.RELEASE,
        TaskState.PENDING,
        "an `interrupted` attempt (a worker's graceful shutdown, or the handler's `Snooze`) "
        "is given back: due at once (or when the snooze ends), not charged to the budget",
    ),
    StateChange(
        TaskState.IN_PROGRESS,
        Cause.NEXT_STEP,
        TaskState.PENDING,
        "a step workflow moves on to its next step, with its state, options and a fresh "
        "budget, due at once or after its delay",
    ),
    StateChange(
        TaskState.IN_PROGRESS,
        Cause.SLEEP,
        TaskState.PENDING,
        "a coroutine's poll ends asleep until a time (or due at once), "
        "with its new state and a fresh budget",
    ),
    StateChange(
        TaskState.IN_PROGRESS,
        Cause.SUSPEND,
        TaskState.WAITING,
        "a coroutine's poll ends waiting for a message, with its new state and a fresh "
        "budget; messages the poll did not see make it pending at once (message)",
    ),
    StateChange(
        TaskState.WAITING,
        Cause.MESSAGE,
        TaskState.PENDING,
        "a message arrives (sent from outside or by a poll, or a child's end): due at once",
    ),
    StateChange(
        TaskState.PENDING,
        Cause.MESSAGE,
        TaskState.PENDING,
        "a message arrives for a sleeping coroutine: its `run_at` moves to now, never later",
    ),
    StateChange(
        TaskState.WAITING,
        Cause.DEPENDENCY,
        TaskState.PENDING,
        "the last of its dependencies ended as its policy asks (succeeded; any way with "
        "`run`): due at once, or at its own later `run_at`",
    ),
    StateChange(
        TaskState.WAITING,
        Cause.DEPENDENCY,
        TaskState.CANCELLED,
        "a dependency ended failed or cancelled and its policy is `cancel` (the default)",
    ),
    StateChange(
        TaskState.WAITING,
        Cause.DEPENDENCY,
        TaskState.FAILED,
        "a dependency ended failed or cancelled and its policy is `fail`",
    ),
    StateChange(
        TaskState.PENDING,
        Cause.CANCEL,
        TaskState.CANCELLED,
        "cancelled before it runs (itself, or as the child of a cancelled coroutine)",
    ),
    StateChange(
        TaskState.WAITING,
        Cause.CANCEL,
        TaskState.CANCELLED,
        "cancelled while it waits (itself, or as the child of a cancelled coroutine)",
    ),
    StateChange(
        TaskState.IN_PROGRESS,
        Cause.CANCEL,
        TaskState.IN_PROGRESS,
        "cancelled while it runs (itself, or as the child of a cancelled coroutine): "
        "`cancel_requested` is set and its worker is told; it ends at its completion or reclaim",
    ),
    StateChange(
        TaskState.IN_PROGRESS,
        Cause.CANCEL,
        TaskState.CANCELLED,
        "the completion of a task whose cancel was requested: its worker stopped it, "
        "or the completion would have made it pending or waiting",
    ),
    StateChange(
        TaskState.FAILED,
        Cause.MANUAL_RETRY,
        TaskState.PENDING,
        "retried by hand: due now, with a fresh budget (attempt numbers go on)",
    ),
    StateChange(
        TaskState.CANCELLED,
        Cause.MANUAL_RETRY,
        TaskState.PENDING,
        "retried by hand: due now, with a fresh budget; the cancel request is cleared",
    ),
    StateChange(
        TaskState.PENDING,
        Cause.QUARANTINE,
        TaskState.FAILED,
        "SQL backends and Redis: a due task whose attempt or spent counter stands at the "
        "32-bit limit (written around conveyor) ends with a `CorruptTask` attempt; on Redis, so "
        "does a task a field of whose hash does not read",
    ),
    StateChange(
        TaskState.IN_PROGRESS,
        Cause.QUARANTINE,
        TaskState.FAILED,
        "SQL backends and Redis: the same, for such a task whose lease expired (Redis: or "
        "that its heartbeat or completion meets)",
    ),
)
"""Every legal move of a task, and only those: the task state machine,
written once. ``docs/state_machine.md`` holds the same table (a test keeps
them equal); the memory store checks each move it makes against it, and the
state-machine tests check every move they see any backend make."""

_MOVES = {(c.from_state, c.cause, c.to_state): c for c in STATE_CHANGES}


def causes(from_state: TaskState | None, to_state: TaskState) -> frozenset[Cause]:
    """The causes that move a task from ``from_state`` (None: not stored
    yet) to ``to_state``; empty when no legal move does."""
    return frozenset(
        c.cause for c in STATE_CHANGES if c.from_state is from_state and c.to_state is to_state
    )


def allowed(from_state: TaskState | None, to_state: TaskState) -> bool:
    """Whether some legal move takes a task from ``from_state`` to ``to_state``."""
    return bool(causes(from_state, to_state))


def check_state_change(
    from_state: TaskState | None, cause: Cause, to_state: TaskState
) -> StateChange:
    """The row of :data:`STATE_CHANGES` for this move; raises
    :class:`IllegalStateChangeError` when there is none (a bug in a store)."""
    found = _MOVES.get((from_state, cause, to_state))
    if found is None:
        start = from_state.value if from_state is not None else "(new)"
        raise IllegalStateChangeError(
            f"no legal move takes a task from {start} to {to_state.value} by {cause.value} "
            "(see conveyor.model.STATE_CHANGES)"
        )
    return found
