"""Rows written around conveyor, on PostgreSQL and SQLite: the store refuses
values no claim can compute with, a row that still cannot be claimed fails
alone while its queue keeps moving, a migration brings old rows within the
bounds, and listings read times no ``datetime`` can hold.
"""

from __future__ import annotations

import asyncio
import contextlib
import json
import math
import sqlite3
from collections.abc import Iterator
from datetime import UTC, datetime, timedelta
from pathlib import Path
from typing import Any

import psycopg
import pytest
import redis as sync_redis
import redis.asyncio as aioredis
from psycopg import sql
from starlette.testclient import TestClient

import conveyor
from conveyor import Outcome, RetryPolicy, TaskState
from conveyor.backends.params import ClaimParams
from conveyor.backends.postgres import statements as pg_statements
from conveyor.backends.redis import keys as redis_keys
from conveyor.backends.sqlfiles import migrations as sql_migrations
from conveyor.backends.sqlite import schema as sqlite_schema
from conveyor.backends.sqlite.statements import SQL as SQLITE_SQL
from conveyor.dashboard import create_app
from conveyor.model import MAX_SECONDS
from tests.cli_harness import Cli
from tests.conftest import PG_URL, REDIS_URL, drop_redis_prefix, schema_for
from tests.worker.helpers import RunningWorker, wait_for, wait_terminal

LIMIT = 2_147_483_646
"""A counter standing here cannot be claimed again: the next would not fit."""


class Store:
    """Raw SQL on the store under test, around conveyor (``{tasks}`` names
    the tasks table)."""

    def __init__(self, kind: str, schema: str, tmp_path: Path) -> None:
        self.kind = kind
        self.schema = schema
        self.path = tmp_path / "tasks.db"
        self.url = PG_URL if kind == "postgres" else f"sqlite:///{self.path}"

    @property
    def tasks(self) -> str:
        return f'"{self.schema}".tasks' if self.kind == "postgres" else "conveyor_tasks"

    def execute(self, statement: str, *args: object) -> list[tuple[Any, ...]]:
        text = statement.format(tasks=self.tasks)
        if self.kind == "postgres":
            with psycopg.connect(PG_URL, autocommit=True) as conn:
                cursor = conn.execute(sql.SQL(text), args or None)  # type: ignore[arg-type]
                return cursor.fetchall() if cursor.description else []
        with contextlib.closing(sqlite3.connect(self.path, isolation_level=None)) as conn:
            found = conn.execute(text.replace("%s", "?"), args).fetchall()
            return found

    def app(self) -> conveyor.App:
        return conveyor.App(self.url, schema=self.schema)


@pytest.fixture(params=["postgres", "sqlite"])
def store(request: pytest.FixtureRequest, tmp_path: Path) -> Store:
    return Store(request.param, schema_for(request.param, request), tmp_path)


@pytest.fixture
def app(store: Store) -> Iterator[conveyor.App]:
    application = store.app()
    yield application
    application.close()


def _refused(store: Store) -> type[Exception]:
    return psycopg.errors.CheckViolation if store.kind == "postgres" else sqlite3.IntegrityError


NUMBER = {
    # what to write, per store: PostgreSQL text casts, SQLite values
    "nan": ("'NaN'::float8", "nan"),
    "huge": ("1e300", "1e300"),
    "infinity": ("'Infinity'::float8", "9e999"),
    "text": (None, "'abc'"),
}


@pytest.mark.parametrize(
    ("column", "value"),
    [
        ("attempt", "2147483647"),
        ("spent", "-1"),
        ("lease_seconds", "nan"),
        ("lease_seconds", "huge"),
        ("lease_seconds", "text"),
        ("timeout_seconds", "infinity"),
        ("timeout_seconds", "-1"),
        ("run_at", "infinity"),
    ],
)
async def test_the_store_refuses_values_no_claim_can_compute_with(
    app: conveyor.App, store: Store, column: str, value: str
) -> None:
    @app.task()
    async def job() -> None:
        return None

    async with app:
        handle = await job.enqueue_async()
    written = NUMBER.get(value, (value, value))[0 if store.kind == "postgres" else 1]
    if column == "run_at":
        written = "'infinity'::timestamptz" if store.kind == "postgres" else "9e999"
    if written is None:
        pytest.skip("PostgreSQL's types refuse it already")
    if store.kind == "sqlite" and value == "nan":
        pytest.skip("SQLite stores NaN as NULL (no lease of its own: the worker's applies)")
    with pytest.raises(_refused(store), match=r"range|violates check"):
        store.execute(f"update {{tasks}} set {column} = {written} where id = %s", handle.id)


