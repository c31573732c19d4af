"""Attempt transactions and transactional enqueue on PostgreSQL.

A handler's writes through ``ctx.transaction()`` commit with its success and
roll back when its lease is lost; a failed COMMIT fails the attempt; two
concurrent calls share one transaction; a slow COMMIT holds back no other
lease; an abandoned thread handler commits nothing. An enqueue on the
caller's connection exists only if the caller commits. Transactional
enqueue on every backend that offers it is in
tests/conformance/test_transactional_enqueue.py. Each case runs on
PostgreSQL directly and through PgBouncer in transaction mode.
"""

from __future__ import annotations

import asyncio
import threading
import time
from collections.abc import Iterator
from dataclasses import dataclass

import psycopg
import pytest

import conveyor
from conveyor import Outcome, RetryPolicy, TaskContext, TaskState
from tests.conftest import PG_URL, bouncer_url
from tests.worker.helpers import RunningWorker, listening, run_all, steal, wait_for, wait_terminal

FAST = RetryPolicy(max_attempts=3, initial_interval=0.01, max_interval=0.01, jitter=0)


@pytest.fixture(params=["postgres", "pgbouncer"])
def app(request: pytest.FixtureRequest, schema: str) -> Iterator[conveyor.App]:
    """An App on PostgreSQL, directly or through PgBouncer in transaction mode."""
    url = PG_URL if request.param == "postgres" else bouncer_url()
    application = conveyor.App(url, schema=schema)
    yield application
    application.close()


def _table(schema: str, name: str) -> psycopg.sql.Composed:
    return psycopg.sql.SQL("{}").format(psycopg.sql.Identifier(schema, name))


async def _execute(app: conveyor.App, statement: psycopg.sql.Composable, *args: object) -> list:
    backend = await app.backend()
    async with backend.pool.connection() as conn:  # type: ignore[attr-defined]
        cursor = await conn.execute(statement, args or None)
        return await cursor.fetchall() if cursor.description else []


async def test_transactional_handler_commits_with_success(app: conveyor.App, schema: str) -> None:
    table = psycopg.sql.Identifier(schema, "effects")

    @app.task()
    async def charge(ctx: TaskContext, order: int) -> str:
        conn = await ctx.transaction()
        await conn.execute(psycopg.sql.SQL("insert into {} values (%s)").format(table), (order,))
        return "charged"

    async with app:
        backend = await app.backend()
        async with backend.pool.connection() as conn:  # type: ignore[attr-defined]
            await conn.execute(psycopg.sql.SQL("create table {} (order_id int)").format(table))
        [task] = await run_all(app, [await charge.enqueue_async(order=7)])
        async with backend.pool.connection() as conn:  # type: ignore[attr-defined]
            rows = await (
                await conn.execute(psycopg.sql.SQL("select order_id from {}").format(table))
            ).fetchall()
    assert task.state is TaskState.SUCCEEDED
    assert rows == [(7,)]


async def test_transactional_handler_writes_roll_back_when_the_lease_is_lost(
    app: conveyor.App, schema: str
) -> None:
    table = psycopg.sql.Identifier(schema, "effects")
    wrote = asyncio.Event()
    release = asyncio.Event()

    @app.task()
    async def charge(ctx: TaskContext, order: int) -> str:
        conn = await ctx.transaction()
        await conn.execute(psycopg.sql.SQL("insert into {} values (%s)").format(table), (order,))
        wrote.set()
        await release.wait()  # shielded from nothing: the worker will cancel us
        return "charged"

    async with app:
        backend = await app.backend()
        async with backend.pool.connection() as conn:  # type: ignore[attr-defined]
            await conn.execute(psycopg.sql.SQL("create table {} (order_id int)").format(table))
        handle = await charge.enqueue_async(order=7)
        async with RunningWorker(app, lease=1.0, poll_interval=30) as worker:
            await asyncio.wait_for(wrote.wait(), 10)
            await wait_for(lambda: listening(worker), timeout=10)
            await steal(app, handle.id, "thief")
            await wait_for(lambda: _no_running(worker), timeout=5)
        async with backend.pool.connection() as conn:  # type: ignore[attr-defined]
            rows = await (
                await conn.execute(psycopg.sql.SQL("select order_id from {}").format(table))
            ).fetchall()
        task = await handle.get_async()
    assert rows == []
    assert task.worker_id == "thief"
    assert task.attempts[0].outcome is Outcome.LEASE_LOST


async def test_transactional_enqueue_exists_only_if_committed(
    app: conveyor.App, pg_url: str
) -> None:
    @app.task()
    async def noop() -> None:
        return None

    async with app:
        await app.backend()  # migrate
        async with await psycopg.AsyncConnection.connect(pg_url) as conn:
            rolled_back = await app.enqueue_async(noop, connection=conn)
            await conn.rollback()
            committed = await app.enqueue_async(noop, connection=conn)
            await conn.commit()
        assert await app.get_async(rolled_back.id) is None
        assert await app.get_async(committed.id) is not None

    with psycopg.connect(pg_url) as sync_conn:
        gone = app.enqueue(noop, connection=sync_conn)
        sync_conn.rollback()
        kept = app.enqueue(noop, connection=sync_conn)
        sync_conn.commit()
    assert app.get(gone.id) is None
    assert app.get(kept.id) is not None


