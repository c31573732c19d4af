"""A dependency's end and an enqueue that names it, at the same moment, on
PostgreSQL: whichever commits first, the end is counted once, by one of
them. And a long chain ends in one write, without a recursion of triggers.

The enqueue locks its dependencies' rows before it reads their states and
stores its edges; the end's trigger reads the edges with a snapshot taken
after the row lock it waited for (see settle_ended in migration 0022).
"""

from __future__ import annotations

import asyncio
from dataclasses import replace

import psycopg
from psycopg import sql

from conveyor.backends.params import EnqueueParams, FinishParams, earlier
from conveyor.backends.postgres import PostgresBackend
from conveyor.model import TaskState
from tests.conformance.test_dependencies import after, state
from tests.conformance.test_tasks import T0, claim, enqueue, later, new, success

S = TaskState


async def test_an_end_waiting_on_an_enqueue_s_lock_sees_its_edges(
    backend: PostgresBackend,
) -> None:
    [x] = await enqueue(backend, new())
    [claimed] = await claim(backend, at=later(1))
    connecting = psycopg.AsyncConnection.connect(backend.url)
    async with await connecting as conn, conn.transaction():  # committed as the block ends
        [d] = await backend.enqueue_in(EnqueueParams([after(x)], now=T0), conn)  # X locked
        ending = asyncio.ensure_future(
            backend.finish(FinishParams("w1", [success(claimed.token)], now=later(2)))
        )
        await asyncio.sleep(0.3)
        assert not ending.done()  # the end waits for the enqueue's lock
    assert (await ending).applied
    assert await state(backend, d) == (S.PENDING, 0)


async def test_an_enqueue_waiting_on_an_end_counts_it_itself(backend: PostgresBackend) -> None:
    [x, y] = await enqueue(backend, new(), new())
    table = sql.Identifier(backend.schema, "tasks")
    async with await psycopg.AsyncConnection.connect(backend.url) as conn:
        await conn.execute(
            sql.SQL("update {} set state = 'failed', finished_at = %s where id = %s").format(table),
            (later(1), x),
        )  # ended, not committed: x has no dependent yet, so no trigger runs
        enqueuing = asyncio.ensure_future(
            backend.enqueue(EnqueueParams([after(x, y), after(x, policy="run")], now=later(2)))
        )
        await asyncio.sleep(0.3)
        assert not enqueuing.done()  # the enqueue waits for the end's row lock
        await conn.commit()
    [cancelled, counted] = await enqueuing
    assert (await state(backend, cancelled))[0] is S.CANCELLED
    assert await state(backend, counted) == (S.PENDING, 0)


async def test_ends_and_enqueues_racing_count_every_end_once(backend: PostgresBackend) -> None:
    other = PostgresBackend(backend.url, schema=backend.schema)
    await other.open()
    try:
        for n in range(30):
            [x] = await enqueue(backend, new())
            [claimed] = await claim(backend, f"w{n}", at=later(1))
            ended, [d] = await asyncio.gather(
                backend.finish(FinishParams(f"w{n}", [success(claimed.token)], now=later(2))),
                other.enqueue(EnqueueParams([after(x)], now=later(2))),
            )
            assert ended.applied
            assert await state(backend, d) == (S.PENDING, 0), f"round {n}"
            [taken] = await claim(backend, "drain", at=later(3))
            assert taken.token.task_id == d
            await backend.finish(FinishParams("drain", [success(taken.token)], now=later(3)))
    finally:
        await other.close()


async def test_a_long_chain_is_cancelled_in_one_write(backend: PostgresBackend) -> None:
    links = 2000  # far deeper than a recursion of triggers could go
    tasks = [new(max_attempts=1), *(after(earlier(i)) for i in range(links - 1))]
    ids = await backend.enqueue(EnqueueParams(tasks=tasks, now=T0))
    assert await backend.cancel(ids[0], now=later(1)) is S.CANCELLED
    assert (await state(backend, ids[-1]))[0] is S.CANCELLED
    last = await backend.get_task(ids[-1], with_attempts=False)
    assert last is not None and last.finished_at == later(1)
    [tail] = await backend.enqueue(EnqueueParams([replace(after(ids[-1]), name="job")], now=T0))
    assert (await state(backend, tail))[0] is S.CANCELLED  # ended already: counted at once


async def test_two_dependencies_ending_together_both_count(backend: PostgresBackend) -> None:
    [y, x, d] = await enqueue(backend, new(), new(), after(earlier(0), earlier(1), policy="run"))
    [claimed] = await claim(backend, at=later(1), limit=1)
    token = claimed.token
    assert token.task_id == y
    table = sql.Identifier(backend.schema, "tasks")
    async with await psycopg.AsyncConnection.connect(backend.url) as conn:
        await conn.execute(
            sql.SQL("update {} set state = 'succeeded', finished_at = %s where id = %s").format(
                table
            ),
            (later(2), x),
        )  # x ended, not committed: its trigger holds d's row
        ending = asyncio.ensure_future(
            backend.finish(FinishParams("w1", [success(token)], now=later(2)))
        )
        await asyncio.sleep(0.3)
        assert not ending.done()  # y's end waits for d's row
        await conn.commit()
    assert (await ending).applied
    assert await state(backend, d) == (S.PENDING, 0)


async def test_the_members_of_chords_ending_at_once_release_every_callback(
    backend: PostgresBackend,
) -> None:
    other = PostgresBackend(backend.url, schema=backend.schema)
    await other.open()
    try:
        for n in range(20):
            [x, y, d] = await enqueue(
                backend, new(), new(), after(earlier(0), earlier(1), policy="run")
            )
            claimed = await claim(backend, f"w{n}", at=later(1), limit=2)
            tokens = {c.token.task_id: c.token for c in claimed}
            await asyncio.gather(
                backend.finish(FinishParams(f"w{n}", [success(tokens[x])], now=later(2))),
                other.finish(FinishParams(f"w{n}", [success(tokens[y])], now=later(2))),
            )
            assert await state(backend, d) == (S.PENDING, 0), f"round {n}"
            [taken] = await claim(backend, "drain", at=later(3))
            assert taken.token.task_id == d
            await backend.finish(FinishParams("drain", [success(taken.token)], now=later(3)))
    finally:
        await other.close()
