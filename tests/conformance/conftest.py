"""Every conformance test runs once per backend.

Redis joins module by module, as its backend grows (issue 19): its cases
are generated only for the modules in ``REDIS_MODULES``, so that every case
collected is one that must pass (no skips).
"""

from __future__ import annotations

from collections.abc import AsyncIterator
from pathlib import Path

import pytest

from conveyor.backends import Backend, backend_from_url
from tests.conftest import BACKENDS, backend_url, schema_for

REDIS_MODULES = frozenset(
    {
        "test_capabilities",
        "test_concurrency_keys",
        "test_controls",
        "test_idempotency",
        "test_inboxes",
        "test_inspector",
        "test_pauses",
        "test_rate_limits",
        "test_retention",
        "test_schedules",
        "test_steps",
        "test_store_texts",
        "test_tasks",
        "test_unique",
        "test_wakeups",
    }
)
"""The conformance modules whose every test the Redis backend passes."""


def pytest_generate_tests(metafunc: pytest.Metafunc) -> None:
    if "backend" not in metafunc.fixturenames:
        return
    kinds = list(BACKENDS)
    if metafunc.module.__name__.rpartition(".")[2] in REDIS_MODULES:
        kinds.append("redis")
    metafunc.parametrize("backend", kinds, indirect=True)


@pytest.fixture
async def backend(request: pytest.FixtureRequest, tmp_path: Path) -> AsyncIterator[Backend]:
    url, options = backend_url(request.param, schema_for(request.param, request), tmp_path)
    instance = backend_from_url(url, **options)
    await instance.open()
    yield instance
    await instance.destroy()
    await instance.close()
