"""A worker whose connections are cut or black-holed (through ``tools/proxy.py``).

The worker runs against ``conveyor.App(proxy.url)``: its pool, its heartbeat
and its wake-up listener all go through the proxy. The test itself enqueues
and inspects through the ``app`` fixture, connected directly, so it keeps
seeing the database whatever the proxy does.
"""

from __future__ import annotations

import asyncio
import logging
import time
from collections import Counter
from collections.abc import Callable, Iterator
from typing import Any

import psycopg
import pytest

import conveyor
from conveyor import Outcome, RetryPolicy, TaskContext, TaskState
from conveyor.backends.params import HeartbeatParams, HeartbeatResult
from conveyor.model import LeaseToken
from conveyor.worker.heartbeat import Heartbeat, HeartbeatConfig
from tests.worker.helpers import RunningWorker, wait_for, wait_terminal
from tools.proxy import Proxy

pytestmark = pytest.mark.slow

TASKS = 200
SLOTS = 3
"""At most SLOTS / 20 ms = 150 tasks a second: the cuts land mid-drain."""
CUTS = 3
CUT_GAP = 0.5
CUT_LEASE = 2.0
BLACKHOLE_LEASE = 1.5
BLACKHOLE = 4.0
"""Seconds the network swallows everything: well past the lease."""
STRANDED_DEADLINE = 30.0
"""Generous: each statement stuck in a stranded connection (a claim, an
completion, a reclaim's claim) costs its bound (the lease) and then up to 10 s
of psycopg giving up on the query it cancels; about 13 s here."""


@pytest.fixture
def proxied(schema: str, proxy: Proxy) -> Iterator[conveyor.App]:
    """The same schema as ``app``, every connection through the proxy."""
    application = conveyor.App(proxy.url, schema=schema)
    yield application
    application.close()


def _register(fn: Callable[..., Any], *apps: conveyor.App, **options: Any) -> None:
    """The same handler on both apps: one enqueues and inspects, one runs it."""
    for each in apps:
        each.task(name=fn.__name__, **options)(fn)


def _outcomes(task: conveyor.Task) -> list[Outcome]:
    assert [a.number for a in task.attempts] == list(range(1, len(task.attempts) + 1))
    return [a.outcome for a in task.attempts]


async def test_worker_drains_the_queue_while_every_connection_is_cut(
    app: conveyor.App, proxied: conveyor.App, proxy: Proxy
) -> None:
    runs: Counter[int] = Counter()
    done: set[int] = set()

    async def sleepy(n: int) -> int:
        runs[n] += 1
        await asyncio.sleep(0.02)
        done.add(n)
        return n

    _register(sleepy, app, proxied)

    async def draining() -> bool:
        return len(done) >= 10

    async with app:
        handles = await app.enqueue_many_async("sleepy", [{"n": n} for n in range(TASKS)])
        ids = [h.id for h in handles]
        runner = RunningWorker(proxied, lease=CUT_LEASE, poll_interval=0.1, concurrency=SLOTS)
        async with runner as worker:
            await wait_for(draining, timeout=10)
            accepted = proxy.accepted
            cut = []
            for i in range(CUTS):
                if i:
                    await asyncio.sleep(CUT_GAP)
                cut.append(proxy.cut())
            done_at_last_cut = len(done)
            tasks = await wait_terminal(app, ids, timeout=30)

            assert runner._task is not None and not runner._task.done(), "the worker died"
            late = await app.enqueue_async("sleepy", {"n": TASKS})
            [late_task] = await wait_terminal(app, [late.id], timeout=10)
            assert not runner._task.done()
            print(
                f"cut {cut} connections; {done_at_last_cut} done at the last cut; "
                f"{proxy.accepted} connections accepted; {worker.claims_made} claims; "
                f"{sum(runs.values()) - len(runs)} handler reruns"
            )

    assert all(cut), f"a cut found no connection to cut: {cut}"
    assert done_at_last_cut < TASKS, "the queue was drained before the last cut"
    assert proxy.accepted > accepted, "the worker never reconnected"
    assert late_task.state is TaskState.SUCCEEDED
    for task in tasks:
        outcomes = _outcomes(task)
        assert task.state is TaskState.SUCCEEDED, (task.id, outcomes)
        assert task.result == task.payload["n"]
        assert outcomes.count(Outcome.SUCCEEDED) == 1, (task.id, outcomes)
        assert set(outcomes) - {Outcome.SUCCEEDED} <= {Outcome.LEASE_LOST}, (task.id, outcomes)
    assert set(runs) == set(range(TASKS + 1))


