"""What only the PostgreSQL backend has: migrations, schema names, row locks.

The common contract is in tests/conformance/, run against every backend.
"""

from __future__ import annotations

import asyncio
import dataclasses
from typing import Any

import psycopg
import pytest

from conveyor.backends import sqlfiles
from conveyor.backends.params import (
    Completion,
    EnqueueParams,
    FinishParams,
    HeartbeatParams,
    NewTask,
)
from conveyor.backends.postgres import PostgresBackend
from conveyor.backends.postgres import statements as pg_statements
from conveyor.errors import BackendError, ConfigurationError
from conveyor.model import Outcome, TaskState
from conveyor.records import PruneParams, PruneResult, TaskFilter
from tests.conformance.test_tasks import LEASE, T0, claim, enqueue, later, new
from tests.conftest import PG_URL


async def test_migrations_are_recorded_and_idempotent(backend: PostgresBackend) -> None:
    assert await backend.migrate() == []
    async with backend.pool.connection() as conn:
        rows = await (
            await conn.execute(
                psycopg.sql.SQL("select version from {}.migrations").format(
                    psycopg.sql.Identifier(backend.schema)
                )
            )
        ).fetchall()
    assert rows == [(version,) for version, _name, _sql in pg_statements.migrations()]


async def test_no_row_trigger_runs_before_an_update_of_tasks(backend: PostgresBackend) -> None:
    """A BEFORE UPDATE row trigger, whatever its WHEN, makes every update of
    a task lock its row first (a second write of the row and a WAL record),
    on every claim and finish (migration 0019): tasks has none."""
    async with backend.pool.connection() as conn:
        rows = await (
            await conn.execute(
                # tgtype bits: 1 row, 2 before, 16 update (pg_trigger.h)
                "select tgname, tgtype & 2 <> 0 as before, tgtype & 16 <> 0 as on_update"
                " from pg_trigger where tgrelid = %s::regclass and not tgisinternal"
                " and tgtype & 1 <> 0",
                [f"{backend.schema}.tasks"],
            )
        ).fetchall()
    triggers = {name: (before, on_update) for name, before, on_update in rows}
    assert [name for name, (before, on_update) in triggers.items() if before and on_update] == []
    # The triggers are still there, after the update or before an insert.
    assert triggers["tasks_unique_scope_left"] == (False, True)
    assert triggers["tasks_concurrency_key_made_pending"] == (False, True)
    assert triggers["tasks_concurrency_key_pending"] == (True, False)


def test_every_statement_stays_short_enough_for_psycopg_to_keep_it_parsed() -> None:
    """psycopg parses a statement once and caches it only up to 4 KiB; a
    longer one (the claim, with its comments, once was) is parsed again at
    every execution, about 0.1 ms of the worker's time per claim."""
    from psycopg._queries import MAX_CACHED_STATEMENT_LENGTH

    statements = pg_statements.load("s" * 40)  # the longest schema name
    assert "claim" in statements
    assert not [name for name in statements if name.startswith(sqlfiles.PART)]
    too_long = {n: len(s) for n, s in statements.items() if len(s) > MAX_CACHED_STATEMENT_LENGTH}
    # The claim that also takes back expired leases runs once per poll
    # interval, not per claim: it must fit under the default schema name.
    assert set(too_long) <= {"claim_reclaim"}
    assert len(pg_statements.load("conveyor")["claim_reclaim"]) <= MAX_CACHED_STATEMENT_LENGTH
    lines = [line for s in statements.values() for line in s.splitlines()]
    assert not [line for line in lines if line.startswith(b"--")]


def test_schema_names_are_validated() -> None:
    for bad in ("Conveyor", "1abc", "a-b", "x; drop table y", "", "a" * 41):
        with pytest.raises(ConfigurationError):
            PostgresBackend("postgresql://127.0.0.1/test", schema=bad)


