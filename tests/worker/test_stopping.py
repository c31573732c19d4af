"""A worker's own tasks end when told to, even when a cancellation is swallowed.

On Python 3.11, ``asyncio.wait_for`` drops a cancellation that arrives as
the call it waits for completes; a worker that cancelled one of its tasks
and awaited it then waited for ever, and never exited after SIGTERM.
"""

from __future__ import annotations

import ast
import asyncio
import sys
from collections.abc import Sequence
from pathlib import Path

import pytest

from conveyor.backends.sqlite import SQLiteBackend
from conveyor.model import LeaseToken
from conveyor.worker.cancels import CancelConfig, CancelWatch
from conveyor.worker.stopping import cancel_and_wait

SRC = Path(__file__).resolve().parents[2] / "src" / "conveyor"


async def test_cancel_and_wait_ends_a_task_that_swallows_a_cancellation() -> None:
    swallowed = asyncio.Event()

    async def stubborn() -> None:
        try:
            await asyncio.Event().wait()
        except asyncio.CancelledError:
            swallowed.set()  # as wait_for does on 3.11: the task goes on
        await asyncio.Event().wait()

    task = asyncio.create_task(stubborn())
    await asyncio.sleep(0)
    async with asyncio.timeout(10):
        await cancel_and_wait(task, every=0.05)
    assert swallowed.is_set() and task.cancelled()


class CancelledAsItAnswers(SQLiteBackend):
    """A real SQLite backend whose cancel check has its caller's task cancelled
    in the turn it answers: the race that ``wait_for`` loses on 3.11."""

    victim: asyncio.Task[None] | None = None

    async def cancel_requested(
        self, worker_id: str, tokens: Sequence[LeaseToken]
    ) -> frozenset[LeaseToken]:
        found = await super().cancel_requested(worker_id, tokens)
        if self.victim is not None:
            self.victim.cancel()
        return found


async def test_the_cancel_watch_stops_when_cancelled_as_its_check_answers(
    tmp_path: Path,
) -> None:
    backend = CancelledAsItAnswers(str(tmp_path / "w.db"))
    await backend.open()
    try:
        watch = CancelWatch(
            CancelConfig("w", min_interval=0.0),
            backend,
            lambda: [LeaseToken(task_id=1, attempt=1, worker_id="w")],
            lambda _found: None,
        )
        watch.start()
        assert watch._task is not None
        backend.victim = watch._task
        watch.hint(None)
        # Cancelled as its check answered: the task ends (wait_for on 3.11
        # would have dropped the cancellation, and the task run on).
        await asyncio.wait({watch._task}, timeout=5)
        assert watch.checks == 1 and watch._task.cancelled()
        async with asyncio.timeout(10):
            await watch.stop()
    finally:
        await backend.close()


def test_conveyor_never_calls_asyncio_wait_for() -> None:
    """``asyncio.timeout`` instead: see the module docstring."""
    found = []
    for path in sorted(SRC.rglob("*.py")):
        for node in ast.walk(ast.parse(path.read_text(), str(path))):
            if isinstance(node, ast.Attribute) and node.attr == "wait_for":
                found.append(f"{path.relative_to(SRC)}:{node.lineno}")
    assert found == []


@pytest.mark.skipif(sys.version_info >= (3, 12), reason="wait_for was rewritten in 3.12")
async def test_wait_for_swallows_such_a_cancellation_on_311() -> None:
    """Why the rules above exist: the race, on the Python that has it."""
    inner: asyncio.Future[int] = asyncio.get_running_loop().create_future()

    async def waiting() -> None:
        await asyncio.wait_for(inner, 10)  # the subject of the test
        await asyncio.sleep(0.2)

    task = asyncio.create_task(waiting())
    await asyncio.sleep(0)
    inner.set_result(1)
    task.cancel()
    await asyncio.wait({task})
    assert not task.cancelled()  # it ran on to its end: the cancellation was lost