async def _lease_expired(app: conveyor.App, schema: str, task_id: int) -> bool:
    """Whether the database (asked directly) holds the task's lease as expired."""
    backend = await app.backend()
    async with backend.pool.connection() as conn:  # type: ignore[attr-defined]
        cursor = await conn.execute(
            psycopg.sql.SQL(
                "select lease_expires_at <= statement_timestamp() from {} where id = %s"
            ).format(psycopg.sql.Identifier(schema, "tasks")),
            (task_id,),
        )
        row = await cursor.fetchone()
    return bool(row and row[0])


async def test_blackhole_longer_than_the_lease_self_fences_then_the_task_is_reclaimed(
    app: conveyor.App, proxied: conveyor.App, proxy: Proxy, schema: str
) -> None:
    started = asyncio.Event()
    cancelled: list[int] = []

    async def long_job(ctx: TaskContext) -> int:
        if ctx.attempt == 1:
            started.set()
            try:
                await asyncio.sleep(60)
            except asyncio.CancelledError:
                cancelled.append(ctx.attempt)
                raise
        return ctx.attempt

    _register(long_job, app, proxied)

    async def fenced() -> bool:
        return bool(cancelled)

    async with app:
        handle = await app.enqueue_async("long_job")
        runner = RunningWorker(proxied, lease=BLACKHOLE_LEASE, poll_interval=0.1)
        async with runner as worker:
            loop = asyncio.get_running_loop()
            await asyncio.wait_for(started.wait(), 10)
            assert worker.heartbeat is not None
            beats = worker.heartbeat.beats
            await wait_for(lambda: _beaten(worker, beats), timeout=10)  # the lease is renewed
            proxy.blackhole()
            try:
                began = loop.time()
                # The worker gives the lease up on its own: nothing reaches the database.
                await wait_for(fenced, timeout=BLACKHOLE_LEASE + 2.0)
                await wait_for(lambda: _idle(worker), timeout=5)  # its slot is free
                # The database, asked directly, lets the lease run out: no one else
                # could have taken the task while the handler was still running.
                await wait_for(lambda: _lease_expired(app, schema, handle.id), timeout=10)
                stale = await handle.get_async()
                assert (stale.state, stale.attempt) == (TaskState.IN_PROGRESS, 1)
                await asyncio.sleep(max(0.0, began + BLACKHOLE - loop.time()))
            finally:
                proxy.restore()
            [task] = await wait_terminal(app, [handle.id], timeout=15)
            assert runner._task is not None and not runner._task.done(), "the worker died"

    assert cancelled == [1]
    assert task.state is TaskState.SUCCEEDED
    outcomes = _outcomes(task)
    # Usually [lease_lost, succeeded]; a claim held back by the black hole and
    # delivered at its end may also take the task and go unanswered, costing
    # one more lease.
    assert outcomes[0] is Outcome.LEASE_LOST, outcomes
    assert outcomes[-1] is Outcome.SUCCEEDED, outcomes
    assert set(outcomes[1:-1]) <= {Outcome.LEASE_LOST}, outcomes
    assert task.result == len(outcomes)
    assert {a.worker_id for a in task.attempts} == {worker.id}


async def _beaten(worker: conveyor.Worker, beats: int) -> bool:
    return worker.heartbeat is not None and worker.heartbeat.beats > beats


async def _idle(worker: conveyor.Worker) -> bool:
    return worker.running == []


