"""A busy inbox on PostgreSQL: sends in flight never hold back their
recipient's claim or renewal, and still never strand a message.

An outside send stays open for a moment (its transaction stores the
message, then commits). While it does, the recipient must stay claimable
and its lease renewable: claims and renewals skip rows they cannot lock,
so a send that locked the recipient's row (FOR UPDATE, or the key-share
lock of the message's foreign key against a claim's FOR UPDATE) kept a
receiver under steady sends from being polled for seconds. The completion of
the recipient's poll must still wait for such a send, or the message could
land after the completion looked for it and before the task suspended.
"""

from __future__ import annotations

import asyncio
from collections.abc import AsyncIterator

import psycopg
import pytest

from conveyor import payload as codec
from conveyor.backends.params import Delivery, FinishParams, HeartbeatParams, SendParams
from conveyor.backends.postgres import PostgresBackend
from conveyor.backends.postgres.messages import finish_with_effects
from conveyor.model import TaskState
from tests.conformance.test_inboxes import NAMES, coroutine, rest
from tests.conformance.test_tasks import LEASE, claim, enqueue, later


@pytest.fixture
async def open_send(backend: PostgresBackend) -> AsyncIterator[psycopg.AsyncConnection[object]]:
    """A connection whose transaction sends and is left open until the test commits."""
    async with await psycopg.AsyncConnection.connect(backend.url) as conn:
        yield conn


async def _send_open(
    backend: PostgresBackend, conn: psycopg.AsyncConnection[object], task_id: int
) -> None:
    # At the tests' clock: the recipient is due already, so nothing wakes it
    # (a wake-up of a waiting task is a row update, held until the commit).
    params = SendParams([Delivery(task_id, codec.encode({"n": 1}))], now=later(1))
    await backend.send_in(params, conn)


async def test_a_send_in_flight_does_not_keep_its_recipient_from_being_claimed(
    backend: PostgresBackend, open_send: psycopg.AsyncConnection[object]
) -> None:
    [task_id] = await enqueue(backend, coroutine({}, message={"first": True}))
    await _send_open(backend, open_send, task_id)  # uncommitted
    [claimed] = await claim(backend, names=NAMES, at=later(1))
    assert claimed.token.task_id == task_id
    await open_send.commit()


async def test_a_send_in_flight_does_not_keep_its_recipient_s_lease_from_renewal(
    backend: PostgresBackend, open_send: psycopg.AsyncConnection[object]
) -> None:
    [task_id] = await enqueue(backend, coroutine({}, message={"first": True}))
    [claimed] = await claim(backend, names=NAMES, at=later(1))
    await _send_open(backend, open_send, task_id)
    beat = await backend.heartbeat(
        HeartbeatParams("w1", [claimed.token], lease=LEASE, now=later(2))
    )
    assert beat.renewed == {claimed.token}
    await open_send.commit()


async def test_a_poll_ending_waits_for_a_send_in_flight_and_then_sees_it(
    backend: PostgresBackend, open_send: psycopg.AsyncConnection[object]
) -> None:
    [task_id] = await enqueue(backend, coroutine({}, message={"first": True}))
    [polled] = await claim(backend, names=NAMES, at=later(1))
    [first] = await backend.inbox(task_id)
    await _send_open(backend, open_send, task_id)
    suspend = rest(polled, {"seen": 1}, consumed=(first.id,))
    completion = asyncio.ensure_future(backend.finish(FinishParams("w1", [suspend], now=later(2))))
    await asyncio.sleep(0.3)
    assert not completion.done()  # it waits for the send under way
    await open_send.commit()
    result = await asyncio.wait_for(completion, 10)
    assert result.applied == {polled.token}
    task = await backend.get_task(task_id)
    assert task is not None
    # It suspended, but the message that came during its poll made it due again.
    assert task.state is TaskState.PENDING
    assert [m.body for m in await backend.inbox(task_id)] == [{"n": 1}]


async def test_a_send_waits_for_a_poll_ending_under_way_and_then_wakes_the_task(
    backend: PostgresBackend,
) -> None:
    """The other order: the completion holds its locks first; the send waits, then
    finds the task waiting and wakes it."""
    [task_id] = await enqueue(backend, coroutine({}, message={"first": True}))
    [polled] = await claim(backend, names=NAMES, at=later(1))
    [first] = await backend.inbox(task_id)
    suspend = rest(polled, {}, consumed=(first.id,))
    async with await psycopg.AsyncConnection.connect(backend.url) as ender:
        async with ender.transaction():
            done = await finish_with_effects(ender, backend.sql, "w1", [suspend], later(2))
            assert done == {(task_id, polled.token.attempt)}
            sending = asyncio.ensure_future(
                backend.send(SendParams([Delivery(task_id, codec.encode({"n": 2}))], now=later(3)))
            )
            await asyncio.sleep(0.3)
            assert not sending.done()  # it waits for the completion under way
        await asyncio.wait_for(sending, 10)
    task = await backend.get_task(task_id)
    assert task is not None and task.state is TaskState.PENDING
    assert [m.body for m in await backend.inbox(task_id)] == [{"n": 2}]
