"""The store's views through the client (conveyor.reads), on every backend:
its clock, an overview, backlogs, activity, running attempts per worker;
and the checks a command makes before it reads (a missing SQLite file, a
store behind its migrations)."""

from __future__ import annotations

from datetime import UTC, datetime, timedelta
from pathlib import Path

import pytest

import conveyor
from conveyor import TaskState
from conveyor.errors import StoreNotReadyError
from conveyor.reads import StoreStatus
from conveyor.records import WorkerInfo
from conveyor.testing import FakeClock, in_memory
from tests.worker.helpers import run_all

NEAR = timedelta(seconds=5)


@pytest.fixture
def app(any_app: conveyor.App) -> conveyor.App:
    return any_app


async def test_the_views_of_a_store_read_through_the_client(app: conveyor.App) -> None:
    @app.task()
    async def job() -> None:
        return None

    async with app:
        now = await app.now_async()
        assert now.tzinfo is not None and abs(now - datetime.now(UTC)) < NEAR
        done = await job.enqueue_async()
        await run_all(app, [done])
        await job.enqueue_async()
        await job.options(delay=3600).enqueue_async()
        backend = await app.backend()
        await backend.register_worker(WorkerInfo("w1", "host", 1, ("default",), 4, tasks=("job",)))

        found = await app.overview_async()
        assert found.now >= now
        assert {(c.state, c.count) for c in found.counts} == {
            (TaskState.SUCCEEDED, 1),
            (TaskState.PENDING, 2),
        }
        [backlog] = found.backlogs
        assert (backlog.queue, backlog.due, backlog.later) == ("default", 1, 1)
        assert [b.due for b in await app.queue_backlogs_async()] == [1]
        assert [w.id for w in found.live_workers] == ["w1"]
        buckets = await app.activity_async(now - timedelta(minutes=1), 60)
        assert sum(b.succeeded for b in buckets) == 1
        assert await app.running_by_worker_async() == {}


def test_the_sync_forms_read_the_same() -> None:
    clock = FakeClock(datetime(2030, 1, 2, 3, 4, 5, tzinfo=UTC))
    with in_memory(conveyor.App("memory://reads-sync"), clock=clock) as app:
        assert app.now() == clock.now()
        assert app.overview().now == clock.now()
        assert app.queue_backlogs() == []
        assert app.activity(clock.now(), 60) == []
        assert app.running_by_worker() == {}
        assert app.store_status().pending == []
        app.check_exists()
        app.check_ready()
        app.close()


def test_a_missing_sqlite_file_is_reported_not_created(tmp_path: Path) -> None:
    path = tmp_path / "missing.db"
    client = conveyor.Client(f"sqlite:///{path}", migrate=False)
    with pytest.raises(StoreNotReadyError, match="no SQLite database at"):
        client.check_exists()
    assert not path.exists()


def test_the_status_of_a_store_behind_lists_its_migrations_and_no_worker(
    tmp_path: Path,
) -> None:
    url = f"sqlite:///{tmp_path / 'behind.db'}"
    client = conveyor.Client(url, migrate=False)
    status = client.store_status()
    assert status.pending and status.workers == []
    with pytest.raises(StoreNotReadyError):
        client.check_ready()
    applied = client.migrate()
    assert [m.version for m in status.pending] == applied
    assert client.store_status() == StoreStatus([], [])
    client.check_ready()
    client.close()
