"""What only the Redis backend's dependencies have: their keys, a task that
nothing depends on writing none of them, a long chain settled in one
script, and a woken queue when a dependent becomes due.

The common contract is in tests/conformance/test_dependencies.py.
"""

from __future__ import annotations

import asyncio
import uuid
from collections.abc import AsyncIterator
from dataclasses import replace

import pytest
import redis.asyncio as aioredis

from conveyor.backends.params import Completion, EnqueueParams, ErrorInfo, FinishParams, earlier
from conveyor.backends.redis import RedisBackend, keys
from conveyor.model import Outcome, TaskState
from tests.conformance.test_tasks import T0, claim, enqueue, later, new, success
from tests.conftest import REDIS_URL


@pytest.fixture
async def raw() -> AsyncIterator[aioredis.Redis]:
    client = aioredis.Redis.from_url(REDIS_URL, decode_responses=True)
    yield client
    await client.aclose()


@pytest.fixture(params=[True, False], ids=["functions", "scripts"])
async def store(request: pytest.FixtureRequest) -> AsyncIterator[RedisBackend]:
    instance = RedisBackend(REDIS_URL, prefix=f"t_{uuid.uuid4().hex[:12]}", functions=request.param)
    await instance.open()
    yield instance
    await instance.destroy()
    await instance.close()


def edge_keys(prefix: str, task_id: int) -> list[str]:
    return [keys.name_of(kind, prefix, task_id) for kind in ("after", "settled", "dependents")]


async def waiting_for(store: RedisBackend, task_id: int) -> int | None:
    task = await store.get_task(task_id, with_attempts=False)
    assert task is not None
    return task.waiting_for


async def test_a_task_nothing_depends_on_writes_no_dependency_key(
    store: RedisBackend, raw: aioredis.Redis
) -> None:
    [plain] = await enqueue(store, new())
    [claimed] = await claim(store, at=later(1))
    await store.finish(FinishParams("w1", [success(claimed.token)], now=later(2)))
    fields = await raw.hgetall(keys.task(store.prefix, plain))
    assert not {"waiting_for", "after_policy", "receives", "dependents"} & set(fields)
    assert await raw.exists(*edge_keys(store.prefix, plain)) == 0


async def test_edges_are_stored_in_order_and_a_deleted_dependent_drops_them(
    store: RedisBackend, raw: aioredis.Redis
) -> None:
    [a, b] = await enqueue(store, new(), new())
    [d] = await enqueue(store, replace(new(), after=(b, a, b), after_policy="run"))
    prefix = store.prefix
    assert await raw.lrange(keys.name_of("after", prefix, d), 0, -1) == [str(b), str(a), str(b)]
    assert await raw.zrange(keys.name_of("dependents", prefix, b), 0, -1) == [f"{d}:0", f"{d}:2"]
    assert await raw.zrange(keys.name_of("dependents", prefix, a), 0, -1) == [f"{d}:1"]
    assert await raw.hget(keys.task(prefix, a), "dependents") == "1"
    assert await waiting_for(store, d) == 3
    assert await store.cancel(b, now=later(1)) is TaskState.CANCELLED
    # b's end counts in both of its edges (policy run).
    assert await raw.smembers(keys.name_of("settled", prefix, d)) == {"0", "2"}
    assert await waiting_for(store, d) == 1
    assert await store.cancel(d, now=later(2)) is TaskState.CANCELLED
    await store.delete(d)
    assert await raw.exists(*edge_keys(prefix, d)) == 0
    assert await raw.zrange(keys.name_of("dependents", prefix, b), 0, -1) == []


async def test_a_long_chain_ends_in_one_script_without_recursion(store: RedisBackend) -> None:
    """Each link's end ends the next by its policy: a worklist, so that a
    chain far longer than Lua's nesting limit ends whole in one finish."""
    links = 10_000
    ids = await store.enqueue(
        EnqueueParams(
            tasks=[
                new(max_attempts=1),
                *(replace(new(), after=(earlier(i),)) for i in range(links - 1)),
            ],
            now=T0,
        )
    )
    [head] = await claim(store, at=later(1))
    failed = Completion(head.token, Outcome.FAILED, TaskState.FAILED, error=ErrorInfo("E", "no"))
    assert (await store.finish(FinishParams("w1", [failed], now=later(2)))).applied
    last = await store.get_task(ids[-1], with_attempts=False)
    assert last is not None and last.state is TaskState.CANCELLED
    assert last.finished_at == later(2)


async def test_a_released_dependent_wakes_its_queue(
    store: RedisBackend, raw: aioredis.Redis
) -> None:
    [a] = await enqueue(store, new())
    [d] = await enqueue(store, replace(new(queue="later"), after=(a,)))
    pubsub = raw.pubsub()
    await pubsub.subscribe(keys.wake_channel(store.prefix))
    try:
        await pubsub.get_message(timeout=1)  # the subscription's confirmation
        [claimed] = await claim(store, at=later(1))
        await store.finish(FinishParams("w1", [success(claimed.token)], now=later(2)))
        heard = []
        for _ in range(10):
            message = await pubsub.get_message(ignore_subscribe_messages=True, timeout=0.5)
            if message is not None:
                heard.append(message["data"])
            if "later" in heard:
                break
            await asyncio.sleep(0)
        assert "later" in heard
    finally:
        await pubsub.aclose()
    task = await store.get_task(d, with_attempts=False)
    assert task is not None and (task.state, task.run_at) == (TaskState.PENDING, later(2))