async def test_sync_handler_transaction_commits_on_success_and_rolls_back_on_failure(
    app: conveyor.App, schema: str
) -> None:
    table = psycopg.sql.Identifier(schema, "effects")

    @app.task(retry=RetryPolicy(max_attempts=1))
    def record(ctx: TaskContext, order: int, fail: bool) -> int:
        conn = ctx.transaction_sync()
        conn.execute(psycopg.sql.SQL("insert into {} values (%s)").format(table), (order,))
        if fail:
            raise RuntimeError("after writing")
        return order

    async with app:
        backend = await app.backend()
        async with backend.pool.connection() as conn:  # type: ignore[attr-defined]
            await conn.execute(psycopg.sql.SQL("create table {} (order_id int)").format(table))
        ok = await record.enqueue_async(order=1, fail=False)
        bad = await record.enqueue_async(order=2, fail=True)
        done, failed = await run_all(app, [ok, bad])
        async with backend.pool.connection() as conn:  # type: ignore[attr-defined]
            rows = await (
                await conn.execute(psycopg.sql.SQL("select order_id from {}").format(table))
            ).fetchall()
    assert done.state is TaskState.SUCCEEDED
    assert failed.state is TaskState.FAILED
    assert rows == [(1,)]


async def _no_running(worker: conveyor.Worker) -> bool:
    return worker.running == []


async def test_a_step_s_writes_commit_with_its_transition(app: conveyor.App, schema: str) -> None:
    table = psycopg.sql.Identifier(schema, "effects")
    flow = app.workflow("payment")

    @flow.step
    @dataclass
    class Pay:
        order: int

        async def run(self, ctx: TaskContext) -> conveyor.Next:
            conn = await ctx.transaction()
            insert = psycopg.sql.SQL("insert into {} values (%s)").format(table)
            await conn.execute(insert, (self.order,))
            return conveyor.next(Receipt(self.order))

    @flow.step
    @dataclass
    class Receipt:
        order: int

        async def run(self, ctx: TaskContext) -> conveyor.Done:
            conn = await ctx.transaction()
            select = psycopg.sql.SQL("select count(*) from {}").format(table)
            [(count,)] = await (await conn.execute(select)).fetchall()
            return conveyor.done(count)

    async with app:
        backend = await app.backend()
        async with backend.pool.connection() as conn:  # type: ignore[attr-defined]
            await conn.execute(psycopg.sql.SQL("create table {} (order_id int)").format(table))
        [task] = await run_all(app, [await flow.start_async(Pay(order=3))])
    assert task.state is TaskState.SUCCEEDED
    assert task.result == 1  # the second step saw the first step's committed write
    assert [a.step for a in task.attempts] == ["Pay", "Receipt"]


# The attempt transaction's COMMIT can fail (deferred constraint, serialization
# failure, connection drop). The error once escaped RunningAttempt.run and the
# worker dropped the attempt: no outcome recorded, attempt row left
# in_progress, lease no longer renewed, task stuck until the lease expired and
# then counted as a crash (lease_lost) instead of a failed attempt with the
# handler's error.


async def test_commit_failure_of_the_attempt_transaction_fails_the_attempt(
    app: conveyor.App, schema: str
) -> None:
    effects = _table(schema, "effects")
    ran = asyncio.Event()

    @app.task(retry=FAST)
    async def charge(ctx: TaskContext) -> str:
        conn = await ctx.transaction()
        # Valid until commit: the deferred unique check fails at COMMIT time.
        await conn.execute(psycopg.sql.SQL("insert into {} values (1), (1)").format(effects))
        ran.set()
        return "charged"

    async with app:
        await _execute(
            app,
            psycopg.sql.SQL("create table {} (id int unique deferrable initially deferred)").format(
                effects
            ),
        )
        handle = await charge.enqueue_async()
        async with RunningWorker(app) as worker:
            await asyncio.wait_for(ran.wait(), 10)

            async def settled() -> bool:
                return worker.running == [] and worker.heartbeat_held() == set()

            await wait_for(settled, timeout=5)
            task = await handle.get_async()
    first = task.attempts[0]
    # Expected: a failed attempt carrying the UniqueViolation, then a retry.
    assert first.outcome is Outcome.FAILED, (
        f"attempt 1 is {first.outcome.value} with no error while the task is "
        f"{task.state.value} and nobody renews its lease"
    )
    assert first.error_type is not None and "UniqueViolation" in first.error_type


# Two concurrent ctx.transaction() calls once opened two transactions; one was
# silently dropped: its writes never committed and its pooled connection
# leaked idle-in-transaction (holding its locks) for the life of the worker.


