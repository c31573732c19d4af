"""Shared fixtures: real PostgreSQL (one fresh schema per test), SQLite (one
fresh file per test), memory (one fresh store per test) and Redis (one
fresh key prefix per test, its keys deleted after)."""

from __future__ import annotations

import atexit
import gc
import os
import uuid
import warnings
from collections.abc import AsyncIterator, Iterator
from pathlib import Path

import psycopg
import pytest

import conveyor
from conveyor.backends.postgres import PostgresBackend
from tests.cli_harness import Cli
from tools import bouncer as pgbouncer
from tools.proxy import Proxy

PG_URL = os.environ.get("CONVEYOR_TEST_URL", "postgresql://127.0.0.1:5432/test")
REDIS_URL = os.environ.get("CONVEYOR_TEST_REDIS_URL", "redis://127.0.0.1:6379/0")


@pytest.fixture
def pg_url() -> str:
    return PG_URL


def new_schema_name() -> str:
    return f"t_{uuid.uuid4().hex[:12]}"


@pytest.fixture
def schema() -> Iterator[str]:
    """A PostgreSQL schema of its own for each test, dropped afterwards: the
    drop connects to PostgreSQL, so a fixture that runs on several kinds of
    store takes it through ``schema_for``, for its PostgreSQL case only."""
    name = new_schema_name()
    yield name
    drop_schema(name)


def drop_schema(name: str) -> None:
    """Drop a PostgreSQL schema a test made, if it is there."""
    with psycopg.connect(PG_URL, autocommit=True) as conn:
        conn.execute(
            psycopg.sql.SQL("drop schema if exists {} cascade").format(psycopg.sql.Identifier(name))
        )


BACKENDS = ["postgres", "sqlite", "memory"]
APP_BACKENDS = [*BACKENDS, "redis", "pgbouncer"]
"""Every backend: what ``any_app`` runs on (PostgreSQL twice: directly, and
through PgBouncer in transaction mode)."""
CONFORMANCE_BACKENDS = [*APP_BACKENDS, "redis-scripts"]
"""What the conformance suite runs on: every backend, and Redis once more
with its operations run as scripts rather than functions."""
POSTGRES_KINDS = frozenset({"postgres", "pgbouncer"})

_bouncer: pgbouncer.Bouncer | None = None


def bouncer_url() -> str:
    """The URL of this test process's PgBouncer in transaction mode (with
    conveyor's ``pool_mode`` and ``listen``), started at the first call and
    stopped when the process ends. Without a ``pgbouncer`` executable the
    test is skipped, unless ``CONVEYOR_REQUIRE_PGBOUNCER`` is set (CI)."""
    global _bouncer
    if _bouncer is None:
        if not pgbouncer.available():
            if os.environ.get("CONVEYOR_REQUIRE_PGBOUNCER"):
                pytest.fail("pgbouncer is not installed (CONVEYOR_REQUIRE_PGBOUNCER is set)")
            pytest.skip("pgbouncer is not installed")
        instance = pgbouncer.Bouncer(PG_URL)
        instance.start()
        atexit.register(instance.close)
        _bouncer = instance
    return _bouncer.url


def schema_for(kind: str, request: pytest.FixtureRequest) -> str:
    """The test's ``schema`` (dropped after it) for a PostgreSQL store; for a
    SQLite or memory store, which ignore it, a fresh name nothing creates, so
    those cases never connect to PostgreSQL."""
    if kind in POSTGRES_KINDS:
        return str(request.getfixturevalue("schema"))
    return new_schema_name()


