"""Errors are classified by cause on every engine: a store that cannot serve
now is BackendUnavailableError (worth retrying with the same key), a value or
statement it refuses for good is a plain BackendError (repeating it loops for
ever), whatever class the driver gives it. The message is one line: no row
echoed, no trigger's source."""

from __future__ import annotations

import contextlib
import random
import sqlite3
import string
from collections.abc import Iterator
from pathlib import Path

import psycopg
import pytest
import redis
from psycopg import sql

import conveyor
from conveyor.errors import BackendError, BackendUnavailableError
from tests.conftest import PG_URL, REDIS_URL, drop_redis_prefix, new_schema_name
from tools.proxy import Proxy
from tools.redis_server import RedisServer


def permanent(app: conveyor.App, queue: str = "default", **args: object) -> BackendError:
    """The error of an enqueue the store refuses for good."""
    with pytest.raises(BackendError) as caught:
        app.enqueue("any.task", args, queue=queue)
    assert not isinstance(caught.value, BackendUnavailableError), caught.value
    text = str(caught.value)
    assert "\n" not in text
    return caught.value


def pg_run(schema: str, statement: str) -> None:
    with psycopg.connect(PG_URL, autocommit=True) as conn:
        conn.execute(sql.SQL(statement).format(schema=sql.Identifier(schema)))  # type: ignore[arg-type]


@pytest.fixture
def pg_app(schema: str) -> Iterator[conveyor.App]:
    app = conveyor.App(PG_URL, schema=schema, allow_unregistered=True)
    app.migrate()
    yield app
    app.close()


# -- PostgreSQL -----------------------------------------------------------------


def test_postgres_a_value_over_an_index_row_limit_is_permanent(
    pg_app: conveyor.App, schema: str
) -> None:
    """SQLSTATE 54000 (program limit) is an OperationalError in psycopg, as a
    lost connection is: it must not read as "unavailable"."""
    pg_run(schema, "create index payload_text on {schema}.tasks ((payload::text))")
    blob = "".join(random.choices(string.ascii_letters + string.digits, k=40_000))
    error = permanent(pg_app, blob=blob)
    assert "54000" in str(error)
    assert blob[:100] not in str(error)
    assert len(str(error)) < 500


def test_postgres_a_check_violation_names_its_constraint_without_the_row(
    pg_app: conveyor.App, schema: str
) -> None:
    pg_run(
        schema,
        "alter table {schema}.tasks add constraint no_refused_queue check (queue <> 'refused')",
    )
    error = permanent(pg_app, "refused", secret="payload-text-in-the-row")
    assert "no_refused_queue" in str(error)
    assert "23514" in str(error)
    assert "Failing row" not in str(error)
    assert "payload-text-in-the-row" not in str(error)


def test_postgres_a_trigger_exception_is_permanent_without_its_source(
    pg_app: conveyor.App, schema: str
) -> None:
    pg_run(
        schema,
        "create function {schema}.refuse() returns trigger language plpgsql as "
        "$$ begin raise exception 'queue % is closed', new.queue; end $$",
    )
    pg_run(
        schema,
        "create trigger refuse before insert on {schema}.tasks for each row "
        "execute function {schema}.refuse()",
    )
    error = permanent(pg_app, "closed")
    assert "queue closed is closed" in str(error)
    assert "P0001" in str(error)
    assert "PL/pgSQL" not in str(error)


def test_postgres_a_cut_connection_is_still_unavailable(schema: str, proxy: Proxy) -> None:
    with conveyor.App(proxy.url, schema=schema, allow_unregistered=True) as app:
        app.enqueue("any.task")
        proxy.refuse()
        with pytest.raises(BackendUnavailableError):
            app.enqueue("any.task")
        proxy.restore()
        app.enqueue("any.task")


def test_postgres_server_states_are_classified_by_sqlstate() -> None:
    """The cases no test can provoke on a shared server, by SQLSTATE."""
    from conveyor.backends.postgres import failures

    for state in ("08006", "57P01", "57P02", "57P03", "53300", "25P03", "40001", "40P01"):
        assert failures.unavailable(psycopg.errors.lookup(state)()), state
    for state in ("54000", "22001", "23505", "42501", "P0001", "XX000", "55000"):
        assert not failures.unavailable(psycopg.errors.lookup(state)()), state
    assert failures.unavailable(psycopg.OperationalError("server closed the connection"))
    assert failures.unavailable(psycopg.InterfaceError("the connection is closed"))
    assert not failures.unavailable(psycopg.DataError("NUL bytes"))


