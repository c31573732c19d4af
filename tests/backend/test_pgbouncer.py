"""PostgreSQL through PgBouncer in transaction mode: the URL's options, what
a backend keeps out of a session, the warning for settings the server's
side lacks, the hint for a pooler conveyor was not told of, a worker that
polls or listens past the bouncer, the CLI, and a bouncer restarted under
a draining worker. (The conformance, worker and dashboard suites run through
a bouncer too: their ``pgbouncer`` cases.)"""

from __future__ import annotations

import asyncio
import logging
import time
from collections.abc import Iterator

import psycopg
import pytest

import conveyor
from conveyor.backends.postgres import PostgresBackend, failures
from conveyor.backends.postgres.urls import target
from conveyor.backends.protocol import Capability
from conveyor.errors import BackendError, BackendUnavailableError, ConfigurationError
from conveyor.model import Task
from tests.cli_harness import Cli
from tests.conftest import PG_URL, bouncer_url
from tests.worker.helpers import RunningWorker, wait_terminal
from tools import bouncer as pgbouncer


@pytest.fixture
def bouncer() -> Iterator[pgbouncer.Bouncer]:
    """A PgBouncer of this test's own (to restart, or to size)."""
    bouncer_url()  # skips (or fails in CI) where pgbouncer is not installed
    instance = pgbouncer.Bouncer(PG_URL, pool_size=2)
    instance.start()
    yield instance
    instance.close()


def test_the_url_options_are_conveyors_and_libpq_never_sees_them() -> None:
    found = target(
        "postgresql://u:p%40w@pool:6432/jobs?pool_mode=transaction&sslmode=disable"
        "&listen=db.internal:5432&application_name=a+b"
    )
    assert found.transaction_pooling
    assert found.url == "postgresql://u:p%40w@pool:6432/jobs?sslmode=disable&application_name=a+b"
    assert found.listen_url == (
        "postgresql://u:p%40w@db.internal:5432/jobs?sslmode=disable&application_name=a+b"
    )
    other_db = target(
        "postgresql:///jobs?host=/run/pool&pool_mode=transaction&listen=[::1]:5433/real"
    )
    assert other_db.url == "postgresql:///jobs?host=/run/pool"
    assert other_db.listen_url == "postgresql://[::1]:5433/real"
    assert target("postgresql://pool/jobs?pool_mode=transaction").listen_url is None
    plain = target("postgresql://db/jobs?sslmode=require")
    assert (plain.url, plain.listen_url, plain.transaction_pooling) == (
        "postgresql://db/jobs?sslmode=require",
        "postgresql://db/jobs?sslmode=require",
        False,
    )


@pytest.mark.parametrize(
    ("query", "named"),
    [
        ("pool_mode=statement", "pool_mode"),
        ("pool_mode=", "pool_mode"),
        ("listen=db", "listen"),
        ("listen=db:0", "listen"),
        ("listen=db:70000", "listen"),
        ("listen=db:5432/a/b", "listen"),
        ("listen=-db:5432", "listen"),
    ],
)
def test_a_bad_option_is_refused_before_any_io(query: str, named: str) -> None:
    # Port 9 of a documentation address: a connection would hang, not refuse.
    with pytest.raises(ConfigurationError, match=named):
        PostgresBackend(f"postgresql://192.0.2.1:9/db?{query}")


@pytest.mark.parametrize(
    "query",
    [
        "listen=u2:s3cretpw@db:5432",
        "listen=postgresql://u2:s3cretpw@db:5432/jobs",
        "listen=db:5432%3Fpassword%3Ds3cretpw",
        "pool_mode=s3cretpw%40db",
    ],
)
def test_a_refused_option_that_may_hold_a_password_is_not_quoted(query: str) -> None:
    with pytest.raises(ConfigurationError) as refused:
        PostgresBackend(f"postgresql://u:pw@192.0.2.1:9/db?{query}")
    assert "s3cretpw" not in str(refused.value)
    assert "characters" in str(refused.value)


@pytest.mark.parametrize(
    ("address", "host"),
    [
        ("db_1.internal:5432", "db_1.internal"),
        ("/var/run/postgresql:5432", "/var/run/postgresql"),
        ("[fe80::1%25eth0]:5432", "fe80::1%eth0"),
        ("[::1]:5433", "::1"),
    ],
)
def test_listen_takes_names_ipv6_addresses_and_socket_directories(address: str, host: str) -> None:
    from psycopg.conninfo import conninfo_to_dict

    found = target(f"postgresql://u:pw@pool:6432/db?pool_mode=transaction&listen={address}")
    assert found.listen_url is not None
    assert conninfo_to_dict(found.listen_url)["host"] == host