def backend_url(kind: str, schema: str, tmp_path: Path) -> tuple[str, dict[str, str]]:
    """The URL (and options) of a fresh, empty store of ``kind``: for Redis,
    a key prefix of its own (``schema``), whose keys ``destroy`` deletes."""
    if kind == "redis":
        return REDIS_URL, {"schema": schema}
    if kind == "redis-scripts":  # scripts by SHA, as on a server without functions
        return REDIS_URL, {"schema": schema, "functions": False}
    if kind == "postgres":
        return PG_URL, {"schema": schema}
    if kind == "pgbouncer":
        return bouncer_url(), {"schema": schema}
    if kind == "sqlite":
        return f"sqlite:///{tmp_path / 'conveyor.db'}", {}
    return f"memory://{uuid.uuid4().hex}", {}


@pytest.fixture
def app(schema: str) -> Iterator[conveyor.App]:
    """An App on PostgreSQL."""
    application = conveyor.App(PG_URL, schema=schema)
    yield application
    application.close()


@pytest.fixture(params=APP_BACKENDS)
def any_app(request: pytest.FixtureRequest, tmp_path: Path) -> Iterator[conveyor.App]:
    """An App on each backend in turn."""
    url, options = backend_url(request.param, schema_for(request.param, request), tmp_path)
    application = conveyor.App(url, **options)
    yield application
    application.close()
    if request.param == "redis":
        drop_redis_prefix(options["schema"])


def drop_redis_prefix(prefix: str) -> None:
    """Delete every key of the Redis store with this key prefix."""
    import redis

    client = redis.Redis.from_url(REDIS_URL)
    try:
        doomed = list(client.scan_iter(match=f"{{{prefix}}}:*", count=1000))
        for start in range(0, len(doomed), 1000):
            client.delete(*doomed[start : start + 1000])
    finally:
        client.close()


@pytest.fixture
async def backend(schema: str) -> AsyncIterator[PostgresBackend]:
    instance = PostgresBackend(PG_URL, schema=schema)
    await instance.open()
    yield instance
    await instance.close()


@pytest.fixture
def proxy() -> Iterator[Proxy]:
    """A TCP proxy to the test database (``proxy.url``), to cut or black-hole."""
    instance = Proxy(PG_URL)
    instance.start()
    try:
        yield instance
    finally:
        instance.stop()
        # A socket the proxy's own loop left behind would warn at some later
        # collection, failing whichever test runs then: collect it now, and
        # do not count the proxy's leftovers against the code under test.
        with warnings.catch_warnings():
            warnings.simplefilter("ignore", ResourceWarning)
            gc.collect()


CLI_ON_REDIS = pytest.mark.parametrize("cli", ["postgres", "sqlite", "redis"], indirect=True)
"""A CLI test that runs on Redis too (each case starts processes: the
commands whose output a store shapes, not every one)."""


@pytest.fixture(params=["postgres", "sqlite"])
def cli(request: pytest.FixtureRequest, pg_url: str, tmp_path: Path) -> Iterator[Cli]:
    """The real ``conveyor`` command on a fresh, migrated store: PostgreSQL
    (a new schema) and SQLite (a new file); with :data:`CLI_ON_REDIS`, Redis
    too (a new key prefix, deleted after). Commands other than migrate and
    worker refuse a store that is not there."""
    yield from _cli(request, pg_url, tmp_path, migrated=True)


@pytest.fixture(params=["postgres", "sqlite"])
def bare_cli(request: pytest.FixtureRequest, pg_url: str, tmp_path: Path) -> Iterator[Cli]:
    """As ``cli``, on a store nothing has made yet: a schema that does not
    exist, a SQLite file that does not exist."""
    yield from _cli(request, pg_url, tmp_path, migrated=False)


def _cli(
    request: pytest.FixtureRequest, pg_url: str, tmp_path: Path, *, migrated: bool
) -> Iterator[Cli]:
    schema = schema_for(request.param, request)
    url = {"redis": REDIS_URL, "postgres": pg_url}.get(
        request.param, f"sqlite:///{tmp_path / 'tasks.db'}"
    )
    if migrated:
        with conveyor.App(url, schema=schema) as made:
            made.migrate()
    yield Cli(url, schema)
    if request.param == "redis":
        drop_redis_prefix(schema)
