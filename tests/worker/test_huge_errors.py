"""Huge errors and results next to short leases, on PostgreSQL and SQLite.

A handler that raises a message of tens of megabytes (plain, full of NUL
characters, or of lone surrogates) or returns a result that size must cost
the worker no more than a small one: the text is cut before it is cleaned
or formatted, a result over the cap is refused before it is encoded, and a
process handler's child does both before it sends anything. Otherwise the
worker's event loop (and, holding the GIL, its heartbeat) stalls for
seconds, the leases of the tasks beside it expire, and those run twice.
"""

from __future__ import annotations

import asyncio

import pytest

import conveyor
from conveyor import Outcome, RetryPolicy, TaskState
from conveyor.payload import encode
from conveyor.worker.outcomes import error_info
from conveyor.worker.texts import MAX_ERROR_MESSAGE, MAX_TRACEBACK, cut, format_traceback
from tests.apps import cpu
from tests.worker.helpers import RunningWorker, wait_terminal

ONCE = RetryPolicy(max_attempts=1)
MB = 1_000_000
HUGE = {
    # name: the message of the exception
    "plain-50mb": "x" * (50 * MB),
    "nul-20mb": "\x00" * (20 * MB),
    "surrogates-20mb": "é\udcff" * (10 * MB),
    "mixed-10mb": "a\x00\udcffé" * (MB // 4 * 10),
}


@pytest.fixture
def app(any_app: conveyor.App) -> conveyor.App:
    return any_app


def _raised(message: str) -> BaseException:
    try:
        try:
            raise KeyError("the cause, " + message[:10])
        except KeyError as cause:
            raise RuntimeError(message) from cause
    except RuntimeError as error:
        return error


@pytest.mark.parametrize("name", list(HUGE))
def test_error_info_of_a_huge_message_is_cut_and_storable(name: str) -> None:
    info = error_info(_raised(HUGE[name]))
    for text, limit in ((info.message, MAX_ERROR_MESSAGE), (info.traceback or "", MAX_TRACEBACK)):
        assert len(text) <= limit
        assert "\x00" not in text
        text.encode("utf-8")  # no lone surrogate left
        assert "characters cut]" in text
    assert info.type == "RuntimeError"
    # The chain stays readable: the cause, the frames, then the cut message.
    assert "KeyError" in (info.traceback or "")
    assert "test_huge_errors.py" in (info.traceback or "")


def test_cut_keeps_short_text_and_says_how_much_it_cut() -> None:
    assert cut("fine", 100) == "fine"
    assert cut("a\x00b", 100) == "a\\x00b"
    cut_text = cut("y" * 1000, 100)
    assert len(cut_text) <= 100 and cut_text.endswith(f"[{1000 - 60} characters cut]")
    # Cleaning may lengthen a text (NUL becomes 4 characters): still within the limit.
    assert len(cut("\x00" * 99, 100)) <= 100
    assert format_traceback(ValueError("short"), 1000).endswith("ValueError: short\n")


def test_a_result_over_the_cap_is_refused_before_it_is_encoded() -> None:
    class Unencodable(str):
        """A string the JSON encoder would choke on, if it ever got it."""

    with pytest.raises(conveyor.PayloadTooLargeError, match="at least"):
        encode({"a": "x" * (50 * MB), "b": Unencodable("never reached")}, 1 << 20)
    with pytest.raises(conveyor.PayloadTooLargeError, match="at least"):
        encode([0] * (10 * MB), 1 << 20)


async def test_huge_errors_do_not_make_their_neighbours_run_twice(app: conveyor.App) -> None:
    """Several 10-50 MB messages among tasks that each hold a 1 s lease for
    0.6 s: every neighbour runs exactly once."""

    @app.task(retry=ONCE)
    async def explode(name: str) -> None:
        raise RuntimeError(HUGE[name])

    @app.task(retry=ONCE)
    def explode_in_thread(name: str) -> None:
        raise RuntimeError(HUGE[name])

    @app.task(retry=ONCE)
    async def huge_result() -> str:
        return "r" * (50 * MB)

    @app.task(retry=RetryPolicy(max_attempts=3, initial_interval=0, jitter=0))
    async def neighbour(n: int) -> int:
        await asyncio.sleep(0.6)
        return n

    async with app:
        neighbours, bad = [], []
        for n in range(24):
            neighbours.append(await neighbour.enqueue_async(n=n))
            if n % 3 == 0:
                name = list(HUGE)[(n // 3) % len(HUGE)]
                task = explode if n % 2 else explode_in_thread
                bad.append(await task.enqueue_async(name=name))
        bad.append(await huge_result.enqueue_async())
        async with RunningWorker(app, concurrency=12, lease=1.0):
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
        assert len(attempt.error_message or "") <= MAX_ERROR_MESSAGE


async def test_a_process_handler_sends_its_huge_error_and_result_cut(app: conveyor.App) -> None:
    raiser = app.task(name="cpu_huge_error", process=True, retry=ONCE)(cpu.huge_error)
    returner = app.task(name="cpu_huge_result", process=True, retry=ONCE)(cpu.huge_result)
    async with app:
        handles = [
            await raiser.enqueue_async(megabytes=50),
            await returner.enqueue_async(megabytes=50),
        ]
        async with RunningWorker(app, concurrency=2):
            raised, returned = await wait_terminal(app, [h.id for h in handles], timeout=120)
    [attempt] = raised.attempts
    assert raised.state is TaskState.FAILED
    assert attempt.error_type == "RuntimeError"
    assert len(attempt.error_message or "") <= MAX_ERROR_MESSAGE
    assert "characters cut]" in (attempt.error_message or "")
    assert len(attempt.traceback or "") <= MAX_TRACEBACK
    [attempt] = returned.attempts
    assert returned.state is TaskState.FAILED
    assert attempt.error_type == "conveyor.errors.PayloadError"
    assert "the result is not stored: payload is at least" in (attempt.error_message or "")
