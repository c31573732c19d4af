"""A store that forgets: a worker whose registration is deleted under it
registers again (every backend); a Redis server restarted empty under a
running worker never lets an attempt of a task it lost complete the new
task that reuses its id; and a PostgreSQL or SQLite store that gives an id
out again (restored from a copy) under a running attempt makes its worker
stop that attempt and drop its result."""

from __future__ import annotations

import asyncio
import contextlib
import sqlite3
import threading
from collections.abc import Iterator
from datetime import UTC, datetime, timedelta
from pathlib import Path

import psycopg
import pytest
from psycopg import sql

import conveyor
from conveyor.errors import BackendUnavailableError
from conveyor.model import Outcome, TaskState
from conveyor.records import PruneParams
from tests.conftest import PG_URL, backend_url, schema_for
from tests.worker.helpers import RunningWorker, wait_for, wait_terminal
from tools.redis_server import RedisServer


async def _registered(app: conveyor.App, worker_id: str) -> bool:
    return worker_id in {w.id for w in await app.list_workers_async()}


async def test_a_worker_whose_registration_is_deleted_registers_again(
    any_app: conveyor.App,
) -> None:
    """An operator (or a restored backup) deletes a live worker's row: its
    next heartbeat finds it missing and the worker registers again."""
    async with RunningWorker(any_app, lease=1.5) as worker:
        await wait_for(lambda: _registered(any_app, worker.id))
        backend = await any_app.backend()
        later = datetime.now(UTC) + timedelta(hours=1)
        # The prune deletes the row (its count says so); the worker's next
        # heartbeat, half a second later or sooner, may already have put it
        # back before a read here could see it gone.
        assert (await backend.prune(PruneParams({}, workers_before=later))).workers == 1
        await wait_for(lambda: _registered(any_app, worker.id))
        [info] = [w for w in await any_app.list_workers_async() if w.id == worker.id]
        assert info.stopped_at is None


@pytest.fixture
def forgetful(tmp_path: Path) -> Iterator[RedisServer]:
    """A Redis server of this test's own that keeps nothing across a restart."""
    instance = RedisServer(tmp_path / "redis", appendonly=False)
    instance.start()
    try:
        yield instance
    finally:
        instance.kill()


async def test_an_attempt_of_a_task_lost_by_a_redis_restart_never_completes_its_successor(
    forgetful: RedisServer,
) -> None:
    """The server restarts empty while an attempt of task 1 runs; a new
    task, enqueued after, is task 1 again and is claimed by the same worker
    as attempt 1. The old attempt ends first: its completion is refused
    (the new task is not its task), and the new task stores its own
    result. The worker, which the server forgot, registers again."""
    app = conveyor.App(forgetful.url, schema="forgets")
    started = {"old": threading.Event(), "new": threading.Event()}
    release = {"old": threading.Event(), "new": threading.Event()}

    @app.task
    def hold(which: str) -> str:
        started[which].set()
        release[which].wait(30)
        return which

    async def enqueue_new() -> conveyor.TaskHandle[str]:
        while True:  # the app's connection was cut by the restart: retried
            try:
                return await hold.enqueue_async("new")
            except BackendUnavailableError:
                await asyncio.sleep(0.05)

    # A long lease: the heartbeat (every third of it) does not beat between
    # the restart and the new task's claim, so the old attempt's completion
    # is what meets the new task's lease.
    try:
        async with RunningWorker(app, lease=20.0) as worker:
            await wait_for(lambda: _registered(app, worker.id))
            old = await hold.enqueue_async("old")
            assert await asyncio.to_thread(started["old"].wait, 10)

            forgetful.kill()
            forgetful.start()  # empty: no AOF, no snapshot
            new = await enqueue_new()
            assert new.id == old.id  # the id counter started again
            assert await asyncio.to_thread(started["new"].wait, 20)

            release["old"].set()  # the old attempt's completion goes first
            await asyncio.sleep(0.5)
            release["new"].set()
            [task] = await wait_terminal(app, [new.id])
            assert task.state is TaskState.SUCCEEDED
            assert task.result == "new"
            assert [(a.number, a.outcome) for a in task.attempts] == [(1, Outcome.SUCCEEDED)]
            await wait_for(lambda: _registered(app, worker.id), timeout=30)
    finally:
        for event in release.values():
            event.set()
        await app.aclose()


def _forget(kind: str, schema: str, path: Path, task_id: int) -> None:
    """What a restore from a copy taken before ``task_id`` was enqueued does
    to the store: the task, its attempts and its id are gone."""
    if kind == "postgres":
        with psycopg.connect(PG_URL, autocommit=True) as conn:
            tasks = sql.Identifier(schema, "tasks")
            conn.execute(sql.SQL("delete from {} where id = %s").format(tasks), [task_id])
            conn.execute(
                sql.SQL("select setval(pg_get_serial_sequence({}, 'id'), %s, false)").format(
                    sql.Literal(f'"{schema}".tasks')
                ),
                [task_id],
            )
        return
    with contextlib.closing(sqlite3.connect(path, isolation_level=None)) as conn:
        conn.execute("delete from conveyor_attempts where task_id = ?", [task_id])
        conn.execute("delete from conveyor_tasks where id = ?", [task_id])
        conn.execute(
            "update sqlite_sequence set seq = ? where name = 'conveyor_tasks'", [task_id - 1]
        )


@pytest.mark.parametrize("kind", ["postgres", "sqlite"])
async def test_an_attempt_of_a_task_lost_by_a_restore_never_completes_its_successor(
    kind: str, request: pytest.FixtureRequest, tmp_path: Path
) -> None:
    """The store is set back under a running attempt of task N (as a restore
    from an older copy does): a new task is task N again, and the same
    worker claims it as attempt 1, the same lease token. The worker stops
    the old attempt and drops its result, which would finish the new task:
    the new task stores its own."""
    schema = schema_for(kind, request)
    url, options = backend_url(kind, schema, tmp_path)
    app = conveyor.App(url, **options)
    started = {"old": threading.Event(), "new": threading.Event()}
    release = {"old": threading.Event(), "new": threading.Event()}

    @app.task
    def hold(which: str) -> str:
        started[which].set()
        release[which].wait(30)
        return which

    try:
        async with RunningWorker(app, lease=20.0, concurrency=4):
            old = await hold.enqueue_async("old")
            assert await asyncio.to_thread(started["old"].wait, 10)
            _forget(kind, schema, tmp_path / "conveyor.db", old.id)
            new = await hold.enqueue_async("new")
            assert new.id == old.id  # the id was given out again
            assert await asyncio.to_thread(started["new"].wait, 20)

            release["old"].set()  # the old attempt ends first
            await asyncio.sleep(0.5)
            release["new"].set()
            [task] = await wait_terminal(app, [new.id])
            assert task.state is TaskState.SUCCEEDED
            assert task.result == "new"
            assert [(a.number, a.outcome) for a in task.attempts] == [(1, Outcome.SUCCEEDED)]
    finally:
        for event in release.values():
            event.set()
        await app.aclose()
