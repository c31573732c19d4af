"""The task state machine as a table: its lookups, its shape, and the memory
store refusing a move the table does not list."""

from __future__ import annotations

import uuid
from datetime import UTC, datetime

import pytest

from conveyor import payload as codec
from conveyor.backends.memory import MemoryBackend
from conveyor.backends.params import ClaimParams, Completion, EnqueueParams, FinishParams, NewTask
from conveyor.model import (
    STATE_CHANGES,
    TERMINAL_STATES,
    Cause,
    IllegalStateChangeError,
    Outcome,
    RetryPolicy,
    TaskState,
    allowed,
    causes,
    check_state_change,
)

T0 = datetime(2030, 1, 1, tzinfo=UTC)
S = TaskState


def test_causes_names_every_way_between_two_states() -> None:
    assert causes(S.IN_PROGRESS, S.PENDING) == {
        Cause.RETRY,
        Cause.RELEASE,
        Cause.NEXT_STEP,
        Cause.SLEEP,
    }
    assert causes(S.IN_PROGRESS, S.IN_PROGRESS) == {Cause.RECLAIM, Cause.CANCEL}
    assert causes(None, S.PENDING) == {Cause.ENQUEUE, Cause.SPAWN}
    assert causes(S.SUCCEEDED, S.PENDING) == frozenset()
    assert causes(S.WAITING, S.FAILED) == {Cause.DEPENDENCY}
    assert causes(None, S.WAITING) == {Cause.ENQUEUE}


@pytest.mark.parametrize(
    ("source", "target"),
    [
        (S.SUCCEEDED, S.PENDING),  # a success is never retried
        (S.FAILED, S.CANCELLED),
        (S.CANCELLED, S.FAILED),
        (S.PENDING, S.SUCCEEDED),  # success needs a claim first
        (S.PENDING, S.WAITING),
        (S.WAITING, S.IN_PROGRESS),  # a message makes it pending, a claim runs it
        (S.WAITING, S.SUCCEEDED),  # a dependent is released to pending, then claimed
        (None, S.IN_PROGRESS),
        (None, S.CANCELLED),  # a dependent is stored waiting, then ended by its dependency
    ],
)
def test_moves_outside_the_table_are_not_allowed(source: TaskState | None, target: S) -> None:
    assert not allowed(source, target)
    for cause in Cause:
        with pytest.raises(IllegalStateChangeError, match="no legal move"):
            check_state_change(source, cause, target)


def test_check_state_change_gives_the_row_of_a_legal_move() -> None:
    row = check_state_change(S.PENDING, Cause.CLAIM, S.IN_PROGRESS)
    assert (row.from_state, row.cause, row.to_state) == (S.PENDING, Cause.CLAIM, S.IN_PROGRESS)
    assert allowed(S.PENDING, S.IN_PROGRESS)
    with pytest.raises(IllegalStateChangeError):  # a legal pair, by the wrong cause
        check_state_change(S.PENDING, Cause.SUCCEED, S.IN_PROGRESS)
    assert issubclass(IllegalStateChangeError, AssertionError)  # a bug, not a user error


def test_the_table_is_one_row_per_move_and_names_every_cause() -> None:
    moves = [(c.from_state, c.cause, c.to_state) for c in STATE_CHANGES]
    assert len(moves) == len(set(moves))
    assert {c.cause for c in STATE_CHANGES} == set(Cause)
    assert all(c.notes and "|" not in c.notes for c in STATE_CHANGES)


def test_only_a_manual_retry_leaves_a_terminal_state_and_never_a_success() -> None:
    leaving = [c for c in STATE_CHANGES if c.from_state in TERMINAL_STATES]
    assert {c.cause for c in leaving} == {Cause.MANUAL_RETRY}
    assert {c.from_state for c in leaving} == {S.FAILED, S.CANCELLED}


def test_every_state_is_reachable_and_every_unfinished_one_can_end() -> None:
    reached: set[TaskState | None] = {None}
    while True:
        more = {c.to_state for c in STATE_CHANGES if c.from_state in reached} - reached
        if not more:
            break
        reached |= more
    assert reached == {None, *TaskState}
    for state in set(TaskState) - TERMINAL_STATES:
        assert any(c.from_state is state and c.to_state is not state for c in STATE_CHANGES)


async def test_the_memory_store_refuses_an_ending_the_table_does_not_list() -> None:
    """No completion moves a task to in_progress: the store raises before it
    writes anything, and the task is as it was."""
    backend = MemoryBackend(uuid.uuid4().hex)
    new = NewTask("job", "q", codec.encode({}), 0, 3, RetryPolicy(max_attempts=3))
    [task_id] = await backend.enqueue(EnqueueParams([new], now=T0))
    [claimed] = await backend.claim(ClaimParams("w1", ["job"], ["q"], 1, 10.0, now=T0))
    before = await backend.get_task(task_id)
    bad = Completion(claimed.token, Outcome.SUCCEEDED, TaskState.IN_PROGRESS)
    with pytest.raises(IllegalStateChangeError):
        await backend.finish(FinishParams("w1", [bad], now=T0))
    assert await backend.get_task(task_id) == before
    await backend.destroy()
