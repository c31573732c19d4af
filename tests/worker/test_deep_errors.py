"""Errors deep or wide, not only long: formatting one costs bounded work.

A traceback of 100,000 frames (deep recursion), a chain of 10,000 causes,
an exception group of 100,000 members and a message of tens of megabytes
are formatted by walking at most a bounded number of frames and
exceptions: the first and last frames of each traceback are kept, with a
count of those left out. Formatting happens on the worker's event loop (an
``async def`` handler's error) or beside it, holding the GIL: unbounded,
it stalls the loop and the heartbeat for seconds, and the tasks beside it
lose their leases.
"""

from __future__ import annotations

import asyncio
import sys
from types import TracebackType

import pytest

import conveyor
from conveyor import Outcome, RetryPolicy, TaskState
from conveyor.worker.texts import (
    CHAIN_KEPT,
    EXCEPTIONS_KEPT,
    FRAMES_KEPT,
    FRAMES_WALKED,
    MAX_TRACEBACK,
    Budget,
    format_traceback,
)
from tests.worker.helpers import RunningWorker, wait_terminal

ONCE = RetryPolicy(max_attempts=1)
SAYS = {
    # What each bad task's stored traceback says it left out.
    "deep": "frames left out",
    "deep_in_thread": "frames left out",
    "chained": "older chained exceptions left out",
    "wide": "and 9992 more exceptions",
}
DEPTH = 100_000


def _recurse(n: int) -> None:
    if n == 0:
        raise ValueError("the bottom")
    _recurse(n - 1)


def deep_error(depth: int) -> BaseException:
    """A real recursion ``depth`` frames deep, raised at its bottom."""
    limit = sys.getrecursionlimit()
    sys.setrecursionlimit(depth + 1_000)
    try:
        _recurse(depth)
    except ValueError as exc:
        return exc
    finally:
        sys.setrecursionlimit(limit)
    raise AssertionError("unreachable")


def built_deep_error(depth: int) -> BaseException:
    """An error whose traceback has ``depth`` entries, built rather than
    recursed (a recursion that deep costs its handler a second of the loop)."""
    exc = ValueError("the bottom")
    frame = sys._getframe()
    tb = None
    for line in range(depth, 0, -1):
        tb = TracebackType(tb, frame, 0, line)
    exc.__traceback__ = tb
    return exc


def long_chain(length: int) -> BaseException:
    """``length`` exceptions, each raised from the one before."""
    previous: BaseException | None = None
    for n in range(length):
        try:
            raise KeyError(f"link {n}") from previous
        except KeyError as exc:
            previous = exc
    assert previous is not None
    return previous


def wide_group(members: int, message: str) -> BaseException:
    try:
        raise ExceptionGroup(message, [ValueError(n) for n in range(members)])
    except ExceptionGroup as exc:
        return exc


def test_a_100000_frame_traceback_walks_a_bounded_number_of_frames() -> None:
    budget = Budget()
    text = format_traceback(built_deep_error(DEPTH), MAX_TRACEBACK, budget)
    assert budget.frames == FRAMES_WALKED
    assert len(text) <= MAX_TRACEBACK
    assert f"[... {FRAMES_WALKED - 2 * FRAMES_KEPT} frames left out, and it goes on" in text
    assert text.endswith("ValueError: the bottom\n")


def test_a_deep_recursion_keeps_its_first_and_last_frames() -> None:
    budget = Budget()
    text = format_traceback(deep_error(5_000), MAX_TRACEBACK, budget)
    assert budget.frames == 5_002  # this test's frame, deep_error's, the recursion
    assert f"[... {5_002 - 2 * FRAMES_KEPT} frames left out ...]" in text
    assert 'raise ValueError("the bottom")' in text  # the innermost frame
    assert text.endswith("ValueError: the bottom\n")


def test_a_chain_of_10000_causes_formats_a_bounded_number() -> None:
    budget = Budget()
    text = format_traceback(long_chain(10_000), MAX_TRACEBACK, budget)
    assert budget.exceptions == CHAIN_KEPT
    assert text.startswith("[older chained exceptions left out]")
    assert text.endswith("KeyError: 'link 9999'\n")
    assert "link 9983" not in text and "link 9984" in text


def test_a_group_of_100000_members_with_a_huge_message_formats_a_bounded_number() -> None:
    budget = Budget()
    text = format_traceback(wide_group(100_000, "m" * 50_000_000), MAX_TRACEBACK, budget)
    assert budget.exceptions <= EXCEPTIONS_KEPT
    assert len(text) <= MAX_TRACEBACK
    assert "and 99992 more exceptions" in text
    assert "characters cut]" in text


@pytest.fixture
def app(any_app: conveyor.App) -> conveyor.App:
    return any_app


async def test_deep_and_chained_errors_cost_their_neighbours_no_lease(app: conveyor.App) -> None:
    """Tracebacks 100,000 frames deep (built in an ``async def``) and 20,000
    (a recursion in a thread), 10,000 chained causes and a wide group with a huge
    message, among tasks that each hold a 2 s lease for 2.5 s: every
    neighbour runs once, and each error is stored readable, within limits."""

    @app.task(retry=ONCE)
    async def deep() -> None:
        raise built_deep_error(DEPTH)

    @app.task(retry=ONCE)
    def deep_in_thread() -> None:
        # Deeper than the frames walked; the recursion itself is the
        # handler's own work (its thread shares the GIL with the heartbeat).
        raise deep_error(2 * FRAMES_WALKED)

    @app.task(retry=ONCE)
    async def chained() -> None:
        raise long_chain(10_000)

    @app.task(retry=ONCE)
    async def wide() -> None:
        raise wide_group(10_000, "w" * 20_000_000)

    @app.task(retry=RetryPolicy(max_attempts=3, initial_interval=0, jitter=0))
    async def neighbour(n: int) -> int:
        await asyncio.sleep(2.5)
        return n

    async with app:
        neighbours = [await neighbour.enqueue_async(n=n) for n in range(16)]
        bad = [await task.enqueue_async() for task in (deep, deep_in_thread, chained, wide)]
        async with RunningWorker(app, concurrency=24, lease=2.0):
            ended = await wait_terminal(app, [h.id for h in neighbours + bad], timeout=120)
    by_id = {t.id: t for t in ended}
    for handle in neighbours:
        task = by_id[handle.id]
        assert task.state is TaskState.SUCCEEDED
        assert [a.outcome for a in task.attempts] == [Outcome.SUCCEEDED], task.attempts
    for handle in bad:
        task = by_id[handle.id]
        [attempt] = task.attempts
        assert (task.state, attempt.outcome) == (TaskState.FAILED, Outcome.FAILED)
        trace = attempt.traceback or ""
        assert 0 < len(trace) <= MAX_TRACEBACK
        assert SAYS[task.name] in trace, trace[-2000:]
