"""Every conformance test runs once per backend."""

from __future__ import annotations

import uuid
from collections.abc import AsyncIterator
from pathlib import Path

import pytest

from conveyor.backends import Backend, backend_from_url
from tests.conftest import PG_URL

BACKENDS = ["postgres", "sqlite", "memory"]


def backend_url(kind: str, schema: str, tmp_path: Path) -> tuple[str, dict[str, str]]:
    """The URL (and options) of a fresh, empty store of ``kind``."""
    if kind == "postgres":
        return PG_URL, {"schema": schema}
    if kind == "sqlite":
        return f"sqlite:///{tmp_path / 'conveyor.db'}", {}
    return f"memory://{uuid.uuid4().hex}", {}


@pytest.fixture(params=BACKENDS)
async def backend(
    request: pytest.FixtureRequest, schema: str, tmp_path: Path
) -> AsyncIterator[Backend]:
    url, options = backend_url(request.param, schema, tmp_path)
    instance = backend_from_url(url, **options)
    await instance.open()
    yield instance
    await instance.destroy()
    await instance.close()
