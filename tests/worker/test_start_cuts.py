"""A store lost while a backend opens or a worker starts: a typed error, nothing left open.

Opening a PostgreSQL backend connects, then applies the migrations. A
connection cut between the two (here: while the migration waits for the
schema's migration lock, which the test holds) must raise
BackendUnavailableError and close the backend's pool. A pool left open
keeps reconnecting and holds its event loop's shutdown for good: a worker
process that never worked and never exited. A worker that reached its
store waits such a cut out and then works, as it does once it runs.
"""

from __future__ import annotations

import asyncio
import contextlib
import sqlite3
import subprocess
import sys
import threading
import time
from collections.abc import AsyncIterator, Iterator
from pathlib import Path

import psycopg
import pytest

import conveyor
from conveyor import TaskState
from conveyor.backends.sqlite import SQLiteBackend
from conveyor.errors import BackendUnavailableError
from tests.conftest import PG_URL
from tests.worker.helpers import RunningWorker, wait_terminal
from tools.proxy import Proxy

pytestmark = pytest.mark.slow

EXIT_BOUND = 60.0
"""Seconds the opening process may take to end: far above what it needs
(a few), far below forever, which is what a pool left open took."""

OPEN_THEN_CUT = """
import asyncio, sys
from conveyor.backends.postgres import PostgresBackend
from conveyor.errors import BackendUnavailableError

async def main() -> None:
    backend = PostgresBackend(sys.argv[1], schema=sys.argv[2])
    try:
        await backend.open()
    except BackendUnavailableError as exc:
        print("raised BackendUnavailableError:", exc, flush=True)
        return
    print("opened", flush=True)
    await backend.close()

asyncio.run(main())
print("loop ended", flush=True)
"""


@contextlib.contextmanager
def migration_lock(schema: str) -> Iterator[psycopg.Connection[tuple[object, ...]]]:
    """Hold ``schema``'s migration lock (the key ``apply_migrations`` takes)
    from a session of the test's own, so a backend opening on it waits in
    its migration."""
    with psycopg.connect(PG_URL, autocommit=True) as conn:
        conn.execute("select pg_advisory_lock(hashtext(%s))", (f"conveyor.migrate.{schema}",))
        try:
            yield conn
        finally:
            conn.execute("select pg_advisory_unlock_all()")


def waiting_for_the_lock(conn: psycopg.Connection[tuple[object, ...]], schema: str) -> int:
    """Sessions waiting for ``schema``'s migration lock now (an advisory lock
    on a bigint splits it into classid, the high half, and objid)."""
    row = conn.execute(
        "select count(*) from pg_locks where locktype = 'advisory' and not granted"
        " and ((classid::bigint << 32) | objid::bigint) = hashtext(%s)::bigint",
        (f"conveyor.migrate.{schema}",),
    ).fetchone()
    assert row is not None
    return int(str(row[0]))


def wait_until_waiting(
    conn: psycopg.Connection[tuple[object, ...]], schema: str, bound: float = 30
) -> None:
    deadline = time.monotonic() + bound
    while waiting_for_the_lock(conn, schema) == 0:
        assert time.monotonic() < deadline, "nobody waited for the migration lock"
        time.sleep(0.05)


def test_a_connection_cut_while_migrating_raises_unavailable_and_the_process_ends(
    schema: str, proxy: Proxy
) -> None:
    with migration_lock(schema) as holder:
        opening = subprocess.Popen(
            [sys.executable, "-c", OPEN_THEN_CUT, proxy.url, schema],
            stdout=subprocess.PIPE,
            stderr=subprocess.PIPE,
            text=True,
        )
        try:
            wait_until_waiting(holder, schema)
            assert proxy.cut() >= 1
        except BaseException:
            opening.kill()
            raise
    try:
        out, err = opening.communicate(timeout=EXIT_BOUND)
    except subprocess.TimeoutExpired:
        opening.kill()
        out, err = opening.communicate()
        pytest.fail(f"the process never ended after a failed open: {out!r} {err[-2000:]!r}")
    assert opening.returncode == 0, err[-2000:]
    assert "raised BackendUnavailableError: PostgreSQL is unavailable" in out, (out, err)
    assert out.rstrip().endswith("loop ended")


@pytest.fixture
async def proxied_app(schema: str, proxy: Proxy) -> AsyncIterator[conveyor.App]:
    application = conveyor.App(proxy.url, schema=schema)
    yield application
    await application.aclose()


async def test_a_worker_whose_migration_is_cut_waits_it_out_then_runs_tasks(
    schema: str, proxy: Proxy, proxied_app: conveyor.App
) -> None:
    direct = conveyor.App(PG_URL, schema=schema)
    ran: list[int] = []

    for each in (direct, proxied_app):

        @each.task(name="note")
        async def note(n: int) -> int:
            ran.append(n)
            return n

    with migration_lock(schema) as holder:
        async with RunningWorker(proxied_app, lease=2.0) as worker:
            await asyncio.to_thread(wait_until_waiting, holder, schema)
            assert proxy.cut() >= 1
            await asyncio.to_thread(holder.execute, "select pg_advisory_unlock_all()")
            handle = await direct.enqueue_async("note", {"n": 7})
            (done,) = await wait_terminal(direct, [handle.id], timeout=30)
            assert done.state is TaskState.SUCCEEDED and ran == [7]
            assert worker.id in {w.id for w in await direct.list_workers_async()}
    await direct.aclose()


def _sqlite_threads() -> set[threading.Thread]:
    return {t for t in threading.enumerate() if t.name.startswith("conveyor-sqlite")}


async def test_a_sqlite_open_that_fails_leaves_no_thread_behind(tmp_path: Path) -> None:
    path = tmp_path / "locked.db"
    holder = sqlite3.connect(path, isolation_level=None)
    holder.execute("begin exclusive")
    before = _sqlite_threads()
    backend = SQLiteBackend(str(path), busy_timeout=0.1)
    try:
        with pytest.raises(BackendUnavailableError):
            await backend.open()
        # Its thread ends once the failed open closed the database.
        for _ in range(100):
            if _sqlite_threads() <= before:
                break
            await asyncio.sleep(0.05)
        assert _sqlite_threads() <= before
    finally:
        holder.execute("rollback")
        holder.close()
        await backend.close()
