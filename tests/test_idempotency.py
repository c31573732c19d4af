"""Idempotency keys through the App, on every backend: enqueue, enqueue_many,
workflow and coroutine starts, sends, and transactional enqueues repeated
with their key return what the first call stored."""

from __future__ import annotations

import contextlib
import sqlite3
from collections.abc import Iterator
from dataclasses import dataclass
from typing import Any

import psycopg
import pytest

import conveyor
from conveyor import TaskContext
from conveyor.backends.protocol import Capability
from tests.conftest import PG_URL


@pytest.fixture
def app(any_app: conveyor.App) -> conveyor.App:
    return any_app


def test_every_start_repeated_with_its_key_returns_the_first(app: conveyor.App) -> None:
    @app.task()
    def charge(order: int) -> None:
        return None

    flow = app.workflow("ship")

    @flow.step
    @dataclass
    class Pack:
        order: int

        async def run(self, ctx: TaskContext) -> conveyor.Done:
            return conveyor.done()

    @app.coroutine("chat")
    async def chat(poll: conveyor.Poll) -> conveyor.Suspend:
        return conveyor.suspend()

    first = app.enqueue(charge, {"order": 1}, idempotency_key="charge-1")
    assert app.enqueue(charge, {"order": 1}, idempotency_key="charge-1").id == first.id
    assert app.enqueue(charge, {"order": 1}).id != first.id

    batch = [
        h.id
        for h in app.enqueue_many(charge, [{"order": n} for n in range(3)], idempotency_key="b")
    ]
    again = [
        h.id
        for h in app.enqueue_many(charge, [{"order": n} for n in range(3)], idempotency_key="b")
    ]
    assert batch == again and len(set(batch)) == 3

    started = flow.start(Pack(1), idempotency_key="ship-1")
    assert flow.start(Pack(1), idempotency_key="ship-1").id == started.id

    talk = chat.start({}, message={"hi": 1}, idempotency_key="chat-1")
    assert chat.start({}, message={"hi": 1}, idempotency_key="chat-1").id == talk.id
    assert [m.body for m in app.inbox(talk.id)] == [{"hi": 1}]
    sent = app.send(talk.id, {"n": 2}, idempotency_key="hook-1")
    assert app.send(talk.id, {"n": 2}, idempotency_key="hook-1") == sent
    assert [m.body for m in app.inbox(talk.id)] == [{"hi": 1}, {"n": 2}]
    assert len(app.list_tasks()) == 1 + 1 + 3 + 1 + 1


@pytest.mark.parametrize("key", ["", "x" * 256, "a\x00b", "\udcff", 7])
def test_a_bad_key_is_refused_before_any_io(app: conveyor.App, key: Any) -> None:
    @app.task()
    def job() -> None:
        return None

    with pytest.raises(conveyor.ConfigurationError, match="idempotency key"):
        app.enqueue(job, idempotency_key=key)
    assert app.list_tasks() == []


@contextlib.contextmanager
def own_connection(app: conveyor.App) -> Iterator[Any]:
    if app.url.startswith("sqlite"):
        with contextlib.closing(sqlite3.connect(app.url.removeprefix("sqlite:///"))) as conn:
            yield conn
    else:
        with psycopg.connect(
            PG_URL, options=f"-c search_path={app._backend_options['schema']}"
        ) as conn:
            yield conn


def test_a_transactional_enqueue_repeated_with_its_key_returns_the_first(
    app: conveyor.App,
) -> None:
    @app.task()
    def job(n: int) -> None:
        return None

    if Capability.TRANSACTIONAL_ENQUEUE not in app.make_backend().capabilities:
        pytest.skip("no transactional enqueue on this backend")
    app.migrate()
    ids = []
    for _ in range(2):
        with own_connection(app) as conn:
            ids.append(app.enqueue(job, {"n": 1}, idempotency_key="tx-1", connection=conn).id)
            conn.commit()
    assert ids[0] == ids[1]
    assert len(app.list_tasks()) == 1
