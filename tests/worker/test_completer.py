"""Batched completions against a real database."""

from __future__ import annotations

import asyncio
import logging
import time
from typing import cast

import pytest

import conveyor
from conveyor.backends.params import (
    ClaimedTask,
    ClaimParams,
    Completion,
    EnqueueParams,
    FinishParams,
    FinishResult,
    HeartbeatParams,
    HeartbeatResult,
    NewTask,
)
from conveyor.backends.postgres import PostgresBackend
from conveyor.backends.protocol import Backend
from conveyor.errors import BackendUnavailableError
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


class _Refusing:
    """The real backend, but ``finish`` fails with a "connection" error for
    any batch that holds the poison task's success (``failures_too``: any
    completion of it), and with ``down`` set, every call fails (probes too),
    as when the store is away."""

    def __init__(self, backend: PostgresBackend, poison: int, failures_too: bool = False) -> None:
        self._backend = backend
        self.poison = poison
        self.failures_too = failures_too
        self.down = False
        self.finishes = 0

    async def finish(self, params: FinishParams) -> FinishResult:
        self.finishes += 1
        if self.down:
            raise BackendUnavailableError("connection refused")
        for c in params.completions:
            if c.token.task_id == self.poison and (
                self.failures_too or c.outcome is Outcome.SUCCEEDED
            ):
                raise BackendUnavailableError("index row size exceeds btree maximum (so to speak)")
        return await self._backend.finish(params)

    async def heartbeat(self, params: HeartbeatParams) -> HeartbeatResult:
        if self.down:
            raise BackendUnavailableError("connection refused")
        return await self._backend.heartbeat(params)


async def _claimed(backend: PostgresBackend, count: int) -> list[ClaimedTask]:
    new = NewTask(
        name="job",
        queue="default",
        payload="{}",
        priority=0,
        max_attempts=3,
        retry=RetryPolicy(max_attempts=3, initial_interval=0, jitter=0),
    )
    await backend.enqueue(EnqueueParams([new] * count))
    return await backend.claim(ClaimParams("w", ["job"], ["default"], count, 30))


def _success(task: ClaimedTask) -> Completion:
    return Completion(task.token, Outcome.SUCCEEDED, TaskState.SUCCEEDED, result="1")


async def test_a_batch_that_keeps_failing_while_the_store_answers_is_split(
    backend: PostgresBackend,
) -> None:
    """Whatever class its error has: the poison's success is written again as
    its attempt's failure, and every other completion of the batch applies."""
    claimed = await _claimed(backend, 20)
    poison = claimed[7]
    refusing = _Refusing(backend, poison.token.task_id)
    recorded: dict[int, tuple[Outcome, bool]] = {}
    completer = Completer(
        cast(Backend, refusing),
        "w",
        lambda _token: True,
        lambda c, applied: recorded.__setitem__(c.token.task_id, (c.outcome, applied)),
    )
    for task in claimed:
        completer.submit(_success(task), task)
    await asyncio.wait_for(completer.flush_once(), 30)
    assert recorded == {
        t.token.task_id: (Outcome.FAILED if t is poison else Outcome.SUCCEEDED, True)
        for t in claimed
    }
    assert completer.refused == 1
    stored = await backend.get_task(poison.token.task_id)
    assert stored is not None and stored.state is TaskState.PENDING  # retried by its policy
    [attempt] = stored.attempts
    assert attempt.error_type == "CompletionRefused"
    assert attempt.error_message == (
        "the store refused this attempt's completion: "
        "index row size exceeds btree maximum (so to speak)"
    )


async def test_a_failure_the_store_refuses_too_is_dropped_not_retried_for_ever(
    backend: PostgresBackend, caplog: pytest.LogCaptureFixture
) -> None:
    claimed = await _claimed(backend, 4)
    poison = claimed[1]
    refusing = _Refusing(backend, poison.token.task_id, failures_too=True)
    recorded: dict[int, bool] = {}
    completer = Completer(
        cast(Backend, refusing),
        "w",
        lambda _token: True,
        lambda c, applied: recorded.__setitem__(c.token.task_id, applied),
    )
    for task in claimed:
        completer.submit(_success(task), task)
    with caplog.at_level(logging.WARNING, logger="conveyor.worker.completer"):
        await asyncio.wait_for(completer.flush_once(), 30)
    assert recorded == {t.token.task_id: t is not poison for t in claimed}
    assert "it is dropped and the task will be reclaimed" in caplog.text
    stored = await backend.get_task(poison.token.task_id)
    assert stored is not None and stored.state is TaskState.IN_PROGRESS  # its lease will expire


