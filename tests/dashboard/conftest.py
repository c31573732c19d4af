"""The dashboard on a seeded store of each kind (memory, SQLite, PostgreSQL directly
and through PgBouncer in transaction mode, Redis),
driven by Starlette's TestClient."""

from __future__ import annotations

import re
from collections.abc import Iterator
from pathlib import Path

import pytest
from starlette.testclient import TestClient

import conveyor
from tests.conftest import backend_url, drop_redis_prefix, schema_for
from tests.dashboard.seed import Seeded, seed_app

CSRF = re.compile(r'name="csrf_token" value="([^"]+)"')
HOSTS = ["testserver"]
"""The host name of Starlette's TestClient, for a dashboard with no auth hook."""


@pytest.fixture(params=["memory", "sqlite", "postgres", "redis", "pgbouncer"])
def store(request: pytest.FixtureRequest, tmp_path: Path) -> Iterator[tuple[conveyor.App, Seeded]]:
    """An App on a fresh store of each kind, with a task in every state."""
    url, options = backend_url(request.param, schema_for(request.param, request), tmp_path)
    app = conveyor.App(url, **options)
    app.migrate()
    seeded = app.portal.run(seed_app(app))
    yield app, seeded
    app.close()
    if request.param == "redis":
        drop_redis_prefix(options["schema"])


def csrf_of(client: TestClient, path: str = "/queues") -> str:
    """The CSRF token of a page (the client keeps its cookie)."""
    found = CSRF.search(client.get(path).text)
    assert found is not None, "the page has a form with a CSRF token"
    return found.group(1)