async def test_without_a_listen_address_the_backend_declares_no_session_capability() -> None:
    url = pgbouncer.polling(bouncer_url())
    polled = PostgresBackend(url)
    session_bound = {Capability.NOTIFICATIONS, Capability.TURNS, Capability.HANDOFF}
    assert not session_bound & polled.capabilities
    with pytest.raises(ConfigurationError, match="listen"):
        polled.wakeups(["default"])
    listening = PostgresBackend(bouncer_url())
    assert Capability.NOTIFICATIONS in listening.capabilities
    assert Capability.TURNS in listening.capabilities


@pytest.mark.parametrize("listen", [True, False], ids=["listens-past-it", "polls"])
async def test_a_worker_through_the_bouncer_drains_with_more_slots_than_server_connections(
    bouncer: pgbouncer.Bouncer, schema: str, listen: bool
) -> None:
    url = bouncer.url if listen else bouncer.polling_url
    app = conveyor.App(url, schema=schema, pool_size=10)
    seen: list[int] = []

    @app.task()
    async def work(n: int) -> int:
        await asyncio.sleep(0.001)
        seen.append(n)
        return n * 2

    try:
        await app.migrate_async()
        handles = await app.enqueue_many_async(work, [{"n": n} for n in range(300)])
        async with RunningWorker(app, concurrency=20, poll_interval=0.1):
            done = await wait_terminal(app, [h.id for h in handles], timeout=60)
        assert {t.state for t in done} == {conveyor.TaskState.SUCCEEDED}
        assert sorted(t.result for t in done) == [n * 2 for n in range(300)]
        assert sorted(seen) == list(range(300))
    finally:
        await app.aclose()


async def test_a_bouncer_conveyor_was_not_told_of_is_named_in_the_error(
    bouncer: pgbouncer.Bouncer, schema: str
) -> None:
    """Without pool_mode=transaction, psycopg's prepared statements meet
    other clients' server sessions: the refusal says what to add."""
    backend = PostgresBackend(bouncer.plain_url, schema=schema)
    await backend.open()
    try:
        app = conveyor.App(bouncer.plain_url, schema=schema)
        with pytest.raises(BackendError, match="pool_mode=transaction"):
            await asyncio.gather(*(app.get_async(1) for _ in range(400)))
        await app.aclose()
    finally:
        await backend.close()


def test_a_prepared_statement_refusal_carries_the_pooler_hint() -> None:
    with psycopg.connect(PG_URL, autocommit=True) as conn:
        conn.execute("prepare _pg3_0 as select 1")
        with pytest.raises(psycopg.Error) as refused:
            conn.execute("prepare _pg3_0 as select 1")
    message = str(failures.translated(refused.value))
    assert "already exists" in message and "pool_mode=transaction" in message
    with psycopg.connect(PG_URL, autocommit=True) as conn, pytest.raises(psycopg.Error) as other:
        conn.execute("prepare mine as select 1; prepare mine as select 1")
    assert "pool_mode" not in str(failures.translated(other.value))


async def test_settings_the_servers_side_lacks_are_named_at_open(
    schema: str, caplog: pytest.LogCaptureFixture
) -> None:
    bouncer_url()
    with pgbouncer.Bouncer(PG_URL, connect_query=None) as bare:
        caplog.set_level(logging.WARNING, "conveyor.postgres")
        backend = PostgresBackend(bare.url, schema=schema)
        await backend.open()
        await backend.close()
    [warning] = [r.getMessage() for r in caplog.records if "connect_query" in r.getMessage()]
    assert "jit = off" in warning and "enable_seqscan = off" in warning
    caplog.clear()
    backend = PostgresBackend(bouncer_url(), schema=schema)
    await backend.open()
    await backend.close()
    assert not [r for r in caplog.records if "connect_query" in r.getMessage()]