async def test_a_task_at_the_counter_limit_fails_alone_while_its_queue_moves_on(
    app: conveyor.App, store: Store
) -> None:
    @app.task(retry=RetryPolicy(max_attempts=3, initial_interval=0, jitter=0))
    async def job(n: int) -> int:
        return n

    async with app:
        good = await app.enqueue_many_async(job, [{"n": n} for n in range(100)])
        at_limit = await job.enqueue_async(n=-1)
        spent_out = await job.enqueue_async(n=-2)
        # Ahead of every good task in claim order, and at the limit.
        store.execute(
            "update {tasks} set priority = 10, attempt = %s where id = %s", LIMIT, at_limit.id
        )
        store.execute(
            "update {tasks} set priority = 10, spent = %s where id = %s", LIMIT, spent_out.id
        )
        async with RunningWorker(app, concurrency=4):
            ended = await wait_terminal(app, [h.id for h in [*good, at_limit, spent_out]], 60)
    *fine, first, second = ended
    assert all((t.state, t.result) == (TaskState.SUCCEEDED, t.payload["n"]) for t in fine)
    for bad in (first, second):
        assert bad.state is TaskState.FAILED
        last = bad.attempts[-1]
        assert (last.outcome, last.error_type) == (Outcome.FAILED, "CorruptTask")
        assert "stands at the limit" in (last.error_message or "")


async def test_a_budget_beyond_the_api_s_with_a_policy_that_does_not_decode_runs_alone(
    app: conveyor.App, store: Store
) -> None:
    """A row whose retry policy does not decode runs with the default policy
    and its own budget, cut to the largest the API takes: a budget above it
    (the column allows it) failed the decode of the whole claimed batch."""

    @app.task()
    async def job(n: int) -> int:
        return n

    async with app:
        good = await app.enqueue_many_async(job, [{"n": n} for n in range(20)])
        odd = await job.options(priority=10).enqueue_async(n=-1)
        policy = "%s::jsonb" if store.kind == "postgres" else "%s"
        store.execute(
            f"update {{tasks}} set max_attempts = 2e9, retry_policy = {policy} where id = %s",
            "{}" if store.kind == "postgres" else "not json",
            odd.id,
        )
        async with RunningWorker(app, concurrency=8):
            ended = await wait_terminal(app, [h.id for h in [*good, odd]], 20)
    assert all((t.state, t.result) == (TaskState.SUCCEEDED, t.payload["n"]) for t in ended)


async def test_a_running_task_at_the_counter_limit_fails_when_its_lease_expires(
    app: conveyor.App, store: Store
) -> None:
    @app.task()
    async def job() -> str:
        return "ran"

    async with app:
        stuck = await job.enqueue_async()
        other = await job.enqueue_async()
        # As a worker that died mid-attempt would leave it, its counters then
        # pushed to the limit around conveyor.
        store.execute(
            "update {tasks} set state = 'in_progress', worker_id = 'gone', attempt = 1, spent = %s,"
            " lease_expires_at = %s where id = %s",
            LIMIT,
            "2000-01-01 00:00:00+00" if store.kind == "postgres" else 946684800.0,
            stuck.id,
        )
        async with RunningWorker(app):
            first, second = await wait_terminal(app, [stuck.id, other.id])
    assert (second.state, second.result) == (TaskState.SUCCEEDED, "ran")
    assert first.state is TaskState.FAILED
    assert first.attempts[-1].error_type == "CorruptTask"


