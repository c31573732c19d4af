"""Every conformance test runs once per backend."""

from __future__ import annotations

from collections.abc import AsyncIterator
from pathlib import Path

import pytest

from conveyor.backends import Backend, backend_from_url
from tests.conftest import BACKENDS, backend_url, schema_for


@pytest.fixture(params=BACKENDS)
async def backend(request: pytest.FixtureRequest, tmp_path: Path) -> AsyncIterator[Backend]:
    url, options = backend_url(request.param, schema_for(request.param, request), tmp_path)
    instance = backend_from_url(url, **options)
    await instance.open()
    yield instance
    await instance.destroy()
    await instance.close()