async def test_concurrent_transaction_calls_share_one_transaction(
    app: conveyor.App, schema: str
) -> None:
    effects = _table(schema, "effects")
    opened: list[psycopg.AsyncConnection] = []

    @app.task()
    async def two_writers(ctx: TaskContext) -> bool:
        async def write(value: int) -> psycopg.AsyncConnection:
            conn = await ctx.transaction()
            await conn.execute(
                psycopg.sql.SQL("insert into {} values (%s)").format(effects), (value,)
            )
            return conn

        first, second = await asyncio.gather(write(1), write(2))
        opened.extend([first, second])
        return first is second

    async with app:
        await _execute(app, psycopg.sql.SQL("create table {} (id int)").format(effects))
        handle = await two_writers.enqueue_async()
        try:
            async with RunningWorker(app):
                [task] = await wait_terminal(app, [handle.id], timeout=10)
            rows = await _execute(
                app, psycopg.sql.SQL("select id from {} order by id").format(effects)
            )
        finally:
            for conn in opened:  # the leaked one holds a lock on the table: free it
                if not conn.closed:
                    await conn.close()
    assert task.state is TaskState.SUCCEEDED
    # Expected: one shared transaction, both writes committed with the success.
    # Actual: two transactions; only the one stored last is committed.
    assert (task.result, rows) == (True, [(1,), (2,)])


# One attempt's slow COMMIT (deferred constraint check, synchronous
# replication, a deferred trigger...) holds its task row locked after the
# fenced finish; the worker's single batched heartbeat statement once blocked
# on that row, so *every other* lease of the worker went unrenewed and was
# self-fenced: healthy handlers were killed and their attempts burned.


async def test_slow_commit_of_one_attempt_does_not_fence_the_others(
    app: conveyor.App, schema: str
) -> None:
    effects = _table(schema, "effects")
    slow = psycopg.sql.Identifier(schema, "slow_commit")
    bystander_started = asyncio.Event()

    @app.task()
    async def committer(ctx: TaskContext) -> str:
        await bystander_started.wait()
        conn = await ctx.transaction()
        await conn.execute(psycopg.sql.SQL("insert into {} values (1)").format(effects))
        return "committed"

    @app.task(retry=RetryPolicy(max_attempts=1))
    async def bystander() -> str:
        bystander_started.set()
        await asyncio.sleep(1.3)
        return "done"

    async with app:
        await _execute(app, psycopg.sql.SQL("create table {} (id int)").format(effects))
        await _execute(
            app,
            psycopg.sql.SQL(
                "create function {}() returns trigger language plpgsql as "
                "$$ begin perform pg_sleep(1.5); return null; end $$"
            ).format(slow),
        )
        await _execute(
            app,
            psycopg.sql.SQL(
                "create constraint trigger slow_commit after insert on {} "
                "deferrable initially deferred for each row execute function {}()"
            ).format(effects, slow),
        )
        other = await bystander.enqueue_async()
        first = await committer.enqueue_async()
        async with RunningWorker(app, lease=1.0, concurrency=2):
            tasks = await wait_terminal(app, [first.id, other.id], timeout=8)
    outcomes = {t.name: [(a.number, a.outcome.value) for a in t.attempts] for t in tasks}
    assert outcomes == {
        "committer": [(1, "succeeded")],
        "bystander": [(1, "succeeded")],
    }


# At shutdown a thread handler that does not stop was once abandoned; its
# attempt transaction was rolled back and its connection returned to the sync
# pool while the thread still used it. The connection was in autocommit mode
# after the rollback, so every later write of the handler committed on its
# own: the task was released as `interrupted` (it would run again) with
# effects already committed. Now a shutdown waits `stop_timeout` for such a
# handler and, if it still runs, leaves its task in progress until its lease
# expires: it is never released while it may run.


async def test_abandoned_thread_handler_commits_nothing(app: conveyor.App, schema: str) -> None:
    effects = _table(schema, "effects")
    insert = psycopg.sql.SQL("insert into {} values (%s)").format(effects)
    started = threading.Event()
    refused = threading.Event()

    @app.task()
    def batch(ctx: TaskContext) -> str:
        conn = ctx.transaction_sync()
        conn.execute(insert, (0,))
        started.set()
        ctx.wait_for_stop(10)  # it hears the order to stop, and writes on regardless
        deadline = time.monotonic() + 10
        while time.monotonic() < deadline:
            try:
                conn.execute(insert, (1,))
            except psycopg.Error:
                refused.set()  # the worker gave up on it and ended its session
                break
            time.sleep(0.01)
        return "done"

    async with app:
        await _execute(app, psycopg.sql.SQL("create table {} (id int)").format(effects))
        handle = await batch.enqueue_async()
        async with RunningWorker(app, grace=0, stop_timeout=0.5):
            assert await asyncio.to_thread(started.wait, 10)
        assert await asyncio.to_thread(refused.wait, 10)
        task = await handle.get_async()
        rows = await _execute(app, psycopg.sql.SQL("select count(*) from {}").format(effects))
    # Given up, not released: it stays in progress until its lease expires.
    assert task.state is TaskState.IN_PROGRESS
    assert task.attempts[0].outcome is Outcome.IN_PROGRESS
    assert rows == [(0,)], f"{rows[0][0]} writes of an abandoned attempt were committed"
