"""A store that is not there, or is behind, is refused and never created by
what must not migrate: ``App(migrate=False)``, its workers, every command
but ``migrate``, ``worker`` and ``demo``, and the dashboard. The default
App still creates its store at first use."""

from __future__ import annotations

import asyncio
import sqlite3
from collections.abc import Iterator
from pathlib import Path

import psycopg
import pytest
import redis

import conveyor
from conveyor.backends import sqlite_path
from tests.cli_harness import Cli
from tests.conftest import PG_URL, REDIS_URL, backend_url, drop_redis_prefix, schema_for
from tools.redis_server import free_port

ENGINES = ["postgres", "sqlite", "redis"]
ON_EVERY_ENGINE = pytest.mark.parametrize("bare_cli", ENGINES, indirect=True)


def kind_of(url: str) -> str:
    return url.partition(":")[0].replace("postgresql", "postgres")


def made(url: str, schema: str) -> bool:
    """Whether anything of a store exists at ``url`` and ``schema``."""
    kind = kind_of(url)
    if kind == "postgres":
        with psycopg.connect(PG_URL, autocommit=True) as conn:
            row = conn.execute("select to_regnamespace(%s) is not null", (schema,)).fetchone()
            return bool(row and row[0])
    if kind == "sqlite":
        path = sqlite_path(url)
        assert path is not None
        return Path(path).exists()
    client = redis.Redis.from_url(REDIS_URL)
    try:
        return any(True for _ in client.scan_iter(match=f"{{{schema}}}:*", count=1000))
    finally:
        client.close()


@pytest.fixture(params=ENGINES)
def bare(request: pytest.FixtureRequest, tmp_path: Path) -> Iterator[tuple[str, str]]:
    """The URL and schema (key prefix) of a store nothing has made yet."""
    schema = schema_for(request.param, request)
    url, _ = backend_url(request.param, schema, tmp_path)
    yield url, schema
    if request.param == "redis":
        drop_redis_prefix(schema)


def test_an_app_that_must_not_migrate_refuses_a_missing_store_and_makes_nothing(
    bare: tuple[str, str],
) -> None:
    url, schema = bare
    with conveyor.App(url, schema=schema, migrate=False, allow_unregistered=True) as app:
        with pytest.raises(conveyor.StoreNotReadyError) as refused:
            app.list_tasks()
        with pytest.raises(conveyor.StoreNotReadyError):
            app.enqueue("add")
    assert "conveyor migrate" in str(refused.value)
    assert isinstance(refused.value, conveyor.ConfigurationError)
    assert not made(url, schema)
    with conveyor.App(url, schema=schema) as app:  # the default: made at first use
        assert app.list_tasks() == []
    assert made(url, schema)
    with conveyor.App(url, schema=schema, migrate=False) as app:
        assert app.list_tasks() == []


def test_a_worker_that_must_not_migrate_refuses_a_missing_store_and_makes_nothing(
    bare: tuple[str, str],
) -> None:
    url, schema = bare
    app = conveyor.App(url, schema=schema, migrate=False)
    app.task(name="add")(lambda a, b: a + b)
    try:
        with pytest.raises(conveyor.StoreNotReadyError):
            asyncio.run(app.worker(burst=True).run())
    finally:
        app.close()
    assert not made(url, schema)


def _set_behind(url: str, schema: str) -> None:
    """Make a migrated store look as an older release left it."""
    kind = kind_of(url)
    if kind == "postgres":
        with psycopg.connect(PG_URL, autocommit=True) as conn:
            conn.execute(
                psycopg.sql.SQL(
                    "delete from {} where version = (select max(version) from {})"
                ).format(
                    psycopg.sql.Identifier(schema, "migrations"),
                    psycopg.sql.Identifier(schema, "migrations"),
                )
            )
    elif kind == "sqlite":
        path = sqlite_path(url)
        assert path is not None
        with sqlite3.connect(path) as conn:
            conn.execute(
                "delete from conveyor_migrations"
                " where version = (select max(version) from conveyor_migrations)"
            )
    else:
        client = redis.Redis.from_url(REDIS_URL)
        try:
            client.set(f"{{{schema}}}:layout", "4")
        finally:
            client.close()


