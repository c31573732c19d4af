"""Batched completions against a real database."""

from __future__ import annotations

import asyncio
import logging
import time

import pytest

import conveyor
from conveyor.backends.postgres import PostgresBackend
from conveyor.backends.protocol import (
    ClaimParams,
    Completion,
    EnqueueParams,
    FinishParams,
    FinishResult,
    NewTask,
)
from conveyor.model import Outcome, RetryPolicy, TaskState
from conveyor.worker import completer as completer_module
from conveyor.worker.completer import Completer
from tests.worker.helpers import RunningWorker


async def test_a_completion_the_database_refuses_does_not_hold_back_the_others(
    backend: PostgresBackend,
) -> None:
    new = NewTask(
        name="job", queue="default", payload="{}", priority=0, max_attempts=3, retry=RetryPolicy()
    )
    await backend.enqueue(EnqueueParams([new] * 3))
    claimed = await backend.claim(ClaimParams("w", ["job"], ["default"], 3, 30))
    good = [
        Completion(c.token, Outcome.SUCCEEDED, TaskState.SUCCEEDED, result="1") for c in claimed[:2]
    ]
    # jsonb cannot hold \u0000: the database refuses this one for good.
    bad = Completion(claimed[2].token, Outcome.SUCCEEDED, TaskState.SUCCEEDED, result='"\\u0000"')
    recorded: dict[int, bool] = {}
    completer = Completer(
        backend,
        "w",
        lambda _token: True,
        lambda c, applied: recorded.__setitem__(c.token.task_id, applied),
    )
    completer.start()
    for completion in (good[0], bad, good[1]):
        completer.submit(completion)
    await asyncio.wait_for(completer.wait_idle(), 10)
    await completer.stop()
    assert recorded == {
        good[0].token.task_id: True,
        bad.token.task_id: False,
        good[1].token.task_id: True,
    }
    states = [(await backend.get_task(c.token.task_id)).state for c in claimed]  # type: ignore[union-attr]
    assert states == [TaskState.SUCCEEDED, TaskState.SUCCEEDED, TaskState.IN_PROGRESS]


class _FirstFinishSwallowed:
    """The real backend, but its first completion goes into a connection that
    swallows packets: it never returns."""

    def __init__(self, backend: PostgresBackend) -> None:
        self._backend = backend
        self.finishes = 0

    async def finish(self, params: FinishParams) -> FinishResult:
        self.finishes += 1
        if self.finishes == 1:
            await asyncio.sleep(3600)
        return await self._backend.finish(params)


async def test_a_write_that_never_returns_is_retried_after_the_timeout(
    backend: PostgresBackend, caplog: pytest.LogCaptureFixture
) -> None:
    new = NewTask(
        name="job", queue="default", payload="{}", priority=0, max_attempts=3, retry=RetryPolicy()
    )
    await backend.enqueue(EnqueueParams([new]))
    [claimed] = await backend.claim(ClaimParams("w", ["job"], ["default"], 1, 30))
    swallowing = _FirstFinishSwallowed(backend)
    recorded: list[bool] = []
    completer = Completer(
        swallowing,  # type: ignore[arg-type]
        "w",
        lambda _token: True,
        lambda _c, applied: recorded.append(applied),
        timeout=0.2,
    )
    completer.start()
    completer.submit(Completion(claimed.token, Outcome.SUCCEEDED, TaskState.SUCCEEDED, result="1"))
    with caplog.at_level(logging.WARNING, logger="conveyor.worker.completer"):
        await asyncio.wait_for(completer.wait_idle(), 10)
    await completer.stop()
    assert (swallowing.finishes, recorded) == (2, [True])
    assert "TimeoutError" in caplog.text
    task = await backend.get_task(claimed.token.task_id)
    assert task is not None and task.state is TaskState.SUCCEEDED


# An error text PostgreSQL cannot store (a NUL character read from a file; a
# lone surrogate from a surrogateescape-decoded file name or subprocess
# output, interpolated into an exception message) once made the batched
# `finish` statement raise. The completer retried the whole batch "while the
# leases are trusted" -- and the heartbeat kept renewing them, so forever:
# that task and every later completion of the worker were never recorded,
# their leases were renewed indefinitely, and shutdown waited on the completer.


@pytest.mark.parametrize("text", ["bad\x00byte", "/data/\udcff.csv"], ids=["nul", "surrogate"])
async def test_unstorable_error_text_does_not_wedge_the_worker(
    app: conveyor.App, text: str, monkeypatch: pytest.MonkeyPatch
) -> None:
    # Only to keep the test short: the completer's retry back-off (2 s max).
    monkeypatch.setattr(completer_module, "RETRY_MAX_DELAY", 0.05)

    @app.task(retry=RetryPolicy(max_attempts=1))
    async def bad() -> None:
        raise ValueError(f"cannot import {text}")  # e.g. a line read from a file

    @app.task()
    async def good() -> int:
        return 1

    async with app:
        poison = await bad.enqueue_async()
        later_task = await good.enqueue_async()
        async with RunningWorker(app, concurrency=1) as worker:
            try:
                deadline = time.monotonic() + 1.5
                while time.monotonic() < deadline:
                    states = [(await app.get_async(i)).state for i in (poison.id, later_task.id)]
                    if all(s.is_terminal for s in states):
                        break
                    await asyncio.sleep(0.05)
            finally:
                # Let the completer give up, or the worker could never shut down.
                assert worker.heartbeat is not None
                for token in worker.heartbeat_held():
                    worker.heartbeat.release(token)
    assert states == [TaskState.FAILED, TaskState.SUCCEEDED]
