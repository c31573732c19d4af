"""A lease the store refuses to renew costs no other lease its renewal.

On Redis a task's stored lease length of ``nan`` (a hash edited around
conveyor) makes the heartbeat's script fail: the store answers, but
refuses the whole beat, and every lease of the worker used to run out of
trust together. The beat is split instead: the refused lease alone is
given up (its handler stopped), the others are renewed. PostgreSQL and
SQLite renew with one statement over typed (or checked) columns that no
stored value makes fail.
"""

from __future__ import annotations

import asyncio
from collections.abc import Iterator
from pathlib import Path

import pytest
import redis

import conveyor
from conveyor import Outcome, TaskState
from tests.conftest import REDIS_URL, backend_url, drop_redis_prefix, new_schema_name
from tests.worker.helpers import RunningWorker, wait_for, wait_terminal


@pytest.fixture
def prefix() -> Iterator[str]:
    """The key prefix of the test's Redis store, its keys deleted after."""
    name = new_schema_name()
    yield name
    drop_redis_prefix(name)


async def test_a_lease_the_store_refuses_to_renew_costs_the_others_nothing(
    prefix: str, tmp_path: Path
) -> None:
    url, options = backend_url("redis", prefix, tmp_path)
    app = conveyor.App(url, **options)
    started: set[int] = set()

    @app.task()
    async def hold(n: int, ctx: conveyor.TaskContext) -> int:
        started.add(ctx.task_id)
        await asyncio.sleep(4)  # two leases long: renewed several times
        return n

    async with app:
        handles = [await hold.enqueue_async(n=n) for n in range(8)]
        victim = handles[3].id
        async with RunningWorker(app, concurrency=8, lease=2.0):

            async def all_started() -> bool:
                return len(started) == len(handles)

            await wait_for(all_started)
            client = redis.Redis.from_url(REDIS_URL)
            try:
                client.hset(f"{{{prefix}}}:task:{victim}", "lease", "nan")
            finally:
                client.close()
            others = [h.id for h in handles if h.id != victim]
            ended = await wait_terminal(app, others, timeout=60)
    app.close()
    for task in ended:
        assert task.state is TaskState.SUCCEEDED
        assert [a.outcome for a in task.attempts] == [Outcome.SUCCEEDED], task.attempts