async def test_heartbeat_skips_a_locked_row_without_calling_it_lost(
    backend: PostgresBackend,
) -> None:
    await enqueue(backend, new(), new())
    busy, free = await claim(backend)
    tasks = psycopg.sql.Identifier(backend.schema, "tasks")
    async with await psycopg.AsyncConnection.connect(backend.url) as locker:
        await locker.execute(
            psycopg.sql.SQL("select 1 from {} where id = %s for update").format(tasks),
            (busy.token.task_id,),
        )
        result = await backend.heartbeat(
            HeartbeatParams("w1", [busy.token, free.token], LEASE, now=later(1))
        )
        await locker.rollback()
    assert result.renewed == {free.token}
    assert result.lost == frozenset()
    busy_task = await backend.get_task(busy.token.task_id)
    assert busy_task is not None
    assert busy_task.lease_expires_at == later(LEASE)  # untouched, not extended


async def test_a_session_frozen_inside_its_own_transaction_loses_its_row_locks(
    backend: PostgresBackend,
) -> None:
    """A worker process frozen mid-transaction (SIGSTOP, a paused VM) must not
    keep other workers from its tasks' rows: the server ends the session
    after one idle second, its transaction rolls back and the lock is gone."""
    [task_id] = await enqueue(backend, new())
    tasks = psycopg.sql.Identifier(backend.schema, "tasks")
    lock = psycopg.sql.SQL("select 1 from {} where id = %s for update nowait").format(tasks)
    async with backend.pool.connection() as frozen:
        await frozen.execute("begin")
        await frozen.execute(lock, (task_id,))
        async with await psycopg.AsyncConnection.connect(backend.url) as other:
            with pytest.raises(psycopg.errors.LockNotAvailable):
                await other.execute(lock, (task_id,))
            await other.rollback()
            await asyncio.sleep(1.5)  # the frozen session says nothing meanwhile
            await other.execute(lock, (task_id,))  # free again
            await other.rollback()
        with pytest.raises(psycopg.errors.IdleInTransactionSessionTimeout):
            await frozen.execute("select 1")


async def test_an_attempt_transaction_may_wait_on_its_handler(backend: PostgresBackend) -> None:
    """The bound on idle transactions is lifted for an attempt's own transaction:
    its handler may work between statements for longer than a second."""
    await enqueue(backend, new())
    [held] = await claim(backend)
    attempt = await backend.begin_attempt_transaction("w1")
    await attempt.connection.execute("select 1")
    await asyncio.sleep(1.5)
    await attempt.connection.execute("select 1")
    assert await attempt.commit_success(
        Completion(held.token, Outcome.SUCCEEDED, TaskState.SUCCEEDED, result="null")
    )


async def test_an_attempt_logged_at_its_claim_is_shown_once_and_closed_by_a_reclaim(
    backend: PostgresBackend,
) -> None:
    """Attempts that started before migration 0005 (or under a worker of an
    older version) have an open row in the log; the log shows that row, not
    a second copy from the task row, and a reclaim closes it in place."""
    [task_id] = await enqueue(backend, new())
    [first] = await claim(backend)
    attempts = psycopg.sql.Identifier(backend.schema, "attempts")
    async with backend.pool.connection() as conn:
        await conn.execute(
            psycopg.sql.SQL(
                "insert into {} (task_id, number, worker_id, started_at) values (%s, 1, 'old', %s)"
            ).format(attempts),
            (task_id, later(-5)),
        )
    task = await backend.get_task(task_id)
    assert task is not None
    assert [(a.number, a.worker_id, a.outcome) for a in task.attempts] == [
        (1, "old", Outcome.IN_PROGRESS)
    ]
    [second] = await claim(backend, "w2", at=later(LEASE + 1))
    assert second.token.attempt == 2
    task = await backend.get_task(task_id)
    assert task is not None
    assert [(a.number, a.worker_id, a.outcome, a.started_at) for a in task.attempts] == [
        (1, "old", Outcome.LEASE_LOST, later(-5)),
        (2, "w2", Outcome.IN_PROGRESS, later(LEASE + 1)),
    ]
    assert first.token.attempt == 1