async def test_listings_read_times_no_datetime_can_hold(app: conveyor.App, store: Store) -> None:
    @app.task()
    async def job() -> None:
        return None

    async with app:
        handle = await job.enqueue_async()
        async with RunningWorker(app):
            await wait_terminal(app, [handle.id])
        if store.kind == "postgres":
            store.execute(
                "update {tasks} set finished_at = 'infinity', created_at = '-infinity'"
                " where id = %s",
                handle.id,
            )
        else:
            store.execute(
                "update {tasks} set finished_at = 9e999, created_at = 'x' where id = %s",
                handle.id,
            )
        task = await handle.get_async()
        [listed] = await app.list_tasks_async()
    assert task.finished_at is not None and task.finished_at.year == 9999
    assert listed.id == handle.id
    cli = Cli(store.url, store.schema)
    assert cli.ok("tasks", "--json")
    assert "succeeded" in cli.ok("show", str(handle.id))
    shown = json.loads(cli.ok("show", str(handle.id), "--json"))
    assert shown["finished_at"].startswith("9999-12-31")


# ---------------------------------------------------------------------------
# Rows from before the bounds: the migration brings them within.
# ---------------------------------------------------------------------------

BEFORE_BOUNDS = {"postgres": 5, "sqlite": 3}


async def _store_before_bounds(store: Store) -> None:
    """The store at the schema version before the bounds, as an older
    conveyor left it."""
    before = BEFORE_BOUNDS[store.kind]
    if store.kind == "postgres":
        with psycopg.connect(PG_URL, autocommit=True) as conn:
            conn.execute(pg_statements.compose("create schema {schema}", store.schema))
            conn.execute(
                pg_statements.compose(
                    "create table {schema}.migrations (version integer primary key, "
                    "name text not null, applied_at timestamptz not null default now())",
                    store.schema,
                )
            )
            for version, name, text in pg_statements.migrations():
                if version <= before:
                    conn.execute(pg_statements.compose(text, store.schema))
                    conn.execute(
                        sql.SQL("insert into {} (version, name) values (%s, %s)").format(
                            sql.Identifier(store.schema, "migrations")
                        ),
                        (version, name),
                    )
        return
    with contextlib.closing(sqlite3.connect(store.path, isolation_level=None)) as conn:
        conn.execute(SQLITE_SQL["migrations_table"])
        for version, name, text in sql_migrations("conveyor.backends.sqlite"):
            if version <= before:
                for statement in sqlite_schema.statements(text):
                    conn.execute(statement)
                conn.execute(SQLITE_SQL["record_migration"], {"version": version, "name": name})


async def test_the_migration_brings_old_rows_within_the_bounds(store: Store) -> None:
    await _store_before_bounds(store)
    app = conveyor.App(store.url, schema=store.schema)

    @app.task()
    async def job(n: int) -> int:
        return n

    # Enqueued by an older conveyor, on the store as it left it.
    policy = json.dumps(RetryPolicy().to_json())
    insert = (
        "insert into {tasks} (name, queue, payload, max_attempts, retry_policy, run_at, created_at)"
        " values ('job', 'default', %s, 5, %s, {now}, {now}) returning id"
    )
    now = "now()" if store.kind == "postgres" else "(julianday('now') - 2440587.5) * 86400.0"
    ids = [
        store.execute(insert.replace("{now}", now), json.dumps({"n": n}), policy)[0][0]
        for n in range(5)
    ]
    nan, infinite = (
        ("'NaN'::float8", "'Infinity'::float8") if store.kind == "postgres" else ("1e300", "9e999")
    )
    far = "'infinity'::timestamptz" if store.kind == "postgres" else "9e999"
    store.execute(f"update {{tasks}} set lease_seconds = {nan} where id = %s", ids[0])
    store.execute(f"update {{tasks}} set timeout_seconds = {infinite} where id = %s", ids[1])
    store.execute("update {tasks} set attempt = 2147483647 where id = %s", ids[2])
    store.execute(f"update {{tasks}} set run_at = {far} where id = %s", ids[3])
    store.execute("update {tasks} set spent = -3 where id = %s", ids[4])

    try:
        async with app:
            assert (await app.migrate_async()) == []  # opening the App migrated already
            rows = store.execute(
                "select id, lease_seconds, timeout_seconds, attempt, spent from {tasks} order by id"
            )
            assert [r[1:] for r in rows] == [
                (None, None, 0, 0),
                (None, None, 0, 0),
                (None, None, LIMIT, 0),
                (None, None, 0, 0),
                (None, None, 0, 0),
            ]
            async with RunningWorker(app):
                done = await wait_terminal(app, [ids[0], ids[1], ids[2], ids[4]])
            far_off = await app.get_async(ids[3])
    finally:
        app.close()
    assert [t.state for t in done] == [
        TaskState.SUCCEEDED,
        TaskState.SUCCEEDED,
        TaskState.FAILED,
        TaskState.SUCCEEDED,
    ]
    assert done[2].attempts[-1].error_type == "CorruptTask"
    assert far_off is not None and far_off.state is TaskState.PENDING
    assert far_off.run_at.year == 9999


