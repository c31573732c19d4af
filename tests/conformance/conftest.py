"""Every conformance test runs once per backend."""

from __future__ import annotations

import uuid
from collections.abc import AsyncIterator

import pytest

from conveyor.backends import Backend, backend_from_url
from tests.conftest import PG_URL

BACKENDS = ["postgres", "memory"]


@pytest.fixture(params=BACKENDS)
async def backend(request: pytest.FixtureRequest, schema: str) -> AsyncIterator[Backend]:
    if request.param == "postgres":
        instance = backend_from_url(PG_URL, schema=schema)
    else:
        instance = backend_from_url(f"memory://{uuid.uuid4().hex}")
    await instance.open()
    yield instance
    await instance.destroy()
    await instance.close()