async def test_one_task_takes_the_single_row_statement(backend: PostgresBackend) -> None:
    """A single enqueue inserts one row of VALUES, not a JSON array of one;
    what it stores is what the many-row statement stores."""
    from conveyor.backends.params import EnqueueParams
    from conveyor.backends.postgres.rows import enqueue_statement

    one = new(payload={"a": 1}, priority=3)
    assert enqueue_statement(EnqueueParams(tasks=[one]))[0] == "enqueue_one"
    assert enqueue_statement(EnqueueParams(tasks=[one, one]))[0] == "enqueue_uniform"
    [single] = await enqueue(backend, one)
    first, _ = await enqueue(backend, one, one)
    stored = [await backend.get_task(i) for i in (single, first)]
    assert stored[0] is not None and stored[1] is not None
    fields = ("name", "queue", "payload", "priority", "run_at", "max_attempts", "retry")
    assert [getattr(stored[0], f) for f in fields] == [getattr(stored[1], f) for f in fields]


async def test_a_claim_between_sweeps_leaves_expired_leases_for_a_later_claim(
    backend: PostgresBackend,
) -> None:
    """A backend searches for expired leases once per sweep interval (a
    worker's poll interval); the claims between those take due work only."""
    from conveyor.backends.params import ClaimParams

    await enqueue(backend, new())
    [first] = await claim(backend)
    own = PostgresBackend(backend.url, schema=backend.schema, migrate=False, sweep_interval=3600)
    await own.open()
    try:

        def params(*names: str) -> ClaimParams:
            return ClaimParams("w2", names, ("default",), 10, LEASE, now=later(LEASE + 1))

        assert await own.claim(params("other")) == []  # the first claim sweeps
        assert await own.claim(params("job")) == []  # within the interval: no sweep
        own._sweep.missed()  # as after a failed sweep: the next claim sweeps
        [again] = await own.claim(params("job"))
        assert (again.token.task_id, again.token.attempt) == (first.token.task_id, 2)
    finally:
        await own.close()


async def test_claims_open_their_own_pool_which_closes_with_the_backend(
    backend: PostgresBackend,
) -> None:
    own = PostgresBackend(backend.url, schema=backend.schema, migrate=False, pool_size=2)
    await own.open()
    try:
        assert own._claim_pool is None  # a backend that only enqueues never opens it
        await enqueue(own, new())
        assert len(await claim(own, limit=1, at=later(1))) == 1
        pool = await own.claim_pool()
        async with pool.connection() as conn:
            cursor = await conn.execute("show plan_cache_mode")
            assert await cursor.fetchone() == ("force_generic_plan",)
        async with own.pool.connection() as conn:  # the user's transactions keep the default
            cursor = await conn.execute("show plan_cache_mode")
            assert await cursor.fetchone() == ("auto",)
    finally:
        await own.close()
    assert pool.closed
    with pytest.raises(BackendError, match="not open"):
        await own.claim_pool()


async def test_one_pruner_at_a_time(backend: PostgresBackend) -> None:
    """A prune batch that finds another under way (its advisory lock held)
    does nothing and says so; once that one commits, the next one prunes."""
    await enqueue(backend, new())
    [taken] = await claim(backend)
    await backend.finish(
        FinishParams(
            "w1", [Completion(taken.token, Outcome.SUCCEEDED, TaskState.SUCCEEDED)], now=later(1)
        )
    )
    params = PruneParams({TaskState.SUCCEEDED: later(2)})
    async with await psycopg.AsyncConnection.connect(backend.url) as other:
        await other.execute(
            "select pg_advisory_xact_lock(%s, -1)", (pg_statements.lock_space(backend.schema),)
        )
        assert await backend.prune(params) == PruneResult(tasks=0, workers=0, busy=True)
        await other.rollback()
    assert await backend.prune(params) == PruneResult(tasks=1, workers=0)