async def test_a_success_whose_commit_is_cut_off_is_not_charged_to_the_handler(
    app: conveyor.App, proxied: conveyor.App, proxy: Proxy, schema: str
) -> None:
    table = psycopg.sql.Identifier(schema, "effects")

    async def charge(ctx: TaskContext, order: int) -> int:
        conn = await ctx.transaction()
        await conn.execute(psycopg.sql.SQL("insert into {} values (%s)").format(table), (order,))
        if ctx.attempt == 1:
            proxy.cut()  # the handler is done; its success has not committed yet
        return ctx.attempt

    retry = RetryPolicy(max_attempts=2, initial_interval=0.01, max_interval=0.01, jitter=0)
    _register(charge, app, proxied, retry=retry)
    async with app:
        backend = await app.backend()
        async with backend.pool.connection() as conn:  # type: ignore[attr-defined]
            await conn.execute(psycopg.sql.SQL("create table {} (order_id int)").format(table))
        handle = await app.enqueue_async("charge", {"order": 7})
        async with RunningWorker(proxied, lease=1.0, poll_interval=0.1):
            [task] = await wait_terminal(app, [handle.id], timeout=15)
        async with backend.pool.connection() as conn:  # type: ignore[attr-defined]
            cursor = await conn.execute(psycopg.sql.SQL("select order_id from {}").format(table))
            rows = await cursor.fetchall()
    assert task.state is TaskState.SUCCEEDED, task.attempts
    assert rows == [(7,)]  # the first attempt's insert rolled back with its lost commit
    # Nothing the handler did failed: the database connection went away. The
    # attempt must not count as the handler's failure (with max_attempts=1 the
    # task would end failed although its handler succeeded).
    first = task.attempts[0]
    assert first.outcome in {Outcome.INTERRUPTED, Outcome.LEASE_LOST}, (
        first.outcome,
        first.error_type,
    )


async def test_a_stranded_connection_does_not_stall_the_claim_loop(
    app: conveyor.App, proxied: conveyor.App, proxy: Proxy, caplog: pytest.LogCaptureFixture
) -> None:
    async def quick(n: int) -> int:
        return n

    _register(quick, app, proxied)
    async with app:
        first = await app.enqueue_async("quick", {"n": 1})
        async with RunningWorker(proxied, lease=1.5, poll_interval=0.1):
            await wait_terminal(app, [first.id], timeout=10)
            # A failover, or a middlebox that forgot the worker's connections:
            # silence without a reset, while new connections go through.
            assert proxy.strand()
            try:
                with caplog.at_level(logging.WARNING, logger="conveyor.worker"):
                    second = await app.enqueue_async("quick", {"n": 2})
                    [task] = await wait_terminal(app, [second.id], timeout=STRANDED_DEADLINE)
            finally:
                proxy.cut()  # release what is stuck, so the worker can stop
    assert task.state is TaskState.SUCCEEDED
    # The claim stuck on the stranded connection timed out, and says so.
    failed = [
        r.getMessage()
        for r in caplog.records
        if r.getMessage().startswith("store unreachable (claim)")
    ]
    assert failed, "no claim timed out on the stranded connection"
    assert any("no answer in time (TimeoutError)" in m for m in failed), failed


class _SwallowedBackend:
    """A backend whose renewals go into a connection that swallows packets."""

    async def heartbeat(self, params: HeartbeatParams) -> HeartbeatResult:
        await asyncio.sleep(60)
        raise AssertionError("unreachable")


async def test_a_renewal_swallowed_by_the_network_is_logged_with_a_reason(
    caplog: pytest.LogCaptureFixture,
) -> None:
    backend: Any = _SwallowedBackend()
    beat = Heartbeat(HeartbeatConfig("w", lease=0.6), lambda: backend, lambda _: None)
    beat.hold(LeaseToken(1, 1, "w"), 0.6, sent_at=time.monotonic())
    with caplog.at_level(logging.WARNING, logger="conveyor.worker"):
        assert await beat.run_once(backend) is None  # bounded by the interval (0.2 s)
    [failed] = [r.getMessage() for r in caplog.records if "(heartbeat)" in r.getMessage()]
    assert failed.startswith("store unreachable (heartbeat): no answer in time (TimeoutError)")


STOP_BOUND = 60.0
"""Seconds a worker may take to stop with every connection stranded: each
statement of its shutdown is bounded by the lease, then psycopg gives up the
query it cancels (up to 10 s); far below forever."""


async def test_a_worker_stops_while_its_connections_are_stranded(
    app: conveyor.App, proxied: conveyor.App, proxy: Proxy
) -> None:
    async def quick(n: int) -> int:
        return n

    _register(quick, app, proxied)
    async with app:
        first = await app.enqueue_async("quick", {"n": 1})
        worker = proxied.worker(lease=1.5, poll_interval=0.1, handle_signals=False)
        running = asyncio.create_task(worker.run())
        try:
            await wait_terminal(app, [first.id], timeout=10)
            assert proxy.strand()  # the pool's idle connections too: its shutdown writes on them
            worker.request_stop()
            done, _ = await asyncio.wait([running], timeout=STOP_BOUND)
            assert done, "the worker never stopped with its connections stranded"
        finally:
            proxy.cut()
            await asyncio.wait([running], timeout=30)
    running.result()
