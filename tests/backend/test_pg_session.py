"""The PostgreSQL session connection: LISTEN and the wake-up turns share one
server session per backend; a turn given back reaches its waiters by a
notice; a session lost gives its turn back and its listeners hear every
queue again; notices that arrive while a turn's statement runs are kept."""

from __future__ import annotations

import asyncio
import contextlib
import uuid
from collections.abc import AsyncIterator

import psycopg
import pytest

from conveyor.backends.params import CancelHint, Wakeup
from conveyor.backends.postgres import PostgresBackend, session, statements
from tests.conftest import PG_URL


def _space(schema: str) -> int:
    """The turns' first key as pg_locks shows it (an unsigned oid)."""
    return (statements.lock_space(schema) ^ 2) & 0xFFFFFFFF


def _named(name: str) -> str:
    return f"{PG_URL}{'&' if '?' in PG_URL else '?'}application_name={name}"


async def _sessions(name: str) -> list[int]:
    async with await psycopg.AsyncConnection.connect(PG_URL, autocommit=True) as conn:
        cursor = await conn.execute(
            "select pid from pg_stat_activity where application_name = %s", (name,)
        )
        return [row[0] for row in await cursor.fetchall()]


async def _holders(schema: str) -> list[int]:
    """The server processes holding a wake-up turn of ``schema``."""
    async with await psycopg.AsyncConnection.connect(PG_URL, autocommit=True) as conn:
        cursor = await conn.execute(
            "select pid from pg_locks where locktype = 'advisory' and granted"
            " and classid::bigint = %s and objsubid = 2",
            (_space(schema),),
        )
        return [row[0] for row in await cursor.fetchall()]


@contextlib.asynccontextmanager
async def _listening(
    backend: PostgresBackend, queues: list[str]
) -> AsyncIterator[asyncio.Queue[Wakeup]]:
    heard: asyncio.Queue[Wakeup] = asyncio.Queue()
    wakeups = backend.wakeups(queues)

    async def read() -> None:
        async for wakeup in wakeups:
            heard.put_nowait(wakeup)

    reader = asyncio.get_running_loop().create_task(read())
    try:
        yield heard
    finally:
        reader.cancel()
        with contextlib.suppress(asyncio.CancelledError):
            await reader
        await wakeups.aclose()  # type: ignore[attr-defined]


async def _drain(heard: asyncio.Queue[Wakeup], until: set[str], timeout: float = 10) -> set[str]:
    seen: set[str] = set()
    async with asyncio.timeout(timeout):
        while not until <= seen:
            wakeup = await heard.get()
            if isinstance(wakeup, str):
                seen.add(wakeup)
    return seen


async def test_listening_and_a_turn_share_one_server_session(schema: str) -> None:
    name = f"conveyor-session-{uuid.uuid4().hex[:8]}"
    backend = PostgresBackend(_named(name), schema=schema)
    await backend.open()
    try:
        before = set(await _sessions(name))
        lock = backend.turn_lock("kind")
        async with _listening(backend, ["q"]) as heard:
            await _drain(heard, {"q"})  # connected: every queue is heard once
            await lock.take()
            added = set(await _sessions(name)) - before
            assert len(added) == 1, f"{len(added)} sessions for LISTEN and a turn"
            assert set(await _holders(schema)) == added
            await lock.close()
    finally:
        await backend.close()
    assert await _sessions(name) == []


async def test_a_turn_given_back_reaches_its_waiter_by_a_notice(
    schema: str, monkeypatch: pytest.MonkeyPatch
) -> None:
    # Retries far apart: only the notice of turn_give can wake the waiter.
    monkeypatch.setattr(session, "TURN_RETRY", 600.0)
    first, second = PostgresBackend(PG_URL, schema=schema), PostgresBackend(PG_URL, schema=schema)
    await first.open()
    await second.open()
    holder, waiter = first.turn_lock("kind"), second.turn_lock("kind")
    try:
        await holder.take()
        waiting = asyncio.get_running_loop().create_task(waiter.take())
        await asyncio.sleep(0.3)
        assert not waiting.done()
        await holder.give()
        async with asyncio.timeout(20):
            await waiting
    finally:
        await holder.close()
        await waiter.close()
        await first.close()
        await second.close()


async def test_a_lost_session_gives_its_turn_back_and_its_listeners_hear_every_queue(
    schema: str, monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.setattr(session, "TURN_RETRY", 0.2)
    name = f"conveyor-session-{uuid.uuid4().hex[:8]}"
    first = PostgresBackend(_named(name), schema=schema)
    second = PostgresBackend(PG_URL, schema=schema)
    await first.open()
    await second.open()
    holder, waiter = first.turn_lock("kind"), second.turn_lock("kind")
    try:
        async with _listening(first, ["a", "b"]) as heard:
            await _drain(heard, {"a", "b"})
            await holder.take()
            waiting = asyncio.get_running_loop().create_task(waiter.take())
            [pid] = await _holders(schema)
            assert pid in await _sessions(name)
            async with await psycopg.AsyncConnection.connect(PG_URL, autocommit=True) as other:
                await other.execute("select pg_terminate_backend(%s)", (pid,))
            async with asyncio.timeout(20):
                await waiting  # the lock went with the session, with no notice
            await _drain(heard, {"a", "b"}, timeout=20)  # reconnected: heard again
            await holder.give()  # taken on the lost session: nothing to give
            [now] = await _holders(schema)  # the waiter's, still held
            assert now != pid and now not in await _sessions(name)
    finally:
        await holder.close()
        await waiter.close()
        await first.close()
        await second.close()


async def test_notices_that_arrive_while_turn_statements_run_are_all_heard(schema: str) -> None:
    backend = PostgresBackend(PG_URL, schema=schema)
    await backend.open()
    queues = [f"q{i}" for i in range(60)]
    lock = backend.turn_lock("kind")
    try:
        async with _listening(backend, queues) as heard:
            await _drain(heard, set(queues))
            await _cancel_hint(heard)

            async def turns() -> None:
                for _ in range(60):
                    await lock.take()
                    await lock.give()

            async def notices() -> None:
                async with await psycopg.AsyncConnection.connect(PG_URL, autocommit=True) as conn:
                    for queue in queues:
                        await conn.execute(
                            "select pg_notify(%s, %s)", (statements.channel(schema), queue)
                        )
                        await asyncio.sleep(0.002)

            await asyncio.gather(turns(), notices())
            assert await _drain(heard, set(queues), timeout=20) == set(queues)
    finally:
        await lock.close()
        await backend.close()


async def _cancel_hint(heard: asyncio.Queue[Wakeup]) -> None:
    """Read up to the cancel hint every (re)connect ends with."""
    async with asyncio.timeout(10):
        while not isinstance(await heard.get(), CancelHint):
            pass
