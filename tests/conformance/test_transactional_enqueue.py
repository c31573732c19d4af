"""Enqueue inside the caller's own transaction, on every backend that offers it.

The task exists only if the caller commits, and is then claimed like any
other. Backends without the capability refuse it (test_capabilities.py).
"""

from __future__ import annotations

import contextlib
import sqlite3
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import psycopg
import pytest

from conveyor.backends import Backend
from conveyor.backends.capabilities import capability_of
from conveyor.backends.params import EnqueueParams
from conveyor.backends.protocol import Capability
from conveyor.backends.sqlite import SQLiteBackend
from conveyor.errors import ConfigurationError
from conveyor.records import TaskFilter
from tests.conformance.test_tasks import T0, claim, new
from tests.conftest import PG_URL


@contextlib.contextmanager
def native_connection(backend: Backend) -> Iterator[Any]:
    """A connection of the caller's own, on the backend's database."""
    if isinstance(backend, SQLiteBackend):
        with contextlib.closing(sqlite3.connect(backend.path)) as conn:
            yield conn
    else:
        with psycopg.connect(PG_URL) as conn:
            yield conn


async def test_a_task_enqueued_in_a_rolled_back_transaction_never_exists(
    backend: Backend,
) -> None:
    transactional = capability_of(backend, Capability.TRANSACTIONAL_ENQUEUE)
    if transactional is None:
        assert not hasattr(backend, "enqueue_in_sync")
        return
    with native_connection(backend) as conn:
        transactional.enqueue_in_sync(EnqueueParams([new(payload={"n": "gone"})], now=T0), conn)
        conn.rollback()
        tasks = [new(payload={"n": "low"}), new(payload={"n": "high"}, priority=5)]
        kept = transactional.enqueue_in_sync(EnqueueParams(tasks, now=T0), conn)
        conn.commit()
    stored = await backend.list_tasks(TaskFilter())
    assert sorted(t.payload["n"] for t in stored) == ["high", "low"]
    assert sorted(t.id for t in stored) == sorted(kept)
    assert [c.token.task_id for c in await claim(backend)] == [kept[1], kept[0]]


async def test_sqlite_transactional_enqueue_checks_its_connection(tmp_path: Path) -> None:
    backend = SQLiteBackend(str(tmp_path / "tasks.db"))
    await backend.open()
    params = EnqueueParams([new()], now=T0)
    with (
        contextlib.closing(sqlite3.connect(tmp_path / "other.db")) as other,
        pytest.raises(ConfigurationError, match="not on this backend's file"),
    ):
        backend.enqueue_in_sync(params, other)
    with contextlib.closing(sqlite3.connect(backend.path, isolation_level=None)) as auto:
        with pytest.raises(ConfigurationError, match="autocommit"):
            backend.enqueue_in_sync(params, auto)
        auto.execute("begin")
        [task_id] = backend.enqueue_in_sync(params, auto)
        auto.execute("commit")
    assert await backend.get_task(task_id) is not None
    with pytest.raises(ConfigurationError, match=r"sqlite3\.Connection"):
        backend.enqueue_in_sync(params, object())
    await backend.close()
