"""Shared fixtures: a real PostgreSQL, one fresh schema per test."""

from __future__ import annotations

import gc
import os
import uuid
import warnings
from collections.abc import AsyncIterator, Iterator

import psycopg
import pytest

import conveyor
from conveyor.backends.postgres import PostgresBackend
from tests.proxy import Proxy

PG_URL = os.environ.get("CONVEYOR_TEST_URL", "postgresql://127.0.0.1:5432/test")


@pytest.fixture
def pg_url() -> str:
    return PG_URL


@pytest.fixture
def schema() -> Iterator[str]:
    """A schema of its own for each test, dropped afterwards."""
    name = f"t_{uuid.uuid4().hex[:12]}"
    yield name
    with psycopg.connect(PG_URL, autocommit=True) as conn:
        conn.execute(
            psycopg.sql.SQL("drop schema if exists {} cascade").format(psycopg.sql.Identifier(name))
        )


@pytest.fixture
def app(schema: str) -> Iterator[conveyor.App]:
    application = conveyor.App(PG_URL, schema=schema)
    yield application
    application.close()


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