async def test_prune_and_delete_take_the_attempt_log_too(backend: PostgresBackend) -> None:
    """The attempt log keeps no foreign key to its task (migration 0004): a
    deleted task's attempts must be deleted by the same statement, or the
    log would grow for ever under retention. Each task here fails once (a
    row in `attempts`) and then succeeds (an attempt its task row holds)."""
    ids = await enqueue(backend, new(), new(), new())
    failed = await claim(backend, limit=3)
    await backend.finish(
        FinishParams(
            "w1",
            [Completion(c.token, Outcome.FAILED, TaskState.PENDING) for c in failed],
            now=later(1),
        )
    )
    taken = await claim(backend, limit=3, at=later(2))
    await backend.finish(
        FinishParams(
            "w1",
            [Completion(c.token, Outcome.SUCCEEDED, TaskState.SUCCEEDED) for c in taken],
            now=later(3),
        )
    )

    async def logged(table: str) -> int:
        count = psycopg.sql.SQL("select count(*) from {}").format(
            psycopg.sql.Identifier(backend.schema, table)
        )
        async with backend.pool.connection() as conn:
            row = await (await conn.execute(count)).fetchone()
        assert row is not None
        return int(row[0])

    assert (await logged("attempts"), await logged("attempt_log")) == (3, 6)
    await backend.delete(ids[0])
    assert (await logged("attempts"), await logged("attempt_log")) == (2, 4)
    assert (await backend.prune(PruneParams({TaskState.SUCCEEDED: later(4)}))).tasks == 2
    assert (await logged("attempts"), await logged("attempt_log")) == (0, 0)


async def _logged_rows(backend: PostgresBackend, task_id: int) -> tuple[int, int]:
    """The rows of one task in `attempts` and in the whole log, `attempt_log`."""
    async with backend.pool.connection() as conn:
        row = await (
            await conn.execute(
                psycopg.sql.SQL(
                    "select (select count(*) from {} where task_id = %(id)s),"
                    " (select count(*) from {} where task_id = %(id)s)"
                ).format(
                    psycopg.sql.Identifier(backend.schema, "attempts"),
                    psycopg.sql.Identifier(backend.schema, "attempt_log"),
                ),
                {"id": task_id},
            )
        ).fetchone()
    assert row is not None
    return int(row[0]), int(row[1])


@pytest.mark.parametrize("batch", ["plain", "mixed"])
async def test_a_succeeded_attempt_stays_in_its_task_row(
    backend: PostgresBackend, batch: str
) -> None:
    """The completion that ends a task succeeded writes its task row only
    (migration 0018), through the lean statement or, in a batch with a
    failure, the general one: the log reads that attempt from the row, once,
    with its worker, start, finish and step, and the task shows no owner.
    An attempt after which the task goes on still gets its own row."""
    ok, other = await enqueue(backend, new(), new())
    taken = {c.token.task_id: c for c in await claim(backend, limit=2)}
    ending = [Completion(taken[ok].token, Outcome.SUCCEEDED, TaskState.SUCCEEDED, result="7")]
    if batch == "mixed":
        ending.append(Completion(taken[other].token, Outcome.FAILED, TaskState.PENDING))
    await backend.finish(FinishParams("w1", ending, now=later(1)))

    assert await _logged_rows(backend, ok) == (0, 1)
    task = await backend.get_task(ok)
    assert task is not None and (task.state, task.worker_id) == (TaskState.SUCCEEDED, None)
    [attempt] = task.attempts
    assert (attempt.number, attempt.worker_id, attempt.outcome) == (1, "w1", Outcome.SUCCEEDED)
    assert (attempt.started_at, attempt.finished_at) == (T0, later(1))
    [listed] = await backend.list_tasks(TaskFilter(state=TaskState.SUCCEEDED))
    assert (listed.id, listed.worker_id) == (ok, None)
    if batch == "mixed":
        assert await _logged_rows(backend, other) == (1, 1)