# ---------------------------------------------------------------------------
# The API refuses durations and budgets no store can hold, before any I/O.
# ---------------------------------------------------------------------------


@pytest.mark.parametrize(
    "options",
    [
        {"delay": MAX_SECONDS * 2},
        {"delay": timedelta(days=365 * 1000)},
        {"delay": math.nan},
        {"lease": 1e300},
        {"timeout": math.inf},
        {"retry": None},  # replaced below: a policy that waits longer than that
    ],
)
def test_enqueue_refuses_durations_beyond_a_hundred_years(options: dict[str, object]) -> None:
    app = conveyor.App("memory://bounds")

    @app.task()
    async def job() -> None:
        return None

    if options.get("retry", 0) is None:
        with pytest.raises(conveyor.ConfigurationError, match="at most"):
            RetryPolicy(max_interval=MAX_SECONDS * 2)
        with pytest.raises(conveyor.ConfigurationError, match="max_attempts"):
            RetryPolicy(max_attempts=2**40)
        return
    with pytest.raises(conveyor.ConfigurationError):
        app.enqueue(job, {}, **options)  # type: ignore[arg-type]
    assert app.list_tasks() == []


# ---------------------------------------------------------------------------
# Redis: a task's hash holds any text. Every field of it, written around
# conveyor with what no claim can compute with, is set aside alone.
# ---------------------------------------------------------------------------

BAD_NUMBERS = ("nan", "inf", "-inf", "1e400", "1e300", "abc", "", "-1")
BAD_TEXTS: tuple[str | bytes | None, ...] = (None, "", "\x01garbage{", b"\xff\xfe{")
"""None: the field is deleted; bytes: not UTF-8."""
PENDING_NUMBERS = (
    "priority",
    "run_at",
    "attempt",
    "spent",
    "max_attempts",
    "timeout",
    "lease",
    "parent_id",
    "created_at",
    "finished_at",
    "lease_expires_at",
    "started_at",
    "unique_until",
    "expires_at",
    "concurrency_limit",
    "rate_limit",
    "rate_period",
    "waiting_for",
)
"""Every numeric field of a task's hash (``conveyor.backends.redis.rows``)."""
TEXTS = (
    "name",
    "queue",
    "payload",
    "state",
    "retry",
    "worker_id",
    "result",
    "step",
    "cancel_requested",
    "inbox",
    "idempotency_key",
    "unique_scope",
    "concurrency_key",
    "trace_context",
    "after_policy",
    "receives",
    "dependents",
)
"""Every other field of it."""
CLAIM_READS = {
    "priority",
    "run_at",
    "attempt",
    "spent",
    "max_attempts",
    "timeout",
    "lease",
    "parent_id",
    "concurrency_limit",
    "expires_at",
    "name",
    "queue",
    "state",
}
"""What a claim reads of a pending task: one of these that does not read sets
the task aside (but for a negative priority, run time or expiry, which are fine)."""
RUNNING_READS = {
    "priority",
    "run_at",
    "attempt",
    "spent",
    "max_attempts",
    "started_at",
    "name",
    "state",
    "worker_id",
}
"""What the expired-lease sweep reads of a running task."""


def _must_set_aside(field: str, value: str | bytes | None, reads: set[str]) -> bool:
    if isinstance(value, bytes) and field in ("payload", "retry", "step", "receives"):
        return reads is CLAIM_READS  # what a claim hands the worker is UTF-8
    if field not in reads:
        return False
    if value == "-1" and field in ("priority", "run_at", "expires_at"):
        return False  # readable: a negative priority, a time in 1969
    return field != "worker_id" or value is None  # any text is a worker's id


@pytest.fixture
def redis_app(request: pytest.FixtureRequest) -> Iterator[tuple[conveyor.App, str]]:
    """An App on a Redis store of the test's own, and its key prefix."""
    prefix = schema_for("redis", request)
    application = conveyor.App(REDIS_URL, schema=prefix)
    yield application, prefix
    application.close()
    drop_redis_prefix(prefix)