def test_a_store_behind_is_refused_until_migrated(bare: tuple[str, str]) -> None:
    url, schema = bare
    with conveyor.App(url, schema=schema) as app:
        app.migrate()
    _set_behind(url, schema)
    app = conveyor.App(url, schema=schema, migrate=False)
    try:
        with pytest.raises(conveyor.StoreNotReadyError, match="conveyor migrate") as refused:
            app.list_tasks()
    finally:
        app.close()
    if kind_of(url) == "redis":
        assert "older key layout '4'" in str(refused.value)
        with conveyor.App(url, schema=schema) as app:
            app.migrate()  # converts it
    else:
        assert "lacks 1 migration(s)" in str(refused.value)


READS = [
    ("tasks",),
    ("counts",),
    ("show", "1"),
    ("explain", "1"),
    ("workers",),
    ("top", "--once"),
    ("schedules",),
    ("pauses",),
    ("keys",),
    ("prune", "--dry-run"),
    ("retry", "--state", "failed", "--dry-run"),
    ("cancel", "1"),
    ("enqueue", "add"),
]


def refusal(cli: Cli) -> str:
    """The one line a command prints for this store that is not there."""
    url, schema = cli.env["CONVEYOR_URL"], cli.env["CONVEYOR_SCHEMA"]
    kind = kind_of(url)
    if kind == "postgres":
        return f'error: no conveyor store in schema "{schema}" at {url}: run `conveyor migrate`'
    if kind == "sqlite":
        return (
            f"error: no SQLite database at {sqlite_path(url)} (check --url or CONVEYOR_URL; "
            "`conveyor migrate` or a worker creates it)"
        )
    return f"error: no conveyor store at {url}?prefix={schema}: run `conveyor migrate`"


@ON_EVERY_ENGINE
def test_read_commands_refuse_a_store_that_is_not_there_and_make_none(bare_cli: Cli) -> None:
    commands = READS if kind_of(bare_cli.env["CONVEYOR_URL"]) == "postgres" else READS[:3]
    for command in commands:
        done = bare_cli.run(*command)
        assert (done.returncode, done.stdout) == (2, ""), (command, done.stderr)
        assert done.stderr.strip() == refusal(bare_cli), command
    port = str(free_port())
    served = bare_cli.run("dashboard", "--no-auth", "--port", port)
    assert served.returncode == 2 and served.stderr.strip() == refusal(bare_cli)
    health = bare_cli.run("health", "--min-workers", "0")  # reports it, and makes nothing
    missing_file = kind_of(bare_cli.env["CONVEYOR_URL"]) == "sqlite"
    assert health.returncode == (2 if missing_file else 1), health.stderr
    assert not made(bare_cli.env["CONVEYOR_URL"], bare_cli.env["CONVEYOR_SCHEMA"])


def test_the_dashboard_of_a_store_not_there_says_so_and_makes_none(
    bare: tuple[str, str],
) -> None:
    from starlette.testclient import TestClient

    from conveyor.dashboard import create_app

    url, schema = bare
    app = conveyor.App(url, schema=schema, migrate=False)
    try:
        with TestClient(create_app(app, allowed_hosts=["testserver"])) as client:
            page = client.get("/tasks")
    finally:
        app.close()
    assert page.status_code == 503
    assert "conveyor migrate" in page.text
    assert not made(url, schema)


def test_migrate_says_what_it_applied_and_then_only_reads(bare: tuple[str, str]) -> None:
    url, schema = bare
    with conveyor.App(url, schema=schema, migrate=False) as app:
        applied = app.migrate()  # whatever the option: migrate() is the DDL path
        assert applied and applied == sorted(applied)
        assert app.migrate() == []
        assert app.list_tasks() == []


def test_a_sqlite_file_of_another_program_is_refused_and_left_as_it_was(tmp_path: Path) -> None:
    other = tmp_path / "other.db"
    with sqlite3.connect(other) as conn:
        conn.execute("create table notes (body text)")
        conn.execute("insert into notes values ('mine')")
    conn.close()
    before = other.read_bytes()
    app = conveyor.App(f"sqlite:///{other}", migrate=False)
    try:
        with pytest.raises(conveyor.StoreNotReadyError, match="no conveyor store in sqlite:///"):
            app.list_tasks()
    finally:
        app.close()
    assert other.read_bytes() == before  # not switched to WAL, nothing added
    assert sorted(p.name for p in tmp_path.iterdir()) == ["other.db"]