# -- SQLite ---------------------------------------------------------------------


def test_sqlite_a_refusal_is_classified_by_its_code_not_its_words(tmp_path: Path) -> None:
    """SQLITE_ERROR (a table a trigger names is missing) is permanent, even
    when its message happens to hold a word such as "busy"."""
    path = tmp_path / "store.db"
    with conveyor.App(f"sqlite:///{path}", allow_unregistered=True) as app:
        app.migrate()
        with sqlite_connection(path) as conn:
            conn.execute(
                "create trigger audit after insert on conveyor_tasks "
                "begin insert into busy_audit values (new.id); end"
            )
        error = permanent(app)
        assert "busy_audit" in str(error)


def test_sqlite_a_constraint_is_permanent_in_one_line(tmp_path: Path) -> None:
    path = tmp_path / "store.db"
    with conveyor.App(f"sqlite:///{path}", allow_unregistered=True) as app:
        app.migrate()
        with sqlite_connection(path) as conn:
            conn.execute(
                "create trigger refuse before insert on conveyor_tasks when new.queue = 'refused' "
                "begin select raise(abort, 'queue refused\nsecond line'); end"
            )
        error = permanent(app, "refused")
        assert "queue refused" in str(error)


def test_sqlite_a_lock_held_too_long_is_unavailable(tmp_path: Path) -> None:
    path = tmp_path / "store.db"
    with conveyor.App(f"sqlite:///{path}?busy_timeout=0.1", allow_unregistered=True) as app:
        app.migrate()
        with sqlite_connection(path) as conn:
            conn.execute("begin immediate")
            with pytest.raises(BackendUnavailableError):
                app.enqueue("any.task")
            conn.execute("rollback")
        app.enqueue("any.task")


def sqlite_connection(path: Path) -> contextlib.closing[sqlite3.Connection]:
    return contextlib.closing(sqlite3.connect(path, isolation_level=None))


# -- Redis ----------------------------------------------------------------------


@pytest.fixture
def private(tmp_path: Path) -> Iterator[RedisServer]:
    server = RedisServer(tmp_path / "redis", appendonly=False)
    server.start()
    yield server
    server.stop()


@pytest.mark.parametrize(
    "refusal",
    [
        pytest.param(("config", "set", "maxmemory", "1"), id="oom"),
        pytest.param(("replicaof", "127.0.0.1", "1"), id="readonly"),
    ],
)
def test_redis_a_server_that_cannot_write_now_is_unavailable(
    private: RedisServer, refusal: tuple[str, ...]
) -> None:
    client = redis.Redis.from_url(private.url)
    with conveyor.App(private.url, schema="t", allow_unregistered=True) as app:
        app.enqueue("any.task")
        client.execute_command(*refusal)
        with pytest.raises(BackendUnavailableError):
            app.enqueue("any.task")
    client.close()


def test_redis_an_operation_refused_for_good_is_permanent(private: RedisServer) -> None:
    client = redis.Redis.from_url(private.url)
    with conveyor.App(private.url, schema="t", allow_unregistered=True) as app:
        app.enqueue("any.task")
        client.execute_command("acl", "setuser", "default", "-fcall", "-evalsha", "-fcall_ro")
        permanent(app)
    client.close()


def test_redis_a_cut_connection_is_still_unavailable() -> None:
    prefix = new_schema_name()
    try:
        with (
            Proxy(REDIS_URL) as proxy,
            conveyor.App(proxy.url, schema=prefix, allow_unregistered=True) as app,
        ):
            app.enqueue("any.task")
            proxy.refuse()
            with pytest.raises(BackendUnavailableError):
                app.enqueue("any.task")
    finally:
        drop_redis_prefix(prefix)


def test_redis_replies_are_classified_by_their_code() -> None:
    from redis import exceptions as redis_errors

    from conveyor.backends.redis.store import unavailable

    for reply in ("BUSY Redis is busy running a script", "MASTERDOWN Link is down", "LOADING x"):
        assert unavailable(redis_errors.ResponseError(reply)), reply
    assert unavailable(redis_errors.ReadOnlyError("You can't write against a read only replica"))
    assert unavailable(redis_errors.OutOfMemoryError("command not allowed"))
    assert not unavailable(redis_errors.ResponseError("ERR user_script:1: Script attempted"))
    assert not unavailable(redis_errors.ResponseError("BUSYGROUP Consumer Group name exists"))
    assert not unavailable(redis_errors.NoPermissionError("this user has no permissions"))