async def test_nothing_is_left_in_a_server_session(bouncer: pgbouncer.Bouncer, schema: str) -> None:
    """After a worker's run, the bouncer's server sessions hold no prepared
    statement of conveyor's and no advisory lock."""
    app = conveyor.App(bouncer.url, schema=schema)

    @app.task()
    def noop() -> None:
        return None

    try:
        await app.migrate_async()
        handles = await app.enqueue_many_async(noop, [{} for _ in range(50)])
        async with RunningWorker(app, concurrency=10):
            await wait_terminal(app, [h.id for h in handles])
            held = (
                "select (select count(*) from pg_prepared_statements),"
                " (select count(*) from pg_locks where locktype = 'advisory'"
                "  and pid = pg_backend_pid())"
            )
            direct = bouncer.plain_url
            with psycopg.connect(direct, autocommit=True, prepare_threshold=None) as conn:
                for _ in range(8):  # whichever server session each lands on
                    assert conn.execute(held).fetchone() == (0, 0)
    finally:
        await app.aclose()


def test_the_cli_through_the_bouncer(schema: str) -> None:
    cli = Cli(bouncer_url(), schema)
    cli.ok("migrate")
    ids = [cli.enqueue("nobody.runs", {"n": n}) for n in range(8)]
    listed = cli.json("tasks", "--limit", "20")
    assert sorted(t["id"] for t in listed) == sorted(ids)
    assert cli.json("show", str(ids[0]))["id"] == ids[0]
    assert "error" not in cli.ok("explain", str(ids[-1])).lower()


async def test_a_worker_keeps_draining_across_bouncer_restarts(
    bouncer: pgbouncer.Bouncer, schema: str
) -> None:
    """A restart cuts every client connection: the worker's pools and its
    listener reconnect, no task is lost and each runs to success."""
    app = conveyor.App(bouncer.url, schema=schema)
    ran: dict[int, int] = {}

    @app.task()
    async def slow(n: int) -> int:
        await asyncio.sleep(0.02)
        ran[n] = ran.get(n, 0) + 1
        return n

    try:
        await app.migrate_async()
        handles = await app.enqueue_many_async(slow, [{"n": n} for n in range(400)])
        async with RunningWorker(app, concurrency=10, poll_interval=0.1):
            for _ in range(3):
                await asyncio.sleep(0.4)
                await asyncio.to_thread(bouncer.restart)
            done = await _terminal_across_cuts(app, [h.id for h in handles])
        assert {t.state for t in done} == {conveyor.TaskState.SUCCEEDED}
        assert sorted(t.result for t in done) == list(range(400))
        assert set(ran) == set(range(400))
    finally:
        await app.aclose()


async def _terminal_across_cuts(app: conveyor.App, ids: list[int]) -> list[Task]:
    """The tasks once all are terminal; a read cut by a restart is read again."""
    deadline = asyncio.get_running_loop().time() + 90
    while asyncio.get_running_loop().time() < deadline:
        try:
            return await wait_terminal(app, ids, timeout=5)
        except (AssertionError, BackendUnavailableError):
            await asyncio.sleep(0.1)
    raise AssertionError("the tasks did not all end in time")


async def test_a_thread_handlers_transaction_may_idle_past_the_sessions_limit(
    schema: str,
) -> None:
    """The bouncer gives each server session conveyor's 1 s limit on idle
    transactions; an attempt transaction lifts it for itself, as it does on
    a direct connection, so a handler may pause between its statements."""
    app = conveyor.App(bouncer_url(), schema=schema)
    effects = psycopg.sql.Identifier(schema, "effects")
    insert = psycopg.sql.SQL("insert into {} values (%s)").format(effects)

    @app.task()
    def slow_writes(ctx: conveyor.TaskContext) -> int:
        conn = ctx.transaction_sync()
        conn.execute(insert, (1,))
        time.sleep(1.5)
        conn.execute(insert, (2,))
        return 2

    try:
        await app.migrate_async()
        with psycopg.connect(PG_URL, autocommit=True) as conn:
            conn.execute(psycopg.sql.SQL("create table {} (id int)").format(effects))
        handle = await slow_writes.enqueue_async()
        async with RunningWorker(app):
            [task] = await wait_terminal(app, [handle.id])
        assert task.state is conveyor.TaskState.SUCCEEDED, task.attempts
        with psycopg.connect(PG_URL, autocommit=True) as conn:
            rows = conn.execute(psycopg.sql.SQL("select id from {} order by id").format(effects))
            assert rows.fetchall() == [(1,), (2,)]
    finally:
        await app.aclose()
