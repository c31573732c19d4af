"""A completion the store refuses for good holds back no other.

A coroutine poll whose spawn the store refuses (a trigger added by the test
to its own store, or on Redis a key of the wrong type where the spawn's
unique key goes) beside 60 plain tasks: every neighbour succeeds, and the
refused attempt is recorded as failed (``CompletionRefused``, the store's
reason as its message), without its effects: its task follows its retry
policy, never left in progress. On PostgreSQL the refusal comes once as a
program limit (SQLSTATE 54000, which a 6,400-character queue name's index
row raises) and once as a connection failure (08006): whatever class an
error has, a write that keeps failing while the store answers is split.
"""

from __future__ import annotations

import asyncio
from collections.abc import Iterator
from pathlib import Path

import psycopg
import pytest
import redis

import conveyor
from conveyor import Poll, RetryPolicy, TaskState
from tests.conftest import PG_URL, REDIS_URL, backend_url, drop_redis_prefix, schema_for
from tests.worker.helpers import RunningWorker, wait_terminal

REFUSED_QUEUE = "refused"
REFUSED_KEY = "poison"
NEIGHBOURS = 60


def refuse_on_postgres(schema: str, errcode: str) -> None:
    """A trigger on the test's own schema that raises ``errcode`` for any
    task stored in the queue ``refused``."""
    with psycopg.connect(PG_URL, autocommit=True) as conn:
        conn.execute(
            psycopg.sql.SQL(
                "create function {schema}.refuse() returns trigger language plpgsql as $$"
                " begin raise exception 'refused by the test' using errcode = {code};"
                " end $$"
            ).format(schema=psycopg.sql.Identifier(schema), code=psycopg.sql.Literal(errcode))
        )
        conn.execute(
            psycopg.sql.SQL(
                "create trigger refuse before insert on {schema}.tasks for each row"
                " when (new.queue = {queue}) execute function {schema}.refuse()"
            ).format(
                schema=psycopg.sql.Identifier(schema), queue=psycopg.sql.Literal(REFUSED_QUEUE)
            )
        )


def refuse_on_sqlite(path: str) -> None:
    import sqlite3

    conn = sqlite3.connect(path)
    try:
        conn.execute(
            "create trigger refuse before insert on conveyor_tasks when new.queue = 'refused'"
            " begin select raise(abort, 'refused by the test'); end"
        )
        conn.commit()
    finally:
        conn.close()


def refuse_on_redis(prefix: str) -> None:
    """The spawn's unique key held by a hash: every script that looks it up fails."""
    client = redis.Redis.from_url(REDIS_URL)
    try:
        name = "child"
        client.hset(f"{{{prefix}}}:unique:{len(name)}:{name}:{REFUSED_KEY}", "x", "1")
    finally:
        client.close()


CASES = ["postgres-54000", "postgres-08006", "sqlite", "redis"]


@pytest.fixture(params=CASES)
def refusing_app(request: pytest.FixtureRequest, tmp_path: Path) -> Iterator[conveyor.App]:
    """An app on a store that refuses to store a task of the queue
    ``refused`` (on Redis: the child ``child`` with the key ``poison``)."""
    kind, _, errcode = request.param.partition("-")
    url, options = backend_url(kind, schema_for(kind, request), tmp_path)
    app = conveyor.App(url, **options)
    app.migrate()
    if kind == "postgres":
        refuse_on_postgres(options["schema"], errcode)
    elif kind == "sqlite":
        refuse_on_sqlite(str(tmp_path / "conveyor.db"))
    else:
        refuse_on_redis(options["schema"])
    yield app
    app.close()
    if kind == "redis":
        drop_redis_prefix(options["schema"])


async def test_a_refused_poll_completion_holds_back_none_of_its_60_neighbours(
    refusing_app: conveyor.App,
) -> None:
    app = refusing_app

    @app.task()
    async def child() -> None:
        return None

    @app.task()
    async def plain(n: int) -> int:
        await asyncio.sleep(0.2)  # they end after the poll: behind its batch
        return n

    @app.coroutine("spawner", retry=RetryPolicy(max_attempts=2, initial_interval=0, jitter=0))
    async def spawner(poll: Poll) -> conveyor.Done:
        poll.spawn(child, args={}, queue=REFUSED_QUEUE, idempotency_key=REFUSED_KEY)
        return conveyor.done("spawned")

    async with app:
        poll = await spawner.start_async({})
        neighbours = [await plain.enqueue_async(n=n) for n in range(NEIGHBOURS)]
        # A lease the test outlasts: a refused completion left in progress
        # would still be in progress at the end.
        async with RunningWorker(app, concurrency=NEIGHBOURS + 4, lease=60) as worker:
            ended = await wait_terminal(app, [h.id for h in neighbours], timeout=30)
            [task] = await wait_terminal(app, [poll.id], timeout=30)
            assert worker.completer is not None and worker.completer.refused == 2
        children = [t for t in await app.list_tasks_async(limit=500) if t.name == "child"]

    assert [t.state for t in ended] == [TaskState.SUCCEEDED] * NEIGHBOURS
    assert [t.result for t in ended] == list(range(NEIGHBOURS))
    # Failed by its policy (two attempts), each refused, none of its effects stored.
    assert task.state is TaskState.FAILED and task.result is None
    assert [a.error_type for a in task.attempts] == ["CompletionRefused"] * 2
    for attempt in task.attempts:
        assert attempt.error_message is not None
        assert attempt.error_message.startswith("the store refused this attempt's completion: ")
        assert "\n" not in attempt.error_message
    messages = " ".join(a.error_message or "" for a in task.attempts)
    assert "refused by the test" in messages or "WRONGTYPE" in messages
    assert children == []
