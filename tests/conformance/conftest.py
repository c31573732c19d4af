"""Every conformance test runs once per backend: PostgreSQL, SQLite,
memory and Redis (twice: its operations as Redis functions, and as scripts
by SHA), each on a fresh store destroyed after the test."""

from __future__ import annotations

from collections.abc import AsyncIterator
from pathlib import Path

import pytest

from conveyor.backends import Backend, backend_from_url
from tests.conftest import CONFORMANCE_BACKENDS, backend_url, schema_for


def pytest_generate_tests(metafunc: pytest.Metafunc) -> None:
    if "backend" not in metafunc.fixturenames:
        return
    metafunc.parametrize("backend", CONFORMANCE_BACKENDS, indirect=True)


@pytest.fixture
async def backend(request: pytest.FixtureRequest, tmp_path: Path) -> AsyncIterator[Backend]:
    url, options = backend_url(request.param, schema_for(request.param, request), tmp_path)
    instance = backend_from_url(url, **options)
    await instance.open()
    yield instance
    await instance.destroy()
    await instance.close()