async def test_a_task_that_succeeded_before_the_row_kept_its_attempt_shows_it_once(
    backend: PostgresBackend,
) -> None:
    """Tasks that succeeded before migration 0018 have their attempt in
    `attempts` and no owner in their row; the log must not show it twice,
    and a newer completion's must show once beside them."""
    old, fresh = await enqueue(backend, new(), new())
    taken = await claim(backend, limit=2)
    succeeded = [Completion(c.token, Outcome.SUCCEEDED, TaskState.SUCCEEDED) for c in taken]
    await backend.finish(FinishParams("w1", succeeded, now=later(1)))
    tasks, attempts = (psycopg.sql.Identifier(backend.schema, t) for t in ("tasks", "attempts"))
    async with backend.pool.connection() as conn:  # what an older worker wrote
        await conn.execute(
            psycopg.sql.SQL("update {} set worker_id = null where id = %s").format(tasks), [old]
        )
        await conn.execute(
            psycopg.sql.SQL(
                "insert into {} (task_id, number, worker_id, outcome, started_at, finished_at)"
                " values (%s, 1, 'w0', 'succeeded', %s, %s)"
            ).format(attempts),
            [old, later(1), later(1)],
        )
    for task_id, worker in ((old, "w0"), (fresh, "w1")):
        task = await backend.get_task(task_id)
        assert task is not None
        assert [(a.number, a.worker_id) for a in task.attempts] == [(1, worker)]


async def test_a_finished_attempt_is_not_reported_cancel_requested(
    backend: PostgresBackend,
) -> None:
    """A cancel asked while the attempt ran, then its success: the task row
    keeps its worker (migration 0018), but the lease is over, so a worker
    asking which of its leases have a cancel requested hears of none."""
    [task_id] = await enqueue(backend, new())
    [running] = await claim(backend)
    assert await backend.cancel(task_id, now=later(1)) is TaskState.IN_PROGRESS
    assert await backend.cancel_requested("w1", [running.token]) == {running.token}
    done = Completion(running.token, Outcome.SUCCEEDED, TaskState.SUCCEEDED)
    await backend.finish(FinishParams("w1", [done], now=later(2)))
    assert await backend.cancel_requested("w1", [running.token]) == frozenset()


async def _task_rows(backend: PostgresBackend) -> tuple[int, int]:
    """The tasks table's live and dead rows, as the server's statistics say."""
    async with backend.pool.connection() as conn:
        await conn.execute("select pg_stat_clear_snapshot()")
        row = await (
            await conn.execute(
                "select n_live_tup, n_dead_tup from pg_stat_user_tables"
                " where schemaname = %s and relname = 'tasks'",
                (backend.schema,),
            )
        ).fetchone()
    return (int(row[0]), int(row[1])) if row else (0, 0)


async def _vacuumed_away(backend: PostgresBackend) -> int:
    """The dead rows left once the workers' vacuum has run. A vacuum cannot
    remove rows a transaction still open elsewhere may see (another test's,
    on this server): while that lasts, the vacuum is asked again, as a
    worker would after its next prune."""
    for _ in range(100):
        dead = (await _task_rows(backend))[1]
        if dead < 1000 or await backend.vacuum() != ["tasks"]:
            return dead
        await asyncio.sleep(0.1)
    return dead


async def _dead_rows_beside_history(backend: PostgresBackend, live: int, dead: int) -> None:
    """With autovacuum off for tasks: ``live`` succeeded tasks kept, and
    ``dead`` more made and deleted; back once the statistics count them."""
    tasks = psycopg.sql.Identifier(backend.schema, "tasks")
    insert = psycopg.sql.SQL(
        "insert into {} (name, queue, payload, state, max_attempts, retry_policy, finished_at)"
        " select 'job', 'default', '{{}}', %s, 3, '{{}}', now() from generate_series(1, %s)"
    ).format(tasks)
    async with backend.pool.connection() as conn:
        await conn.execute(
            psycopg.sql.SQL("alter table {} set (autovacuum_enabled = false)").format(tasks)
        )
        await conn.execute(insert, ("succeeded", live))
        await conn.execute(insert, ("failed", dead))
        await conn.execute(psycopg.sql.SQL("delete from {} where state = 'failed'").format(tasks))
    await _rows_reported(backend, live, dead)


async def _rows_reported(backend: PostgresBackend, live: int, dead: int) -> None:
    """Wait until the statistics count at least ``live`` and ``dead`` rows
    in tasks (the collector reports within a moment)."""
    for _ in range(50):
        found = await _task_rows(backend)
        if found[0] >= live and found[1] >= dead:
            return
        await asyncio.sleep(0.1)
    raise AssertionError(f"the statistics did not report the rows: {found}")


