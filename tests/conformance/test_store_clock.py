"""The store's clock, read on its own (``Backend.store_clock``): timezone-aware,
the same clock the schedules are listed by, and the one workers are live by."""

from __future__ import annotations

from datetime import UTC, datetime, timedelta

from conveyor.backends import Backend
from conveyor.backends.capabilities import capability_of
from conveyor.backends.protocol import Capability
from conveyor.records import WorkerInfo

NEAR = timedelta(seconds=5)
"""How far the store's clock may be from this process's (the same machine)."""


async def test_the_store_clock_is_aware_and_near_real_time(backend: Backend) -> None:
    now = await backend.store_clock()
    assert now.tzinfo is not None
    assert abs(now - datetime.now(UTC)) < NEAR


async def test_the_store_clock_is_the_clock_schedules_are_listed_by(backend: Backend) -> None:
    before = await backend.store_clock()
    listed, _ = await backend.list_schedules()
    after = await backend.store_clock()
    assert before <= listed <= after


async def test_a_worker_that_just_registered_is_live_by_the_store_clock(backend: Backend) -> None:
    await backend.register_worker(WorkerInfo("w1", "host", 1, ("default",), 2))
    now = await backend.store_clock()
    inspector = capability_of(backend, Capability.INSPECT)
    assert inspector is not None
    [worker] = [w for w in await inspector.list_workers() if w.id == "w1"]
    assert worker.live(now)
