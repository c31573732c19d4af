"""Idempotency keys on every backend: an enqueue or a send repeated with its
key stores nothing more and returns what the first one stored, also when
many callers race with one key.
"""

from __future__ import annotations

import asyncio
from dataclasses import replace
from pathlib import Path

import pytest

from conveyor import payload as codec
from conveyor.backends import backend_from_url
from conveyor.backends.params import Delivery, EnqueueParams, FinishParams, NewTask, SendParams
from conveyor.backends.protocol import Backend
from conveyor.errors import TaskFinishedError
from conveyor.model import TaskState
from conveyor.records import TaskFilter
from tests.conformance.test_inboxes import claim_one, coroutine, rest
from tests.conformance.test_tasks import claim, enqueue, later, new, success
from tests.conftest import backend_url, schema_for


def keyed(key: str | None, name: str = "job", payload: object = None) -> NewTask:
    return replace(new(name, payload=payload), idempotency_key=key)


async def count_tasks(backend: Backend) -> int:
    return len(await backend.list_tasks(TaskFilter(limit=1000)))


async def test_an_enqueue_repeated_with_its_key_returns_the_stored_task(
    backend: Backend,
) -> None:
    [first] = await enqueue(backend, keyed("order-7", payload={"n": 1}))
    [again] = await enqueue(backend, keyed("order-7", payload={"n": 2}))
    assert again == first
    [other_name] = await enqueue(backend, keyed("order-7", name="other"))
    assert other_name != first
    [unkeyed] = await enqueue(backend, keyed(None))
    assert await count_tasks(backend) == 3
    task = await backend.get_task(first)
    assert task is not None
    assert (task.payload, task.idempotency_key) == ({"n": 1}, "order-7")
    assert unkeyed not in (first, other_name)


async def test_a_stored_key_returns_its_task_whatever_its_state(backend: Backend) -> None:
    [task_id] = await enqueue(backend, keyed("once"))
    [claimed] = await claim(backend, limit=1)
    await backend.finish(FinishParams("w1", [success(claimed.token)], now=later(1)))
    [again] = await enqueue(backend, keyed("once"))
    assert again == task_id
    task = await backend.get_task(task_id)
    assert task is not None and task.state is TaskState.SUCCEEDED


async def test_a_batch_mixes_keys_and_repeats_in_order(backend: Backend) -> None:
    [stored] = await enqueue(backend, keyed("b"))
    ids = await enqueue(
        backend,
        keyed("a", payload={"i": 0}),
        keyed(None, payload={"i": 1}),
        keyed("b", payload={"i": 2}),
        keyed("a", payload={"i": 3}),
        keyed(None, payload={"i": 4}),
    )
    assert ids[0] == ids[3]
    assert ids[2] == stored
    assert len({ids[0], ids[1], ids[2], ids[4]}) == 4
    assert ids[1] < ids[4]
    assert await count_tasks(backend) == 4
    first = await backend.get_task(ids[0])
    assert first is not None and first.payload == {"i": 0}


async def test_a_coroutine_started_twice_with_its_key_gets_one_first_message(
    backend: Backend,
) -> None:
    start = replace(coroutine({}, message={"hello": 1}), idempotency_key="conversation-1")
    [task_id] = await backend.enqueue(EnqueueParams(tasks=[start], now=later(0)))
    [again] = await backend.enqueue(EnqueueParams(tasks=[start], now=later(0)))
    assert again == task_id
    assert [m.body for m in await backend.inbox(task_id)] == [{"hello": 1}]


async def send(backend: Backend, task_id: int, body: object, key: str | None) -> int:
    delivery = Delivery(task_id, codec.encode(body), idempotency_key=key)
    [message_id] = await backend.send(SendParams([delivery], now=later(1)))
    return message_id


async def test_a_send_repeated_with_its_key_sends_once_even_after_its_task_ended(
    backend: Backend,
) -> None:
    [task_id] = await enqueue(backend, coroutine({}))
    first = await send(backend, task_id, {"pay": 10}, "webhook-1")
    assert await send(backend, task_id, {"pay": 10}, "webhook-1") == first
    other = await send(backend, task_id, {"pay": 5}, "webhook-2")
    assert other != first
    assert [m.body for m in await backend.inbox(task_id)] == [{"pay": 10}, {"pay": 5}]
    # The poll consumes both and ends the task: the key still answers.
    polled = await claim_one(backend, later(2))
    seen = tuple(m.id for m in await backend.inbox(task_id))
    completion = replace(success(polled.token), effects=rest(polled, {}, consumed=seen).effects)
    assert (await backend.finish(FinishParams("w1", [completion], now=later(3)))).applied
    assert await send(backend, task_id, {"pay": 10}, "webhook-1") == first
    assert await backend.inbox(task_id) == []
    with pytest.raises(TaskFinishedError):
        await send(backend, task_id, {"pay": 1}, "webhook-3")


@pytest.mark.parametrize("kind", ["postgres", "sqlite", "memory", "redis"])
async def test_concurrent_enqueues_of_one_key_store_one_task(
    kind: str, request: pytest.FixtureRequest, tmp_path: Path
) -> None:
    url, options = backend_url(kind, schema_for(kind, request), tmp_path)
    callers = [backend_from_url(url, **options) for _ in range(8)]
    for caller in callers:
        await caller.open()
    try:
        for round_ in range(5):
            task = keyed(f"race-{round_}")
            ids = await asyncio.gather(*(c.enqueue(EnqueueParams(tasks=[task])) for c in callers))
            assert len({task_ids[0] for task_ids in ids}) == 1, ids
        assert await count_tasks(callers[0]) == 5
    finally:
        await callers[0].destroy()
        for caller in callers:
            await caller.close()


async def test_concurrent_sends_of_one_key_send_once(backend: Backend) -> None:
    [task_id] = await enqueue(backend, coroutine({}))
    ids = await asyncio.gather(*(send(backend, task_id, {"n": 1}, "k") for _ in range(8)))
    assert len(set(ids)) == 1
    assert len(await backend.inbox(task_id)) == 1
