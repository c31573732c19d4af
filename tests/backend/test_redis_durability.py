"""The Redis store's durability: what its server's settings promise, and a
server killed mid-run (SIGKILL, ``appendfsync always``) losing nothing it
acknowledged. Each test runs a ``redis-server`` of its own."""

from __future__ import annotations

import asyncio
import logging
from collections.abc import Iterator
from pathlib import Path

import pytest

from conveyor.backends.params import EnqueueParams, FinishParams
from conveyor.backends.redis import RedisBackend
from conveyor.backends.redis.persistence import Persistence
from conveyor.errors import BackendUnavailableError
from conveyor.model import TaskState
from tests.conformance.test_tasks import claim, new, success
from tools.redis_server import RedisServer


@pytest.fixture
def server(tmp_path: Path) -> Iterator[RedisServer]:
    instance = RedisServer(tmp_path / "redis")
    instance.start()
    try:
        yield instance
    finally:
        instance.kill()


def test_only_fsync_before_each_reply_and_no_eviction_keep_every_promise() -> None:
    assert Persistence("yes", "always", "noeviction").problems() == []
    [lost] = Persistence("yes", "everysec", "noeviction").problems()
    assert "about a second" in lost and "appendfsync always" in lost
    [lost] = Persistence("yes", "no", "noeviction").problems()
    assert "30 s" in lost
    [lost] = Persistence("no", "everysec", "noeviction").problems()
    assert "appendonly is no" in lost
    [evicted] = Persistence("yes", "always", "allkeys-lru").problems()
    assert "allkeys-lru" in evicted and "noeviction" in evicted
    [unknown] = Persistence(None, None, None).problems()
    assert "CONFIG GET refused" in unknown


async def test_open_warns_of_settings_that_can_lose_acknowledged_work(
    tmp_path: Path, caplog: pytest.LogCaptureFixture
) -> None:
    loose = RedisServer(tmp_path / "loose", appendfsync="everysec", maxmemory_policy="allkeys-lru")
    loose.start()
    try:
        with caplog.at_level(logging.WARNING, logger="conveyor"):
            backend = RedisBackend(loose.url, prefix="loose")
            await backend.open()
            await backend.close()
    finally:
        loose.kill()
    warned = " ".join(r.getMessage() for r in caplog.records if r.levelno == logging.WARNING)
    assert "appendfsync is everysec" in warned
    assert "maxmemory-policy is allkeys-lru" in warned
    assert loose.url.split("//")[1].split("/")[0] in warned  # names the server


async def test_open_is_quiet_on_a_server_that_keeps_every_promise(
    server: RedisServer, caplog: pytest.LogCaptureFixture
) -> None:
    with caplog.at_level(logging.WARNING, logger="conveyor"):
        backend = RedisBackend(server.url, prefix="quiet")
        await backend.open()
        await backend.close()
    assert not [r for r in caplog.records if r.levelno >= logging.WARNING]


async def test_a_server_killed_mid_run_loses_nothing_it_acknowledged(
    server: RedisServer,
) -> None:
    """Enqueues run flat out while the server is SIGKILLed; after its
    restart, every enqueue that returned is there, and so are the claims
    and completions acknowledged before the kill."""
    backend = RedisBackend(server.url, prefix="durable")
    await backend.open()
    acknowledged: list[int] = []

    async def enqueue_until_refused() -> None:
        while True:
            try:
                ids = await backend.enqueue(
                    EnqueueParams(tasks=[new(run_at=None), new(run_at=None)])
                )
            except BackendUnavailableError:
                return
            acknowledged.extend(ids)

    enqueuing = asyncio.ensure_future(enqueue_until_refused())
    while len(acknowledged) < 400:
        await asyncio.sleep(0.001)
    claimed = await claim(backend, limit=20, at=None)  # type: ignore[arg-type]
    done = [success(c.token) for c in claimed[:10]]
    finished = await backend.finish(FinishParams(worker_id="w1", completions=done))
    assert not finished.rejected
    while len(acknowledged) < 800:  # enqueues go on after the claim
        await asyncio.sleep(0.001)
    server.kill()
    await asyncio.wait_for(enqueuing, timeout=30)
    await backend.close()

    server.start()
    reopened = RedisBackend(server.url, prefix="durable")
    await reopened.open()
    try:
        states = {}
        for task_id in acknowledged:
            task = await reopened.get_task(task_id, with_attempts=False)
            assert task is not None, f"acknowledged task {task_id} is gone"
            states[task_id] = task.state
        assert {states[c.token.task_id] for c in claimed[:10]} == {TaskState.SUCCEEDED}
        assert {states[c.token.task_id] for c in claimed[10:]} == {TaskState.IN_PROGRESS}
        pending = [t for t, s in states.items() if s is TaskState.PENDING]
        assert len(pending) == len(acknowledged) - len(claimed)
        # The leases claimed before the kill still fence: their holder finishes them.
        rest = [success(c.token) for c in claimed[10:]]
        assert not (await reopened.finish(FinishParams(worker_id="w1", completions=rest))).rejected
    finally:
        await reopened.close()