async def test_a_store_whose_server_does_not_vacuum_is_vacuumed_by_its_workers(
    backend: PostgresBackend,
) -> None:
    """With autovacuum off (as on this machine's server, or for the table),
    dead rows past the threshold are vacuumed away after a prune."""
    await _dead_rows_beside_history(backend, 0, 30_000)
    assert await backend.vacuum() == ["tasks"]
    assert await _vacuumed_away(backend) < 1000
    async with backend.pool.connection() as conn:
        analyzed = await (
            await conn.execute(
                "select last_analyze is not null from pg_stat_user_tables"
                " where schemaname = %s and relname = 'tasks'",
                (backend.schema,),
            )
        ).fetchone()
    assert analyzed == (True,), "vacuumed without statistics for the planner"
    assert await backend.vacuum() == []  # nothing left to do


async def test_the_vacuum_comes_with_the_churn_not_with_a_fifth_of_the_history(
    backend: PostgresBackend,
) -> None:
    """Each claim leaves a dead entry in the pending index that every later
    claim steps over until a vacuum: with 200,000 tasks of history, 30,000
    dead rows must bring a vacuum (autovacuum's default fifth would wait
    for 50,000). Autovacuum, where it is on, gets the same twentieth."""
    async with backend.pool.connection() as conn:
        options = await (
            await conn.execute(
                "select c.reloptions from pg_class c join pg_namespace n on n.oid = c.relnamespace"
                " where n.nspname = %s and c.relname = 'tasks'",
                (backend.schema,),
            )
        ).fetchone()
    assert options is not None and "autovacuum_vacuum_scale_factor=0.05" in options[0]
    await _dead_rows_beside_history(backend, 200_000, 30_000)
    assert await backend.vacuum() == ["tasks"]
    assert await _vacuumed_away(backend) < 1000


def _keyed(kind: str, key: str) -> NewTask:
    task = new()
    if kind == "unique":
        return dataclasses.replace(task, idempotency_key=key)
    return dataclasses.replace(task, concurrency_key=key, concurrency_limit=1)


async def _waiting(
    conn: psycopg.AsyncConnection[Any], waiters: int, done: asyncio.Future[Any]
) -> None:
    """Until ``waiters`` sessions wait for a lock, or ``done`` is."""
    for _ in range(500):
        if done.done():
            return
        cursor = await conn.execute("select count(*) from pg_locks where not granted")
        row = await cursor.fetchone()
        if row is not None and row[0] >= waiters:
            return
        await asyncio.sleep(0.02)
    raise AssertionError(f"{waiters} sessions never waited for a lock")


@pytest.mark.parametrize("kind", ["unique", "concurrency"])
async def test_enqueues_of_the_same_new_keys_in_other_orders_do_not_deadlock(
    backend: PostgresBackend, kind: str
) -> None:
    """One enqueue stalls midway on key c (held by an open transaction)
    after taking key a; another wants b then a. Inserting in batch order,
    the first then wants b and each waits for the other: PostgreSQL kills
    one with "deadlock detected". Keys are taken in one order instead."""

    def batch(*keys: str) -> EnqueueParams:
        return EnqueueParams(tasks=[_keyed(kind, key) for key in keys])

    async with (
        await psycopg.AsyncConnection.connect(PG_URL) as holder,
        await psycopg.AsyncConnection.connect(PG_URL, autocommit=True) as watcher,
    ):
        async with holder.transaction():
            [held] = await backend.enqueue_in(batch("c"), holder)
            first = asyncio.ensure_future(backend.enqueue(batch("a", "c", "b")))
            await _waiting(watcher, 1, first)
            second = asyncio.ensure_future(backend.enqueue(batch("b", "a")))
            await _waiting(watcher, 2, second)
        ids = await asyncio.gather(first, second)
    tasks = await backend.list_tasks(TaskFilter(limit=100))
    assert len(tasks) == (3 if kind == "unique" else 6)
    if kind == "unique":
        assert ids == [[ids[0][0], held, ids[0][2]], [ids[0][2], ids[0][0]]]
