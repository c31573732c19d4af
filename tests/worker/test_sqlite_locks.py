"""SQLite's single write lock, held by someone else: the worker waits it out.

An application transaction on the same file that holds the write lock longer
than ``busy_timeout`` makes the worker's registration wait, and its claims
fail with BackendUnavailableError; the worker logs them, backs off and goes
on, and nothing is lost or run twice.
"""

from __future__ import annotations

import asyncio
import contextlib
import logging
import sqlite3
from collections.abc import AsyncIterator
from pathlib import Path

import pytest

import conveyor
from conveyor import Outcome, TaskState
from conveyor.backends.sqlite import SQLiteBackend
from conveyor.errors import BackendUnavailableError
from tests.worker.helpers import RunningWorker, wait_for, wait_terminal


def _messages(caplog: pytest.LogCaptureFixture) -> list[str]:
    return [r.getMessage() for r in caplog.records]


async def test_a_write_lock_held_elsewhere_delays_the_worker_without_harm(
    tmp_path: Path, caplog: pytest.LogCaptureFixture
) -> None:
    path = tmp_path / "tasks.db"
    app = conveyor.App(f"sqlite:///{path}?busy_timeout=0.1")

    @app.task
    async def echo(n: int) -> int:
        return n

    caplog.set_level(logging.WARNING, logger="conveyor")
    async with app:
        await app.backend()  # the file and its tables exist
        with contextlib.closing(sqlite3.connect(path, isolation_level=None)) as other:
            other.execute("begin immediate")  # held while the worker starts
            async with RunningWorker(app, poll_interval=0.05) as worker:
                await asyncio.sleep(0.5)
                assert any(
                    m.startswith("store unreachable (registration)") and "database is locked" in m
                    for m in _messages(caplog)
                )
                other.execute("commit")
                await wait_for(lambda: _claimed_once(worker))

                handles = [await app.enqueue_async(echo, {"n": n}, delay=0.3) for n in range(5)]
                other.execute("begin immediate")  # held while the tasks fall due
                await asyncio.sleep(1.0)
                assert worker.claimed_count == 0
                other.execute("commit")
                tasks = await wait_terminal(app, [h.id for h in handles])
    assert [t.state for t in tasks] == [TaskState.SUCCEEDED] * 5
    assert [t.result for t in tasks] == list(range(5))
    assert all([a.outcome for a in t.attempts] == [Outcome.SUCCEEDED] for t in tasks)
    # Once per part and cause, not once per failed claim.
    failed_claims = [m for m in _messages(caplog) if m.startswith("store unreachable (claim)")]
    assert len(failed_claims) == 1 and "database is locked" in failed_claims[0]


async def _claimed_once(worker: conveyor.Worker) -> bool:
    return worker.claims_made >= 1


async def test_a_failing_wake_up_listener_leaves_the_worker_polling(
    tmp_path: Path, caplog: pytest.LogCaptureFixture, monkeypatch: pytest.MonkeyPatch
) -> None:
    async def broken(self: object, queues: object) -> AsyncIterator[str]:
        raise BackendUnavailableError("the file went away")
        yield ""  # an async generator, like the real one

    monkeypatch.setattr(SQLiteBackend, "wakeups", broken)
    app = conveyor.App(f"sqlite:///{tmp_path / 'tasks.db'}")

    @app.task
    async def echo(n: int) -> int:
        return n

    caplog.set_level(logging.WARNING, logger="conveyor")
    async with app, RunningWorker(app, poll_interval=0.1):
        handle = await echo.enqueue_async(n=1)
        [task] = await wait_terminal(app, [handle.id])
    assert task.result == 1
    assert any("wake-ups stopped" in m and "went away" in m for m in _messages(caplog))