async def test_a_redis_task_whose_any_field_does_not_read_is_set_aside_alone(
    redis_app: tuple[conveyor.App, str],
) -> None:
    """Pending tasks (claimed), delayed ones (promoted) and running ones of a
    worker that died (the expired-lease sweep), each with one field of its
    hash written around conveyor, beside healthy ones: every healthy task
    succeeds, each corrupt one ends (those a claim cannot compute with
    `failed`, CorruptTask), nothing stays in progress, and listings read.
    (A name changed to another name is a task of that name: no store can
    tell, so it is not a case here.)"""
    app, prefix = redis_app

    @app.task(retry=RetryPolicy(max_attempts=2, initial_interval=0, jitter=0))
    async def job(n: int) -> int:
        return n

    cases: list[tuple[int, str, str | bytes | None, set[str]]] = []
    async with app:
        client = aioredis.Redis.from_url(REDIS_URL, decode_responses=True)
        backend = await app.backend()
        try:
            good = await app.enqueue_many_async(job, [{"n": n} for n in range(40)])
            fields = [(f, v) for f in PENDING_NUMBERS for v in BAD_NUMBERS]
            fields += [(f, v) for f in TEXTS for v in BAD_TEXTS]
            # Pending, due: met by the claim's hand-out.
            for field, value in fields:
                handle = await job.options(priority=5).enqueue_async(n=-1)
                cases.append((handle.id, field, value, CLAIM_READS))
            # Delayed: met when a claim promotes them.
            delayed = [(f, v) for f in ("run_at", "priority") for v in BAD_NUMBERS[:7]]
            for field, value in [*delayed, ("name", None), ("name", "")]:
                handle = await job.options(delay=0.5).enqueue_async(n=-2)
                cases.append((handle.id, field, value, {"run_at", "priority", "name"}))
            # Running under a worker that is gone, its lease expired: the sweep.
            running_fields = [
                (f, v)
                for f in sorted(RUNNING_READS - {"name", "worker_id"})
                for v in BAD_NUMBERS[:4]
            ]
            running_fields += [("name", None), ("name", ""), ("worker_id", None)]
            running = await app.enqueue_many_async(
                job, [{"n": -3} for _ in running_fields], queue="dead"
            )
            past = datetime.now(UTC) - timedelta(hours=1)
            taken = await backend.claim(
                ClaimParams("gone", ["job"], ["dead"], len(running), 1.0, now=past)
            )
            assert len(taken) == len(running)
            for handle, (field, value) in zip(running, running_fields, strict=True):
                cases.append((handle.id, field, value, RUNNING_READS))
            for task_id, field, value, _reads in cases:
                if value is None:
                    await client.hdel(redis_keys.task(prefix, task_id), field)
                else:
                    await client.hset(redis_keys.task(prefix, task_id), field, value)
            # Listings and counts read every one of them, before and after.
            listed = await app.list_tasks_async(limit=1000)
            assert len(listed) == len(good) + len(cases)
            counted = await app.count_tasks_async()
            assert sum(c.count for c in counted) == len(listed)
            async with RunningWorker(app, concurrency=16, queues=["default", "dead"]):
                ids = [h.id for h in good] + [c[0] for c in cases]
                ended = await wait_terminal(app, ids, 60)
            corrupt = await client.smembers(f"{redis_keys.base(prefix)}:corrupt")
        finally:
            await client.aclose()
        listed = await app.list_tasks_async(limit=1000)
        counted = await app.count_tasks_async()
    assert len(listed) == len(good) + len(cases) == sum(c.count for c in counted)
    fine, bad = ended[: len(good)], ended[len(good) :]
    assert all((t.state, t.result) == (TaskState.SUCCEEDED, n) for n, t in enumerate(fine))
    for task, (task_id, field, value, reads) in zip(bad, cases, strict=True):
        if not _must_set_aside(field, value, reads):
            continue
        where = f"task {task_id}, {field} = {value!r}"
        assert task.state is TaskState.FAILED, where
        # The scripts note what they set aside; the worker ends what the
        # scripts cannot tell (bytes that are not UTF-8) by its completion.
        assert isinstance(value, bytes) or str(task_id) in corrupt, where
        last = task.attempts[-1]
        assert (last.outcome, last.error_type) == (Outcome.FAILED, "CorruptTask"), where
        assert field in (last.error_message or ""), where
        if value is None:
            assert "(missing)" in (last.error_message or ""), where
    cli = Cli(REDIS_URL, prefix)
    assert len(json.loads(cli.ok("tasks", "--json", "--limit", "1000"))) == len(listed)
    assert cli.ok("tasks", "--limit", "1000").count("\n") > len(listed)
    some = next(c[0] for c in cases if c[1] == "priority" and c[2] == "nan")
    assert "corrupt" in cli.ok("show", str(some))