async def test_a_store_that_is_away_is_waited_out_and_nothing_is_split(
    backend: PostgresBackend, monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.setattr(completer_module, "RETRY_MAX_DELAY", 0.05)
    claimed = await _claimed(backend, 5)
    refusing = _Refusing(backend, poison=0)
    refusing.down = True
    recorded: dict[int, bool] = {}
    completer = Completer(
        cast(Backend, refusing),
        "w",
        lambda _token: True,
        lambda c, applied: recorded.__setitem__(c.token.task_id, applied),
    )
    for task in claimed:
        completer.submit(_success(task), task)
    flush = asyncio.create_task(completer.flush_once())
    while refusing.finishes < 4 * completer_module.REFUSALS:
        await asyncio.sleep(0.01)
    assert not flush.done() and recorded == {}
    refusing.down = False
    await asyncio.wait_for(flush, 10)
    assert recorded == {t.token.task_id: True for t in claimed}
    assert completer.refused == 0 and completer.flushes == 1  # one whole batch


async def test_stop_gives_up_what_it_cannot_write_within_its_bound(
    backend: PostgresBackend, caplog: pytest.LogCaptureFixture
) -> None:
    """A store away for good, leases still trusted: the stop does not wait
    for them to run out."""
    claimed = await _claimed(backend, 3)
    refusing = _Refusing(backend, poison=0)
    refusing.down = True
    recorded: list[bool] = []
    completer = Completer(
        cast(Backend, refusing), "w", lambda _token: True, lambda _c, a: recorded.append(a)
    )
    completer.start()
    for task in claimed:
        completer.submit(_success(task), task)
    while refusing.finishes < 2:
        await asyncio.sleep(0.01)
    with caplog.at_level(logging.ERROR, logger="conveyor.worker.completer"):
        await asyncio.wait_for(completer.stop(timeout=0.2), 10)
    assert recorded == []
    assert "3 completions were not written in the 0.2s a stop gives them" in caplog.text
    await asyncio.wait_for(completer.wait_idle(), 1)


class _FirstFinishHeld:
    """The real backend, but its first completion waits for ``released``."""

    def __init__(self, backend: PostgresBackend) -> None:
        self._backend = backend
        self.released = asyncio.Event()
        self._held = False

    async def finish(self, params: FinishParams) -> FinishResult:
        if not self._held:
            self._held = True
            await self.released.wait()
        return await self._backend.finish(params)


async def test_a_discarded_token_s_completions_are_neither_written_nor_reported(
    backend: PostgresBackend,
) -> None:
    """A newer claim holds a token (the store gave it out again): its queued
    completion is dropped before any write, and one being written when the
    token is discarded is not reported to the worker (whose lease of that
    token is the new claim's)."""
    new = NewTask(
        name="job", queue="default", payload="{}", priority=0, max_attempts=3, retry=RetryPolicy()
    )
    await backend.enqueue(EnqueueParams([new] * 3))
    queued, writing, kept = await backend.claim(ClaimParams("w", ["job"], ["default"], 3, 30))
    held = _FirstFinishHeld(backend)
    recorded: dict[int, bool] = {}
    completer = Completer(
        cast(Backend, held),
        "w",
        lambda _token: True,
        lambda c, applied: recorded.__setitem__(c.token.task_id, applied),
    )
    completer.start()

    def success(claimed: ClaimedTask) -> Completion:
        return Completion(claimed.token, Outcome.SUCCEEDED, TaskState.SUCCEEDED, result="1")

    completer.submit(success(writing))
    await asyncio.sleep(0.05)  # the first write is under way, held
    completer.submit(success(queued))
    completer.submit(success(kept))
    completer.discard(queued.token)
    completer.discard(writing.token)
    held.released.set()
    await asyncio.wait_for(completer.wait_idle(), 10)
    await completer.stop()
    assert recorded == {kept.token.task_id: True}
    states = {}
    for claimed in (queued, writing, kept):
        task = await backend.get_task(claimed.token.task_id)
        assert task is not None
        states[claimed.token.task_id] = task.state
    assert states == {
        queued.token.task_id: TaskState.IN_PROGRESS,
        writing.token.task_id: TaskState.SUCCEEDED,
        kept.token.task_id: TaskState.SUCCEEDED,
    }
