"""The async API's backend closes when its event loop ends, and the loop does end.

Each case is a program of its own (a subprocess), since what is tested is
how that program's event loop shuts down: that it ends at all, and what it
says on the way.
"""

from __future__ import annotations

import asyncio
import subprocess
import sys
import threading
import uuid
from pathlib import Path

import pytest

import conveyor
from tests.conftest import PG_URL

ROOT = Path(__file__).resolve().parents[1]
EXIT_BOUND = 60.0
"""Seconds a program may take to end: far above what it needs (about one),
far below forever."""

NEVER_CLOSED_AFTER_A_CUT = """
import asyncio, sys, uuid
import conveyor
from tools.proxy import Proxy

proxy = Proxy(sys.argv[1])
proxy.start()
app = conveyor.App(proxy.url, schema=sys.argv[2], allow_unregistered=True)

async def main() -> None:
    await app.enqueue_async("job", {})
    proxy.cut()  # the pool's connection is reset: it reconnects in the background
    try:
        await app.enqueue_async("job", {})
    except conveyor.BackendUnavailableError:
        print("lost", flush=True)

asyncio.run(main())  # no aclose(): the loop's end closes the backend
print("ended", flush=True)
"""

ENDED_BY_HAND = """
import asyncio, gc, sys, threading
import conveyor

app = conveyor.App(sys.argv[1], allow_unregistered=True)

async def main() -> None:
    await app.enqueue_async("job", {})

loop = asyncio.new_event_loop()
loop.run_until_complete(main())
loop.run_until_complete(loop.shutdown_asyncgens())
loop.close()
gc.collect()
# The backend's thread was told to end (it is not joined on the loop): it
# ends within moments, however loaded the machine.
for thread in threading.enumerate():
    if thread.name.startswith("conveyor-sqlite"):
        thread.join(10)
left = [t.name for t in threading.enumerate() if t.name.startswith("conveyor-sqlite")]
print("sqlite threads left:", left, flush=True)
"""


def _run(script: str, *args: str) -> subprocess.CompletedProcess[str]:
    try:
        return subprocess.run(
            [sys.executable, "-c", script, *args],
            capture_output=True,
            text=True,
            timeout=EXIT_BOUND,
            cwd=ROOT,
        )
    except subprocess.TimeoutExpired as exc:
        pytest.fail(f"the program never ended: {exc.stdout!r} {exc.stderr!r}")


def test_a_program_that_never_closes_its_app_ends_after_a_lost_connection(schema: str) -> None:
    done = _run(NEVER_CLOSED_AFTER_A_CUT, PG_URL, schema)
    assert done.returncode == 0, done.stderr[-2000:]
    assert done.stdout.split() == ["lost", "ended"], done.stderr[-2000:]


def test_a_loop_ended_by_hand_closes_the_backend_and_leaves_no_task(tmp_path: Path) -> None:
    done = _run(ENDED_BY_HAND, f"sqlite:///{tmp_path / 'tasks.db'}")
    assert done.returncode == 0, done.stderr[-2000:]
    assert "sqlite threads left: []" in done.stdout, done.stdout
    assert "Task was destroyed but it is pending" not in done.stderr, done.stderr


async def test_a_backend_replaced_by_use_on_the_same_loop_is_closed(tmp_path: Path) -> None:
    def sqlite_threads() -> int:
        return sum(t.name.startswith("conveyor-sqlite") for t in threading.enumerate())

    before = sqlite_threads()
    app = conveyor.App(f"sqlite:///{tmp_path / 'first.db'}", allow_unregistered=True)
    await app.enqueue_async("job", {})  # opens a SQLite backend on this loop
    assert sqlite_threads() == before + 1
    app.use(f"memory://{uuid.uuid4().hex}")
    await app.enqueue_async("job", {})  # opens a memory backend on the same loop
    for _ in range(100):
        if sqlite_threads() == before:
            break
        await asyncio.sleep(0.02)
    assert sqlite_threads() == before, "the replaced SQLite backend is still open"
    await app.aclose()
    app.close()