async def test_a_redis_task_corrupted_while_it_runs_is_set_aside_by_its_heartbeat_or_completion(
    redis_app: tuple[conveyor.App, str],
) -> None:
    """Fields written around conveyor while the task runs: a lease of its own
    that does not read is met by the heartbeat, the others by the completion
    (or, when its fence itself does not read, by the sweep once its lease
    expires). Each ends failed (CorruptTask); the tasks beside them succeed."""
    app, prefix = redis_app
    release = asyncio.Event()
    started: set[int] = set()

    @app.task(retry=RetryPolicy(max_attempts=2, initial_interval=0, jitter=0))
    async def hold(n: int) -> int:
        started.add(n)
        await release.wait()
        return n

    beaten = [("lease", v) for v in BAD_NUMBERS]
    finished = [(f, v) for f in ("spent", "attempt", "started_at") for v in BAD_NUMBERS[:4]]
    finished += [("parent_id", "nan"), ("priority", "inf"), ("queue", None), ("name", None)]
    cases = beaten + finished
    async with app:
        handles = await app.enqueue_many_async(hold, [{"n": n} for n in range(len(cases) + 10)])
        client = aioredis.Redis.from_url(REDIS_URL, decode_responses=True)
        try:
            async with RunningWorker(app, concurrency=len(handles), lease=1.5):
                await wait_for(lambda: _true(len(started) == len(handles)), 30)
                for handle, (field, value) in zip(handles, cases, strict=False):
                    if value is None:
                        await client.hdel(redis_keys.task(prefix, handle.id), field)
                    else:
                        await client.hset(redis_keys.task(prefix, handle.id), field, value)
                beaten_ids = [h.id for h in handles[: len(beaten)]]
                await wait_terminal(app, beaten_ids, 30)
                release.set()
                ended = await wait_terminal(app, [h.id for h in handles], 30)
        finally:
            await client.aclose()
        listed = await app.list_tasks_async(limit=1000)
    assert len(listed) == len(handles)
    for task, (field, value) in zip(ended, cases, strict=False):
        where = f"task {task.id}, {field} = {value!r}"
        assert task.state is TaskState.FAILED, where
        last = task.attempts[-1]
        assert last.error_type == "CorruptTask", where
        assert f"field {field} " in (last.error_message or ""), where
        if value is None:
            assert "(missing)" in (last.error_message or ""), where
    fine = ended[len(cases) :]
    assert all((t.state, t.result) == (TaskState.SUCCEEDED, t.payload["n"]) for t in fine)


async def _true(value: bool) -> bool:
    return value


def test_the_dashboard_shows_a_corrupt_redis_task_and_its_neighbours(
    redis_app: tuple[conveyor.App, str],
) -> None:
    """The dashboard reads through the same functions: a hash that does not
    read is a task shown as corrupt, and the list around it still shows."""
    app, prefix = redis_app

    @app.task()
    async def job(n: int) -> int:
        return n

    handles = app.enqueue_many(job, [{"n": n} for n in range(3)])
    client = sync_redis.Redis.from_url(REDIS_URL)
    try:
        client.hset(redis_keys.task(prefix, handles[0].id), "priority", "nan")
        client.hdel(redis_keys.task(prefix, handles[1].id), "state")
        client.hset(redis_keys.task(prefix, handles[2].id), "name", b"\xff")
    finally:
        client.close()
    with TestClient(create_app(app, allowed_hosts=["testserver"])) as page:
        listed = page.get("/tasks")
        assert listed.status_code == 200
        for handle in handles:
            assert f"/tasks/{handle.id}" in listed.text
            shown = page.get(f"/tasks/{handle.id}")
            assert shown.status_code == 200 and "corrupt" in shown.text
