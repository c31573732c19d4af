"""The worker's pruner on every backend: finished tasks past their age go,
in batches, while the worker runs; the rest stays; ``retention=None`` keeps
everything."""

from __future__ import annotations

import asyncio
from datetime import UTC, datetime, timedelta

import pytest

import conveyor
from conveyor import Retention, TaskState
from conveyor.backends.memory.backend import MemoryBackend
from conveyor.errors import ConfigurationError
from conveyor.worker import pruner as pruner_module
from conveyor.worker.pruner import Pruner
from tests.worker.helpers import RunningWorker, wait_for, wait_terminal


@pytest.fixture
def app(any_app: conveyor.App) -> conveyor.App:
    return any_app


async def test_a_running_worker_prunes_what_retention_does_not_keep(app: conveyor.App) -> None:
    @app.task()
    async def job(fail: bool = False) -> None:
        if fail:
            raise conveyor.Fatal("no")

    keep = Retention(succeeded=1, failed=3600, interval=0.1)
    async with app:
        done = [await job.enqueue_async() for _ in range(3)]
        failed = await job.enqueue_async(fail=True)
        later = await job.options(delay=3600).enqueue_async()
        async with RunningWorker(app, retention=keep):
            await wait_terminal(app, [h.id for h in [*done, failed]])

            async def pruned() -> bool:
                return all([await app.get_async(h.id) is None for h in done])

            await wait_for(pruned, timeout=15)
        kept = [await app.get_async(h.id) for h in (failed, later)]
    assert [t.state for t in kept if t is not None] == [TaskState.FAILED, TaskState.PENDING]


async def test_a_worker_prunes_soon_after_it_starts_not_an_interval_later(
    app: conveyor.App,
) -> None:
    # A worker that runs for less than an interval (a burst, a crash loop,
    # frequent deploys) must still prune: its first prune comes within
    # FIRST_PRUNE_WITHIN seconds of its start, whatever the interval.
    @app.task()
    async def job() -> None:
        return None

    async with app:
        done = [await job.enqueue_async() for _ in range(3)]
        async with RunningWorker(app, retention=None):
            await wait_terminal(app, [h.id for h in done])
        await asyncio.sleep(1.1)  # past the one second kept
        hourly = Retention(succeeded=1, interval=3600)
        async with RunningWorker(app, retention=hourly) as worker:

            async def pruned() -> bool:
                gone = all([await app.get_async(h.id) is None for h in done])
                return gone and worker.pruner is not None and worker.pruner.pruned == 3

            await wait_for(pruned, timeout=pruner_module.FIRST_PRUNE_WITHIN + 10)


def test_the_first_prune_comes_within_its_window_or_the_interval_if_shorter() -> None:
    backend = MemoryBackend()
    window = pruner_module.FIRST_PRUNE_WITHIN
    hourly = Pruner(backend, Retention(interval=3600))
    firsts = [hourly.first_pause() for _ in range(200)]
    assert all(0 <= p <= window for p in firsts) and len(set(firsts)) > 1
    assert all(0.8 * 3600 <= hourly.next_pause() <= 1.2 * 3600 for _ in range(50))
    brisk = Pruner(backend, Retention(interval=0.5))
    assert all(0 <= brisk.first_pause() <= 0.5 for _ in range(200))


async def test_a_backlog_goes_in_batches(app: conveyor.App) -> None:
    @app.task()
    async def job() -> None:
        return None

    async with app:
        handles = await app.enqueue_many_async(job, [{} for _ in range(25)])
        async with RunningWorker(app, retention=None, concurrency=10):
            await wait_terminal(app, [h.id for h in handles])
        pruner = Pruner(await app.backend(), Retention(succeeded=1, batch=10))
        soon = datetime.now(UTC)
        assert (await pruner.run_once(now=soon)).tasks == 0  # not a second old yet
        result = await pruner.run_once(now=soon + timedelta(seconds=5))
        assert (result.tasks, result.busy) == (25, False)
        assert [await app.get_async(h.id) for h in handles] == [None] * 25
        # The API does the same, as does `conveyor prune`.
        assert (await app.prune_async(Retention(succeeded=1), dry_run=True)).tasks == 0


async def test_a_prune_that_stops_at_max_batches_is_followed_soon(
    app: conveyor.App, monkeypatch: pytest.MonkeyPatch
) -> None:
    @app.task()
    async def job() -> None:
        return None

    monkeypatch.setattr(pruner_module, "MAX_BATCHES", 2)
    async with app:
        handles = await app.enqueue_many_async(job, [{} for _ in range(25)])
        async with RunningWorker(app, retention=None, concurrency=10):
            await wait_terminal(app, [h.id for h in handles])
        pruner = Pruner(await app.backend(), Retention(succeeded=1, batch=10, interval=3600))
        later = datetime.now(UTC) + timedelta(seconds=5)
        assert (await pruner.run_once(now=later)).tasks == 20  # two full batches: more left
        assert pruner.backlog
        assert pruner.next_pause() == pruner_module.PRUNE_PAUSE  # not a whole interval
        assert (await pruner.run_once(now=later)).tasks == 5
        assert not pruner.backlog
        assert 0.8 * 3600 <= pruner.next_pause() <= 1.2 * 3600
        assert pruner.pruned == 25


async def test_retention_none_keeps_everything(app: conveyor.App) -> None:
    @app.task()
    async def job() -> None:
        return None

    async with app:
        handle = await job.enqueue_async()
        async with RunningWorker(app, retention=None) as worker:
            await wait_terminal(app, [handle.id])
            await asyncio.sleep(0.3)
            assert worker.pruner is None
        assert await app.get_async(handle.id) is not None


@pytest.mark.parametrize(
    "bad", [{"succeeded": 0}, {"failed": -1}, {"batch": 0}, {"interval": 0}, {"workers": "1d"}]
)
def test_retention_refuses_nonsense(bad: dict[str, object]) -> None:
    with pytest.raises(ConfigurationError, match="Retention"):
        Retention(**bad)  # type: ignore[arg-type]


def test_worker_config_takes_only_a_retention() -> None:
    with pytest.raises(ConfigurationError, match="retention"):
        conveyor.WorkerConfig(retention=3600)  # type: ignore[arg-type]
